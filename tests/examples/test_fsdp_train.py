"""The FSDP2 example (examples/fsdp_train.py) as a user runs it: torchrun with 2 ranks on
gloo, a few steps, both paths and FSDP2's own fp32; it must finish and report the bytes
against FSDP2's fp32 reduce-scatter in words that read right."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="PyTorch is not installed (the 'ddp' extra)")

from host.ddp import free_loopback_port  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "fsdp_train.py"


def _torchrun(*arguments):
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
               "--nproc_per_node=2", "--master_addr=127.0.0.1",
               f"--master_port={free_loopback_port()}", str(EXAMPLE), "--device", "cpu",
               "--steps", "3", "--hidden", "33", *arguments]
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=180)


@pytest.mark.parametrize("arguments", [("--codec", "inceptionn", "--error-feedback"),
                                       ("--codec", "lhc", "--dtype", "bfloat16"),
                                       ("--codec", "none")])
def test_the_example_trains_two_ranks(arguments):
    done = _torchrun(*arguments)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^step +2  loss \d", done.stdout, re.MULTILINE), done.stdout
    if arguments[1] == "none":
        assert "FSDP2's own fp32 reduce-scatter" in done.stdout
        return
    saved = re.search(r"bytes sent by the reduce-scatters: (\d+) \(all ranks\); FSDP2's fp32 "
                      r"reduce-scatter: (\d+); saved: (-?\d+) \((\d+\.\d) % of the dense "
                      r"bytes, (\d+\.\d\d)x (fewer|more)\)", done.stdout)
    assert saved, done.stdout
    sent, dense, difference = (int(v) for v in saved.groups()[:3])
    assert sent > 0 and dense > 0 and difference == dense - sent
    assert saved.group(6) == ("fewer" if sent < dense else "more")


def test_cuda_without_cuda_is_one_line():
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    done = subprocess.run([sys.executable, str(EXAMPLE), "--device", "cuda"], cwd=REPO,
                          env=dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "fsdp_train.py: error: --device cuda, but CUDA is not available here "
        "(use --device cpu or auto)"]
