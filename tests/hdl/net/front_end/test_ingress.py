"""IngressBuffer: whole datagrams in or none of them, never a stall, never a spill."""
import random

import pytest

from hdl.net.front_end.ingress import IngressBuffer
from tests.amaranth_sim import run, take_items

META = {"ip_address": 0x0A000001, "src_port": 0, "dst_port": 47570, "length": 0}


def wide_beats(payload, tag, *, error=False, drop=False, extra_beats=0, missing_beats=0):
    """A datagram as the Upsizer's 256-bit beats (``WideBeat`` payload dicts)."""
    padded = bytes(payload) + bytes(-len(payload) % 32 or (32 if not payload else 0))
    chunks = [padded[i:i + 32] for i in range(0, len(padded), 32)]
    chunks += [bytes(32)] * extra_beats
    chunks = chunks[:len(chunks) - missing_beats] if missing_beats else chunks
    meta = dict(META, length=len(payload), src_port=tag)
    return [{"data": int.from_bytes(c, "little"), "last": int(n == len(chunks) - 1),
             "error": int(error and n == len(chunks) - 1),
             "drop": int(drop and n == len(chunks) - 1), "meta": meta}
            for n, c in enumerate(chunks)]


def expected_beats(payload, byte_keep=False):
    n = max(1, -(-len(payload) // 32))
    padded = bytes(payload) + bytes(32 * n - len(payload))
    words = -(-len(payload) // 4)
    last_bytes = 4 * (words - 8 * (n - 1)) if not byte_keep else len(payload) - 32 * (n - 1)
    return [(int.from_bytes(padded[32 * b:32 * b + 32], "little"),
             (1 << last_bytes) - 1 if b == n - 1 else (1 << 32) - 1,
             int(b == n - 1), int(b == 0)) for b in range(n)]


def drive(dut, datagrams, rng, *, p_gap=0.0, consumer, hold=None):
    """Feed WideBeat lists at up to one beat per clock (the input never stalls)."""
    events = {"accepted": [], "full": [], "too_long": [], "mismatch": []}
    done = {"input": False}

    async def producer(ctx):
        for tag, beats in datagrams:
            for beat in beats:
                while rng.random() < p_gap:
                    await ctx.tick()
                ctx.set(dut.i.valid, 1)
                ctx.set(dut.i.p, beat)
                await ctx.tick()
                assert ctx.get(dut.i.ready)
            ctx.set(dut.i.valid, 0)
        for _ in range(4):
            await ctx.tick()
        done["input"] = True

    async def watch(ctx):
        # a datagram's event strobe comes EVENT_LATENCY clocks after its last beat went in
        ended = {}
        cycle = 0
        async for _, _, valid, p, accepted, full, too_long, mismatch in ctx.tick().sample(
                dut.i.valid, dut.i.p, dut.events.accepted, dut.events.full,
                dut.events.too_long, dut.events.mismatch):
            for name, strobe in (("accepted", accepted), ("full", full),
                                 ("too_long", too_long), ("mismatch", mismatch)):
                if strobe:
                    events[name].append(ended[cycle - IngressBuffer.EVENT_LATENCY])
            if valid and p.last:
                ended[cycle] = int(p.meta.src_port)
            cycle += 1

    run(dut, producer, consumer(done), background=(watch,))
    return events


def collect_datagrams(beats):
    out, current = [], []
    for data, keep, last, first, src, length in beats:
        current.append((data, keep, last, first))
        if last:
            out.append((src, length, current))
            current = []
    return out


def convert(p):
    return (int(p.data), int(p.keep), int(p.last), int(p.first), int(p.meta.src_port),
            int(p.meta.length))


@pytest.mark.parametrize("seed,p_gap,p_block,byte_keep", [
    (1, 0.0, 0.0, False), (2, 0.5, 0.3, False), (3, 0.0, 0.8, False), (4, 0.2, 0.2, True)])
def test_good_datagrams_pass_whole_bad_ones_vanish(seed, p_gap, p_block, byte_keep):
    rng = random.Random(seed)
    dut = IngressBuffer(depth=64, datagrams=8, byte_keep=byte_keep)
    datagrams, want = [], []
    for tag in range(60):
        payload = bytes(rng.getrandbits(8) for _ in range(rng.choice(
            [0, 1, 3, 4, 31, 32, 33, 64, rng.randint(0, 300)])))
        kind = rng.choice(["good"] * 4 + ["error", "drop"])
        datagrams.append((tag, wide_beats(payload, tag, error=kind == "error",
                                          drop=kind == "drop")))
        if kind == "good":
            want.append((tag, payload))
    got = []

    def consumer(done):
        async def take(ctx):
            beats, idle = [], 0
            while not done["input"] or idle < 64:
                ctx.set(dut.o.ready, rng.random() >= p_block)
                _, _, p, valid, ready = await ctx.tick().sample(dut.o.p, dut.o.valid, dut.o.ready)
                idle = 0 if valid else idle + 1
                if valid and ready:
                    beats.append(convert(p))
            got.extend(collect_datagrams(beats))
        return take

    events = drive(dut, datagrams, rng, p_gap=p_gap, consumer=consumer)
    accepted = set(events["accepted"])
    # Whatever was accepted comes out whole, in order, exact; the rest never.
    expected = [(tag, payload) for tag, payload in want if tag in accepted]
    assert [(src, length) for src, length, _ in got] == \
        [(tag, len(payload)) for tag, payload in expected]
    for (src, length, beats), (tag, payload) in zip(got, expected):
        assert beats == expected_beats(payload, byte_keep), f"datagram {tag}"
    # Each good datagram is counted exactly once; flagged ones not at all.
    counted = sorted(events["accepted"] + events["full"] + events["too_long"]
                     + events["mismatch"])
    assert counted == sorted(tag for tag, _ in want)


def test_full_buffer_drops_whole_datagrams_and_recovers():
    """Reader stalled: the buffer takes what fits (by beats and by queue slots), drops the
    rest whole, then everything taken comes out exact and new datagrams are taken again."""
    rng = random.Random(4)
    depth, queue = 32, 4
    dut = IngressBuffer(depth=depth, datagrams=queue, max_length=600)
    sizes = [200, 300, 10, 500, 100, 0, 40, 33, 601, 64, 64]
    datagrams, payloads = [], {}
    for tag, n in enumerate(sizes):
        payloads[tag] = bytes(rng.getrandbits(8) for _ in range(n))
        datagrams.append((tag, wide_beats(payloads[tag], tag)))
    # The model: reader stalled, so admission is decided by beats and queue slots alone.
    # Once the first datagram is published the reader holds its descriptor and its first
    # two beats (the block RAM's output and the output register), so from the third
    # datagram on there are two more beats and one more slot.
    free, slots, model = depth, queue, {"accepted": [], "full": [], "too_long": []}
    for tag, n in enumerate(sizes):
        beats = max(1, -(-n // 32))
        if tag == 2:
            free, slots = free + 2, slots + 1
        if n > 600:
            model["too_long"].append(tag)
        elif beats <= free and slots:
            model["accepted"].append(tag)
            free, slots = free - beats, slots - 1
        else:
            model["full"].append(tag)
    assert model["full"] and model["accepted"] and model["too_long"]
    after = [(100 + t, wide_beats(payloads[t], 100 + t)) for t in (0, 3)]
    got = []
    phase = {"drained": False}

    def consumer(done):
        async def take(ctx):
            while not done["input"]:
                await ctx.tick()
            beats = await take_items(ctx, dut.o, rng, p_block=0.3, convert=convert,
                                     until=lambda b: b[2] and b[4] == model["accepted"][-1])
            got.extend(collect_datagrams(beats))
            phase["drained"] = True
        return take

    events = drive(dut, datagrams, rng, consumer=consumer)
    assert {k: events[k] for k in model} == model and not events["mismatch"]
    assert [src for src, _, _ in got] == model["accepted"]
    for src, length, beats in got:
        assert beats == expected_beats(payloads[src])

    # afterwards (empty again) the big ones fit
    dut2_events = drive(dut, after, rng, consumer=lambda done: _drain(dut, rng, done, got))
    assert dut2_events["accepted"] == [100, 103]


def _drain(dut, rng, done, got):
    async def take(ctx):
        beats = await take_items(ctx, dut.o, rng, count=sum(
            max(1, -(-n // 32)) for n in (200, 500)), convert=convert)
        got.extend(collect_datagrams(beats))
    return take


def test_datagram_with_the_wrong_beat_count_is_never_published():
    rng = random.Random(5)
    dut = IngressBuffer(depth=64, datagrams=8)
    payload = bytes(range(100))
    datagrams = [(1, wide_beats(payload, 1, extra_beats=1)),
                 (2, wide_beats(payload, 2, missing_beats=1)),
                 (3, wide_beats(payload, 3))]
    got = []

    def consumer(done):
        async def take(ctx):
            got.extend(collect_datagrams(await take_items(ctx, dut.o, rng, convert=convert,
                                                          until=lambda b: b[2])))
            for _ in range(20):
                assert not ctx.get(dut.o.valid)
                await ctx.tick()
        return take

    events = drive(dut, datagrams, rng, consumer=consumer)
    assert events["mismatch"] == [1, 2] and events["accepted"] == [3]
    assert [(src, beats) for src, _, beats in got] == [(3, expected_beats(payload))]


@pytest.mark.parametrize("seed,p_block", [(6, 0.0), (7, 0.6)])
def test_header_of_long_takes_a_long_datagram_as_its_header(seed, p_block):
    """``header_of_long``: a datagram over ``max_length`` (one over the whole buffer too)
    comes out as its first beat with length 32, counted accepted; the rest is exact."""
    rng = random.Random(seed)
    dut = IngressBuffer(depth=8, datagrams=4, max_length=64, header_of_long=True)
    sizes = [10, 65, 64, 1000, 0, 96, 257, 33]
    payloads = {tag: bytes(rng.getrandbits(8) for _ in range(n)) for tag, n in enumerate(sizes)}
    datagrams = [(tag, wide_beats(payloads[tag], tag)) for tag in payloads]
    datagrams.insert(2, (99, wide_beats(bytes(200), 99, error=True)))   # long and flagged
    got = []

    def consumer(done):
        async def take(ctx):
            got.extend(collect_datagrams(await take_items(
                ctx, dut.o, rng, p_block=p_block, convert=convert,
                until=lambda b: b[2] and b[4] == len(sizes) - 1)))
        return take

    events = drive(dut, datagrams, rng, p_gap=0.3, consumer=consumer)
    assert events["accepted"] == list(range(len(sizes)))
    assert not events["too_long"] and not events["full"] and not events["mismatch"]
    for (src, length, beats), (tag, payload) in zip(got, payloads.items(), strict=True):
        kept = payload if len(payload) <= 64 else payload[:32]
        assert (src, length, beats) == (tag, len(kept), expected_beats(kept)), tag


def test_parameters_are_checked():
    with pytest.raises(ValueError, match="power of two"):
        IngressBuffer(depth=48)
    with pytest.raises(ValueError, match="max_length"):
        IngressBuffer(depth=4, max_length=129)
    with pytest.raises(ValueError, match="header_of_long"):
        IngressBuffer(depth=4, max_length=31, header_of_long=True)
    with pytest.raises(ValueError, match="at least 1"):
        IngressBuffer(depth=4, datagrams=0)


def test_a_stored_datagram_leaves_at_a_beat_per_clock():
    """With the reader ready, a published datagram's beats leave one every clock (the block
    RAM's output stage and the output register never bubble inside a datagram; between
    datagrams the next descriptor takes a clock)."""
    rng = random.Random(7)
    dut = IngressBuffer(depth=64, datagrams=8)
    payloads = [bytes(rng.getrandbits(8) for _ in range(n)) for n in (320, 64, 200)]
    beats = [max(1, -(-len(p) // 32)) for p in payloads]
    datagrams = [(tag, wide_beats(p, tag)) for tag, p in enumerate(payloads)]
    trace = []

    def reader(done):
        async def take(ctx):
            ctx.set(dut.o.ready, 0)
            while not done["input"]:        # everything is stored before reading starts
                await ctx.tick()
            ctx.set(dut.o.ready, 1)
            for _ in range(sum(beats) + 16):
                trace.append((ctx.get(dut.o.valid), ctx.get(dut.o.p.last)))
                await ctx.tick()
        return take

    drive(dut, datagrams, rng, consumer=reader)
    runs, current, gaps, gap = [], 0, [], 0
    for valid, last in trace:
        if valid:
            if current == 0 and runs:
                gaps.append(gap)
            current, gap = current + 1, 0
            if last:
                runs.append(current)
                current = 0
        elif current:
            runs.append(-current)        # a bubble inside a datagram
            current = 0
        else:
            gap += 1
    assert runs == beats and gaps == [1, 1], (runs, gaps)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_hold_reads_a_datagram_again_or_frees_it_as_told(seed):
    """``hold``: each reading of a datagram waits for ``again`` (the same datagram from its
    first beat, as often as told) or ``release`` (the next one). Its beats stay taken until
    the release, so what arrives meanwhile is admitted only where it fits beside it (else
    dropped whole, counted ``full``), and no held beat is ever overwritten."""
    rng = random.Random(seed)
    dut = IngressBuffer(depth=16, datagrams=4, byte_keep=True, hold=True)
    sizes = [rng.choice([1, 31, 32, 33, 100, 200, 480]) for _ in range(16)]
    payloads = [bytes(rng.getrandbits(8) for _ in range(n)) for n in sizes]
    readings = [rng.randint(1, 3) for _ in payloads]     # then released
    got, count = [], [0] * len(payloads)

    def reader(done):
        async def take(ctx):
            current, idle = [], 0
            while idle < 300:
                idle = idle + 1 if done["input"] else 0
                ctx.set(dut.o.ready, rng.random() < 0.7)
                _, _, valid, ready, p = await ctx.tick().sample(dut.o.valid, dut.o.ready,
                                                               dut.o.p)
                if not (valid and ready):
                    continue
                idle = 0
                current.append(convert(p))
                if p.last:
                    (tag, length, beats), = collect_datagrams(current)
                    current = []
                    got.append((tag, length, beats))
                    count[tag] += 1
                    ctx.set(dut.o.ready, 0)
                    for _ in range(rng.randrange(4)):        # a few clocks later
                        await ctx.tick()
                    strobe = dut.again if count[tag] < readings[tag] else dut.release
                    ctx.set(strobe, 1)
                    await ctx.tick()
                    ctx.set(strobe, 0)
        return take

    datagrams = [(tag, wide_beats(p, tag)) for tag, p in enumerate(payloads)]
    events = drive(dut, datagrams, rng, consumer=reader)
    assert sorted(events["accepted"] + events["full"]) == list(range(len(payloads))), events
    assert events["full"] and len(events["accepted"]) >= 3, events
    want = [(tag, len(payloads[tag]), expected_beats(payloads[tag], byte_keep=True))
            for tag in events["accepted"] for _ in range(readings[tag])]
    assert got == want
