"""UdpSwitchWorker (host/driver/udp_worker.py): one worker per socket, as a training process
runs it, against the virtual board on 127.0.0.1. The workers run in threads of this process
here (each with its own socket, as separate processes would); loss, duplication and
reordering on the board's wire; a job that never completes; a board that is gone. Every
wait is bounded by the worker's timeout."""
import socket
import time

import numpy as np
import pytest

from contract.header import Header, PacketType
from contract.network import MAX_WORKERS_IN_TABLE, NET_REGISTERS, network_address
from host.board import VirtualBoard, WireFaults, free_port_base
from host.driver.transport import TransportError
from host.driver.transport import NoReplyError
from host.driver.udp import UdpTransport
from host.driver.udp_worker import JobLayout, UdpSwitchWorker, configure_job
from tests.helpers import fresh_rng, in_threads

SLOTS = 8
FAST = dict(rto=0.05, min_rto=0.01, max_rto=0.2)


@pytest.fixture
def board():
    with VirtualBoard("golden", port_base=None, slots=SLOTS, lanes=64) as b:
        yield b


def _workers(board, n, job=0, slot_base=0, slot_count=None, **options):
    workers = [UdpSwitchWorker(board.host, port_base=board.port_base, job=job, worker=w,
                               **{**FAST, **options}) for w in range(n)]
    with board.transport(region="switch") as control:
        layout = configure_job(control, job, [w.address for w in workers],
                               slot_base=slot_base, slot_count=slot_count)
    for w in workers:
        w.set_layout(layout)
    return workers, layout


def _in_threads(workers, messages):
    """Each worker aggregates its own list of ``(words, op, exponent)`` in a thread of its
    own; returns every worker's results (or raises the first worker's error)."""
    def run(w):
        return [workers[w].aggregate(words, op, exponent=e, name=f"message {i}")
                for i, (words, op, e) in enumerate(messages[w])]
    return in_threads([lambda w=w: run(w) for w in range(len(workers))])


def _messages(rng, n_workers, sizes):
    """Per worker, one OR and one ADD message of every size (random words, the full 32 bits,
    so ADD wraps), and a random exponent per message."""
    per_worker = [[] for _ in range(n_workers)]
    expected = []
    for size in sizes:
        for op in (PacketType.AGG_OR32, PacketType.AGG_ADD_I32):
            vectors = [rng.integers(0, 2**32, size, dtype=np.uint64).astype(np.uint32)
                       for _ in range(n_workers)]
            exponents = [int(e) for e in rng.integers(-128, 128, n_workers)]
            if op == PacketType.AGG_OR32:
                total = np.bitwise_or.reduce(np.stack(vectors), axis=0) if size else vectors[0]
            else:
                total = (np.stack(vectors).astype(np.uint64).sum(axis=0) % 2**32).astype(np.uint32)
            expected.append((total, max(exponents) if size else None))
            for w in range(n_workers):
                per_worker[w].append((vectors[w], op, exponents[w]))
    return per_worker, expected


def _check(results, expected):
    for worker_results in results:
        assert len(worker_results) == len(expected)
        for (vector, exponent), (total, e_max) in zip(worker_results, expected):
            assert vector.dtype == np.uint32
            np.testing.assert_array_equal(vector, total)
            assert exponent == e_max


def test_workers_on_their_own_sockets_aggregate_exactly(board):
    rng = fresh_rng()
    workers, layout = _workers(board, 3)
    assert layout == JobLayout(job=0, workers=3, slot_base=0, slot_count=SLOTS, lanes=64)
    # Sizes around a packet (64 lanes) and around the slot window (8 slots of 64), and one
    # message far larger than the window: versions alternate many times, across messages.
    messages, expected = _messages(rng, 3, [0, 1, 63, 64, 65, SLOTS * 64 + 1, 5000])
    try:
        _check(_in_threads(workers, messages), expected)
        for w in workers:
            chunks = sum(-(-size // 64) for size in [0, 1, 63, 64, 65, SLOTS * 64 + 1, 5000]) * 2
            assert w.stats.packets == chunks == w.stats.results
            assert w.stats.messages == 14 and w.next_chunk == chunks
            assert w.stats.bytes_out >= chunks * (32 + 256)
        counters = board.backend.aggregator.counters
        assert counters["accepted"] == 3 * chunks
        assert counters["drop_bad_slot"] == counters["drop_bad_worker"] == 0
    finally:
        for w in workers:
            w.close()


@pytest.mark.parametrize("rate", [0.1, 0.3])
def test_loss_duplication_and_reordering_leave_the_results_exact(rate):
    rng = fresh_rng()
    faults = WireFaults(rate, seed=int(rng.integers(1 << 31)), max_delay=0.01)
    with VirtualBoard("golden", port_base=None, slots=SLOTS, faults=faults) as board:
        workers, _ = _workers(board, 4, timeout=20)
        # (30 %: fewer values, every round takes several resends)
        messages, expected = _messages(rng, 4, [1, 700, 3000] if rate < 0.2 else [1, 700])
        try:
            _check(_in_threads(workers, messages), expected)
            resends = sum(w.stats.resends for w in workers)
            assert resends > 0 and faults.stats()["lost"] > 0
            # however often a packet went, each took exactly one result
            for w in workers:
                assert w.stats.results == w.stats.packets > 0
            # Lost multicast copies come back as unicast answers to the resends.
            assert sum(w.stats.unicast for w in workers) > 0
            assert sum(w.stats.discarded for w in workers) > 0
        finally:
            for w in workers:
                w.close()


def test_a_round_that_never_completes_is_a_clear_error_within_the_timeout(board):
    workers, _ = _workers(board, 2, timeout=0.6)
    try:
        started = time.monotonic()
        with pytest.raises(NoReplyError, match=r"within 0.6 s: is the board running, is job 0 "
                                               r"configured .* do all 2 workers"):
            workers[0].aggregate(np.arange(200, dtype=np.uint32), PacketType.AGG_ADD_I32)
        assert time.monotonic() - started < 3.0
        # It resent while it waited (the switch dropped those: the round is incomplete).
        assert workers[0].stats.resends > 0
        assert board.backend.aggregator.counters["retransmit_dropped"] > 0
    finally:
        for w in workers:
            w.close()


def test_a_board_that_is_gone_is_a_clear_error_within_the_timeout():
    base = free_port_base()
    worker = UdpSwitchWorker("127.0.0.1", port_base=base, timeout=0.5, **FAST)
    worker.set_layout(JobLayout(job=0, workers=1, slot_base=0, slot_count=4, lanes=64))
    try:
        started = time.monotonic()
        with pytest.raises(NoReplyError, match=f"127.0.0.1:{base + 2}"):
            worker.aggregate(np.ones(10, np.uint32), PacketType.AGG_OR32)
        assert time.monotonic() - started < 3.0
    finally:
        worker.close()


def test_datagrams_from_elsewhere_and_stale_results_are_ignored(board):
    rng = fresh_rng()
    workers, _ = _workers(board, 2)
    intruder = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        # Something that looks like a result, from another port: ignored.
        fake = Header(type=PacketType.AGG_ADD_I32, flags=2, worker=0xFF, count=64).pack()
        for w in workers:
            intruder.sendto(fake + bytes(256), w.address)
        messages, expected = _messages(rng, 2, [100])
        _check(_in_threads(workers, messages), expected)
        assert all(w.stats.foreign >= 1 for w in workers)
    finally:
        intruder.close()
        for w in workers:
            w.close()


def test_only_the_workers_own_socket_may_contribute(board):
    """The worker table decides: a second socket sending as worker 0 is dropped by the
    board (drop_bad_source), and the round completes with the real workers' values."""
    workers, layout = _workers(board, 2)
    impostor = UdpSwitchWorker(board.host, port_base=board.port_base, job=0, worker=1, **FAST)
    impostor.set_layout(layout)
    impostor.timeout = 0.3
    try:
        with pytest.raises(NoReplyError):
            impostor.aggregate(np.full(64, 1000, np.uint32), PacketType.AGG_ADD_I32)
        assert board.backend.counters["drop_bad_source"] >= 1
        messages = [[(np.full(64, w + 1, np.uint32), PacketType.AGG_ADD_I32, 0)]
                    for w in range(2)]
        results = _in_threads(workers, messages)
        np.testing.assert_array_equal(results[0][0][0], np.full(64, 3, np.uint32))
    finally:
        impostor.close()
        for w in workers:
            w.close()


def test_configure_job_writes_the_worker_table_and_checks_the_slots(board):
    addresses = [("127.0.0.1", 40000 + w) for w in range(3)]
    with board.transport(region="switch") as control:
        layout = configure_job(control, 1, addresses, slot_base=2, slot_count=3)
        assert layout == JobLayout(job=1, workers=3, slot_base=2, slot_count=3, lanes=64)
        table = NET_REGISTERS["worker"]
        ports = control.read_many([network_address("net", table.address(MAX_WORKERS_IN_TABLE + w,
                                                                        "port"))
                                   for w in range(3)], full=True)
        assert ports == [40000, 40001, 40002]
        with pytest.raises(ValueError, match="not inside the board's switch pool of 8"):
            configure_job(control, 2, addresses, slot_base=6, slot_count=3)
        with pytest.raises(ValueError, match="workers must be an integer in 1..32"):
            configure_job(control, 2, [])
    with UdpTransport(board.host, port_base=board.port_base, key=board.key ^ 1,
                      region="switch", timeout=0.05, max_timeout=0.1, retries=2) as wrong:
        with pytest.raises(NoReplyError, match="control key"):
            configure_job(wrong, 0, addresses)


def test_arguments_are_checked(board):
    with pytest.raises(ValueError, match="worker must be an integer in 0..31"):
        UdpSwitchWorker(board.host, port_base=board.port_base, worker=32)
    worker = UdpSwitchWorker(board.host, port_base=board.port_base, worker=1)
    try:
        with pytest.raises(RuntimeError, match="set_layout"):
            worker.aggregate(np.ones(3, np.uint32), PacketType.AGG_OR32)
        with pytest.raises(ValueError, match="is not a worker of"):
            worker.set_layout(JobLayout(job=0, workers=1, slot_base=0, slot_count=4, lanes=64))
        worker.set_layout(JobLayout(job=0, workers=2, slot_base=0, slot_count=4, lanes=64))
        with pytest.raises(TypeError, match="32-bit integer words"):
            worker.aggregate(np.ones(3, np.float64), PacketType.AGG_OR32)
        with pytest.raises(ValueError, match="op must be"):
            worker.aggregate(np.ones(3, np.uint32), PacketType.RAW_F32)
    finally:
        worker.close()
    with pytest.raises(TransportError, match="closed"):
        worker.aggregate(np.ones(3, np.uint32), PacketType.AGG_OR32)
