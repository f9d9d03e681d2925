"""SwitchWorkerWindow (host/switchml/window.py) driven directly, with no network: the window
bound, loss and resends, reordered and duplicated results, stale timers, inconsistent
answers; every result bit-exact with the OR / wrap-around sum of the workers' words. And
the packetisation it uses (make_packets, collect_results)."""
import random

import numpy as np
import pytest

from contract.header import WORKER_MULTICAST, Flags, PacketType
from contract.packet import Packet
from host.golden.aggregator import AggregatorModel, model_transport
from host.switchml.window import (ProtocolError, SwitchWorkerWindow, chunk_slot, collect_results,
                                make_packets)

ADD, OR = PacketType.AGG_ADD_I32, PacketType.AGG_OR32


# ---------------------------------------------------------------------------------------
# packetisation

def test_chunks_map_to_slots_versions_seq_and_offsets():
    words = np.arange(1, 8 * 7 + 4, dtype=np.uint32)           # 7 full chunks + 3 words
    packets = make_packets(words, op=OR, job=3, worker=2, slot_base=10, slot_count=3, lanes=8,
                           first_chunk=5, exponent=-7)
    assert len(packets) == 8
    for i, p in enumerate(packets):
        g = 5 + i
        h = p.header
        assert (h.slot, h.slot_version) == (10 + g % 3, (g // 3) % 2) == chunk_slot(g, 10, 3)
        assert (h.type, h.job, h.worker, h.exponent, h.count) == (OR, 3, 2, -7, 8)
        assert (h.seq, h.offset, h.flags) == (g, 8 * i, 0)
        lanes = np.frombuffer(p.payload, "<u4")
        expect = np.zeros(8, np.uint32)
        piece = words[8 * i:8 * i + 8]
        expect[:piece.size] = piece
        assert lanes.tolist() == expect.tolist()                # last chunk zero padded
    # versions alternate on every reuse of a slot
    assert [p.header.slot_version for p in packets if p.header.slot == 10] == [0, 1, 0]


def test_int32_words_travel_as_their_bits():
    values = np.array([-1, -(2**31), 2**31 - 1, 0], dtype=np.int32)
    (p,) = make_packets(values, op=ADD, job=0, worker=0, slot_base=0, slot_count=1, lanes=8)
    assert np.frombuffer(p.payload, "<i4")[:4].tolist() == values.tolist()
    with pytest.raises(TypeError):
        make_packets(np.ones(3, np.float32), op=ADD, job=0, worker=0, slot_base=0,
                     slot_count=1, lanes=8)
    with pytest.raises(ValueError, match="lanes"):
        make_packets(values, op=ADD, job=0, worker=0, slot_base=0, slot_count=1, lanes=12)
    with pytest.raises(ValueError, match="op"):
        make_packets(values, op=PacketType.RAW_F32, job=0, worker=0, slot_base=0,
                     slot_count=1, lanes=8)


def test_collect_results_reassembles_and_checks():
    words = np.arange(100, dtype=np.uint32)
    packets = make_packets(words, op=ADD, job=0, worker=0, slot_base=0, slot_count=4, lanes=16,
                           first_chunk=9, exponent=3)
    results = [Packet(p.header.replace(flags=Flags.RESULT, worker=0xFF), p.payload)
               for p in packets]
    rng = np.random.default_rng(1)
    shuffled = [results[i] for i in rng.permutation(len(results))] + results[:2]   # + dups
    vector, exponent = collect_results(shuffled, 100, lanes=16, first_chunk=9)
    assert vector.tolist() == words.tolist() and exponent == 3
    with pytest.raises(ProtocolError, match="missing"):
        collect_results(results[1:], 100, lanes=16, first_chunk=9)
    bad = Packet(results[0].header, bytes(64))
    with pytest.raises(ProtocolError, match="different"):
        collect_results(results + [bad], 100, lanes=16, first_chunk=9)
    with pytest.raises(ProtocolError, match="not a result"):
        collect_results(packets, 100, lanes=16, first_chunk=9)


# ---------------------------------------------------------------------------------------
# the window, driven by hand

LAYOUT = dict(job=2, slot_base=4, slot_count=3, lanes=8)


def windows_for(vectors, op, *, first_chunk=0, exponents=None):
    exponents = exponents or [0] * len(vectors)
    return [SwitchWorkerWindow(v, op=op, worker=w, first_chunk=first_chunk, exponent=e,
                               **LAYOUT) for w, (v, e) in enumerate(zip(vectors, exponents))]


def switch_for(workers):
    model = AggregatorModel(slots=16, lanes=LAYOUT["lanes"], max_workers=8, jobs=4)
    model.configure_job(LAYOUT["job"], workers, LAYOUT["slot_base"], LAYOUT["slot_count"])
    return model_transport(model)


def drive(windows, switch, *, seed=0, loss=0.0, dup=0.0, reorder=False, max_rounds=10_000):
    """A network without a clock: each round delivers what is in flight (some packets and
    result copies lost, some twice, results shuffled); a round with nothing to send is a
    timeout, and every outstanding packet goes again. A lost packet is never delivered
    later, so no stale copy can overtake a worker's next round on its slot."""
    rng = random.Random(seed)
    in_flight = [p for window in windows for p in window.start()]
    counts = dict(accepted=0, ignored=0, resent=0)
    for _ in range(max_rounds):
        if all(window.done for window in windows):
            return counts
        delivered = []
        for packet in in_flight:
            if rng.random() < loss:
                continue
            delivered += [packet] * (2 if rng.random() < dup else 1)
        copies = []
        for result in switch(delivered):
            worker = result.header.worker
            for target in range(len(windows)) if worker == WORKER_MULTICAST else [worker]:
                if rng.random() < loss:
                    continue
                copies += [(target, result)] * (2 if rng.random() < dup else 1)
        if reorder:
            rng.shuffle(copies)
        in_flight = []
        for target, result in copies:
            accepted, following = windows[target].on_result(result)
            counts["accepted" if accepted else "ignored"] += 1
            in_flight += following
        if not in_flight:
            for window in windows:
                for seq in sorted(window.outstanding):
                    in_flight.append(window.resend(seq))
                    counts["resent"] += 1
    raise AssertionError("the windows made no progress")


def vectors_of(seed, workers=3, n=100, *, sparse=False):
    rng = np.random.default_rng(seed)
    out = rng.integers(0, 2**32, size=(workers, n), dtype=np.uint64).astype(np.uint32)
    if sparse:
        out &= rng.integers(0, 2**32, size=(workers, n), dtype=np.uint64).astype(np.uint32)
    return list(out)


def expected(vectors, op):
    if op == OR:
        return np.bitwise_or.reduce(np.array(vectors), axis=0)
    return np.sum(np.array(vectors, dtype=np.uint64), axis=0).astype(np.uint32)  # wraps


@pytest.mark.parametrize("op", [OR, ADD])
@pytest.mark.parametrize("faults", [dict(), dict(loss=0.2), dict(reorder=True),
                                    dict(dup=0.3), dict(loss=0.15, dup=0.2, reorder=True)],
                         ids=["clean", "loss", "reorder", "dup", "all"])
def test_every_worker_gets_the_exact_aggregate(op, faults):
    vectors = vectors_of(1)
    windows = windows_for(vectors, op, first_chunk=5, exponents=[3, -2, 7])
    counts = drive(windows, switch_for(len(vectors)), seed=7, **faults)
    for window in windows:
        vector, exponent = window.result()
        assert vector.dtype == np.uint32 and np.array_equal(vector, expected(vectors, op))
        assert exponent == 7
        assert window.end_chunk == 5 + 13 and not window.outstanding
    if "loss" in faults:
        assert counts["resent"] > 0
    if "dup" in faults:
        assert counts["ignored"] > 0


def test_the_same_as_collect_results_of_make_packets():
    vectors = vectors_of(2, n=61)
    windows = windows_for(vectors, ADD)
    drive(windows, switch_for(len(vectors)))
    send = switch_for(len(vectors))
    per_worker = [make_packets(v, op=ADD, worker=w, **LAYOUT) for w, v in enumerate(vectors)]
    # chunk by chunk: every round on a slot completes before the slot's next one
    results = [r for chunk in zip(*per_worker) for r in send(list(chunk))]
    vector, exponent = collect_results(results, 61, lanes=LAYOUT["lanes"])
    assert np.array_equal(windows[0].result()[0], vector) and exponent == 0


def result_for(packet, payload=None, **changes):
    h = packet.header
    changes = {"flags": h.flags | Flags.RESULT, "worker": WORKER_MULTICAST, **changes}
    return Packet(h.replace(**changes),
                  packet.payload if payload is None else payload)


def test_one_outstanding_packet_per_slot():
    window = SwitchWorkerWindow(np.arange(8 * 7, dtype=np.uint32), op=OR, worker=0,
                                first_chunk=10, **LAYOUT)
    first = window.start()
    assert [p.header.seq for p in first] == [10, 11, 12]
    assert sorted(window.outstanding) == [10, 11, 12]
    with pytest.raises(RuntimeError, match="started"):
        window.start()
    # the result of chunk 11 frees its slot for chunk 14 (same slot, the other version)
    accepted, following = window.on_result(result_for(first[1]))
    assert accepted and [p.header.seq for p in following] == [14]
    assert chunk_slot(14, 4, 3) == (following[0].header.slot, following[0].header.slot_version)
    assert following[0].header.slot == first[1].header.slot
    assert following[0].header.slot_version != first[1].header.slot_version
    # a duplicate of it is ignored and frees nothing
    assert window.on_result(result_for(first[1])) == (False, [])
    for packet in [first[0], first[2], following[0]]:
        window.on_result(result_for(packet))
    assert sorted(window.outstanding) == [13, 15]         # 14's slot has no chunk 17
    assert [p.header.seq for p in window.on_result(
        result_for(window.outstanding[13].packet))[1]] == [16]
    # the last chunks free no further one
    rest = [window.outstanding[seq].packet for seq in (15, 16)]
    assert all(window.on_result(result_for(p))[1] == [] for p in rest)
    assert window.done and window.remaining == 0


def test_resend_gives_the_same_packet_until_its_result_is_in():
    window = SwitchWorkerWindow(np.ones(8, np.uint32), op=ADD, worker=1, **LAYOUT)
    packet, = window.start()
    assert window.resend(0, attempt=0) is packet
    assert window.outstanding[0].attempt == 1
    assert window.resend(0, attempt=0) is None            # a timer of an earlier attempt
    assert window.resend(0) is packet and window.outstanding[0].attempt == 2
    window.on_result(result_for(packet))
    assert window.resend(0) is None                       # answered: nothing to resend
    assert window.resend(99) is None


def test_results_for_others_are_not_the_windows():
    window = SwitchWorkerWindow(np.ones(8, np.uint32), op=ADD, worker=1, **LAYOUT)
    packet, = window.start()
    assert window.on_result(result_for(packet, job=3)) == (False, [])
    assert window.on_result(result_for(packet, worker=0)) == (False, [])
    assert window.on_result(packet) == (False, [])        # not a result (no RESULT flag)
    assert window.on_result(result_for(packet, seq=1)) == (False, [])
    assert window.on_result(result_for(packet, worker=1))[0]      # a unicast answer


@pytest.mark.parametrize("change", [dict(slot_version=1), dict(offset=8), dict(slot=5),
                                    dict(type=OR), dict(payload=bytes(4))],
                         ids=["version", "offset", "slot", "type", "length"])
def test_a_result_that_does_not_answer_its_packet_is_an_error(change):
    window = SwitchWorkerWindow(np.ones(8, np.uint32), op=ADD, worker=0, **LAYOUT)
    packet, = window.start()
    with pytest.raises(ProtocolError, match="does not answer"):
        window.on_result(result_for(packet, **change))
    assert not window.done


def test_an_empty_message_sends_nothing():
    window = SwitchWorkerWindow(np.zeros(0, np.int32), op=ADD, worker=0, first_chunk=4,
                                **LAYOUT)
    assert window.start() == [] and window.done and window.end_chunk == 4
    vector, exponent = window.result()
    assert vector.size == 0 and exponent is None


def test_no_result_before_every_chunk_is_in():
    window = SwitchWorkerWindow(np.ones(20, np.uint32), op=ADD, worker=0, **LAYOUT)
    window.start()
    with pytest.raises(ProtocolError, match="still without a result"):
        window.result()
