# amaranth: UnusedElaboratable=no
"""Amaranth-simulator unit tests of the NIC sub-blocks, against the golden model.

Lane encoder/decoder over every class boundary (and exhaustively over the 8-bit codes),
block packer, bit accumulator and unpacker with random stalls on both sides, plus a short
end-to-end run of each engine. The full engines are checked on Verilator in
``tests/test_nic_cocotb.py``.
"""
import random

import numpy as np
import pytest
from amaranth import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from hdl.stream.axis import AxisBeat
from hdl.nic.bit_accumulator import BitAccumulator, BlockRotator
from hdl.nic.block_packer import BlockItem, BlockPacker
from hdl.nic.compressor import Compressor
from hdl.nic.decompressor import Decompressor, PacketBuffer, buffer_depth
from hdl.nic.lane_decoder import LaneDecoder
from hdl.nic.lane_encoder import TAG_BYTES, LaneEncoder
from hdl.nic.unpacker import End, Unpacker
from host.golden.inceptionn import codes, decode, encode, nic_rx, nic_tx
from contract.header import Flags, Header, PacketType
from contract.packet import Packet
from sim.nic_stimulus import gradient_words, nasty_words, random_words, raw_words, tx_packet

LANES = 8


# -- helpers ---------------------------------------------------------------------------------

def run_stream(dut, inputs, set_input, collect, expected_outputs, *, seed, p_stall=0.3,
               p_block=0.3, extra=None, timeout_cycles=200000):
    """Drive ``inputs`` into ``dut.i`` (idle cycles with probability ``p_stall``) and collect
    from ``dut.o`` (not ready with probability ``p_block``) until ``expected_outputs`` items."""
    rng = random.Random(seed)
    got = []

    async def producer(ctx):
        for item in inputs:
            while rng.random() < p_stall:
                await ctx.tick()
            ctx.set(dut.i.valid, 1)
            set_input(ctx, item)
            await ctx.tick().until(dut.i.ready)
            ctx.set(dut.i.valid, 0)

    async def consumer(ctx):
        cycles = 0
        while len(got) < expected_outputs:
            ctx.set(dut.o.ready, rng.random() >= p_block)
            _, _, payload, valid, ready = await ctx.tick().sample(dut.o.p, dut.o.valid,
                                                                  dut.o.ready)
            if valid and ready:
                got.append(collect(payload))
            cycles += 1
            assert cycles < timeout_cycles, "no progress: the engine hangs"

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(producer)
    sim.add_testbench(consumer)
    if extra:
        sim.add_testbench(extra, background=True)
    sim.run()
    return got


def comb_eval(dut, cases, apply, read):
    """Evaluate a combinational component on every case; return the outputs."""
    results = []

    async def bench(ctx):
        for case in cases:
            apply(ctx, case)
            await ctx.delay(1e-9)
            results.append(read(ctx))

    sim = Simulator(dut)
    sim.add_testbench(bench)
    sim.run()
    return results


def stream_bytes(tags, code_words):
    """A bitstream built directly from tags and codes (8 lanes per block), for golden decode."""
    out = bytearray()
    for b in range(0, len(tags), LANES):
        block_tags, block_codes = tags[b:b + LANES], code_words[b:b + LANES]
        out += int(sum(int(t) << 2 * j for j, t in enumerate(block_tags))).to_bytes(2, "little")
        for t, c in zip(block_tags, block_codes):
            out += int(c).to_bytes(4, "little")[:TAG_BYTES[int(t)]]
    out += bytes(-len(out) % 4)
    return bytes(out)


def beat_words(beat_data):
    return [(int(beat_data) >> (32 * j)) & 0xFFFFFFFF for j in range(LANES)]


def packet_beats(packet):
    return [{"data": d, "keep": k, "last": int(last)} for d, k, last in packet.to_beats()]


def collect_axis(payload):
    return int(payload.data), int(payload.keep), int(payload.last)


def reassemble(beats):
    """Packets (as bytes, kept bytes only) from collected ``(data, keep, last)`` beats."""
    packets, current = [], b""
    for data, keep, last in beats:
        raw = data.to_bytes(32, "little")
        current += bytes(raw[i] for i in range(32) if keep >> i & 1)
        if last:
            packets.append(current)
            current = b""
    return packets


# -- lane encoder ----------------------------------------------------------------------------

@pytest.mark.parametrize("k", range(1, 16))
def test_lane_encoder_matches_golden(k):
    rng = np.random.default_rng(k)
    words = np.concatenate([nasty_words(k), random_words(rng, 300),
                            gradient_words(rng, 300, scale=2.0 ** -k)])
    want_tags, want_codes = codes(words, k)
    dut = LaneEncoder()

    def apply(ctx, word):
        ctx.set(dut.value, int(word))
        ctx.set(dut.k, k)

    got = comb_eval(dut, words, apply, lambda ctx: (ctx.get(dut.code.tag),
                                                    ctx.get(dut.code.payload),
                                                    ctx.get(dut.code.width)))
    for word, tag, code, (g_tag, g_payload, g_width) in zip(words, want_tags, want_codes, got):
        assert (g_tag, g_payload, g_width) == (tag, code, TAG_BYTES[int(tag)]), \
            f"k={k} word {int(word):#010x}: got tag {g_tag} payload {g_payload:#x} width " \
            f"{g_width}, golden tag {tag} code {int(code):#x}"
    # every class occurs, so the comparison covers all four branches
    assert set(int(t) for t in want_tags) == ({0, 1, 3} if k <= 7 else {0, 1, 2, 3})


# -- lane decoder ----------------------------------------------------------------------------

def decoder_cases(k, rng):
    """(tag, code) pairs: every 8-bit code, a spread of 16-bit codes (each leading-one
    position with several low patterns, both signs), random raw words, tag 00."""
    cases = [(1, c) for c in range(256)]
    p16 = {0, 1, 0x7FFF} | {(1 << lead) | low for lead in range(15)
                            for low in (0, (1 << lead) - 1, int(rng.integers(0, 1 << 15)) & ((1 << lead) - 1))}
    cases += [(2, (s << 15) | p) for p in sorted(p16) for s in (0, 1)]
    cases += [(3, int(w)) for w in random_words(rng, 40)] + [(3, int(w)) for w in nasty_words(k)]
    cases += [(0, 0)] * 8
    return cases


@pytest.mark.parametrize("k", [1, 2, 7, 8, 10, 15])
def test_lane_decoder_matches_golden(k):
    rng = np.random.default_rng(100 + k)
    cases = decoder_cases(k, rng)
    cases += [(0, 0)] * (-len(cases) % LANES)
    tags = np.array([t for t, _ in cases], dtype=np.uint8)
    code_words = np.array([c for _, c in cases], dtype=np.uint32)
    want = decode(stream_bytes(tags, code_words), len(cases), k).view(np.uint32)
    dut = LaneDecoder()

    def apply(ctx, case):
        ctx.set(dut.tag, case[0])
        ctx.set(dut.payload, case[1])
        ctx.set(dut.k, k)

    got = comb_eval(dut, cases, apply, lambda ctx: ctx.get(dut.value))
    for (tag, code), g, w in zip(cases, got, want):
        assert g == int(w), f"k={k} tag {tag} code {code:#x}: got {g:#010x}, golden {int(w):#010x}"


def test_lane_encoder_decoder_idempotent():
    """Decoding then encoding again gives the same codes (the spec's idempotence)."""
    k = 9
    rng = np.random.default_rng(5)
    words = np.concatenate([nasty_words(k), random_words(rng, 200)])
    tags, code_words = codes(words, k)
    dec = LaneDecoder()

    def apply(ctx, case):
        ctx.set(dec.tag, int(case[0]))
        ctx.set(dec.payload, int(case[1]))
        ctx.set(dec.k, k)

    decoded = comb_eval(dec, list(zip(tags, code_words)), apply, lambda ctx: ctx.get(dec.value))
    tags2, codes2 = codes(np.array(decoded, dtype=np.uint32), k)
    keep = tags != 0   # tag 00 decodes to +0.0, which encodes to tag 00 again
    assert np.array_equal(tags2, tags) and np.array_equal(codes2[keep], code_words[keep])


# -- block packer ----------------------------------------------------------------------------

def encoded_beats(words, k):
    """EncodedBeat payloads for the packer, from golden codes."""
    tags, code_words = codes(words, k)
    beats = []
    for b in range(0, words.size, LANES):
        n = min(LANES, words.size - b)
        lanes = []
        for j in range(LANES):
            t = int(tags[b + j]) if j < n else 0
            c = int(code_words[b + j]) if j < n else 0
            lanes.append({"tag": t, "payload": c, "width": TAG_BYTES[t]})
        beats.append({"lanes": lanes, "raw": 0, "empty": 0, "keep": 0, "last": 0})
    return beats


@pytest.mark.parametrize("seed", [1, 2])
def test_block_packer_blocks_match_golden(seed):
    rng = np.random.default_rng(seed)
    k = 10
    words = np.concatenate([gradient_words(rng, 200, 1e-3), raw_words(rng, 40),
                            np.zeros(24, dtype=np.uint32), nasty_words(k), random_words(rng, 5)])
    beats = encoded_beats(words, k)
    raw_word = [int(w) for w in random_words(rng, 8)]
    beats.insert(3, {"lanes": [{"tag": 3, "payload": w, "width": 4} for w in raw_word],
                     "raw": 1, "empty": 0, "keep": 0xFFF, "last": 1})
    dut = BlockPacker()
    got = run_stream(dut, beats, lambda ctx, b: ctx.set(dut.i.p, b),
                     lambda p: (int(p.bits), int(p.width), int(p.raw), int(p.keep), int(p.last)),
                     len(beats), seed=seed)
    values = [words[b:b + LANES] for b in range(0, words.size, LANES)]
    values.insert(3, None)
    for i, ((bits, width, raw, keep, last), v) in enumerate(zip(got, values)):
        if v is None:
            assert (raw, keep, last, width) == (1, 0xFFF, 1, 32)
            assert bits & ((1 << 256) - 1) == sum(w << 32 * j for j, w in enumerate(raw_word))
            continue
        want = encode(v, k)   # one block, padded to 32 bits
        block = bits.to_bytes(34, "little")[:width]
        assert want[:width] == block and not any(want[width:]), f"block {i}"
        assert len(want) == -(-width // 4) * 4
        assert bits >> (8 * width) == 0, "bits above the block width must be zero"


# -- bit accumulator -------------------------------------------------------------------------

class RotateAndAccumulate(wiring.Component):
    """BlockRotator then BitAccumulator, joined by the stream handshake (in the compressor a
    credit buffer sits between them; here the rotator waits for the accumulator)."""
    i: In(stream.Signature(BlockItem))
    o: Out(stream.Signature(AxisBeat))

    def elaborate(self, platform):
        m = Module()
        m.submodules.rotate = rotate = BlockRotator()
        m.submodules.accumulate = accumulate = BitAccumulator()
        wiring.connect(m, wiring.flipped(self.i), rotate.i)
        wiring.connect(m, rotate.o, accumulate.i)
        wiring.connect(m, accumulate.o, wiring.flipped(self.o))
        return m


@pytest.mark.parametrize("seed,p_stall,p_block", [(1, 0.3, 0.3), (2, 0.0, 0.6), (3, 0.6, 0.0)])
def test_bit_accumulator_packs_blocks(seed, p_stall, p_block):
    """Random-length blocks (2..34 bytes, plus raw beats) concatenate into whole words."""
    rng = random.Random(seed)
    packets = []
    for _ in range(12):
        if rng.random() < 0.2:   # a raw packet with its own last tkeep
            n = rng.randint(1, 4)
            items = [(rng.getrandbits(256), 32, 1, 0) for _ in range(n)]
            keep = (1 << 4 * rng.randint(1, 8)) - 1
            packets.append((items, keep))
            continue
        items = [(rng.getrandbits(256), 32, 1, 0)]    # header
        for _ in range(rng.randint(0, 30)):
            width = rng.choice([2, 3, 10, 18, 31, 32, 33, 34, rng.randint(2, 34)])
            items.append((rng.getrandbits(8 * width), width, 0, 0))
        packets.append((items, None))
    inputs, expected = [], []
    for items, keep in packets:
        for i, (bits, width, raw, _) in enumerate(items):
            last = i == len(items) - 1
            inputs.append({"bits": bits, "width": width, "raw": raw,
                           "keep": keep if (keep and last) else 0xFFFFFFFF, "last": last})
        if keep is not None:
            data = b"".join(b.to_bytes(32, "little") for b, *_ in items)
            expected.append(data[:len(data) - 32 + keep.bit_length()])
        else:
            stream = items[0][0].to_bytes(32, "little") + \
                b"".join(b.to_bytes(w, "little") for b, w, *_ in items[1:])
            expected.append(stream + bytes(-len(stream) % 4))
    beats_out = sum(-(-len(e) // 32) for e in expected)
    dut = RotateAndAccumulate()
    got = run_stream(dut, inputs, lambda ctx, x: ctx.set(dut.i.p, x), collect_axis, beats_out,
                     seed=seed, p_stall=p_stall, p_block=p_block)
    assert reassemble(got) == expected


# -- unpacker --------------------------------------------------------------------------------

def unpacker_expectation(packet):
    """Items the unpacker must emit for an INC_F32 packet: (kind, bytes, last, end)."""
    h = packet.header
    out, cause = nic_rx(packet)
    items = [("raw", h.replace(type=PacketType.RAW_F32).pack())]
    if cause != "decompressed":
        return items, cause
    data, pos = packet.payload, 0
    for b in range(-(-h.count // LANES)):
        lanes = min(LANES, h.count - LANES * b)
        tags = int.from_bytes(data[pos:pos + 2], "little") & ((1 << 2 * lanes) - 1)
        width = 2 + sum(TAG_BYTES[(tags >> 2 * j) & 3] for j in range(LANES))
        items.append(("block", tags.to_bytes(2, "little") + data[pos + 2:pos + width]))
        pos += width
    return items, cause


@pytest.mark.parametrize("seed,p_stall,p_block", [(1, 0.3, 0.3), (2, 0.0, 0.0), (3, 0.5, 0.2)])
def test_unpacker_cuts_golden_blocks(seed, p_stall, p_block):
    rng = np.random.default_rng(seed)
    packets = []
    for i in range(14):
        k = int(rng.integers(1, 16))
        n = int(rng.choice([0, 1, 7, 8, 9, 40, 129, 300]))
        words = [gradient_words(rng, n, 1e-2), raw_words(rng, n), random_words(rng, n)][i % 3]
        good, _ = nic_tx(tx_packet(words, k))
        variant = i % 5
        if variant == 3 and good.payload:      # truncated
            good = Packet(good.header, good.payload[:-4])
        elif variant == 4:                       # over-long
            good = Packet(good.header, good.payload + bytes(4 * int(rng.integers(1, 10))))
        packets.append(good)
    bypass = Packet(Header(type=PacketType.AGG_OR32, count=5), bytes(range(20)))
    packets.insert(2, bypass)

    inputs, expected = [], []
    for p in packets:
        is_bypass = p is bypass
        for beat in packet_beats(p):
            inputs.append({**beat, "bypass": int(is_bypass)})
        if is_bypass:
            expected.append(("bypass", p))
        else:
            expected.append(unpacker_expectation(p))
    verdicts = []
    dut = Unpacker(max_count=2048)

    async def watch_events(ctx):
        async for _, _, dec, trunc, over in ctx.tick().sample(dut.events.decompressed,
                                                              dut.events.drop_truncated,
                                                              dut.events.drop_overlong):
            for name, strobe in (("decompressed", dec), ("drop_truncated", trunc),
                                 ("drop_overlong", over)):
                if strobe:
                    verdicts.append(name)

    # Items: each packet ends with a COMMIT or REWIND; count them to know when to stop.
    items = []
    rng_py = random.Random(seed)

    async def producer(ctx):
        for item in inputs:
            while rng_py.random() < p_stall:
                await ctx.tick()
            ctx.set(dut.i.valid, 1)
            ctx.set(dut.i.p, item)
            await ctx.tick().until(dut.i.ready)
            ctx.set(dut.i.valid, 0)

    async def consumer(ctx):
        ends = 0
        wanted = sum(len(packet_beats(p)) if p is bypass else 1 for p in packets)
        cycles = 0
        while ends < wanted:
            ctx.set(dut.o.ready, rng_py.random() >= p_block)
            _, _, payload, valid, ready = await ctx.tick().sample(dut.o.p, dut.o.valid,
                                                                  dut.o.ready)
            cycles += 1
            assert cycles < 100000, "unpacker hangs"
            if valid and ready:
                items.append((int(payload.bits), int(payload.raw), int(payload.write),
                              int(payload.keep), int(payload.last), End(payload.end)))
                if items[-1][5] != End.NONE:
                    ends += 1

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(producer)
    sim.add_testbench(consumer)
    sim.add_testbench(watch_events, background=True)
    sim.run()

    # Split the item stream per packet and compare.
    position = 0
    for p, want in zip(packets, expected):
        if want[0] == "bypass":
            for beat in packet_beats(p):
                bits, raw, write, keep, last, end = items[position]
                assert (raw, write, keep, last, end) == (1, 1, beat["keep"], beat["last"],
                                                         End.COMMIT)
                assert bits & ((1 << 256) - 1) == beat["data"]
                position += 1
            continue
        want_items, cause = want
        mine = []
        while True:
            mine.append(items[position])
            position += 1
            if mine[-1][5] != End.NONE:
                break
        final_end = mine[-1][5]
        assert final_end == (End.COMMIT if cause == "decompressed" else End.REWIND), \
            f"{p}: verdict {final_end}, golden {cause}"
        if cause != "decompressed":
            continue
        written = [x for x in mine if x[2]]
        assert len(written) == len(want_items), p
        header_bits = written[0][0] & ((1 << 256) - 1)
        assert header_bits.to_bytes(32, "little") == want_items[0][1]
        for (bits, raw, _, keep, last, _), (_, block) in zip(written[1:], want_items[1:]):
            assert raw == 0
            assert bits.to_bytes(34, "little")[:len(block)] == block
        lanes_last = p.header.count % LANES or LANES
        assert written[-1][3] == ((1 << 4 * lanes_last) - 1 if p.header.count else 0xFFFFFFFF)
        assert written[-1][4] == 1
    assert position == len(items)
    golden_verdicts = [nic_rx(p)[1] for p in packets if p is not bypass]
    assert verdicts == golden_verdicts


# -- packet buffer ---------------------------------------------------------------------------

def test_packet_buffer_commit_and_rewind():
    """Committed packets come out in order; rewound ones never appear; full buffer stalls."""
    rng = random.Random(7)
    depth = 16
    items, expected = [], []
    for p in range(40):
        beats = rng.randint(1, 12)
        good = rng.random() < 0.6
        datas = [rng.getrandbits(256) for _ in range(beats)]
        for b, d in enumerate(datas):
            last = b == beats - 1
            end = (End.COMMIT if good else End.REWIND) if last else End.NONE
            items.append({"data": d, "keep": 0xFFFFFFFF, "last": last, "write": 1,
                          "end": end})
        if rng.random() < 0.2:   # a verdict-only item after a packet changes nothing
            items.append({"data": 0, "keep": 0, "last": 0, "write": 0, "end": End.COMMIT})
        if good:
            expected += [(d, 0xFFFFFFFF, int(b == beats - 1)) for b, d in enumerate(datas)]
    dut = PacketBuffer(depth=depth)
    got = run_stream(dut, items, lambda ctx, x: ctx.set(dut.i.p, x), collect_axis,
                     len(expected), seed=7, p_stall=0.2, p_block=0.4)
    assert got == expected


def test_parameters_are_checked():
    with pytest.raises(ValueError, match="power of two"):
        PacketBuffer(depth=12)
    with pytest.raises(ValueError, match="headroom"):
        PacketBuffer(depth=8, headroom=8)
    with pytest.raises(ValueError, match="max_count"):
        Decompressor(max_count=0)
    with pytest.raises(TypeError, match="max_count"):
        Unpacker(max_count=2.5)
    assert buffer_depth(2048) == 512


# -- engines end to end (short; the long runs are on Verilator) ------------------------------

def test_compressor_end_to_end():
    rng = np.random.default_rng(11)
    packets = [tx_packet(gradient_words(rng, n, 1e-3), k) for n, k in ((0, 3), (1, 15), (13, 10))]
    packets += [tx_packet(raw_words(rng, 17), 5),
                Packet(Header(type=PacketType.AGG_ADD_I32, count=3), bytes(12)),
                tx_packet(random_words(rng, 9), 0),                       # bad k
                tx_packet(random_words(rng, 9), 4).__class__(              # length mismatch
                    Header(type=0, flags=Flags.COMPRESS, k=4, count=7), bytes(36))]
    inputs = [b for p in packets for b in packet_beats(p)]
    expected = [nic_tx(p)[0].to_bytes() for p in packets]
    dut = Compressor()
    got = run_stream(dut, inputs, lambda ctx, x: ctx.set(dut.i.p, x), collect_axis,
                     sum(-(-len(e) // 32) for e in expected), seed=11)
    assert reassemble(got) == expected


def test_decompressor_end_to_end():
    rng = np.random.default_rng(12)
    good = [nic_tx(tx_packet(gradient_words(rng, n, 1e-2), k))[0]
            for n, k in ((0, 3), (1, 15), (21, 10), (64, 7))]
    packets = [good[0], Packet(good[2].header, good[2].payload[:-4]), good[1],
               Packet(good[3].header, good[3].payload + bytes(8)), good[2],
               Packet(good[1].header.replace(k=0), good[1].payload),
               Packet(good[1].header.replace(magic=1), good[1].payload),
               Packet(good[3].header.replace(count=4000), good[3].payload), good[3]]
    inputs = [b for p in packets for b in packet_beats(p)]
    expected = [o.to_bytes() for o, _ in map(nic_rx, packets) if o is not None]
    dut = Decompressor()
    got = run_stream(dut, inputs, lambda ctx, x: ctx.set(dut.i.p, x), collect_axis,
                     sum(-(-len(e) // 32) for e in expected), seed=12)
    assert reassemble(got) == expected


def count_events(dut, names, tally):
    """Background testbench: add up the one-cycle counter strobes of ``dut.events``."""
    async def watch(ctx):
        fields = [getattr(dut.events, name) for name in names]
        async for _, _, *strobes in ctx.tick().sample(*fields):
            for name, strobe in zip(names, strobes):
                tally[name] += int(strobe)
    return watch


@pytest.mark.parametrize("p_stall", [0.0, 0.4])
def test_compressor_counters_back_to_back(p_stall):
    """Counter strobes match the golden causes, also when a packet's end and the next
    header-only packet's end fall on consecutive cycles (no stalls)."""
    from contract.counters import NIC_TX_COUNTERS
    rng = np.random.default_rng(13)
    empty = lambda count: Packet(Header(type=0, flags=Flags.COMPRESS, k=6, count=count))
    packets = [tx_packet(gradient_words(rng, 8, 1e-2), 10), empty(0), empty(3),
               tx_packet(gradient_words(rng, 9, 1e-2), 10), empty(0), empty(0),
               Packet(Header(type=0, flags=Flags.COMPRESS, k=3, count=5), bytes(16)),
               empty(1), Packet(Header(type=0, flags=Flags.COMPRESS, k=0, count=0)),
               Packet(Header(type=3, count=0)), empty(0)]
    inputs = [b for p in packets for b in packet_beats(p)]
    expected = [nic_tx(p) for p in packets]
    tally = dict.fromkeys(NIC_TX_COUNTERS, 0)
    dut = Compressor()
    got = run_stream(dut, inputs, lambda ctx, x: ctx.set(dut.i.p, x), collect_axis,
                     sum(o.beats for o, _ in expected), seed=13, p_stall=p_stall, p_block=0.0,
                     extra=count_events(dut, NIC_TX_COUNTERS, tally))
    assert reassemble(got) == [o.to_bytes() for o, _ in expected]
    want = dict.fromkeys(NIC_TX_COUNTERS, 0)
    want["packets"] = len(packets)
    for _, cause in expected:
        want[cause] += 1
    assert tally == want


def test_decompressor_small_buffer_under_back_pressure():
    """With the smallest packet buffer its max_count allows and a mostly stalled output,
    the decoder (which never stalls) still never meets a full buffer: nothing is lost."""
    rng = np.random.default_rng(15)
    max_count = 16
    packets = [nic_tx(tx_packet(gradient_words(rng, int(n), 1e-2), 9))[0]
               for n in rng.integers(0, max_count + 1, 12)]
    packets.insert(3, Packet(Header(type=PacketType.AGG_ADD_I32, count=40), bytes(160)))
    inputs = [b for p in packets for b in packet_beats(p)]
    expected = [o.to_bytes() for o, _ in map(nic_rx, packets) if o is not None]
    dut = Decompressor(max_count=max_count)
    assert buffer_depth(max_count) == 8
    got = run_stream(dut, inputs, lambda ctx, x: ctx.set(dut.i.p, x), collect_axis,
                     sum(-(-len(e) // 32) for e in expected), seed=15, p_stall=0.1,
                     p_block=0.8)
    assert reassemble(got) == expected


def test_decompressor_counters():
    from contract.counters import NIC_RX_COUNTERS
    rng = np.random.default_rng(14)
    good = [nic_tx(tx_packet(gradient_words(rng, n, 1e-2), 9))[0] for n in (0, 5, 16)]
    packets = [good[0], good[0], Packet(good[1].header, good[1].payload[:-4]), good[2],
               Packet(good[0].header, bytes(4)), Packet(good[2].header.replace(version=3)),
               Packet(good[1].header.replace(k=16), good[1].payload),
               Packet(Header(type=2, count=1), bytes(4)), good[0],
               Packet(good[2].header.replace(count=2049), good[2].payload), good[1]]
    inputs = [b for p in packets for b in packet_beats(p)]
    expected = [nic_rx(p) for p in packets]
    outputs = [o for o, _ in expected if o is not None]
    tally = dict.fromkeys(NIC_RX_COUNTERS, 0)
    dut = Decompressor()
    got = run_stream(dut, inputs, lambda ctx, x: ctx.set(dut.i.p, x), collect_axis,
                     sum(o.beats for o in outputs), seed=14, p_stall=0.0, p_block=0.0,
                     extra=count_events(dut, NIC_RX_COUNTERS, tally))
    assert reassemble(got) == [o.to_bytes() for o in outputs]
    want = dict.fromkeys(NIC_RX_COUNTERS, 0)
    want["packets"] = len(packets)
    for _, cause in expected:
        want[cause] += 1
    assert tally == want
