# amaranth: UnusedElaboratable=no
"""Block rotator and bit accumulator: blocks into the golden bitstream's words, under
random stalls on both sides."""
import random

import pytest
from amaranth import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from hdl.nic.bit_accumulator import BitAccumulator, BlockRotator
from hdl.nic.block_packer import BlockItem
from hdl.stream.axis import AxisBeat

LANES = 8

from tests.amaranth_sim import collect_axis, reassemble, run_stream

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
