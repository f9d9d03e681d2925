"""The DDP example (examples/ddp_train.py) as a user runs it: torchrun with 2 ranks on gloo,
a few steps, each codec; it must finish and report the bytes the hook saved."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="PyTorch is not installed (it comes with the 'ddp' extra: "
                                    "pip install -e '.[ddp]')")

from host.ddp import free_loopback_port  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "ddp_train.py"


def _torchrun(*arguments):
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
               "--nproc_per_node=2", "--master_addr=127.0.0.1",
               f"--master_port={free_loopback_port()}", str(EXAMPLE), "--device", "cpu",
               "--steps", "3", "--hidden", "32", *arguments]
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("arguments", [("--codec", "inceptionn", "--k", "8",
                                        "--error-feedback"),
                                       ("--codec", "lhc", "--dtype", "bfloat16")])
def test_the_example_trains_two_ranks_and_reports_the_saved_bytes(arguments):
    done = _torchrun(*arguments)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^step +2  loss \d", done.stdout, re.MULTILINE), done.stdout
    saved = re.search(r"bytes sent by the hook: (\d+) \(all ranks\); a dense fp32 ring "
                      r"all-reduce: (\d+); saved: (-?\d+)", done.stdout)
    assert saved, done.stdout
    sent, dense, difference = (int(v) for v in saved.groups())
    assert sent > 0 and dense > 0 and difference == dense - sent


def test_uneven_ranks_finish_under_join():
    # Rank 1 runs one step fewer; join() shadows the missing step with the hook.
    done = _torchrun("--codec", "inceptionn", "--uneven")
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^step +2  loss \d", done.stdout, re.MULTILINE), done.stdout
    assert "bytes sent by the hook" in done.stdout


def _example(*arguments, env=None, timeout=120):
    return subprocess.run([sys.executable, str(EXAMPLE), *arguments], cwd=REPO,
                          env=dict(os.environ, **(env or {})), capture_output=True, text=True,
                          timeout=timeout)


def test_cuda_without_cuda_is_one_line():
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    done = _example("--device", "cuda", env={"RANK": "0", "WORLD_SIZE": "1",
                                             "LOCAL_RANK": "0"})
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "ddp_train.py: error: --device cuda, but CUDA is not available here "
        "(use --device cpu or auto)"]


def test_an_unreachable_rendezvous_fails_in_one_line_naming_it():
    port = free_loopback_port()                        # nobody listens there
    done = _example("--device", "cpu", "--rendezvous-timeout", "3",
                    env={"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
                         "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}, timeout=60)
    assert done.returncode == 2, done.stderr[-2000:]
    line, = done.stderr.strip().splitlines()
    assert line.startswith(f"ddp_train.py: error: rank 1 could not reach the rendezvous at "
                           f"127.0.0.1:{port} within 3 s")


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT"])
def test_sigterm_and_ctrl_c_stop_torchrun_and_every_rank(how):
    import signal
    import time

    from tests.host.ddp.test_launch import _alive, _descendants, _session, _wait_for

    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
               "--nproc_per_node=2", "--master_addr=127.0.0.1",
               f"--master_port={free_loopback_port()}", str(EXAMPLE), "--device", "cpu",
               "--steps", "1000000", "--hidden", "32"]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True,
                               env=dict(os.environ, GLOO_SOCKET_IFNAME="lo",
                                        OMP_NUM_THREADS="1"))
    try:
        assert _wait_for(lambda: len(_descendants(process.pid)) >= 2, 120)
        time.sleep(5.0)                                 # the ranks training
        started = _descendants(process.pid)
        if how == "SIGTERM":
            process.send_signal(signal.SIGTERM)
        else:
            os.killpg(process.pid, signal.SIGINT)       # Ctrl-C: the foreground group
        process.wait(timeout=30)
        assert _wait_for(lambda: not any(_alive(p) for p in started), 30)
        assert _wait_for(lambda: not _session(process.pid), 30)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
