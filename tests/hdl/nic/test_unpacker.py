# amaranth: UnusedElaboratable=no
"""The unpacker cuts the golden model's blocks out of the bitstream, under random stalls."""
import random

import numpy as np
import pytest

from contract.header import Header, PacketType
from contract.packet import Packet
from hdl.nic.layouts import TAG_BYTES
from hdl.nic.unpacker import Unpacker
from hdl.stream.packet_buffer import End
from host.golden.inceptionn import nic_rx, nic_tx
from sim.nic_stimulus import gradient_words, random_words, raw_words, tx_packet

LANES = 8

from tests.amaranth_sim import packet_beats, run

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

    run(dut, producer, consumer, background=(watch_events,))

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
