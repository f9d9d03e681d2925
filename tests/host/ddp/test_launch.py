"""The launcher stops when asked (issue 49, item 7): host/ddp/launch.py and ``gradwire
accuracy``.

* Inside a network namespace whose loopback is down (``unshare -rn``, where user
  namespaces are allowed), the local process-group launcher and ``gradwire accuracy`` fail
  in one line that names the rendezvous address, within a bounded time; with the
  launcher's own check bypassed, the ranks' bounded rendezvous says the same.
* SIGTERM and Ctrl-C (SIGINT to the whole foreground process group) stop the launcher and
  every process it started within seconds, for ``run_local_group`` and for
  ``gradwire accuracy``.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="PyTorch is not installed (the 'ddp' extra)")

from tests.helpers import REPO  # noqa: E402

#: generous bounds (the machine may be busy); what they prove is "not an hour"
FAIL_WITHIN = 60.0
STOP_WITHIN = 30.0


def _unshare_works():
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rn", "true"], capture_output=True)
    return probe.returncode == 0


NO_NETNS = "unshare -rn (a user and network namespace) is not allowed here"


def _run_python(code, *, netns=False, timeout=FAIL_WITHIN + 30):
    command = [sys.executable, "-c", textwrap.dedent(code)]
    if netns:
        command = ["unshare", "-rn", *command]
    started = time.monotonic()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    return done, time.monotonic() - started


LAUNCH = """
    import sys
    from host.ddp import launch
    from tests.host.ddp.test_launch import {fn}
    {patch}
    try:
        launch.run_local_group({fn}, 2, timeout=600, rendezvous_timeout=5)
    except launch.RendezvousError as exc:
        print("RendezvousError:", exc)
        sys.exit(7)
"""


def idle(rank, world):
    return rank


@pytest.mark.skipif(not _unshare_works(), reason=NO_NETNS)
def test_launcher_without_loopback_fails_in_one_line_naming_the_address():
    done, seconds = _run_python(LAUNCH.format(fn="idle", patch=""), netns=True)
    assert done.returncode == 7, done.stderr[-2000:]
    line, = done.stdout.strip().splitlines()
    assert "cannot connect to the rendezvous address 127.0.0.1:" in line
    assert "loopback" in line
    assert seconds < FAIL_WITHIN


@pytest.mark.skipif(not _unshare_works(), reason=NO_NETNS)
def test_ranks_rendezvous_is_bounded_when_the_launcher_check_is_bypassed():
    patch = "launch.check_rendezvous_address = lambda *a, **k: None"
    done, seconds = _run_python(LAUNCH.format(fn="idle", patch=patch), netns=True)
    assert done.returncode == 7, done.stderr[-2000:]
    line = done.stdout.strip().splitlines()[-1]
    assert "could not reach the rendezvous at 127.0.0.1:" in line and "within 5 s" in line
    assert seconds < FAIL_WITHIN


@pytest.mark.skipif(not _unshare_works(), reason=NO_NETNS)
def test_gradwire_accuracy_without_loopback_fails_in_one_line(tmp_path):
    started = time.monotonic()
    done = subprocess.run(
        ["unshare", "-rn", sys.executable, "-m", "host.cli", "accuracy", "--quick",
         "--backend", "udp", "--tasks", "digits", "--codecs", "inceptionn-k10",
         "--world-size", "2", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=FAIL_WITHIN + 60,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    seconds = time.monotonic() - started
    assert done.returncode == 2, (done.stdout[-2000:], done.stderr[-2000:])
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, done.stderr[-3000:]
    assert errors[0].startswith("gradwire accuracy: error: cannot connect to the rendezvous "
                                "address 127.0.0.1:")
    assert seconds < FAIL_WITHIN + 30


# ---------------------------------------------------------------------------------------
# SIGTERM and Ctrl-C

def sleeper(rank, world, pid_dir):
    """A rank that writes its pid and then waits forever (in C++: a barrier that the other
    rank never joins, then sleeps)."""
    import torch.distributed as dist

    Path(pid_dir, f"{rank}.pid").write_text(str(os.getpid()))
    if rank == 1:
        dist.barrier()             # rank 0 never comes: blocked in gloo
    while True:
        time.sleep(1.0)


def _descendants(root):
    """Every live process below ``root`` (from /proc)."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path("/proc", entry, "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _session(sid):
    """Live processes of session ``sid``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path("/proc", entry, "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z" and int(fields[4]) == sid:
                found.append(int(entry))
    return found


def _alive(pid):
    try:
        state = Path("/proc", str(pid), "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_for(condition, within):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


def _as_from_a_terminal():
    """A shell's child: SIGINT and SIGTERM at their defaults and not blocked, whatever the
    test process inherited or a test before this one left (a launcher started with SIGINT
    ignored ignores it too, as ``nohup`` wants)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def _start(command):
    # A session of its own: Ctrl-C is SIGINT to the terminal's whole foreground group.
    return subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True,
                            preexec_fn=_as_from_a_terminal,
                            env={**os.environ, "PYTHONPATH": str(REPO)})


def _signal_state(pid):
    """The signal lines of ``/proc/PID/status`` (what a process ignores, blocks, catches)."""
    try:
        lines = Path("/proc", str(pid), "status").read_text().splitlines()
    except OSError:
        return "gone"
    return "; ".join(line for line in lines if line.startswith(("SigBlk", "SigIgn", "SigCgt")))


def _stop_and_check(process, how, started_pids):
    if how == "SIGTERM":
        process.send_signal(signal.SIGTERM)
    else:
        os.killpg(process.pid, signal.SIGINT)
    sent = time.monotonic()
    try:
        process.wait(timeout=STOP_WITHIN)
    except subprocess.TimeoutExpired:
        state = _signal_state(process.pid)
        os.killpg(process.pid, signal.SIGKILL)
        pytest.fail(f"the launcher ignored {how} for {STOP_WITHIN:.0f} s ({state}; this "
                    f"test's process: {_signal_state(os.getpid())})")
    assert _wait_for(lambda: not any(_alive(p) for p in started_pids), STOP_WITHIN), \
        f"processes left running after {how}: {[p for p in started_pids if _alive(p)]}"
    # Nothing of the session is left either (zombies waiting for their reaper aside).
    assert _wait_for(lambda: not _session(process.pid), STOP_WITHIN), _session(process.pid)
    return time.monotonic() - sent


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT"])
def test_run_local_group_stops_every_rank_on_signal(tmp_path, how):
    code = textwrap.dedent(f"""
        from host.ddp import launch
        from tests.host.ddp.test_launch import sleeper
        launch.run_local_group(sleeper, 2, {str(tmp_path)!r}, timeout=600)
    """)
    process = _start([sys.executable, "-c", code])
    pid_files = [tmp_path / "0.pid", tmp_path / "1.pid"]
    try:
        assert _wait_for(lambda: all(p.exists() and p.read_text() for p in pid_files), 120), \
            process.stderr.read() if process.poll() is not None else "ranks did not start"
        time.sleep(1.0)                                    # rank 1 inside the barrier
        ranks = [int(p.read_text()) for p in pid_files]
        started = _descendants(process.pid)
        assert set(ranks) <= set(started)
        _stop_and_check(process, how, started)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT"])
def test_gradwire_accuracy_stops_every_process_on_signal(tmp_path, how):
    # The udp backend without a board: a virtual board process besides the two ranks.
    process = _start([sys.executable, "-m", "host.cli", "accuracy", "--backend", "udp",
                      "--tasks", "digits", "--codecs", "inceptionn-k10", "--world-size", "2",
                      "--steps", "100000", "--out", str(tmp_path)])
    started = []
    try:
        # The board and both ranks (and their helpers) running.
        assert _wait_for(lambda: len(_descendants(process.pid)) >= 3, 120), \
            process.stderr.read() if process.poll() is not None else "nothing started"
        time.sleep(5.0)                                    # the ranks inside training
        started = _descendants(process.pid)
        _stop_and_check(process, how, started)
        assert process.returncode == (143 if how == "SIGTERM" else 130)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        for pid in started:                # the board has a session of its own
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def test_savings_are_worded_so_that_they_read_right_both_ways():
    from host.ddp.launch import bytes_compared
    assert bytes_compared(100, 400) == "25.0 % of the dense bytes, 4.00x fewer"
    assert bytes_compared(103, 100) == "103.0 % of the dense bytes, 1.03x more"
    assert bytes_compared(100, 100) == "100.0 % of the dense bytes, as many"
    assert bytes_compared(0, 100) == "0.0 % of the dense bytes, none sent"
    assert "less" not in bytes_compared(97, 100) + bytes_compared(103, 100)
