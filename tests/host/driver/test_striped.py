"""One job over several boards (``docs/protocol/network.md`` section 3): the chunk striping of
``host.switchml.stripe`` and :class:`~host.driver.striped.StripedSwitchWorker` against
golden virtual boards on 127.0.0.1, bit for bit what one board gives (vector and exponent),
with vectors shorter than one chunk per board and lengths that are not a multiple of the
boards' chunks. The workers run in threads of this process (each with its own sockets, as
separate processes would); every wait is bounded by the workers' timeout."""
import contextlib

import numpy as np
import pytest

from contract.header import PacketType
from host.board import VirtualBoard, WireFaults
from host.driver.striped import StripedSwitchWorker, check_layouts
from host.driver.udp_worker import JobLayout, UdpSwitchWorker, configure_job
from host.switchml import stripe
from tests.helpers import fresh_rng
from tests.host.driver.test_udp_worker import FAST, SLOTS, _in_threads, _messages, _workers

LANES = 64
#: around one chunk, around B chunks (fewer than B: some boards get nothing), not a multiple
#: of B chunks, past the slot window of every board, and one message far larger
SIZES = [0, 1, 63, 64, 65, 2 * LANES + 1, 3 * LANES, 5 * LANES - 7, SLOTS * LANES + 1, 5000]


@pytest.mark.parametrize("boards", [1, 2, 3, 5])
@pytest.mark.parametrize("size", [0, 1, 63, 64, 65, 129, 191, 192, 193, 640, 641, 5000])
def test_split_and_join_are_inverse_and_follow_the_chunk_rule(boards, size):
    words = np.arange(size, dtype=np.uint32) + 1
    parts = stripe.split(words, LANES, boards)
    assert len(parts) == boards
    assert [-(-p.size // LANES) for p in parts] == stripe.board_chunks(size, LANES, boards)
    for b, part in enumerate(parts):
        # board b holds chunks b, b + B, ... in order, as its chunks 0, 1, ...
        chunks = range(b, -(-size // LANES), boards)
        want = np.concatenate([words[c * LANES:(c + 1) * LANES] for c in chunks]) \
            if len(chunks) else words[:0]
        np.testing.assert_array_equal(part, want)
    np.testing.assert_array_equal(stripe.join(parts, size, LANES), words)


def test_join_refuses_a_part_that_is_too_short():
    parts = stripe.split(np.arange(300, dtype=np.uint32), LANES, 2)
    with pytest.raises(ValueError, match="board 1's part holds"):
        stripe.join([parts[0], parts[1][:-1]], 300, LANES)
    with pytest.raises(ValueError, match="boards must be a positive integer"):
        stripe.split(np.arange(3, dtype=np.uint32), LANES, 0)


@contextlib.contextmanager
def _boards(count, slots=SLOTS, faults=None):
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(VirtualBoard("golden", port_base=None, slots=slots,
                                                lanes=LANES, faults=faults))
               for _ in range(count)]


def _striped(boards, n, job=0, **options):
    """``n`` striped workers of ``job`` over ``boards`` (configured on each board)."""
    per_board = [_workers(board, n, job=job, **options) for board in boards]
    workers = []
    for w in range(n):
        striped = StripedSwitchWorker([ws[w] for ws, _ in per_board])
        striped.set_layout([layout for _, layout in per_board])
        workers.append(striped)
    return workers


def _one_board(messages, n):
    """The golden one-board results of ``messages`` (per worker)."""
    with _boards(1) as (board,):
        workers, _ = _workers(board, n)
        try:
            return _in_threads(workers, messages)
        finally:
            for w in workers:
                w.close()


@pytest.mark.parametrize("count", [2, 3])
def test_striped_workers_give_the_one_board_result_bit_for_bit(count):
    rng = fresh_rng()
    n = 3
    messages, expected = _messages(rng, n, SIZES)
    reference = _one_board(messages, n)
    with _boards(count) as boards:
        workers = _striped(boards, n)
        try:
            results = _in_threads(workers, messages)
            for worker_results, one_board in zip(results, reference):
                for (vector, exponent), (want, want_exponent), (total, e_max) in zip(
                        worker_results, one_board, expected):
                    assert vector.dtype == np.uint32 and vector.size == want.size
                    np.testing.assert_array_equal(vector.view(np.uint32), want)
                    np.testing.assert_array_equal(vector, total)
                    assert exponent == want_exponent == e_max
            # every board aggregated exactly its chunks, and its chunk numbers count on
            # over the messages (so its versions keep alternating) the same on every worker
            shares = np.sum([stripe.board_chunks(size, LANES, count) for size in SIZES],
                            axis=0) * 2          # an OR and an ADD message per size
            for worker in workers:
                assert [s.packets for s in worker.board_stats] == list(shares)
                assert [w.next_chunk for w in worker.workers] == list(shares)
                assert worker.stats.packets == sum(shares) == worker.stats.results
                assert worker.stats.messages == 2 * len(SIZES)
            for board, share in zip(boards, shares):
                counters = board.backend.aggregator.counters
                assert counters["accepted"] == n * share
                assert counters["drop_bad_worker"] == counters["drop_bad_slot"] == 0
        finally:
            for w in workers:
                w.close()


def test_a_lossy_board_among_others_still_gives_the_exact_result():
    rng = fresh_rng()
    n = 2
    messages, expected = _messages(rng, n, [1, 130, 5000])
    faults = WireFaults(0.1, seed=7, max_delay=0.002)
    with _boards(1) as (clean,), _boards(1, faults=faults) as (lossy,):
        workers = _striped([clean, lossy], n)
        try:
            results = _in_threads(workers, messages)
            for worker_results in results:
                for (vector, exponent), (total, e_max) in zip(worker_results, expected):
                    np.testing.assert_array_equal(vector, total)
                    assert exponent == e_max
            assert faults.stats()["lost"] > 0
            assert sum(w.board_stats[1].resends for w in workers) > 0
        finally:
            for w in workers:
                w.close()


def test_boards_that_disagree_on_slots_or_lanes_are_a_clear_error():
    a = JobLayout(job=0, workers=2, slot_base=0, slot_count=8, lanes=64)
    assert check_layouts([a, a]) == (64, 8)
    for field, value in (("slot_count", 4), ("lanes", 32), ("workers", 3), ("job", 1)):
        other = JobLayout(**{**a.as_dict(), field: value})
        with pytest.raises(ValueError, match=f"must agree on {field}: board 0 has .*, "
                                             f"board 1 has {value}"):
            check_layouts([a, other])
    with _boards(1, slots=8) as (small,), _boards(1, slots=16) as (large,):
        per_board = [_workers(board, 1) for board in (small, large)]
        striped = StripedSwitchWorker([ws[0] for ws, _ in per_board])
        try:
            with pytest.raises(ValueError, match="must agree on slot_count: board 0 has 8, "
                                                 "board 1 has 16"):
                striped.set_layout([layout for _, layout in per_board])
            with pytest.raises(RuntimeError, match="set_layout"):
                striped.aggregate(np.zeros(3, np.uint32), PacketType.AGG_OR32)
        finally:
            striped.close()
    with pytest.raises(ValueError, match="same job and worker"):
        StripedSwitchWorker([UdpSwitchWorker(worker=0, **FAST), UdpSwitchWorker(worker=1, **FAST)])
