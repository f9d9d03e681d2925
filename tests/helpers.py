"""Helpers the tests share: a fresh random generator (its seed printed, so a failure can be
replayed), the raw bits of fp32 values, a ``gradwire board serve`` process, and a script run
in a network namespace of its own."""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np

from host.board.process import start_module

__all__ = ["REPO", "fresh_rng", "bits", "serve_board", "in_threads", "Wire", "namespace_command",
           "run_in_namespace"]

REPO = Path(__file__).resolve().parents[1]


def fresh_rng():
    """A generator from a fresh seed; the seed is printed (pytest shows it on failure)."""
    seed = secrets.randbits(32)
    print(f"seed {seed}")
    return np.random.default_rng(seed)


def bits(a):
    """The raw bits of fp32 values (for bit-exact comparisons)."""
    return np.asarray(a, np.float32).view(np.uint32)


def serve_board(*args, timeout=60.0):
    """A ``gradwire board serve ARGS`` process and the lines it printed up to its ``ready``
    line (:func:`host.board.process.start_module`: killed, with what it printed, when no
    ``ready`` comes within ``timeout`` s)."""
    return start_module(["host.cli", "board", "serve", *args], timeout=timeout, cwd=REPO)


def in_threads(calls, timeout: float = 120.0) -> list:
    """Call each of ``calls`` (no arguments) in a thread of its own; their return values, in
    order, once every thread has ended (each waited for ``timeout`` s at most: one still
    running fails the test), or the first error raised in one of them."""
    results = [None] * len(calls)
    errors = []

    def run(i):
        try:
            results[i] = calls[i]()
        except BaseException as exc:       # noqa: BLE001 (re-raised below)
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    if errors:
        raise errors[0]
    return results


class Wire:
    """A board backend's datagrams, in and out, seen where the virtual board hands them to
    it: ``seen`` holds every payload; ``inbound`` and ``outbound`` (datagram -> datagram,
    or None to lose it) may change or lose one on its way."""

    def __init__(self, backend):
        self._deliver = backend.deliver
        self.lock = threading.Lock()
        self.seen, self.inbound, self.outbound = [], None, None
        backend.deliver = self.deliver

    def deliver(self, datagrams):
        if self.inbound:
            datagrams = [d for d in map(self.inbound, datagrams) if d is not None]
        out = self._deliver(datagrams)
        with self.lock:
            if self.outbound:
                out = [d for d in map(self.outbound, out) if d is not None]
            self.seen.extend(d.payload for d in list(datagrams) + out)
        return out


def control_forgeries(key: bytes) -> dict:
    """What an attacker on the LAN does to a tagged ``CTRL`` request (section 7) to make it
    do something else: name -> request -> forged request, each with a wrong tag under
    ``key`` (a 128-bit control key)."""
    from host.golden.ctrl_auth import seal
    return {
        "wrong-tag": lambda p: p[:24] + bytes([p[24] ^ 0x80]) + p[25:],
        "old-64-bit-key": lambda p: seal(int.from_bytes(key[:8], "little"), p),
        "truncated": lambda p: p[:-8],
        "tag-moved-to-the-end": lambda p: p[:24] + bytes(8) + p[32:] + p[24:32],
        "tag-moved-to-the-counter": lambda p: p[:16] + p[24:32] + bytes(8) + p[32:],
        "another-128-bit-key": lambda p: seal(bytes(16), p),
        "value-changed": lambda p: p[:-1] + bytes([p[-1] ^ 1]),
    }


def namespace_command(setup: str, what: str):
    """``(command, None)``: ``unshare -n`` (root) or ``unshare -rn`` (a user namespace),
    checked by running the shell commands ``setup`` in a new namespace; or ``(None, why)``
    where that cannot be done here (``what``: what the namespace must hold, for the reason)."""
    if not sys.platform.startswith("linux"):
        return None, "network namespaces are Linux's"
    for tool in ("unshare", "ip"):
        if shutil.which(tool) is None:
            return None, f"no {tool} command"
    command = ["unshare", "-n"] if os.geteuid() == 0 else ["unshare", "-rn"]
    r = subprocess.run([*command, "sh", "-c", setup], capture_output=True, text=True,
                       timeout=30)
    if r.returncode:
        return None, (f"this machine allows no network namespace with {what} in it "
                      f"({' '.join(command)}: {r.stderr.strip() or r.returncode}; needs "
                      f"CAP_SYS_ADMIN or unprivileged user namespaces)")
    return command, None


def run_in_namespace(command, script, target: Path, timeout: float) -> dict:
    """Run ``python script target`` under ``command`` (:func:`namespace_command`), without
    the caller's ``GRADWIRE_*`` settings, in a session of its own (killed whole after
    ``timeout`` s, with what it printed); returns the JSON it wrote to ``target``."""
    import pytest

    env = {k: v for k, v in os.environ.items() if not k.startswith("GRADWIRE_")}
    process = subprocess.Popen([*command, sys.executable, str(script), str(target)],
                               cwd=REPO, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)     # the script's own session: its children too
        out, err = process.communicate()
        pytest.fail(f"{Path(script).name} took over {timeout} s: {out[-2000:]} {err[-3000:]}")
    assert process.returncode == 0, f"{out[-2000:]} {err[-3000:]}"
    return json.loads(Path(target).read_text())
