# amaranth: UnusedElaboratable=no
"""One direction of the NIC in the wire (``hdl/wire/path.py``) with the NIC engine behind it,
against the golden wire (``host/board/wire_golden.py``): every frame goes through both, and
the frames the path sends must be the golden model's, byte for byte (less the FCS the MAC
appends), and its counter strobes the golden model's per-port counter deltas. On the host
side (tx) the board's service stands behind the path, as in the wire's engine: its replies
must be the golden model's too.

The MAC side is driven as a LiteEth MAC does (never stalled, ``error`` with a bad FCS), the
output with random back-pressure.
"""
import random

import numpy as np
import pytest
from amaranth import Module
from amaranth.back import verilog
from amaranth.lib import wiring

from contract.counters import WIRE_COUNTERS
from hdl.nic.engine import NicEngine
from contract.network import decode_network_address
from hdl.wire.classify import BEAT_BYTES, DIRECTIONS, MAX_BODY_BYTES, MIN_BODY_BYTES
from hdl.wire.path import WirePath
from hdl.wire.service import BoardService
from host.board.wire_golden import FCS_BYTES, GoldenWire
from sim.frames import (KEY, MALFORMED, PASS_THROUGH, SPECIALS, body_of, frame, gradient,
                        random_frame, raw_packet, values)
from sim.wire_stimulus import (MAX_COUNT, FrameCollector, bad_cases, beat_schedule,
                               gradient_cases, inc_packet, malformed_cases, pass_cases,
                               same_frames, spaced)
from tests.amaranth_sim import run

#: the events that count a frame's fate: each frame counts in exactly one
FATES = [name for name in WIRE_COUNTERS if name not in ("frames_in", "frames_out")]


class Wire:
    """A :class:`WirePath` and the :class:`NicEngine` path of its direction, as a top wires
    them (the path's NIC members to one direction of a shared engine), and on the host side
    the board's service behind the path (its register bus left to the bench)."""

    def __init__(self, direction, **kwargs):
        self.path = WirePath(direction=direction, max_count=MAX_COUNT, **kwargs)
        self.engine = NicEngine(max_count=MAX_COUNT)
        self.service = BoardService(key=KEY) if direction == "tx" else None
        self.direction = direction

    def module(self):
        m = Module()
        m.submodules.path, m.submodules.engine = path, engine = self.path, self.engine
        if self.direction == "tx":
            m.submodules.service = service = self.service
            wiring.connect(m, path.board, service.i)
            m.d.comb += path.board_free.eq(service.free)
            wiring.connect(m, path.nic_in, engine.tx_in)
            wiring.connect(m, engine.tx_out, path.nic_out)
        else:
            wiring.connect(m, path.nic_in, engine.rx_in)
            wiring.connect(m, engine.rx_out, path.nic_out)
            m.d.comb += path.nic_dropped.eq(engine.rx_dropped)
        return m


def simulate(direction, cases, *, seed, p_idle=0.5, gap=(4, 40), p_ready=0.7, hold=0,
             path_args=None, watch=None, line_rate=False, replies=None, registers=None):
    """``cases`` (``(name, data)`` or ``(name, data, error_beat)``) into a path, one after
    the other with ``gap`` idle cycles between frames and idle cycles before a beat with
    probability ``p_idle``; ``o.ready`` low for the first ``hold`` cycles, then high with
    probability ``p_ready``. ``line_rate``: 1 GbE at 62.5 MHz instead, both ways: one idle
    cycle before every beat in, ``o.ready`` every other cycle. Returns the frames out
    (bytes) and the event counts (the service's among them, but its ``frames_out``); the
    service's replies (bytes) go into the list ``replies``, and its register reads are
    answered from ``registers`` (``WIRE_REGISTERS`` address -> value; others read 0)."""
    rng = random.Random(seed)
    wire = Wire(direction, **(path_args or {}))
    path, service = wire.path, wire.service
    registers = registers or {}
    schedule = beat_schedule(cases, rng, path.i.p.shape(), p_idle=p_idle, gap=gap,
                             line_rate=line_rate)
    out = FrameCollector(path.o.p.shape())
    answers = FrameCollector(path.o.p.shape())
    ev_layout = path.events.shape()
    ev_offsets = {name: field.offset for name, field in ev_layout}
    counts = dict.fromkeys(WIRE_COUNTERS, 0)

    async def bench(ctx):
        payload = path.i.p.as_value()
        cycle = quiet = 0
        # until every frame has had its fate counted, and a while after (frames out)
        while cycle < len(schedule) or quiet < 50 \
                or sum(counts[name] for name in FATES) < counts["frames_in"]:
            beat = schedule[cycle] if cycle < len(schedule) else None
            ctx.set(path.i.valid, beat is not None)
            ctx.set(payload, beat if beat is not None else rng.getrandbits(len(payload)))
            ctx.set(path.o.ready, cycle >= hold and (cycle % 2 == 0 if line_rate
                                                     else rng.random() < p_ready))
            if service is not None:
                ctx.set(service.o.ready, rng.random() < p_ready)
            _, _, valid, ready, value, events, *board = await ctx.tick().sample(
                path.o.valid, path.o.ready, path.o.p.as_value(), path.events.as_value(),
                *service_signals)
            active = False
            if valid and ready:
                active = True
                out.word(value)
            for name, offset in ev_offsets.items():
                if events >> offset & 1:
                    counts[name] += 1
                    active = True
            if service is not None:
                active |= serve(ctx, *board)
            if watch:
                watch(cycle, beat, valid and ready)
            quiet = 0 if active or cycle < len(schedule) else quiet + 1
            cycle += 1
            assert cycle < len(schedule) + 100_000, "no progress: the path hangs"

    service_signals = () if service is None else (
        service.o.valid, service.o.ready, service.o.p.as_value(), service.bus.re,
        service.bus.addr, service.events.answered, service.events.drop_unanswered)

    def serve(ctx, valid, ready, value, re, addr, answered, unanswered):
        """The service's side of a cycle: its replies taken, its register reads answered
        the cycle after, its events counted. Whether anything happened."""
        ctx.set(service.bus.rdata, registers.get(addr, 0) if re else rng.getrandbits(32))
        counts["answered"] += answered
        counts["drop_unanswered"] += unanswered
        if valid and ready:
            answers.word(value)
        return bool(valid or answered or unanswered)

    run(wire.module(), bench)
    assert not out.unfinished and not answers.unfinished, "a frame left unfinished"
    if replies is not None:
        replies.extend(answers.frames)
    return out.frames, counts


def golden(direction, cases, *, replies=None, registers=None):
    """The frames (FCS stripped) and the counter deltas the golden wire gives for
    ``cases``, per ``WIRE_COUNTERS`` name, ``frames_out`` the other port's (the golden
    store never fills: ``drop_full`` 0). The board's replies (padded by the MAC, the FCS
    stripped) go into the list ``replies``; ``CTRL`` requests read ``registers``
    (``WIRE_REGISTERS`` address -> value; others 0), as :func:`simulate`'s bus does."""
    port = DIRECTIONS[direction]
    wire = GoldenWire(KEY, max_count=MAX_COUNT)
    registers = registers or {}

    def read(address):
        where = decode_network_address(address)
        return registers.get(where[1], 0) if where and where[0].name == "wire" else 0

    wire.read = read
    frames = []
    for case in cases:
        if isinstance(case[1], int):         # ("pause", cycles)
            continue
        for out_port, data in wire.receive(port, case[1]):
            if out_port != port:
                frames.append(data[:-FCS_BYTES])
            elif replies is not None:
                replies.append(data[:-FCS_BYTES])
    counts = dict(wire.counters[port])
    counts["frames_out"] = wire.counters[1 - port]["frames_out"]
    return frames, counts


def check(direction, cases, *, seed, registers=None, **kwargs):
    """Run ``cases`` through the path and the golden model; every frame, reply and counter
    equal."""
    want_replies, got_replies = [], []
    want_frames, want_counts = golden(direction, cases, replies=want_replies,
                                      registers=registers)
    got_frames, got_counts = simulate(direction, cases, seed=seed, replies=got_replies,
                                      registers=registers, **kwargs)
    assert got_counts == want_counts
    same_frames(got_frames, want_frames)
    # the MAC pads a reply to 60 bytes
    same_frames([r.ljust(MIN_BODY_BYTES, b"\0") for r in got_replies], want_replies, "reply")
    return want_counts


# -- tests ---------------------------------------------------------------------------------

@pytest.mark.parametrize("direction", DIRECTIONS)
def test_gradients_match_the_golden_model(direction):
    counts = check(direction, gradient_cases(direction) + malformed_cases(), seed=1)
    if direction == "tx":
        assert counts["compressed"] >= 10 and counts["incompressible"] >= 3
    else:
        assert counts["decompressed"] >= 10 and counts["drop_malformed"] >= len(MALFORMED)


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_pass_through_and_board_frames(direction):
    counts = check(direction, pass_cases(direction), seed=2)
    assert counts["passed"] >= len(PASS_THROUGH) - 1


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_bad_frames_then_good_ones(direction):
    counts = check(direction, bad_cases(), seed=3, p_idle=0, gap=(0, 0), p_ready=1)
    assert counts["drop_fcs"] == 2 and counts["drop_runt"] == 2 \
        and counts["drop_oversize"] == 1


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_back_to_back(direction):
    """No idle cycle between frames or beats, output back-pressure; frames of every kind."""
    rng = random.Random(4)
    cases = gradient_cases(direction, mtu=False)[:8] + pass_cases(direction)[:8]
    rng.shuffle(cases)
    check(direction, cases, seed=4, p_idle=0, gap=(0, 0), p_ready=0.8)


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_random_frames(direction):
    """The classifier tests' random mix (gradients of random sizes and checksums, mutated
    headers, cut frames, padding, ARP, frames for the board, bad FCS)."""
    rng = random.Random(8 + DIRECTIONS[direction])
    # (a jumbo gradient takes about two cycles a word, the NIC path then out, as long as it
    # takes to arrive at line rate: one after another would fill the store)
    cases = spaced([(f"random {n}", random_frame(rng)) for n in range(40)], 3000)
    counts = check(direction, cases, seed=9, p_ready=0.9)
    assert counts["passed"] and counts["drop_fcs"] + counts["drop_runt"]


def test_jumbo_passes():
    check("tx", [("jumbo", frame(PASS_THROUGH["jumbo"])),
                 ("after it", frame(gradient(raw_packet(SPECIALS, 7))))], seed=5, p_idle=0)


def test_back_to_back_jumbos_at_line_rate():
    """Jumbo frames (9014 bytes) back to back at 1 GbE, in and out: the store holds one and
    the start of the next, so each word must be free once read, not once its frame is done.
    None is dropped (``drop_full`` 0), all pass exact."""
    jumbo = frame(PASS_THROUGH["jumbo"])
    assert len(jumbo) - FCS_BYTES == MAX_BODY_BYTES
    counts = check("tx", [(f"jumbo {n}", jumbo) for n in range(3)], seed=10, gap=(0, 0),
                   line_rate=True)
    assert counts["passed"] == counts["frames_out"] == 3 and counts["drop_full"] == 0


def test_jumbo_then_minimum_frames_at_line_rate():
    """A jumbo frame (9014 bytes) and then minimum frames (60), back to back at 1 GbE in and
    out: the frames that arrive while the jumbo goes out (some 108 of them on a real wire,
    preamble and gap included) wait in the store, each in a descriptor slot of its own, and
    fit in its words. None is dropped (``drop_full`` 0), all pass exact."""
    jumbo = frame(PASS_THROUGH["jumbo"])
    smalls = [(f"minimum {n}", body_of(60)) for n in range(120)]
    counts = check("tx", [("jumbo", jumbo)] + smalls, seed=11, gap=(0, 0), line_rate=True)
    assert counts["passed"] == counts["frames_out"] == 121 and counts["drop_full"] == 0


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_full_store_drops_and_recovers(direction):
    """The output held back: frames that find no room in a small store are dropped whole
    and counted (``drop_full``), whatever their size; later frames come through exact. (An
    output FIFO of 8 words: a bigger one would take words of the first frame off the store
    while the output waits.)"""
    store_words, slots = 1024, 4
    filler = [(f"big {n}", body_of(1514)) for n in range(3)] \
        + [("jumbo", frame(PASS_THROUGH["jumbo"]))] \
        + [(f"small {n}", body_of(100)) for n in range(5)]
    later = gradient_cases(direction, mtu=False)[:6] + pass_cases(direction)[:3]
    # which fillers fit: words and descriptor slots, none freed while the output waits
    used, kept = 0, []
    for case in filler:
        words = -(-(len(case[1]) - FCS_BYTES) // 4)
        if used + words <= store_words and len(kept) < slots:
            used += words
            kept.append(case)
    assert 2 <= len(kept) < len(filler)
    hold = 6000                       # cycles: every filler arrives before the output moves
    assert sum(len(c[1]) // 4 + 3 for c in filler) < hold
    want_frames, want_counts = golden(direction, kept + later)
    want_counts["frames_in"] += len(filler) - len(kept)
    want_counts["drop_full"] = len(filler) - len(kept)
    got_frames, got_counts = simulate(
        # (later frames spaced out: four slots do not absorb back-to-back gradients)
        direction, filler + [("pause", hold)] + [c for case in later for c in
                                                  (case, ("pause", 300))], seed=6, p_idle=0,
        gap=(0, 2),
        hold=hold, path_args={"store_bytes": 4 * store_words, "frames": slots, "out_words": 8})
    assert got_counts == want_counts
    assert got_frames == want_frames


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_elaborates_to_verilog(direction):
    dut = WirePath(direction=direction, store_bytes=4096, max_count=64)
    ports = [dut.i.valid, dut.i.p.as_value(), dut.o.valid, dut.o.ready, dut.o.p.as_value(),
             dut.nic_in.valid, dut.nic_in.ready, dut.nic_in.p.as_value(), dut.nic_out.valid,
             dut.nic_out.p.as_value(), dut.nic_dropped, dut.events.as_value()]
    assert "module wire_path" in verilog.convert(dut, name="wire_path", ports=ports)


@pytest.mark.parametrize("kwargs, match", [
    ({"direction": "up"}, "direction"),
    ({"direction": "tx", "store_bytes": 2048}, "store_bytes"),
    ({"direction": "tx", "store_bytes": 5000}, "store_bytes"),
    ({"direction": "rx", "frames": 1}, "frames"),
    ({"direction": "rx", "out_words": 7}, "out_words"),
    ({"direction": "rx", "max_count": 0}, "max_count"),
    ({"direction": "rx", "max_count": 4096}, "max_count"),
    ({"direction": "tx", "gradient_port": 0}, "gradient_port"),
])
def test_parameters_checked(kwargs, match):
    with pytest.raises(ValueError, match=match):
        WirePath(**kwargs)


def output_starts(direction, cases, **kwargs):
    """The frames out and the cycle each starts at, input and output at 1 GbE."""
    outs = []
    frames, counts = simulate(direction, cases, seed=3, gap=(0, 0), line_rate=True,
                              watch=lambda cycle, beat, out: out and outs.append(cycle),
                              **kwargs)
    starts, word = [], 0
    for data in frames:
        starts.append(outs[word])
        word += -(-len(data) // BEAT_BYTES)
    return frames, counts, starts


def test_decompressed_mtu_at_line_rate():
    """Back-to-back compressed MTU datagrams (360 values, k=10) at 1 GbE in, decompressed
    to 1514-byte frames that leave back to back: each starts two clocks a word after the one
    before (the MAC's pace), the next datagram's NIC turn hidden behind the wire time. With
    an 8-word output FIFO they left 940 clocks apart, 0.82 of the line rate."""
    rng = np.random.default_rng(17)
    cases = [(f"g{n}", frame(gradient(inc_packet(values(rng, 360), 10)))) for n in range(6)]
    frames, counts, starts = output_starts("rx", cases)
    assert counts["decompressed"] == len(frames) == 6
    words = -(-len(frames[0]) // BEAT_BYTES)
    assert all(b - a == 2 * words for a, b in zip(starts[1:], starts[2:])), starts


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_small_frames_behind_gradients_at_line_rate(direction):
    """Minimum-size frames at 1 GbE behind an MTU gradient datagram in the NIC path: they
    wait in the store, all exact against the golden wire (with 16 descriptor slots and an
    8-word output FIFO, 12 (tx) and 38 (rx) of these 120 were drop_full)."""
    rng = np.random.default_rng(19)
    cases = []
    for rep in range(2):
        vals = values(rng, 360)
        packet = raw_packet(vals, 10) if direction == "tx" else inc_packet(vals, 10)
        cases.append((f"gradient {rep}", frame(gradient(packet))))
        cases += [(f"small {rep}.{n}", frame(gradient(bytes(18), dport=9)))
                  for n in range(60)]
    counts = check(direction, cases, seed=21, gap=(0, 0), line_rate=True)
    assert counts["drop_full"] == 0 and counts["frames_out"] == 122


def latency(direction, data):
    """Cycles from a frame's last beat in to its first and its last word out, input and
    output never waiting."""
    seen = {"in": None, "out": []}

    def watch(cycle, beat, out):
        if beat is not None:
            seen["in"] = cycle
        if out:
            seen["out"].append(cycle)

    frames, _ = simulate(direction, [("frame", data)], seed=7, p_idle=0, gap=(0, 0),
                         p_ready=1, watch=watch)
    assert len(frames) == 1
    return seen["out"][0] - seen["in"], seen["out"][-1] - seen["in"]


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_mtu_latency(direction):
    """MTU-sized frames, 360 values: store and forward, so a gradient's first word leaves
    once its whole payload has been through the NIC path. Measured, cycles from the frame's
    last beat in to its first / last word out: tx, a 1514-byte frame compressed (k=10): 392 /
    528; rx, its 546-byte INC_F32 frame decompressed to 1514 bytes: 203 / 581; a 1514-byte
    frame passed: 8 / 386. A regression bound, not a contract."""
    rng = np.random.default_rng(13)
    vals = values(rng, 360)
    packet = raw_packet(vals, 10) if direction == "tx" else inc_packet(vals, 10)
    data = frame(gradient(packet))
    first, last = latency(direction, data)
    print(f"{direction} gradient {len(data) - 4} bytes: first word {first}, last {last}")
    passed = frame(gradient(bytes(1472), dport=9))
    pfirst, plast = latency(direction, passed)
    print(f"{direction} passed {len(passed) - 4} bytes: first word {pfirst}, last {plast}")
    assert first < 450 and last < 650 and pfirst < 10 and plast < 400
