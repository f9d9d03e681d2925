"""A tree of aggregators on the in-process network (``host/switchml/tree_network.py``;
``aggregator-protocol.md`` section 4): golden leaf boards and a golden root exchanging
datagrams with the hosts and with each other, bit for bit the flat golden all-reduce over
every worker, with seeded loss, duplication and reordering on both levels, the workers'
timeouts driving every recovery.

The targeted tests script single datagrams (``TreeFaults.script``): a lost upstream
packet, a lost parent result, a duplicated one, a stale one from the previous round, and
forged results (wrong source, wrong job, unexpected), each run ending bit-exact with the
drops counted where the contract says. A result two rounds late is the one thing a leaf
cannot tell apart (the network's rule, which the run checks)."""
import time

import numpy as np
import pytest

from contract.header import HEADER_BYTES, HEADER_FIELDS, Flags, PacketType
from host.golden import lhc
from host.switchml.network import Phase, TickFaults
from host.switchml.tree import Tree
from host.switchml.tree_network import (LEVELS, TreeFaults, TreeJob, TreeNetwork, TreeSwitch,
                                        allreduce_tree, run_trees, tree_faults, worker_address)
from host.switchml.window import ProtocolError
from tests.helpers import fresh_rng

_FLAGS, _JOB = ({f.name: f.offset for f in HEADER_FIELDS}[name] for name in ("flags", "job"))


def make_tree(leaves, workers, *, slot_count=4, root_job=0, leaf_job=0, groups=None):
    return Tree("10.0.0.1", [f"10.0.1.{leaf + 1}" for leaf in range(leaves)], workers,
                root_job=root_job, leaf_job=leaf_job, slot_count=slot_count, groups=groups)


def configured(tree, **params):
    network = TreeNetwork.golden(tree, **{"slots": 16, "lanes": 64, "jobs": 4, **params})
    addresses = [worker_address(0, tree.worker(r).leaf, tree.worker(r).worker, tree.leaf_job)
                 for r in range(tree.total_workers)]
    return network, network.configure(tree, addresses)


def add_protocol(words):
    result = yield Phase("add", PacketType.AGG_ADD_I32, words)
    return result


def wrapped_sum(vectors):
    return (np.stack(vectors).astype(np.uint64).sum(axis=0) % 2**32).astype(np.uint32)


def run_add(tree, vectors, faults=None, max_ticks=20_000, **options):
    """Every worker's ADD of its vector through the tree; checks every worker got the
    wrap-around sum of all of them; returns (stats, network). (A run that stops making
    progress fails within ``max_ticks``.)"""
    network, layout = configured(tree)
    ((results, stats),) = run_trees([TreeJob(layout, [add_protocol(v) for v in vectors])],
                                    network, faults=faults, max_ticks=max_ticks, **options)
    want = wrapped_sum(vectors)
    for vector, _ in results:
        np.testing.assert_array_equal(vector, want)
    return stats, network


def random_vectors(rng, n, size):
    return [rng.integers(0, 2**32, size, dtype=np.uint64).astype(np.uint32) for _ in range(n)]


def counters(stats, board, block="switch"):
    return stats.counters[board][block]


def sparse_tensors(rng, n, size, support, per_worker):
    """Gradients that share a support (a sparse model's rows): the sketch path's case."""
    common = rng.choice(size, support, replace=False)
    out = []
    for _ in range(n):
        x = np.zeros(size, np.float32)
        idx = rng.choice(common, per_worker, replace=False)
        x[idx] = rng.standard_normal(per_worker).astype(np.float32) \
            * np.float32(10.0 ** rng.integers(-4, 1))
        out.append(x)
    return out


@pytest.mark.slow
def test_a_32_by_32_tree_of_1024_workers_is_bit_exact_under_faults_on_both_levels():
    """The headline run: 1024 workers, 32 golden leaves and a golden root, small sparse
    tensors (index, sketch, fallback: the LHC path, the scale for 1024 workers), 10 % loss,
    duplication and reordering on both levels."""
    rng = fresh_rng()
    tree = make_tree(32, 32, slot_count=16)
    network, layout = configured(tree)
    tensors = sparse_tensors(rng, tree.total_workers, 2000, 120, 40)
    seed = int(rng.integers(1 << 31))
    started = time.perf_counter()
    result, stats = allreduce_tree(tensors, network, layout, path="sketch",
                                   faults=tree_faults(0.1, seed=seed))
    seconds = time.perf_counter() - started
    want, want_stats = lhc.allreduce(tensors, path="sketch")
    assert np.array_equal(result.view(np.uint32), want.view(np.uint32))
    assert stats["lhc"] == want_stats and stats["lhc"].workers == 1024
    levels = stats["tree"].levels
    print(f"1024 workers: {seconds:.1f} s, {stats['tree'].ticks} ticks, "
          f"{stats['packets'].packets_sent} packets, {stats['packets'].resends} resends")
    for name in LEVELS:
        print(name, levels[name].as_dict())
    chunks = sum(stats["packets"].chunks.values())
    assert levels["workers"].first_up == 1024 * chunks
    assert levels["upstream"].first_up == 32 * chunks
    for name in LEVELS:
        assert levels[name].lost and levels[name].duplicated and levels[name].delayed
        assert levels[name].resends_up > 0
    root = counters(stats["tree"], tree.root)
    assert root["accepted"] == 32 * chunks and root["results_multicast"] == chunks
    for board in tree.leaves:
        leaf = counters(stats["tree"], board)
        assert leaf["upstream_sent"] == leaf["results_upstream"] == chunks
        assert leaf["accepted"] == 32 * chunks and leaf["results_multicast"] == 0


@pytest.mark.parametrize("path", ["auto", "sketch", "dense"])
def test_a_small_tree_under_faults_is_the_flat_all_reduce_bit_for_bit(path):
    rng = fresh_rng()
    tree = make_tree(4, 8, slot_count=4)
    network, layout = configured(tree)
    tensors = sparse_tensors(rng, 32, 1500, 200, 30)
    result, stats = allreduce_tree(tensors, network, layout, path=path,
                                   faults=tree_faults(0.1, seed=int(rng.integers(1 << 31))),
                                   max_ticks=200_000)
    want, want_stats = lhc.allreduce(tensors, path=path)
    assert np.array_equal(result.view(np.uint32), want.view(np.uint32))
    assert stats["lhc"] == want_stats
    tree_stats = stats["tree"]
    assert tree_stats.levels["upstream"].resends_up > 0 < tree_stats.packets.resends
    # the faults' own counts, per level
    assert all(tree_stats.levels[name].lost > 0 for name in LEVELS)


def test_without_faults_every_level_carries_each_chunk_once():
    rng = fresh_rng()
    tree = make_tree(3, [2, 3, 4], slot_count=2)
    vectors = random_vectors(rng, 9, 64 * 5 + 3)
    stats, _ = run_add(tree, vectors)
    chunks = 6
    workers, upstream = stats.levels["workers"], stats.levels["upstream"]
    assert (workers.first_up, workers.resends_up, workers.datagrams_down,
            workers.multicast_down, workers.unicast_down) == (9 * chunks, 0, 9 * chunks,
                                                              9 * chunks, 0)
    assert (upstream.first_up, upstream.resends_up, upstream.datagrams_down,
            upstream.multicast_down) == (3 * chunks, 0, 3 * chunks, 3 * chunks)
    assert workers.delivered == 18 * chunks and upstream.delivered == 6 * chunks
    assert stats.packets.resends == 0 and stats.packets.results_accepted == 9 * chunks
    assert counters(stats, make_tree(3, 1).root)["results_multicast"] == chunks


def test_result_groups_at_the_leaf_level():
    rng = fresh_rng()
    tree = make_tree(2, 3, groups=["239.9.0.1:5000", None])
    vectors = random_vectors(rng, 6, 64 * 3)
    stats, network = run_add(tree, vectors)
    workers = stats.levels["workers"]
    # leaf 0 sends each result once, to its group; leaf 1 once per worker
    assert workers.group_down == 3 and workers.datagrams_down == 3 + 3 * 3
    assert counters(stats, tree.leaves[0], "net")["switch_group_out"] == 3
    assert counters(stats, tree.leaves[1], "net")["switch_group_out"] == 0


def test_the_faults_keep_the_trees_rule_or_refuse():
    with pytest.raises(ValueError, match="below two worker-link latencies"):
        TreeFaults(workers=TickFaults(latency=2), upstream=TickFaults(reorder=0.1, max_delay=4))
    TreeFaults(workers=TickFaults(latency=2), upstream=TickFaults(reorder=0.1, max_delay=3))
    faults = tree_faults(0.1)
    assert faults.upstream.max_delay < 2 * faults.workers.latency


def test_several_tree_jobs_at_once_share_the_boards():
    rng = fresh_rng()
    tree = make_tree(2, 3)
    network = TreeNetwork.golden(tree, slots=16, lanes=64, jobs=4)
    switch = TreeSwitch(network, tree.root, tree.leaves, 3, faults=tree_faults(0.05, seed=3),
                        max_ticks=50_000)
    sets = [sparse_tensors(rng, 6, size, 50, 10) for size in (700, 64, 3000)]
    runs = switch.allreduce_jobs(sets, path="auto")
    for tensors, (result, flat) in zip(sets, runs):
        want, _ = lhc.allreduce(tensors, path="auto")
        assert np.array_equal(result.view(np.uint32), want.view(np.uint32))
        assert {"union_nnz", "peeled", "unpeeled", "packets_sent", "resends",
                "results_unicast", "upstream_first_up", "workers_resends_up"} <= set(flat)
    configs = [network.boards[tree.root].aggregator.job_config(j) for j in range(3)]
    assert [(c.slot_base, c.slot_count) for c in configs] == [(0, 6), (6, 5), (11, 5)]


# -- targeted: one datagram at a time ---------------------------------------------------

def header_of(payload):
    from contract.header import Header
    return Header.parse(payload)


class Script:
    """A ``TreeFaults.script`` that applies ``rule(hop, src, dst, header, payload, now,
    copies)`` and records what it did."""

    def __init__(self, rule):
        self.rule, self.hits = rule, 0

    def __call__(self, hop, datagram, now, copies):
        src, dst, payload = datagram
        if len(payload) < HEADER_BYTES:
            return copies
        out = self.rule(hop, src, dst, header_of(payload), payload, now, copies)
        if out is not copies:
            self.hits += 1
        return out


def scripted(rule):
    script = Script(rule)
    return TreeFaults(script=script), script


TARGET_TREE = dict(leaves=2, workers=3, slot_count=2)
SIZE = 64 * 6          # 6 chunks on 2 slots: three rounds per slot


def test_a_lost_upstream_packet_is_recovered_by_the_workers_timeouts():
    lost = []

    def rule(hop, src, dst, h, payload, now, copies):
        if hop == "upstream_up" and h.seq == 0 and src[0] == "10.0.1.1" and not lost:
            lost.append(now)
            return []
        return copies

    faults, script = scripted(rule)
    tree = make_tree(**TARGET_TREE)
    stats, _ = run_add(tree, random_vectors(fresh_rng(), 6, SIZE), faults=faults)
    assert script.hits == 1
    leaf = counters(stats, tree.leaves[0])
    # leaf 0's workers timed out, their resends sent the pending aggregate up again
    assert stats.packets.resends >= 3 and leaf["upstream_resent"] >= 1
    assert leaf["upstream_sent"] == leaf["results_upstream"] == 6
    # (leaf 1's workers timed out too: the root's round waited for leaf 0)
    assert stats.levels["upstream"].resends_up == sum(
        counters(stats, board)["upstream_resent"] for board in tree.leaves)
    assert counters(stats, tree.root)["accepted"] == 12


def test_a_lost_parent_result_is_answered_again_by_the_root():
    def rule(hop, src, dst, h, payload, now, copies):
        if hop == "upstream_down" and h.seq == 0 and dst[0] == "10.0.1.2" \
                and h.worker == 0xFF:
            return []
        return copies

    faults, script = scripted(rule)
    tree = make_tree(**TARGET_TREE)
    stats, _ = run_add(tree, random_vectors(fresh_rng(), 6, SIZE), faults=faults)
    assert script.hits == 1
    leaf, root = counters(stats, tree.leaves[1]), counters(stats, tree.root)
    assert leaf["upstream_resent"] >= 1 and root["results_unicast"] >= 1
    assert leaf["results_upstream"] == 6 and stats.levels["upstream"].unicast_down >= 1


def test_a_duplicated_parent_result_is_dropped_as_a_duplicate():
    def rule(hop, src, dst, h, payload, now, copies):
        if hop == "upstream_down" and h.seq == 1 and dst[0] == "10.0.1.1":
            return copies + [(now + 3, copies[0][1])]
        return copies

    faults, script = scripted(rule)
    tree = make_tree(**TARGET_TREE)
    stats, _ = run_add(tree, random_vectors(fresh_rng(), 6, SIZE), faults=faults)
    assert script.hits == 1
    leaf = counters(stats, tree.leaves[0])
    assert leaf["drop_result_duplicate"] == 1 and leaf["results_upstream"] == 6
    assert leaf["drop_result_unexpected"] == 0
    assert counters(stats, tree.leaves[1])["drop_result_duplicate"] == 0


def _stale_rule(when, seen=None):
    """Keep the root's result of chunk 0 for leaf 0 and put a copy of it on the wire again
    when ``when(hop, src, h)`` says (at the same tick, after the datagram that says so)."""
    kept = {}

    def rule(hop, src, dst, h, payload, now, copies):
        if hop == "upstream_down" and h.seq == 0 and dst[0] == "10.0.1.1" and copies:
            kept["copy"] = copies[0][1]
        if "copy" in kept and not kept.get("used") and when(hop, src, h):
            kept["used"] = now
            return copies + [(copies[0][0], kept["copy"])]
        return copies

    return rule, kept


def test_a_stale_result_of_the_slots_previous_round_is_a_duplicate():
    """Chunk 0's result arrives again while leaf 0 waits for chunk 2 (the same slot, the
    other version): it names (slot 0, version 0), which is final."""
    rule, kept = _stale_rule(lambda hop, src, h: hop == "upstream_up"
                             and src[0] == "10.0.1.1" and h.seq == 2)
    tree = make_tree(**TARGET_TREE)
    stats, _ = run_add(tree, random_vectors(fresh_rng(), 6, SIZE),
                       faults=TreeFaults(script=Script(rule)))
    assert kept.get("used")
    leaf = counters(stats, tree.leaves[0])
    assert leaf["drop_result_duplicate"] == 1 and leaf["drop_result_unexpected"] == 0


def test_a_stale_result_while_the_version_fills_again_is_unexpected():
    """Chunk 0's result arrives again once leaf 0 has taken the first packet of chunk 4
    (slot 0, version 0 again, incomplete): neither pending nor final."""
    rule, kept = _stale_rule(lambda hop, src, h: hop == "worker_up" and h.seq == 4
                             and h.worker == 0 and h.job == 0
                             and src[0].startswith("10.64.0."))
    tree = make_tree(**TARGET_TREE)
    stats, _ = run_add(tree, random_vectors(fresh_rng(), 6, SIZE),
                       faults=TreeFaults(script=Script(rule)))
    assert kept.get("used")
    leaf = counters(stats, tree.leaves[0])
    assert leaf["drop_result_unexpected"] == 1 and leaf["drop_result_duplicate"] == 0


def test_a_result_two_rounds_late_breaks_the_networks_rule_and_the_run_says_so():
    """Chunk 0's result arriving while leaf 0 waits, pending, for chunk 4's (the same slot
    and version, two rounds on) would be taken for it: the engine does not compare the
    result's seq (reported; tests/host/golden/test_aggregator_tree.py). The network's rule
    forbids it; the run stops with an error that names it instead of a wrong sum."""
    rule, kept = _stale_rule(lambda hop, src, h: hop == "upstream_up"
                             and src[0] == "10.0.1.1" and h.seq == 4)
    tree = make_tree(**TARGET_TREE)
    with pytest.raises(ProtocolError, match="two rounds late"):
        run_add(tree, random_vectors(fresh_rng(), 6, SIZE),
                faults=TreeFaults(script=Script(rule)))
    assert kept.get("used")


def _forged(change):
    """Put a forged copy of the root's first result to leaf 0 on the wire beside it."""
    def rule(hop, src, dst, h, payload, now, copies):
        if hop == "upstream_down" and h.seq == 0 and dst[0] == "10.0.1.1" and copies:
            forged_src, forged_payload = change(src, bytearray(payload))
            return copies + [(copies[0][0], (forged_src, dst, bytes(forged_payload)))]
        return copies
    return rule


@pytest.mark.parametrize("what, change", [
    ("another host", lambda src, p: (("10.0.0.9", src[1]), p)),
    ("the root's address, another port", lambda src, p: ((src[0], src[1] + 1), p)),
    ("the root, another job", lambda src, p: (src, p[:_JOB] + bytes([1]) + p[_JOB + 1:])),
    ("a leaf, its own job number", lambda src, p: (("10.0.1.2", src[1]), p)),
])
def test_a_result_from_a_wrong_source_or_job_is_dropped_by_the_front_end(what, change):
    script = Script(_forged(change))
    tree = make_tree(**TARGET_TREE)
    stats, _ = run_add(tree, random_vectors(fresh_rng(), 6, SIZE),
                       faults=TreeFaults(script=script))
    assert script.hits == 1
    net, leaf = counters(stats, tree.leaves[0], "net"), counters(stats, tree.leaves[0])
    assert net["drop_result_source"] == 1, what
    assert leaf["drop_result_duplicate"] == leaf["drop_result_unexpected"] == 0


def test_a_result_for_a_slot_neither_pending_nor_final_is_unexpected():
    """A well-sourced result for slot 1 version 1 before anything used it."""
    def rule(hop, src, dst, h, payload, now, copies):
        if hop == "upstream_down" and h.seq == 0 and dst[0] == "10.0.1.1" and copies:
            from contract.header import Header
            forged = Header.parse(payload).replace(slot=1, slot_version=1, seq=99).pack() \
                + payload[HEADER_BYTES:]
            return copies + [(copies[0][0], (src, dst, forged))]
        return copies

    script = Script(rule)
    tree = make_tree(**TARGET_TREE)
    stats, _ = run_add(tree, random_vectors(fresh_rng(), 6, SIZE),
                       faults=TreeFaults(script=script))
    assert script.hits == 1
    leaf = counters(stats, tree.leaves[0])
    assert leaf["drop_result_unexpected"] == 1
    assert counters(stats, tree.leaves[0], "net")["drop_result_source"] == 0


def test_a_result_to_the_root_which_has_no_upstream_is_dropped_by_its_front_end():
    def rule(hop, src, dst, h, payload, now, copies):
        if hop == "upstream_up" and h.seq == 0 and src[0] == "10.0.1.1" and copies:
            forged = bytearray(payload)
            forged[_FLAGS] |= Flags.RESULT
            return copies + [(copies[0][0], (src, dst, bytes(forged)))]
        return copies

    script = Script(rule)
    tree = make_tree(**TARGET_TREE)
    stats, _ = run_add(tree, random_vectors(fresh_rng(), 6, SIZE),
                       faults=TreeFaults(script=script))
    assert script.hits == 1
    assert counters(stats, tree.root, "net")["drop_result_source"] == 1
