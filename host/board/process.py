"""A virtual board in a process of its own: ``gradwire board serve`` as a context manager.

:class:`~host.board.virtual.VirtualBoard` serves from a thread of the calling process. That is
right for tests of the board itself; a caller whose process is busy, or holds a large heap
(PyTorch: a full cycle of Python's garbage collector then stops every thread of the process,
the board's too, for a few hundred milliseconds), gives the board a process of its own
instead, as a real board is a machine of its own. :class:`BoardProcess` starts ``python -m
host.cli board serve`` on free ports of 127.0.0.1 with a fresh key, waits for its ``ready``
line, and stops it (SIGTERM, then SIGKILL) on exit. :func:`start_module` and
:func:`stop_module` are the same two steps for any ``python -m`` command of this package
that prints a ``ready`` line (the tests' and the benchmarks' servers).
"""
from __future__ import annotations

import re
import secrets
import subprocess
import sys
import threading
import time

__all__ = ["BoardProcess", "start_module", "stop_module"]

#: seconds to wait for the board's ``ready`` line (imports on a busy machine)
START_TIMEOUT = 60.0


def start_module(args, *, timeout=START_TIMEOUT, cwd=None):
    """``python -m ARGS`` with its standard streams piped, once it has printed ``ready``.

    Returns
    -------
    (subprocess.Popen, list of str)
        The process and the lines it printed up to and with the ``ready`` line.

    Raises
    ------
    RuntimeError
        No ``ready`` line within ``timeout`` seconds (or the process ended first): the
        process is killed, and what it printed is in the message.
    """
    process = subprocess.Popen([sys.executable, "-m", *args], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, stdin=subprocess.PIPE, text=True,
                               cwd=cwd)
    lines = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "ready" in line:
            return process, lines
    process.kill()
    process.wait()
    raise RuntimeError(f"python -m {' '.join(args)} did not become ready: {lines} "
                       f"{process.stderr.read()}")


def stop_module(process, *, timeout=20.0):
    """Stop a child process: close its input, SIGTERM, and SIGKILL after ``timeout`` s."""
    if process.stdin is not None and not process.stdin.closed:
        process.stdin.close()
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            stream.close()


class BoardProcess:
    """``gradwire board serve`` in a child process.

    Parameters
    ----------
    fault_rate, fault_seed : float, int
        Faults on the board's wire (``--fault-rate``, ``--fault-seed``).
    options
        Further ``board serve`` options as keywords (``slots=16`` is ``--slots 16``).

    Attributes
    ----------
    host, port_base, key
        Where it serves and its control key (after :meth:`start`).
    stopped_line : str
        Its last line after :meth:`stop` (datagrams in and out, wire faults).
    """

    def __init__(self, *, fault_rate: float = 0.0, fault_seed: int = 0, **options):
        self.fault_rate, self.fault_seed, self.options = fault_rate, fault_seed, options
        self.host = "127.0.0.1"
        self.port_base = None
        self.key = secrets.randbits(64)
        self.process = None
        self.stopped_line = ""
        self._lines = []

    @property
    def address(self) -> str:
        """``HOST:PORT_BASE``, what the hooks' ``board=`` and ``--board`` take."""
        return f"{self.host}:{self.port_base}"

    def start(self) -> "BoardProcess":
        from .virtual import free_port_base

        self.port_base = free_port_base()
        command = [sys.executable, "-m", "host.cli", "board", "serve",
                   "--port-base", str(self.port_base), "--key", f"{self.key:016x}"]
        if self.fault_rate:
            command += ["--fault-rate", str(self.fault_rate), "--fault-seed",
                        str(self.fault_seed)]
        for name, value in self.options.items():
            command += [f"--{name.replace('_', '-')}", str(value)]
        # A session of its own: a terminal's Ctrl-C goes to the foreground group, and the
        # caller decides (stopping this board on its way out). In the same group the board
        # could stop first, and a training run report its ranks' errors instead of the
        # interrupt (a loaded machine schedules the caller last).
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        text=True, start_new_session=True)
        ready = threading.Event()

        def read():
            for line in self.process.stdout:
                self._lines.append(line.rstrip("\n"))
                if "ready on" in line:
                    ready.set()

        reader = threading.Thread(target=read, daemon=True, name="board-process-output")
        reader.start()
        deadline = time.monotonic() + START_TIMEOUT
        while not ready.wait(0.1):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the virtual board did not start (port base "
                                   f"{self.port_base}): {' | '.join(self._lines[-5:])}")
        self._reader = reader
        return self

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        # the reader ends at the end of the output; the streams are closed after it
        reader = getattr(self, "_reader", None)
        if reader is not None:
            reader.join(timeout=5)
        stop_module(process)
        stopped = [line for line in self._lines if "stopped after" in line]
        self.stopped_line = stopped[-1] if stopped else ""

    def datagrams(self) -> tuple[int, int] | None:
        """``(in, out)`` from the board's last line, after :meth:`stop`."""
        match = re.search(r"stopped after ([\d,]+) datagrams in, ([\d,]+) out", self.stopped_line)
        if match is None:
            return None
        return tuple(int(group.replace(",", "")) for group in match.groups())

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
