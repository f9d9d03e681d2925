"""The golden board's authenticated jobs (``docs/protocol/network.md`` section 7, **Jobs**), as
datagrams in and out without sockets: the job key, tags on a job's datagrams and results,
the per-(job, worker) replay filter, epochs; and each attack dropped, counted and harmless
to the genuine traffic beside it, which stays bit-exact."""
import numpy as np
import pytest

from contract.header import HEADER_BYTES, Flags, Header, PacketType
from contract.network import SERVICE_OFFSETS, Service, network_address
from contract.counters import AGG_COUNTERS
from contract.registers import AUTH_REGISTERS, SWITCH_REGISTERS
from host.board import GoldenBoard
from host.board.backend import Datagram
from host.board.control import BackendControl
from host.driver.udp_worker import configure_job, job_key_for
from host.golden.job_auth import PASSED, REPLAY, JobAuthTable
from host.golden.siphash import REFERENCE_KEY, check_tag, job_key, tag_datagram
from host.switchml.window import make_packets

KEY = bytes.fromhex("8d3a51c2f0e97b46a1d52c3e9f078b64")
WORKERS = [("10.0.0.11", 41000), ("10.0.0.12", 41001)]
SLOTS, LANES = 4, 8
ENABLE = network_address("net", AUTH_REGISTERS["job_auth"].address(0, "enable"))
EPOCH = network_address("net", AUTH_REGISTERS["job_auth"].address(0, "epoch"))


def make_board(epoch=7):
    board = GoldenBoard(KEY, slots=SLOTS, lanes=LANES)
    control = BackendControl(board, region="switch")
    layout = configure_job(control, 0, WORKERS, epoch=epoch)
    return board, control, layout


def chunks(worker, values, key, first_chunk=0):
    """Worker ``worker``'s tagged datagrams of ``values`` (one chunk of LANES words each)."""
    packets = make_packets(values, op=PacketType.AGG_ADD_I32, job=0, worker=worker,
                           slot_base=0, slot_count=SLOTS, lanes=LANES,
                           first_chunk=first_chunk)
    return [tag_datagram(key, p.to_bytes()) if key else p.to_bytes() for p in packets]


def send(board, worker, payload, source=None):
    """``payload`` to the switch port from worker ``worker``'s address (or ``source``):
    the results (``(destination, payload)``)."""
    ip, port = source or WORKERS[worker]
    switch = board.port_base + SERVICE_OFFSETS[Service.SWITCH]
    out = board.deliver([Datagram(ip, port, board.ip, switch, payload)])
    return [((d.dst_ip, d.dst_port), d.payload) for d in out]


def drops(board):
    return {name: board.counters[name] for name in ("drop_bad_tag", "drop_replay",
                                                    "drop_bad_source")}


def engine_counters(board):
    block = SWITCH_REGISTERS["counter"]
    return {name: board.aggregator.read(block.address(name)) for name in AGG_COUNTERS}


def vectors(seed, n_chunks):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 2**32, n_chunks * LANES, dtype=np.uint64).astype(np.uint32)
            for _ in WORKERS]


def run_round(board, key, values, first_chunk=0):
    """Both workers' chunks, interleaved; the board's results by seq (checked tagged)."""
    mine = [chunks(w, values[w], key, first_chunk) for w in range(2)]
    results = {}
    for a, b in zip(*mine):
        for w, payload in ((0, a), (1, b)):
            for _, result in send(board, w, payload):
                assert key is None or check_tag(key, result), \
                    "a result of an authenticated job is tagged"
                results.setdefault(Header.parse(result).seq, result[HEADER_BYTES:])
    return results


def expected(values):
    return ((values[0].astype(np.uint64) + values[1]) % 2**32).astype(np.uint32)


def gathered(results, first_chunk, n_chunks):
    return np.concatenate([np.frombuffer(results[first_chunk + i], dtype="<u4")
                           for i in range(n_chunks)])


# -- the job key and the registers -------------------------------------------------------

def test_the_job_key_is_section_7s_derivation():
    """Two SipHash-2-4 outputs under the control key over "gwjobkey", job, i, epoch, 0, 0:
    computed here from the spec's words with the reference test vectors' key."""
    import struct

    from host.golden.siphash import siphash24
    derived = job_key(REFERENCE_KEY, 3, 0x01020304)
    by_hand = b"".join(siphash24(REFERENCE_KEY, b"gwjobkey" + struct.pack("<BBIxx", 3, i,
                                                                         0x01020304))
                       .to_bytes(8, "little") for i in (0, 1))
    assert derived == by_hand and len(derived) == 16
    assert job_key(REFERENCE_KEY, 3, 1) != derived != job_key(REFERENCE_KEY, 4, 0x01020304)


def test_job_auth_registers_apply_at_the_commit_and_read_back_as_written():
    board, control, layout = make_board(epoch=0xDEADBEEF)
    assert layout.epoch == 0xDEADBEEF
    assert control.read_many([ENABLE, EPOCH], full=True) == [1, 0xDEADBEEF]
    assert board.job_auth.active(0).key == job_key(KEY, 0, 0xDEADBEEF) == \
        job_key_for(KEY, layout)
    # written but not committed: the job keeps its key until the commit
    control.write_many([(EPOCH, 5)], full=True)
    assert board.job_auth.active(0).epoch == 0xDEADBEEF
    configure_job(control, 0, WORKERS)              # again, without authentication
    assert control.read_many([ENABLE, EPOCH], full=True) == [0, 0]
    assert board.job_auth.active(0) is None


def test_a_board_with_a_64_bit_key_refuses_authentication_in_one_line():
    board = GoldenBoard(0x0123456789ABCDEF, slots=SLOTS, lanes=LANES)
    control = BackendControl(board, region="switch")
    from host.driver.transport import TransportError
    with pytest.raises(TransportError, match="does not authenticate job 0"):
        configure_job(control, 0, WORKERS, epoch=1)
    assert board.aggregator.job_config(0) is None           # stopped before the commit
    with pytest.raises(ValueError, match="128-bit"):
        job_key_for(0x0123456789ABCDEF, configure_job(control, 0, WORKERS)
                    .__class__(0, 2, 0, 4, 8, epoch=1))


# -- genuine traffic ---------------------------------------------------------------------

def test_an_authenticated_job_is_exact_with_every_result_tagged():
    board, _, layout = make_board()
    key = job_key_for(KEY, layout)
    values = vectors(1, 3 * SLOTS)
    results = run_round(board, key, values)
    assert np.array_equal(gathered(results, 0, 3 * SLOTS), expected(values))
    assert drops(board) == dict(drop_bad_tag=0, drop_replay=0, drop_bad_source=0)


def test_a_job_without_authentication_beside_it_is_unchanged():
    board, control, _ = make_board()
    configure_job(control, 0, WORKERS)
    values = vectors(2, SLOTS)
    results = run_round(board, None, values)
    assert np.array_equal(gathered(results, 0, SLOTS), expected(values))
    assert not any(check_tag(job_key(KEY, 0, 7), r) for r in results.values())


# -- attacks -----------------------------------------------------------------------------

@pytest.mark.parametrize("forge", ["untagged", "control key", "other job's key",
                                   "payload changed", "tag moved"])
def test_a_forged_datagram_with_a_workers_address_is_dropped_and_counted(forge):
    """Anyone on the LAN can send from worker 0's address and port: without the job key,
    nothing reaches the aggregator, and the round is the genuine workers' sum."""
    board, _, layout = make_board()
    key = job_key_for(KEY, layout)
    values, poison = vectors(3, 1), vectors(4, 1)[0]
    genuine = chunks(0, poison, key)[0]
    forged = {
        "untagged": chunks(0, poison, None)[0],
        "control key": chunks(0, poison, KEY)[0],
        "other job's key": chunks(0, poison, job_key(KEY, 1, 7))[0],
        "payload changed": genuine[:-1] + bytes([genuine[-1] ^ 1]),
        "tag moved": genuine[:16] + genuine[24:32] + genuine[16:24] + genuine[32:],
    }[forge]
    engine = engine_counters(board)                 # the aggregator sees nothing of it
    assert send(board, 0, forged) == []
    assert drops(board) == dict(drop_bad_tag=1, drop_replay=0, drop_bad_source=0)
    assert engine_counters(board) == engine
    results = run_round(board, key, values)
    assert np.array_equal(gathered(results, 0, 1), expected(values))


def test_an_earlier_rounds_datagram_replayed_into_its_slot_and_version_is_dropped():
    """Chunk c and chunk c + 2S share (slot, version): worker 0's captured chunk c, sent
    again while the round of c + 2S waits, would be taken as its contribution. The replay
    filter drops it (seq c is below c + S, the last that passed for slot 0 from worker
    0)."""
    board, _, layout = make_board()
    key = job_key_for(KEY, layout)
    first, second = vectors(5, 2 * SLOTS), vectors(6, SLOTS)
    captured = chunks(0, first[0], key)[0]                  # chunk 0: slot 0, version 0
    results = run_round(board, key, first)                  # chunks 0 .. 2S-1
    assert np.array_equal(gathered(results, 0, 2 * SLOTS), expected(first))
    # the round of chunk 2S (slot 0, version 0 again): worker 1 has sent; worker 0 not yet
    later = [chunks(w, second[w], key, first_chunk=2 * SLOTS) for w in range(2)]
    assert send(board, 1, later[1][0]) == []
    assert send(board, 0, captured) == []                   # the replay
    assert drops(board)["drop_replay"] == 1
    results = {}
    for payload in later[0]:
        for _, result in send(board, 0, payload):
            results.setdefault(Header.parse(result).seq, result[HEADER_BYTES:])
    for payload in later[1][1:]:
        for _, result in send(board, 1, payload):
            results.setdefault(Header.parse(result).seq, result[HEADER_BYTES:])
    assert np.array_equal(gathered(results, 2 * SLOTS, SLOTS), expected(second))
    assert drops(board) == dict(drop_bad_tag=0, drop_replay=1, drop_bad_source=0)


def test_a_resend_within_the_window_still_passes_the_filter():
    """A worker's own resend (the same seq, never below its slot's last) goes on to the aggregator,
    which answers a complete round's retransmission from the slot."""
    board, _, layout = make_board()
    key = job_key_for(KEY, layout)
    values = vectors(7, 1)
    run_round(board, key, values)
    again = send(board, 0, chunks(0, values[0], key)[0])
    assert len(again) == 1 and check_tag(key, again[0][1])
    assert np.array_equal(np.frombuffer(again[0][1][HEADER_BYTES:], dtype="<u4"),
                          expected(values))
    assert drops(board)["drop_replay"] == 0


def test_a_new_epoch_makes_the_old_keys_datagrams_worthless():
    board, control, layout = make_board(epoch=1)
    old_key = job_key_for(KEY, layout)
    values = vectors(8, 1)
    old = chunks(0, values[0], old_key)
    run_round(board, old_key, values)
    layout = configure_job(control, 0, WORKERS, epoch=2)
    new_key = job_key_for(KEY, layout)
    assert send(board, 0, old[0]) == []
    assert drops(board)["drop_bad_tag"] == 1
    values = vectors(9, 1)
    results = run_round(board, new_key, values)
    assert np.array_equal(gathered(results, 0, 1), expected(values))


def test_a_forged_source_does_not_move_the_replay_filter():
    """A genuine datagram sent again from another address: dropped for its source, after
    its tag passed, before the filter (which keeps the genuine worker's h)."""
    board, _, layout = make_board()
    key = job_key_for(KEY, layout)
    far = chunks(0, vectors(10, 1)[0], key, first_chunk=50)[0]
    assert send(board, 0, far, source=("10.0.0.66", 41000)) == []
    assert drops(board) == dict(drop_bad_tag=0, drop_replay=0, drop_bad_source=1)
    values = vectors(11, 1)
    results = run_round(board, key, values)                 # seq 0: not a replay of 50
    assert np.array_equal(gathered(results, 0, 1), expected(values))


# -- the filter's bound ------------------------------------------------------------------

def test_the_replay_filter_drops_exactly_a_seq_below_the_slots_last():
    table = JobAuthTable(KEY, jobs=1)
    table.set_register(0, "enable", 1)
    table.commit(0)

    def packet(seq, slot):
        return Header(type=PacketType.AGG_ADD_I32, count=8, seq=seq,
                      slot=slot).pack() + bytes(32)
    SLOTS = range(4)
    # nothing is dropped before a slot has a last seq; a resend (the same seq) passes
    assert [table.filter(0, 0, packet(s, s % 4), SLOTS) for s in (2, 0, 3, 1, 1)] == [PASSED] * 5
    assert table.filter(0, 0, packet(9, 1), SLOTS) == PASSED               # slot 1's last: 9
    assert table.filter(0, 0, packet(5, 1), SLOTS) == REPLAY
    assert table.filter(0, 0, packet(8, 1), SLOTS) == REPLAY
    assert table.filter(0, 0, packet(9, 1), SLOTS) == PASSED
    assert table.filter(0, 0, packet(0, 0), SLOTS) == PASSED               # per slot
    assert table.filter(0, 1, packet(1, 1), SLOTS) == PASSED               # per worker
    table.commit(0)                                                  # forgets them
    assert table.filter(0, 0, packet(1, 1), SLOTS) == PASSED
    # a slot outside the job's range keeps nothing (the aggregator drops the packet)
    assert table.filter(0, 0, packet(9, 7), SLOTS) == PASSED
    assert table.filter(0, 0, packet(1, 7), SLOTS) == PASSED
    with pytest.raises(ValueError, match="16-byte"):
        JobAuthTable(0x1234, jobs=1)


def test_a_stuck_chunks_resend_passes_while_the_other_slots_ran_far_ahead():
    """Slots move on independently: worker 0's chunk 0 lost, its other slots go round
    twice; its resend of chunk 0 (S + many chunks behind its newest) must pass. (A filter
    per worker, dropping seq <= h - S, drops it: the job stalls for good.)"""
    board, _, layout = make_board()
    key = job_key_for(KEY, layout)
    values = vectors(12, 3 * SLOTS)
    mine = [chunks(w, values[w], key) for w in range(2)]
    results = {}
    for g in range(3 * SLOTS):
        for w in range(2):
            if g % SLOTS == 0 and g > 0:
                continue               # slot 0 waits for chunk 0's result: not sent yet
            if (w, g) == (0, 0):
                continue               # chunk 0 of worker 0: lost
            for _, result in send(board, w, mine[w][g]):
                results.setdefault(Header.parse(result).seq, result[HEADER_BYTES:])
    assert 0 not in results and max(results) > SLOTS
    for _, result in send(board, 0, mine[0][0]):            # the resend
        results.setdefault(Header.parse(result).seq, result[HEADER_BYTES:])
    assert 0 in results and drops(board)["drop_replay"] == 0
    assert np.array_equal(np.frombuffer(results[0], dtype="<u4"),
                          expected(values)[:LANES])
