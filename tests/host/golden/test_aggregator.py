"""Switch aggregator reference model (host/golden/aggregator.py) against docs/switch-contract.md."""
import itertools

import numpy as np
import pytest

from contract.registers import COMMIT, SWITCH_REGISTERS, switch_params_word
from host.golden.aggregator import AggregatorModel, model_transport
from contract.counters import AGG_COUNTERS, AGG_DROP_CAUSES
from contract.header import MAGIC, Flags, Header, PacketType
from contract.packet import Packet

ADD, OR = PacketType.AGG_ADD_I32, PacketType.AGG_OR32
P = 16
N = 3
BASE, COUNT = 4, 8


def packet(worker=0, values=None, *, type=ADD, job=0, slot=BASE, version=0, exponent=0,
           seq=0, offset=0, count=P, flags=0, k=0, payload=None, **fields):
    if payload is None:
        values = np.zeros(P, np.uint32) if values is None else np.asarray(values)
        payload = values.astype("<u4").tobytes()
    return Packet(Header(type=type, job=job, worker=worker, slot=slot, slot_version=version,
                         exponent=exponent, seq=seq, offset=offset, count=count, flags=flags,
                         k=k, **fields), payload)


def lanes(*values):
    return (np.resize(np.array(values, dtype=np.int64), P) & 0xFFFFFFFF).astype(np.uint32)


@pytest.fixture
def model():
    m = AggregatorModel(slots=16, lanes=P, max_workers=8, jobs=4)
    m.configure_job(0, N, BASE, COUNT)
    return m


def counters_delta(before, after):
    return {k: after[k] - before[k] for k in AGG_COUNTERS if after[k] != before[k]}


def payload_u32(p):
    return np.frombuffer(p.payload, "<u4")


# ---------------------------------------------------------------------------------------
# construction and configuration

def test_counters_start_at_zero_with_the_shared_names():
    m = AggregatorModel()
    assert list(m.counters) == list(AGG_COUNTERS)
    assert set(m.counters.values()) == {0}
    assert (m.slots, m.lanes, m.max_workers, m.jobs) == (64, 64, 32, 4)


@pytest.mark.parametrize("kwargs", [dict(lanes=12), dict(lanes=0), dict(slots=0),
                                    dict(slots=1 << 17), dict(max_workers=33),
                                    dict(max_workers=0), dict(jobs=0), dict(lanes=8.0)])
def test_bad_parameters(kwargs):
    with pytest.raises(ValueError):
        AggregatorModel(**kwargs)


@pytest.mark.parametrize("args,match", [
    ((4, 2, 0, 1), "job"), ((0, 0, 0, 1), "workers"), ((0, 9, 0, 1), "workers"),
    ((0, 2, 0, 0), "slot_count"), ((0, 2, 15, 2), "slot_base"), ((0, 2, -1, 2), "slot_base"),
    ((1, 2, 11, 2), "overlap"), ((1, 2, 0, 5), "overlap"), ((0, True, 0, 1), "integer"),
])
def test_bad_configurations_are_rejected(model, args, match):
    before = model.state()
    with pytest.raises(ValueError, match=match):
        model.configure_job(*args)
    assert AggregatorModel.states_equal(before, model.state())


def test_reconfiguring_resets_the_jobs_slots_only(model):
    model.configure_job(1, 2, 0, 4)
    model.process(packet(0, lanes(5), slot=BASE + 1))
    model.process(packet(0, lanes(6), job=1, slot=2))
    model.configure_job(0, N, BASE, COUNT)        # same job, same range: allowed, resets
    assert model.slot_state(BASE + 1, 0)["count"] == 0
    assert model.slot_state(BASE + 1, 0)["seen"] == 0
    assert model.slot_state(2, 0)["count"] == 1   # job 1 untouched
    model.configure_job(0, 2, 8, 4)               # may move to overlap its old range
    assert model.job_config(0).slot_range == range(8, 12)


# ---------------------------------------------------------------------------------------
# aggregation semantics

def test_add_round_emits_one_multicast_with_the_sum_and_signed_max_exponent(model):
    a, b, c = lanes(1, 2**32 - 1, 7), lanes(2**31, 1, 0), lanes(2**31, 5, 0xFFFFFFFF)
    assert model.process(packet(0, a, exponent=-5, seq=10)) == []
    assert model.process(packet(2, b, exponent=-7, seq=11)) == []
    out = model.process(packet(1, c, exponent=-2, seq=12, offset=99, k=9,
                               flags=Flags.COMPRESS))
    assert len(out) == 1
    h = out[0].header
    assert h == Header(type=ADD, flags=Flags.COMPRESS | Flags.RESULT, k=9, job=0, worker=0xFF,
                       exponent=-2, count=P, slot=BASE, slot_version=0, seq=12, offset=99)
    expect = (a.astype(np.uint64) + b + c) % 2**32
    assert payload_u32(out[0]).tolist() == expect.tolist()
    assert model.counters["accepted"] == 3 and model.counters["results_multicast"] == 1
    assert model.slot_state(BASE, 0)["count"] == N and model.slot_state(BASE, 0)["seen"] == 0b111


def test_or_round(model):
    vals = [lanes(1, 0, 0x80000000), lanes(2, 0, 1), lanes(4, 0x10, 0)]
    outs = [model.process(packet(w, v, type=OR, version=1, slot=BASE + 7, exponent=w))
            for w, v in enumerate(vals)]
    assert outs[0] == outs[1] == []
    assert payload_u32(outs[2][0]).tolist() == (vals[0] | vals[1] | vals[2]).tolist()
    assert outs[2][0].header.type == OR and outs[2][0].header.exponent == 2


def test_exponent_max_is_signed(model):
    model.process(packet(0, exponent=-128))
    model.process(packet(1, exponent=127))
    out = model.process(packet(2, exponent=-1))
    assert out[0].header.exponent == 127


def test_retransmissions(model):
    model.process(packet(0, lanes(1), seq=1))
    before_state, before = model.state(), dict(model.counters)
    # incomplete: dropped, nothing changes (even with a different payload / op)
    assert model.process(packet(0, lanes(99), seq=1)) == []
    assert model.process(packet(0, lanes(99), type=OR, seq=1)) == []
    assert counters_delta(before, model.counters) == {"packets": 2, "retransmit_dropped": 2}
    assert AggregatorModel.states_equal(before_state, model.state())
    model.process(packet(1, lanes(2), seq=1, exponent=3))
    model.process(packet(2, lanes(3), seq=1))
    # complete: each retransmission gets a unicast with the stored value
    before_state, before = model.state(), dict(model.counters)
    out = model.process(packet(1, lanes(77), seq=1, offset=5, exponent=-9))
    assert len(out) == 1
    h = out[0].header
    assert h.worker == 1 and h.flags & Flags.RESULT and h.exponent == 3 and h.offset == 5
    assert payload_u32(out[0]).tolist() == lanes(6).tolist()
    assert counters_delta(before, model.counters) == {"packets": 1, "results_unicast": 1}
    assert AggregatorModel.states_equal(before_state, model.state())


def test_version_alternation_and_slot_reuse(model):
    for w in range(N):                                   # round 1 on (slot, v0)
        model.process(packet(w, lanes(w + 1)))
    # worker 0 goes on to the next round on the shadow copy v1
    assert model.process(packet(0, lanes(10), version=1)) == []
    assert model.slot_state(BASE, 0)["seen"] == 0b110
    assert model.slot_state(BASE, 1)["seen"] == 0b001
    # worker 2 never got the v0 result: its retransmission is still answered
    out = model.process(packet(2, lanes(0), version=0))
    assert out[0].header.worker == 2 and payload_u32(out[0]).tolist() == lanes(6).tolist()
    out = [model.process(packet(w, lanes(10 * w + 10), version=1)) for w in (1, 2)]
    assert out[0] == [] and payload_u32(out[1][0]).tolist() == lanes(60).tolist()
    # round 3 reuses v0: it starts afresh from the first contribution
    assert model.process(packet(1, lanes(100), version=0)) == []
    s = model.slot_state(BASE, 0)
    assert s["count"] == 1 and s["seen"] == 0b010 and s["lanes"].tolist() == lanes(100).tolist()
    assert model.slot_state(BASE, 1)["seen"] == 0b101
    model.process(packet(0, lanes(200), version=0))
    out = model.process(packet(2, lanes(300), version=0))
    assert payload_u32(out[0]).tolist() == lanes(600).tolist()


def test_stale_copy_after_the_next_round_is_taken_as_new():
    """Why the host must never let an old packet arrive after its next round on the slot."""
    m = AggregatorModel(slots=4, lanes=P, max_workers=2, jobs=1)
    m.configure_job(0, 2, 0, 1)
    m.process(packet(0, lanes(1), slot=0))
    m.process(packet(1, lanes(2), slot=0))               # round 1 complete: 3
    m.process(packet(0, lanes(10), slot=0, version=1))   # worker 0, round 2
    assert m.process(packet(0, lanes(1), slot=0)) == []  # stale duplicate of round 1
    assert m.slot_state(0, 0)["count"] == 1              # ... folded in as a new round
    assert m.slot_state(0, 1)["seen"] == 0               # and worker 0's round-2 bit is gone
    assert m.counters["accepted"] == 4


def test_single_worker_completes_every_contribution():
    m = AggregatorModel(slots=2, lanes=8, max_workers=1, jobs=1)
    m.configure_job(0, 1, 0, 2)
    for i in range(4):
        out = m.process(Packet(Header(type=ADD, count=8, slot=1, slot_version=i % 2, seq=i),
                               np.full(8, i, "<u4").tobytes()))
        assert len(out) == 1 and out[0].header.worker == 0xFF and out[0].header.seq == i
        assert payload_u32(out[0]).tolist() == [i] * 8
    out = m.process(Packet(Header(type=ADD, count=8, slot=1, slot_version=1, seq=3),
                           bytes(32)))
    assert out[0].header.worker == 0 and payload_u32(out[0]).tolist() == [3] * 8
    assert m.counters["results_multicast"] == 4 and m.counters["results_unicast"] == 1


def test_mixed_ops(model):
    model.process(packet(0, lanes(1), type=ADD))
    before_state, before = model.state(), dict(model.counters)
    assert model.process(packet(1, lanes(2), type=OR)) == []
    assert counters_delta(before, model.counters) == {"packets": 1, "drop_mixed_op": 1}
    assert AggregatorModel.states_equal(before_state, model.state())
    model.process(packet(1, lanes(2), type=ADD))
    assert len(model.process(packet(2, lanes(3), type=ADD))) == 1
    # after completion the next round on the same (slot, version) may use the other op
    model.process(packet(0, lanes(1), type=ADD, version=1))     # free v0 for worker 0
    for w in range(N):
        model.process(packet(w, lanes(1), type=ADD, version=1))
    outs = [model.process(packet(w, lanes(1 << w), type=OR, version=0)) for w in range(N)]
    assert payload_u32(outs[-1][0]).tolist() == lanes(7).tolist()
    assert model.counters["drop_mixed_op"] == 1


def test_jobs_are_isolated(model):
    model.configure_job(2, 2, 12, 4)
    model.process(packet(0, lanes(1), slot=BASE))
    model.process(packet(0, lanes(100), job=2, slot=12))
    assert model.process(packet(1, lanes(200), job=2, slot=12))[0].payload == \
        lanes(300).astype("<u4").tobytes()
    assert model.slot_state(BASE, 0)["count"] == 1
    before = dict(model.counters)
    model.process(packet(0, job=2, slot=BASE))        # job 2 may not touch job 0's slots
    model.process(packet(2, job=2, slot=12))          # job 2 has only 2 workers
    model.process(packet(0, job=1, slot=0))           # job 1 is not configured
    assert counters_delta(before, model.counters) == {
        "packets": 3, "drop_bad_slot": 1, "drop_bad_worker": 1, "drop_unconfigured_job": 1}
    model.clear_job(2)
    assert model.process(packet(0, job=2, slot=12)) == []
    assert model.counters["drop_unconfigured_job"] == 2
    model.configure_job(1, 2, 12, 4)                  # job 2's old range is free again


# ---------------------------------------------------------------------------------------
# bad packets

def _good_raw():
    return bytearray(packet(1, lanes(5), slot=BASE + 2).to_bytes())


def _set(raw, offset, value, size=1, signed=False):
    raw[offset:offset + size] = int(value).to_bytes(size, "little", signed=signed)


#: Ways to make the good packet bad in exactly one way, per cause. Each edits the raw image.
DEFECTS = {
    "bad_header": [lambda r: _set(r, 0, MAGIC ^ 1), lambda r: _set(r, 1, 2),
                   lambda r: _set(r, 1, 0)],
    "bad_type": [lambda r: _set(r, 2, PacketType.RAW_F32), lambda r: _set(r, 2, PacketType.INC_F32),
                 lambda r: _set(r, 2, 4), lambda r: _set(r, 2, 255)],
    "unconfigured_job": [lambda r: _set(r, 5, 1), lambda r: _set(r, 5, 3), lambda r: _set(r, 5, 4),
                         lambda r: _set(r, 5, 255)],
    "bad_worker": [lambda r: _set(r, 6, N), lambda r: _set(r, 6, 7), lambda r: _set(r, 6, 0xFF)],
    "bad_slot": [lambda r: _set(r, 12, BASE - 1, 2), lambda r: _set(r, 12, BASE + COUNT, 2),
                 lambda r: _set(r, 12, 0xFFFF, 2)],
    "bad_slot_version": [lambda r: _set(r, 14, 2), lambda r: _set(r, 14, 3),
                         lambda r: _set(r, 14, 255)],
    "bad_count": [lambda r: _set(r, 8, P - 8, 4), lambda r: _set(r, 8, P + 1, 4),
                  lambda r: _set(r, 8, 0, 4), lambda r: _set(r, 8, P + (1 << 16), 4)],
    "bad_length": [lambda r: r.__delitem__(slice(-4, None)), lambda r: r.extend(bytes(4)),
                   lambda r: r.__delitem__(slice(32, None)), lambda r: r.extend(bytes(2)),
                   lambda r: r.__delitem__(slice(-1, None)), lambda r: r.extend(bytes(4 * P))],
}


def _mixed_op(raw):
    _set(raw, 2, OR)


def _prime_mixed_op_round(model):
    """A round in progress on the good packet's (slot, version) with ADD, from worker 0."""
    model.process(packet(0, lanes(9), slot=BASE + 2))


@pytest.mark.parametrize("cause,variant", [(c, i) for c in DEFECTS for i in
                                           range(len(DEFECTS[c]))])
def test_each_bad_packet_class_is_counted_once_and_changes_nothing(model, cause, variant):
    _prime_mixed_op_round(model)
    raw = _good_raw()
    DEFECTS[cause][variant](raw)
    before_state, before = model.state(), dict(model.counters)
    assert model.process(bytes(raw)) == []
    assert counters_delta(before, model.counters) == {"packets": 1, f"drop_{cause}": 1}
    assert AggregatorModel.states_equal(before_state, model.state())
    # the good packet itself is accepted (the defect alone made it bad)
    assert model.process(bytes(_good_raw())) == []
    assert model.counters["accepted"] == before["accepted"] + 1


def test_mixed_op_packet_is_counted_and_changes_nothing(model):
    _prime_mixed_op_round(model)
    raw = _good_raw()
    _mixed_op(raw)
    before_state, before = model.state(), dict(model.counters)
    assert model.process(bytes(raw)) == []
    assert counters_delta(before, model.counters) == {"packets": 1, "drop_mixed_op": 1}
    assert AggregatorModel.states_equal(before_state, model.state())


@pytest.mark.parametrize("length", [0, 1, 4, 31])
def test_images_shorter_than_a_header_are_length_errors(model, length):
    raw = bytes(_good_raw()[:length])
    before_state, before = model.state(), dict(model.counters)
    assert model.process(raw) == []
    assert counters_delta(before, model.counters) == {"packets": 1, "drop_bad_length": 1}
    assert AggregatorModel.states_equal(before_state, model.state())


def test_several_defects_count_under_the_first_cause_in_priority_order(model):
    _prime_mixed_op_round(model)
    defects = dict(DEFECTS)
    defects = {c: defects[c][0] for c in defects}
    defects["mixed_op"] = _mixed_op
    causes = list(AGG_DROP_CAUSES)
    assert set(defects) == set(causes)
    checked = 0
    for size in range(2, len(causes) + 1):
        for combo in itertools.combinations(causes, size):
            raw = _good_raw()
            # apply in reverse priority so e.g. bad_type's type byte beats mixed_op's
            for cause in reversed(combo):
                defects[cause](raw)
            before_state, before = model.state(), dict(model.counters)
            assert model.process(bytes(raw)) == []
            assert counters_delta(before, model.counters) == \
                {"packets": 1, f"drop_{combo[0]}": 1}, combo
            assert AggregatorModel.states_equal(before_state, model.state())
            checked += 1
    assert checked == 2**len(causes) - 1 - len(causes)


def test_retransmission_is_not_a_mixed_op(model):
    model.process(packet(1, lanes(1), slot=BASE))
    assert model.process(packet(1, lanes(1), slot=BASE, type=OR)) == []
    assert model.counters["retransmit_dropped"] == 1 and model.counters["drop_mixed_op"] == 0


def test_slot_version_other_than_0_or_1_is_dropped(model):
    """aggregator-protocol.md section 2: only versions 0 and 1 exist; a result never echoes
    another (the model once used bit 0 and echoed the byte)."""
    for version in (2, 3, 4, 128, 255):
        before = model.state()
        assert model.process(packet(0, lanes(1), version=version)) == []
        assert AggregatorModel.states_equal(before, model.state())
    assert model.counters["drop_bad_slot_version"] == 5
    for worker in range(N - 1):
        assert model.process(packet(worker, lanes(1), version=1)) == []
    out = model.process(packet(N - 1, lanes(1), version=1))
    assert out[0].header.slot_version == 1 and payload_u32(out[0]).tolist() == lanes(N).tolist()


def test_partial_beats_other_than_the_last_are_bad_lengths(model):
    """A beat other than the last whose tkeep is not all ones is a bad length, after the
    header's causes; the last beat's tkeep is the packet's length, as before."""
    raw = _good_raw()
    beats = [(bytes(raw[i:i + 32]), (1 << 32) - 1, i + 32 == len(raw))
             for i in range(0, len(raw), 32)]
    assert model.process_beats(beats) == [] and model.counters["accepted"] == 1
    for bad in range(len(beats) - 1):            # the header beat and each payload beat
        for keep in (0, (1 << 31) - 1, 0xFFFF_FFFE):
            partial = list(beats)
            partial[bad] = (beats[bad][0], keep, False)
            before, state = dict(model.counters), model.state()
            assert model.process_beats(partial) == []
            assert counters_delta(before, model.counters) == {"packets": 1, "drop_bad_length": 1}
            assert AggregatorModel.states_equal(state, model.state())
    bad_magic = [(bytes([MAGIC ^ 1]) + beats[0][0][1:], 0xFFFF, False)] + beats[1:]
    before = dict(model.counters)
    model.process_beats(bad_magic)
    assert counters_delta(before, model.counters) == {"packets": 1, "drop_bad_header": 1}
    # A last beat that keeps fewer bytes: the payload is short (as a byte image would be).
    short = beats[:-1] + [(beats[-1][0], (1 << 28) - 1, True)]
    before = dict(model.counters)
    model.process_beats(short)
    assert counters_delta(before, model.counters) == {"packets": 1, "drop_bad_length": 1}


def test_bytes_and_packets_are_the_same_input(model):
    twin = AggregatorModel(slots=16, lanes=P, max_workers=8, jobs=4)
    twin.configure_job(0, N, BASE, COUNT)
    rng = np.random.default_rng(5)
    for _ in range(300):
        p = packet(int(rng.integers(0, 4)), rng.integers(0, 2**32, P, dtype=np.uint64),
                   type=[ADD, OR][int(rng.integers(0, 2))], slot=int(rng.integers(2, 14)),
                   version=int(rng.integers(0, 2)), exponent=int(rng.integers(-128, 128)),
                   count=P if rng.random() < 0.9 else P + 8)
        assert model.process(p) == twin.process(p.to_bytes())
    assert model.counters == twin.counters
    assert AggregatorModel.states_equal(model.state(), twin.state())


def test_counters_wrap_at_32_bits(model):
    model.counters["packets"] = 2**32 - 1
    model.process(packet(0))
    assert model.counters["packets"] == 0
JOB = SWITCH_REGISTERS["job"]
COUNTERS = SWITCH_REGISTERS["counter"]


# ---------------------------------------------------------------------------------------
# control registers

def test_control_registers_configure_and_read_back():
    m = AggregatorModel(slots=32, lanes=16, jobs=4)
    assert m.read(SWITCH_REGISTERS["params"].address) == switch_params_word(slots=32, lanes=16)
    m.write(JOB.address(2, "workers"), 3)
    m.write(JOB.address(2, "slot_base"), 8)
    m.write(JOB.address(2, "slot_count"), 4)
    assert m.job_config(2) is None            # nothing happens before the commit
    assert [m.read(JOB.address(2, f)) for f in ("workers", "slot_base", "slot_count")] == [3, 8, 4]
    m.write(JOB.address(2, "commit"), COMMIT)
    assert m.job_config(2).workers == 3 and m.job_config(2).slot_range == range(8, 12)
    m.process(Packet(Header(type=ADD, job=2, worker=0, count=16, slot=8), bytes(64)))
    m.process(b"short")
    assert [m.read(COUNTERS.base + i) for i in range(len(AGG_COUNTERS))] == \
        [m.counters[c] for c in AGG_COUNTERS]
    assert m.read(COUNTERS.base + AGG_COUNTERS.index("drop_bad_length")) == 1
    m.write(JOB.address(2, "workers"), 0)
    m.write(JOB.address(2, "commit"), COMMIT)                     # workers 0 + commit = clear
    assert m.job_config(2) is None
    m.write(COUNTERS.base, 5)                  # read-only: ignored
    assert m.read(COUNTERS.base) == 2


def test_model_transport_feeds_packets_in_order(model):
    send = model_transport(model)
    out = send([packet(w, lanes(w)) for w in range(N)] + [packet(0, lanes(0))])
    assert [p.header.worker for p in out] == [0xFF, 0]
