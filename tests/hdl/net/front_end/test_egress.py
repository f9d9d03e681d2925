"""EgressBuffer: engine output packets stored whole (or dropped whole), sent as words, replayed."""
import random

import pytest

from hdl.net.front_end.egress import EgressBuffer
from hdl.net.front_end.layouts import ReplyTag
from tests.amaranth_sim import run


def packet_beats(words):
    """An engine output packet of 32-bit ``words`` as AXI beats (keep whole words)."""
    beats = []
    n = max(1, -(-len(words) // 8))
    for b in range(n):
        chunk = words[8 * b:8 * b + 8]
        data = sum(w << (32 * j) for j, w in enumerate(chunk))
        beats.append({"data": data, "keep": (1 << (4 * len(chunk))) - 1,
                      "last": int(b == n - 1)})
    return beats


def bench(dut, packets, rng, *, p_gap, p_block, replays=None, hold_output=0, gap_between=0):
    """Feed ``packets`` (tag, words) at up to one beat per clock; collect words as
    (tag, length, [words]) per sent packet; ``replays[tag]`` extra sends of that packet."""
    replays = dict(replays or {})
    sent, events = [], {"stored": [], "full": []}
    state = {"input_done": False}

    async def producer(ctx):
        for tag, words in packets:
            for beat in packet_beats(words):
                while rng.random() < p_gap:
                    ctx.set(dut.i.valid, 0)
                    await ctx.tick()
                ctx.set(dut.i.valid, 1)
                ctx.set(dut.i.p, beat)
                ctx.set(dut.tag, {"ip_address": tag, "src_port": 7, "dst_port": 9})
                await ctx.tick()
                assert ctx.get(dut.i.ready)
            ctx.set(dut.i.valid, 0)
            for _ in range(gap_between):
                await ctx.tick()
        state["input_done"] = True

    async def consumer(ctx):
        for _ in range(hold_output):
            await ctx.tick()
        current, idle = [], 0
        while not state["input_done"] or idle < 100:
            ctx.set(dut.o.ready, rng.random() >= p_block)
            tag = int(ctx.get(dut.o.p.tag.ip_address))
            ctx.set(dut.replay, replays.get(tag, 0) > 0)
            _, _, p, valid, ready = await ctx.tick().sample(dut.o.p, dut.o.valid, dut.o.ready)
            idle = 0 if valid else idle + 1
            if valid and ready:
                current.append(int(p.data))
                if p.last:
                    t = int(p.tag.ip_address)
                    assert (int(p.tag.src_port), int(p.tag.dst_port)) == (7, 9)
                    sent.append((t, int(p.length), current))
                    if replays.get(t, 0) > 0:
                        replays[t] -= 1
                    current = []

    async def watch(ctx):
        tags = []
        async for _, _, valid, last, tag, stored, full in ctx.tick().sample(
                dut.i.valid, dut.i.p.last, dut.tag.ip_address, dut.events.stored,
                dut.events.full):
            if stored:
                events["stored"].append(tags[-1])
            if full:
                events["full"].append(tags[-1])
            if valid and last:
                tags.append(int(tag))

    run(dut, producer, consumer, background=(watch,))
    return sent, events


def check_sent(sent, packets, expect):
    words_of = dict(packets)
    assert [t for t, _, _ in sent] == expect
    for t, length, words in sent:
        want = words_of[t] or [None]
        assert length == 4 * len(words_of[t]), t
        assert len(words) == len(want), t
        if words_of[t]:
            assert words == want, t


@pytest.mark.parametrize("seed,p_gap,p_block", [(1, 0.0, 0.0), (2, 0.3, 0.5), (3, 0.7, 0.1)])
def test_packets_leave_as_words_exact_and_in_order(seed, p_gap, p_block):
    rng = random.Random(seed)
    packets = [(t, [rng.getrandbits(32) for _ in range(rng.choice([0, 1, 7, 8, 9, 16, 17,
                                                                   rng.randint(0, 80)]))])
               for t in range(40)]
    dut = EgressBuffer(depth=256, packets=64, tag_shape=ReplyTag)
    sent, events = bench(dut, packets, rng, p_gap=p_gap, p_block=p_block)
    assert events == {"stored": list(range(40)), "full": []}
    check_sent(sent, packets, list(range(40)))


def test_full_buffer_drops_whole_packets_and_recovers():
    """The transmit path is held: packets that fit are stored, the rest dropped whole (by
    beats or by descriptor slots); after it drains, everything stored leaves exact."""
    rng = random.Random(4)
    sizes = [60, 60, 10, 100, 0, 8, 8, 30, 9]        # words; depth 32 beats, 4 slots
    packets = [(t, [rng.getrandbits(32) for _ in range(n)]) for t, n in enumerate(sizes)]
    free, slots, stored = 32, 4, []
    for t, n in enumerate(sizes):
        beats = max(1, -(-n // 8))
        if beats <= free and slots:
            stored.append(t)
            free, slots = free - beats, slots - 1
    dut = EgressBuffer(depth=32, packets=4, tag_shape=ReplyTag)
    sent, events = bench(dut, packets, rng, p_gap=0.0, p_block=0.2, hold_output=400)
    # the reader holds nothing back here: descriptors and beats stay until sent
    assert events["stored"] == stored
    assert events["full"] == [t for t in range(len(sizes)) if t not in stored]
    check_sent(sent, packets, stored)

    # the drained buffer takes the same packets again
    sent, events = bench(dut, packets[:3], rng, p_gap=0.0, p_block=0.0)
    assert events["stored"] == [0, 1, 2]


def test_replay_sends_one_stored_packet_many_times():
    rng = random.Random(5)
    packets = [(t, [rng.getrandbits(32) for _ in range(n)]) for t, n in
               enumerate([72, 3, 0, 17])]
    dut = EgressBuffer(depth=64, packets=8, tag_shape=ReplyTag)
    sent, events = bench(dut, packets, rng, p_gap=0.2, p_block=0.3,
                         replays={0: 3, 2: 1, 3: 31})
    check_sent(sent, packets, [0] * 4 + [1] + [2] * 2 + [3] * 32)
    assert events["full"] == []


def test_parameters_are_checked():
    with pytest.raises(ValueError, match="power of two"):
        EgressBuffer(depth=4096, tag_shape=ReplyTag)
    with pytest.raises(ValueError, match="at least 1"):
        EgressBuffer(depth=4, packets=0, tag_shape=ReplyTag)
