"""An authenticated tree of aggregators over UDP on 127.0.0.1 (``network.md`` section 7 and
``aggregator-protocol.md`` section 4): three virtual golden boards with 128-bit keys of their
own, the root's job and each leaf's job under one epoch, each leaf holding the root job's
key as its upstream key (written wrapped: never in clear on the wire, reads 0). Aggregates
go up and results come down under the root job's tags, each leaf's workers get its own
job's; a parent's result forged or changed on the way is dropped (``drop_bad_tag``) and
recovered, bit-exact. Every wait is bounded (the workers' timeouts, ``in_threads``)."""
import numpy as np
import pytest

from contract.header import HEADER_BYTES, Flags, PacketType
from contract.network import network_address
from contract.registers import AUTH_REGISTERS
from host.board import VirtualBoard
from host.driver.transport import TransportError
from host.driver.udp import UdpTransport
from host.driver.udp_worker import UdpSwitchWorker, job_key_for, write_upstream_key
from host.golden.ctrl_auth import key_fragments
from host.golden.siphash import check_tag
from host.switchml.tree import BoardAddress, Tree, configure_tree_over_udp
from tests.helpers import Wire, in_threads

FAST = dict(rto=0.05, min_rto=0.01, max_rto=0.2, timeout=30)
KEYS = [bytes.fromhex(k) for k in ("00112233445566778899aabbccddeeff",
                                   "0f1e2d3c4b5a69788796a5b4c3d2e1f0",
                                   "a1b2c3d4e5f60718293a4b5c6d7e8f90")]
WORD0 = network_address("net", AUTH_REGISTERS["upstream_key"].address(1, "word0"))


def run_tree(change_root_result=None, epoch=11, seed=1):
    """Root and two leaves of two workers each, authenticated under ``epoch``; one
    message; ``change_root_result`` may change the root's datagrams on their way. The
    boards, workers' stats and the layout."""
    with VirtualBoard("golden", port_base=None, key=KEYS[0], slots=8) as root, \
            VirtualBoard("golden", port_base=None, key=KEYS[1], slots=8) as leaf0, \
            VirtualBoard("golden", port_base=None, key=KEYS[2], slots=8) as leaf1:
        boards = (root, leaf0, leaf1)
        for b in boards:
            b.wire = Wire(b.backend)
        root.wire.outbound = change_root_result
        tree = Tree(BoardAddress(root.host, root.port_base),
                    [BoardAddress(b.host, b.port_base) for b in (leaf0, leaf1)], 2,
                    root_job=2, leaf_job=1, slot_count=4)
        keys = {str(address): key for address, key in zip(tree.boards, KEYS)}
        workers = []
        for rank in range(4):
            plan = tree.worker(rank)
            workers.append(UdpSwitchWorker(plan.board.host, port_base=plan.board.port_base,
                                           job=plan.job, worker=plan.worker, **FAST))
        try:
            layout = configure_tree_over_udp(tree, keys, [w.address for w in workers],
                                             epoch=epoch)
            for rank, worker in enumerate(workers):
                plan, leaf_layout = layout.worker_layout(rank)
                worker.set_layout(leaf_layout, job_key=layout.leaf_job_key(plan.leaf, keys))
            rng = np.random.default_rng(seed)
            vectors = [rng.integers(0, 2**32, 64 * 12, dtype=np.uint64).astype(np.uint32)
                       for _ in workers]
            results = in_threads([lambda w=w, v=v: w.aggregate(v, PacketType.AGG_ADD_I32)[0]
                                  for w, v in zip(workers, vectors)], timeout=60)
            total = (np.stack(vectors).astype(np.uint64).sum(axis=0) % 2**32).astype(np.uint32)
            for got in results:
                assert np.array_equal(got, total)
            return boards, [w.stats for w in workers], layout, keys
        finally:
            for w in workers:
                w.close()


def test_an_authenticated_tree_is_exact_with_the_right_tags_on_each_level():
    (root, leaf0, leaf1), stats, layout, keys = run_tree()
    root_key = job_key_for(KEYS[0], layout.root)
    leaf_keys = [layout.leaf_job_key(i, keys) for i in range(2)]
    assert len({root_key, *leaf_keys}) == 3
    for leaf, key in zip((leaf0, leaf1), leaf_keys):
        agg = [p for p in leaf.wire.seen if len(p) >= HEADER_BYTES
               and p[2] == PacketType.AGG_ADD_I32]
        # what the leaf's workers send and get: the leaf's job key; what goes up and
        # comes down: the root job's
        ups = [p for p in agg if p[5] == 2]
        own = [p for p in agg if p[5] == 1]
        assert ups and own
        assert all(check_tag(root_key, p) for p in ups)
        assert all(check_tag(key, p) for p in own)
        assert leaf.backend.counters["drop_bad_tag"] == 0
    assert root.backend.counters["drop_bad_tag"] == root.backend.counters["drop_replay"] == 0
    fragments = [f for key in (*KEYS, root_key, *leaf_keys) for f in key_fragments(key)]
    every = root.wire.seen + leaf0.wire.seen + leaf1.wire.seen
    assert len(every) > 50 and not [p for p in every for f in fragments if f in p]


def test_a_parents_result_changed_on_the_way_is_dropped_and_recovered():
    changed = []

    def flip_first_result(datagram):
        p = datagram.payload
        if (not changed and len(p) > HEADER_BYTES and p[2] == PacketType.AGG_ADD_I32
                and p[3] & Flags.RESULT):
            changed.append(p)
            return datagram._replace(payload=p[:-1] + bytes([p[-1] ^ 1]))
        return datagram

    (root, leaf0, leaf1), stats, _, _ = run_tree(flip_first_result, seed=2)
    assert len(changed) == 1
    assert leaf0.backend.counters["drop_bad_tag"] + leaf1.backend.counters["drop_bad_tag"] == 1
    assert sum(s.resends for s in stats) >= 1


def test_the_upstream_key_is_written_wrapped_and_reads_zero():
    with VirtualBoard("golden", port_base=None, key=KEYS[1]) as board:
        board.wire = Wire(board.backend)
        key = bytes(range(100, 116))
        with UdpTransport("127.0.0.1", port_base=board.port_base, key=KEYS[1],
                          region="switch", timeout=0.1) as control:
            write_upstream_key(control, 1, key)
            assert control.read_many([WORD0], full=True) == [0]
        assert board.backend.job_auth._pending[1]["word0"] == int.from_bytes(key[:4],
                                                                             "little")
        assert not [p for p in board.wire.seen for f in key_fragments(key) + [key[:4]]
                    if f in p]
    with VirtualBoard("golden", port_base=None, key=0x1234) as board:
        with UdpTransport("127.0.0.1", port_base=board.port_base, key=0x1234,
                          region="switch", timeout=0.1) as control:
            with pytest.raises(TransportError, match="128-bit"):
                write_upstream_key(control, 1, key)
            with pytest.raises(ValueError, match="wrapped"):
                control.write_many([(WORD0, 5)], full=True)


def test_a_lost_key_write_is_resent_wrapped_anew_under_its_new_counter():
    """The first request of the key write is lost: the transport's resend carries a new
    counter, so its words are wrapped again under it, and the board unwraps the key."""
    with VirtualBoard("golden", port_base=None, key=KEYS[1]) as board:
        board.wire = Wire(board.backend)
        lost = []

        def lose_first_write(datagram):
            if not lost and datagram.payload[2] == PacketType.CTRL:
                lost.append(datagram.payload)
                return None
            return datagram

        board.wire.inbound = lose_first_write
        key = bytes(range(200, 216))
        with UdpTransport("127.0.0.1", port_base=board.port_base, key=KEYS[1],
                          region="switch", timeout=0.05, min_timeout=0.01,
                          max_timeout=0.2) as control:
            write_upstream_key(control, 3, key)
        writes = [p for p in board.wire.seen if len(p) >= HEADER_BYTES
                  and p[2] == PacketType.CTRL and not p[3] & Flags.RESULT]
        assert len(lost) == 1 and len(writes) == 1
        assert writes[0][HEADER_BYTES + 4:HEADER_BYTES + 8] != \
            lost[0][HEADER_BYTES + 4:HEADER_BYTES + 8]          # wrapped differently
        pending = board.backend.job_auth._pending[3]
        assert b"".join(pending[f"word{i}"].to_bytes(4, "little") for i in range(4)) == key
