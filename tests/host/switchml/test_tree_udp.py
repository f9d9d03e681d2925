"""A tree of aggregators over real UDP sockets on 127.0.0.1 (``aggregator-protocol.md``
section 4): two virtual-board leaves and a virtual-board root, each board its own port
base, configured by :func:`host.switchml.tree.configure_tree` over their control ports; one
:class:`~host.driver.udp_worker.UdpSwitchWorker` per worker, in threads (each with its own
socket, as separate processes would), talking to its leaf alone, unchanged. The leaves
send their completed slots to the root's switch socket and take its results, both from
the addresses the registers name; every result is bit for bit what one aggregator of all
the workers gives, also with loss, duplication and reordering on every board's wire.

The Verilated network top as one leaf is the last test: it runs once the gateware holds the
upstream registers and is skipped, saying so, while they do not read back."""
import contextlib

import numpy as np
import pytest

from contract.header import PacketType
from host.board import VirtualBoard, WireFaults
from host.driver.udp_worker import UdpSwitchWorker
from host.golden import lhc
from host.switchml.tree import BoardAddress, Tree, configure_tree
from tests.helpers import fresh_rng, in_threads

FAST = dict(rto=0.05, min_rto=0.01, max_rto=0.2, timeout=30)
SLOTS, LANES = 8, 64
#: below the workers' first resend timeout, and far below two rounds of a slot (the tree's
#: network rule, host/switchml/tree_network.py)
MAX_DELAY = 2e-4


@contextlib.contextmanager
def serving(backends):
    """Each backend (a name or a BoardBackend) served by a virtual board of its own ports."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(VirtualBoard(b, port_base=None, **params))
               for b, params in backends]


def tree_of(root, leaves, workers, **kwargs):
    return Tree(BoardAddress(root.host, root.port_base),
                [BoardAddress(b.host, b.port_base) for b in leaves], workers, **kwargs)


def start_workers(tree, boards):
    """Configure ``tree`` over the boards' control; one UdpSwitchWorker per rank, with its
    leaf's layout. ``boards`` maps each BoardAddress to its VirtualBoard."""
    workers = []
    for rank in range(tree.total_workers):
        plan = tree.worker(rank)
        workers.append(UdpSwitchWorker(plan.board.host, port_base=plan.board.port_base,
                                       job=plan.job, worker=plan.worker, **FAST))
    controls = {address: board.transport(region="switch") for address, board in boards.items()}
    try:
        layout = configure_tree(tree, controls, [w.address for w in workers])
    finally:
        for control in controls.values():
            control.close()
    for rank, worker in enumerate(workers):
        worker.set_layout(layout.worker_layout(rank)[1])
    return workers, layout


def lhc_rank(worker, tensor, total, path):
    """One rank's LHC all-reduce through its UdpSwitchWorker (the phases of
    host.switchml.network.lhc_protocol), quantised for every worker of the tree."""
    w = lhc.LhcWorker(tensor, total, path=path)
    merged, e_max = worker.aggregate(w.phase_a_words, PacketType.AGG_OR32,
                                     exponent=w.exponent, name="index")
    if e_max is None:
        e_max = lhc.EXPONENT_ZERO
    if w.plan_phase(merged, e_max) == "dense":
        total_sum, _ = worker.aggregate(w.dense_phase(merged, e_max, w.plan),
                                        PacketType.AGG_ADD_I32, name="dense")
        return w.finish(total_sum.view(np.int32))[0]
    sketch_sum, _ = worker.aggregate(w.sketch_phase(merged, e_max, w.plan),
                                     PacketType.AGG_ADD_I32, name="sketch")
    fallback = w.fallback_phase(sketch_sum.view(np.int32))
    fallback_sum, _ = worker.aggregate(fallback, PacketType.AGG_ADD_I32, name="fallback")
    return w.finish(fallback_sum.view(np.int32))[0]


def tensors_for(rng, n, size=3000):
    out = []
    common = rng.choice(size, 300, replace=False)
    for _ in range(n):
        x = np.zeros(size, np.float32)
        idx = rng.choice(common, 60, replace=False)
        x[idx] = rng.standard_normal(60).astype(np.float32)
        out.append(x)
    return out


def check_tree(boards_by_address, tree, rng, path="auto"):
    workers, layout = start_workers(tree, boards_by_address)
    try:
        # a plain wrap-around ADD and OR of full 32-bit words first, then the LHC all-reduce
        size = 64 * SLOTS * 2 + 5
        vectors = [rng.integers(0, 2**32, size, dtype=np.uint64).astype(np.uint32)
                   for _ in workers]
        total = (np.stack(vectors).astype(np.uint64).sum(axis=0) % 2**32).astype(np.uint32)
        ored = np.bitwise_or.reduce(np.stack(vectors), axis=0)
        exponents = [int(e) for e in rng.integers(-128, 128, len(workers))]
        results = in_threads([
            lambda w=w, v=v, e=e: (w.aggregate(v, PacketType.AGG_ADD_I32, exponent=e),
                                   w.aggregate(v, PacketType.AGG_OR32))
            for w, v, e in zip(workers, vectors, exponents)])
        for (added, e_max), (or_result, _) in results:
            np.testing.assert_array_equal(added, total)
            np.testing.assert_array_equal(or_result, ored)
            assert e_max == max(exponents)
        tensors = tensors_for(rng, len(workers))
        got = in_threads([lambda w=w, t=t: lhc_rank(w, t, tree.total_workers, path)
                          for w, t in zip(workers, tensors)])
        want, _ = lhc.allreduce(tensors, path=path)
        for result in got:
            assert np.array_equal(result.view(np.uint32), want.view(np.uint32))
        return workers, layout
    finally:
        for w in workers:
            w.close()


@pytest.mark.parametrize("rate", [0.0, 0.05])
def test_two_virtual_leaves_and_a_virtual_root_over_udp(rate):
    rng = fresh_rng()
    seed = int(rng.integers(1 << 31))
    faults = [WireFaults(rate, seed=seed + i, max_delay=MAX_DELAY) if rate else None
              for i in range(3)]
    with serving([("golden", dict(slots=SLOTS, lanes=LANES, faults=f)) for f in faults]) \
            as (root, leaf0, leaf1):
        tree = tree_of(root, [leaf0, leaf1], [3, 2], root_job=1, leaf_job=2, slot_count=SLOTS)
        boards = dict(zip(tree.boards, (root, leaf0, leaf1)))
        workers, _ = check_tree(boards, tree, rng)
        root_counters = root.backend.aggregator.counters
        for leaf in (leaf0, leaf1):
            c = leaf.backend.aggregator.counters
            assert c["upstream_sent"] == c["results_upstream"] > 0
            assert c["results_multicast"] == 0 and c["drop_result_unexpected"] == 0
            assert leaf.backend.counters["switch_upstream_out"] >= c["upstream_sent"]
            assert leaf.backend.counters["drop_result_source"] == 0
        assert root_counters["results_multicast"] == \
            leaf0.backend.aggregator.counters["upstream_sent"]
        assert root.backend.counters["drop_bad_source"] == 0
        if rate:
            assert sum(w.stats.resends for w in workers) > 0
            assert any(f.stats()["lost"] for f in faults)


@pytest.mark.slow
def test_a_verilated_network_top_as_one_leaf():
    """Leaf 1 is the gateware (the network top behind the compiled harness's PHY), leaf 0
    and the root golden boards: bit-exact, and the gateware's upstream registers read back
    what the tree's configuration wrote."""
    from host.driver.switch import SwitchInterface
    from sim.harness.board import VerilatorBoard
    rng = fresh_rng()
    with VirtualBoard(VerilatorBoard(), port_base=None) as verilated:
        with verilated.transport(region="switch") as control:
            slots, lanes = SwitchInterface(control).slots, SwitchInterface(control).lanes
        with serving([("golden", dict(slots=slots, lanes=lanes))] * 2) as (root, leaf0):
            tree = tree_of(root, [leaf0, verilated], [2, 2], slot_count=min(slots, SLOTS))
            boards = dict(zip(tree.boards, (root, leaf0, verilated)))
            check_tree(boards, tree, rng)


def test_the_hook_side_one_call_each():
    """What LhcHook(tree=...) will call: open_tree_worker on every rank (the group must be
    the whole tree), configure_tree_over_udp on one rank with each board's key,
    release_tree at the end."""
    from host.switchml.tree import (configure_tree_over_udp, open_tree_worker, release_tree,
                                    tree_keys)
    rng = fresh_rng()
    backends = [("golden", dict(slots=SLOTS, key=key)) for key in (0x11, 0x22, 0x33)]
    with serving(backends) as (root, leaf0, leaf1):
        tree = tree_of(root, [leaf0, leaf1], 2, root_job=3, leaf_job=1, slot_count=4)
        keys = {str(b): board.key for b, board in zip(tree.boards, (root, leaf0, leaf1))}
        assert tree_keys(tree, keys)[tree.leaves[1]] == 0x33
        with pytest.raises(ValueError, match="a process group of 3 ranks cannot run it"):
            open_tree_worker(tree, 0, 3)
        opened = [open_tree_worker(tree, rank, 4, **FAST) for rank in range(4)]
        workers = [worker for _, worker in opened]
        try:
            layout = configure_tree_over_udp(tree, keys, [w.address for w in workers])
            for rank, (plan, worker) in enumerate(opened):
                assert (plan.leaf, plan.worker, worker.job) == (rank // 2, rank % 2, 1)
                worker.set_layout(layout.worker_layout(rank)[1])
            vectors = [rng.integers(0, 2**32, 300, dtype=np.uint64).astype(np.uint32)
                       for _ in workers]
            results = in_threads([lambda w=w, v=v: w.aggregate(v, PacketType.AGG_ADD_I32)
                                  for w, v in zip(workers, vectors)])
            total = (np.stack(vectors).astype(np.uint64).sum(axis=0) % 2**32).astype(np.uint32)
            for vector, _ in results:
                np.testing.assert_array_equal(vector, total)
            assert leaf1.backend.aggregator.job_config(1).upstream == tree.upstream(1)
        finally:
            for w in workers:
                w.close()
        release_tree(tree, keys)
        assert root.backend.aggregator.job_config(3) is None
        assert leaf0.backend.aggregator.job_config(1) is None
        with pytest.raises(ValueError, match="no control key for board"):
            tree_keys(tree, {str(tree.root): 1})


def test_configuring_a_tree_with_a_board_gone_names_the_board():
    from host.driver.transport import TransportError
    from host.switchml.tree import configure_tree_over_udp
    with serving([("golden", dict(slots=SLOTS, key=5))] * 2) as (root, leaf0):
        gone = BoardAddress("127.0.0.1", leaf0.port_base + 100)
        tree = Tree(BoardAddress(root.host, root.port_base),
                    [BoardAddress(leaf0.host, leaf0.port_base), gone], 1, slot_count=4)
        with pytest.raises(TransportError, match=f"board 127.0.0.1:{gone.port_base} .leaf. "
                                                 f"of the tree"):
            configure_tree_over_udp(tree, 5, [("127.0.0.1", 40001), ("127.0.0.1", 40002)],
                                    retries=1)
