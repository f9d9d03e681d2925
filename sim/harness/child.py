"""The child process of a compiled harness and its two pipes, shared by the engine tops'
:class:`~sim.harness.transport.HarnessTransport` and the network top's
:class:`~sim.harness.network.NetworkHarness`.

A request is bytes written to the request pipe; its answer is a ``(status, length)`` head
and ``length`` bytes on the reply pipe (``harness.cpp``, ``phy.cpp``). A harness that
crashes, is killed or stops answering within ``timeout`` ends as a
:class:`~host.driver.transport.TransportError` carrying the tail of its log.
"""
from __future__ import annotations

import os
import select
import signal
import struct
import subprocess
import tempfile
from pathlib import Path

from host.driver.transport import TransportError

__all__ = ["HarnessProcess", "LOG_TAIL_LINES", "OP_CLOSE"]

#: the request that ends a harness (the same opcode in both C++ harnesses)
OP_CLOSE = 6
_HEAD = struct.Struct("<BQ")
LOG_TAIL_LINES = 40


def _grow_pipe(fd, size=1 << 20):
    """Make a pipe hold a whole typical request, so that the writer does not wait for the
    reader to drain it (Linux; elsewhere, or above the system's limit, it stays as it is)."""
    try:
        import fcntl
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), size)
    except (ImportError, OSError):
        pass


class HarnessProcess:
    """Starts a harness executable with two pipes and talks to it.

    Subclasses set :attr:`name` (the top, prefix of the harness's error answers) and
    :attr:`label` (how errors name the harness) before :meth:`_start`, and
    ``self._timeout`` (seconds without an answer before the harness is killed, or None).
    """

    name = "harness"
    label = "the harness"
    _proc = None
    _tmp = None
    _timeout = None

    def _waves_arguments(self, top, waves):
        """``["--waves", PATH]`` for a harness built with tracing (``waves``), else ``[]``;
        sets :attr:`waves_path` (``build/waves/<top>/dump.<format of self.build>``)."""
        self.waves_path = None
        if not waves:
            return []
        from sim.runner import BUILD
        folder = BUILD / "waves" / top
        folder.mkdir(parents=True, exist_ok=True)
        self.waves_path = folder / f"dump.{self.build.waves}"
        return ["--waves", str(self.waves_path)]

    def _start(self, executable, args, tmp_prefix):
        self._tmp = tempfile.TemporaryDirectory(prefix=tmp_prefix)
        self.log_path = Path(self._tmp.name) / "harness.log"
        request_r, self._request_w = os.pipe()
        self._reply_r, reply_w = os.pipe()
        for fd in (self._request_w, self._reply_r):
            _grow_pipe(fd)
        try:
            with open(self.log_path, "wb") as log:
                self._proc = subprocess.Popen(
                    [str(executable), str(request_r), str(reply_w), *args],
                    pass_fds=(request_r, reply_w), stdin=subprocess.DEVNULL,
                    stdout=log, stderr=log, close_fds=True)
        finally:
            os.close(request_r)
            os.close(reply_w)

    def _log_tail(self):
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-LOG_TAIL_LINES:]) or "(the log is empty)"

    def _died(self, what):
        proc, code = self._proc, None
        if proc is not None:
            try:
                code = proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
        if code is None:
            how = "is gone"
        elif code < 0:
            how = f"was killed by {signal.Signals(-code).name}"
        else:
            how = f"exited with status {code}"
        raise TransportError(f"{self.label} {how} {what}; its log "
                             f"({self.log_path}):\n{self._log_tail()}")

    def _read(self, n):
        chunks, left = [], n
        while left:
            if self._timeout is not None:
                ready, _, _ = select.select([self._reply_r], [], [], self._timeout)
                if not ready:
                    self._proc.kill()
                    self._died(f"after no answer for {self._timeout} s")
            chunk = os.read(self._reply_r, min(left, 1 << 20))
            if not chunk:
                self._died("while answering")
            chunks.append(chunk)
            left -= len(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def _request(self, request):
        """Send one request; return the answer's bytes; raise on an error answer."""
        if self._proc is None:
            raise TransportError(f"{self.label} is closed")
        try:
            view = memoryview(request)
            while view:
                view = view[os.write(self._request_w, view):]
        except OSError:
            self._died("before it took a request")
        status, length = _HEAD.unpack(self._read(_HEAD.size))
        payload = self._read(length) if length else b""
        if status != 0:
            raise TransportError(f"{self.name}: {payload.decode(errors='replace')}")
        return payload

    def _stop(self):
        """End the harness (a close request, then a kill if it does not go) and remove its
        log folder; safe to call more than once."""
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                if proc.poll() is None:
                    os.write(self._request_w, bytes([OP_CLOSE]))
                    proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()
            for fd in (self._request_w, self._reply_r):
                try:
                    os.close(fd)
                except OSError:
                    pass
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
