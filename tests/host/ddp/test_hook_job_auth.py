"""``LhcHook(backend="udp")`` on boards with 128-bit control keys (``network.md`` section 7,
**Jobs**): group rank 0 configures the job (on one board, or every job of a tree) with a
fresh epoch, derives the job keys and hands them to the other ranks over the hook's
process group; every rank's datagrams and results are tagged, and the sum is bit for bit
the golden all-reduce's."""
import contextlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from contract.header import HEADER_BYTES, PacketType  # noqa: E402
from host import ddp  # noqa: E402
from host.board import VirtualBoard  # noqa: E402
from host.golden.siphash import check_tag, job_key  # noqa: E402
from host.switchml.tree import BoardAddress, Tree  # noqa: E402
from tests.host.ddp.test_hook_worker import _Bucket  # noqa: E402

KEY = bytes.fromhex("5f0e2a9c41b7d3866e12c0fa9b3d4e71")
TREE_KEYS = tuple(bytes.fromhex(k) for k in ("6d1c0b3a29f8e7d6c5b4a39281706f5e",
                                             "13579bdf02468ace13579bdf02468ace",
                                             "fedcba98765432100123456789abcdef"))
WORLD = 2


def _sum_through(hook, rank, world):
    """One bucket through ``hook``, against the golden all-reduce: exact or not, and what
    the rank's switch worker used."""
    rng = np.random.default_rng(100 + rank)
    x = rng.standard_normal(3000).astype(np.float32) * np.float32(rank + 1)
    x[rng.random(3000) < 0.9] = 0                        # sparse, as LHC's gradients
    try:
        got = hook(None, _Bucket(torch.from_numpy(x.copy()), 0, True)).wait()
        worker = hook._hardware.worker
        layout, stats, job_key = worker.layout, worker.stats, worker._job_key
    finally:
        hook.close()
    want = torch.from_numpy(ddp.lhc_allreduce(x, None)[0]).div_(world)
    dist.barrier()
    return dict(same=bool(np.array_equal(got.numpy().view(np.uint32),
                                         want.numpy().view(np.uint32))),
                epoch=layout.epoch, job_key=job_key, bad_tag=stats.bad_tag,
                packets=stats.packets)


def _rank_main(rank, world, address, tree_boards):
    out = {"board": _sum_through(ddp.LhcHook(backend="udp", board=address, key=KEY),
                                 rank, world)}
    root, *leaves = [BoardAddress(host, base) for host, base in tree_boards]
    tree = Tree(root, leaves, 1)                         # a leaf per rank
    out["tree"] = _sum_through(ddp.LhcHook(backend="udp", tree=tree, key=list(TREE_KEYS)),
                               rank, world)
    return out


def _capture(board, seen):
    deliver = board.backend.deliver

    def capture(datagrams):
        out = deliver(datagrams)
        seen.extend(d.payload for d in list(datagrams) + out)
        return out

    board.backend.deliver = capture


def test_lhc_hooks_on_authenticated_boards_tag_their_jobs_and_stay_exact():
    """One board, then a tree of three (a leaf per rank): every rank takes the same job
    key (its leaf's, on the tree; never the same twice), every datagram of the job
    carries its tag, and no key byte crosses the wire."""
    seen = []
    with contextlib.ExitStack() as stack:
        board = stack.enter_context(VirtualBoard("golden", port_base=None, key=KEY))
        tree_boards = [stack.enter_context(VirtualBoard("golden", port_base=None, key=k))
                       for k in TREE_KEYS]
        for b in (board, *tree_boards):
            _capture(b, seen)
        ranks = ddp.run_local_group(_rank_main, WORLD, f"{board.address[0]}:"
                                    f"{board.address[1]}",
                                    [(b.host, b.port_base) for b in tree_boards], timeout=240)
        counters = [dict(b.backend.counters) for b in (board, *tree_boards)]
    single = [r["board"] for r in ranks]
    on_tree = [r["tree"] for r in ranks]
    assert all(r["same"] and r["packets"] > 0 and r["bad_tag"] == 0
               for r in single + on_tree)
    assert len({r["epoch"] for r in single}) == 1 and single[0]["epoch"] is not None
    assert len({r["job_key"] for r in single}) == 1 and len(single[0]["job_key"]) == 16
    assert on_tree[0]["epoch"] is not None
    keys = {r["job_key"] for r in single} | {r["job_key"] for r in on_tree}
    assert len(keys) == 3                        # the board's, and each leaf's its own
    agg = [p for p in seen if len(p) >= HEADER_BYTES
           and p[2] in (PacketType.AGG_ADD_I32, PacketType.AGG_OR32)]
    root_key = job_key(TREE_KEYS[0], 0, on_tree[0]["epoch"])     # the root's job 0
    keys.add(root_key)
    assert agg and all(any(check_tag(k, p) for k in keys) for p in agg)
    assert any(check_tag(root_key, p) for p in agg)
    assert not [p for p in seen for k in (*keys, KEY, *TREE_KEYS) if k in p]
    for c in counters:
        assert c["drop_bad_tag"] == c["drop_replay"] == 0
