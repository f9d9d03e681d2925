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
