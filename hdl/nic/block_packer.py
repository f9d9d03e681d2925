"""Block packer: eight encoded lanes -> one contiguous INCEPTIONN block (16..272 bits).

Two registered stages:

1. **prefix sum**: the byte offset of every lane's payload inside the block
   (``2 + sum of the widths of the lanes before it``; the 2 bytes are the tag vector) and
   the block's total width. Payload widths are 0, 1, 2 or 4 bytes, so all offsets are
   whole bytes and lane ``j`` can only start at bytes ``2 .. 2 + 4j``.
2. **assembly**: the tag vector in bits 0..15 and every payload OR-ed in at its offset.
   Each lane is a mux over at most 29 byte positions; nothing here shifts the whole block.

Raw beats (headers, bypassed packets) come out as their 256-bit data with width 32 bytes.
A beat without any valid lane (only possible with an all-zero ``tkeep``) gives an empty
item (width 0) that still carries ``last``.
"""
from amaranth import Cat, Module, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from contract.header import LANES
from hdl.nic.lane_encoder import EncodedBeat
from hdl.nic.layouts import BLOCK_BITS, TAG_VECTOR_BYTES, prefix_offsets
from hdl.stream.stage import register_stage

__all__ = ["PrefixedBeat", "BlockItem", "BlockPacker"]

#: After the prefix-sum stage.
PrefixedBeat = data.StructLayout({
    "payloads": data.ArrayLayout(unsigned(32), LANES),
    "tags": unsigned(2 * LANES),
    "offsets": data.ArrayLayout(unsigned(5), LANES),   # byte offset of each payload
    "width": unsigned(6),                              # block length in bytes, 0..34
    "raw": unsigned(1),
    "keep": unsigned(4 * LANES),
    "last": unsigned(1),
})

#: One block (or raw beat), right-aligned: ``bits[0]`` is the first bit of the stream.
BlockItem = data.StructLayout({
    "bits": unsigned(BLOCK_BITS),
    "width": unsigned(6),            # bytes; 32 for raw beats
    "raw": unsigned(1),
    "keep": unsigned(4 * LANES),     # tkeep of a raw last beat
    "last": unsigned(1),
})


class BlockPacker(wiring.Component):
    """Prefix-sum the lane widths, then concatenate one block; one beat per clock.

    Ports
    -----
    i : In(stream.Signature(EncodedBeat))
    o : Out(stream.Signature(BlockItem))
    """

    def __init__(self):
        super().__init__({
            "i": In(stream.Signature(EncodedBeat)),
            "o": Out(stream.Signature(BlockItem)),
        })

    def elaborate(self, platform):
        m = Module()
        mid = stream.Signature(PrefixedBeat).create(path=("prefixed",))

        # -- stage 1: prefix sum ----------------------------------------------------------
        offsets, running = prefix_offsets(m, [lane.width for lane in self.i.p.lanes], "offset")
        total = Signal(6)
        with m.If(self.i.p.raw):
            m.d.comb += total.eq(32)
        with m.Elif(self.i.p.empty):
            m.d.comb += total.eq(0)
        with m.Else():
            m.d.comb += total.eq(running)

        with register_stage(m, self.i, mid):
            m.d.sync += [
                mid.p.tags.eq(Cat(lane.tag for lane in self.i.p.lanes)),
                mid.p.width.eq(total),
                mid.p.raw.eq(self.i.p.raw),
                mid.p.keep.eq(self.i.p.keep),
                mid.p.last.eq(self.i.p.last),
            ]
            for j in range(LANES):
                m.d.sync += [
                    mid.p.payloads[j].eq(self.i.p.lanes[j].payload),
                    mid.p.offsets[j].eq(offsets[j]),
                ]

        # -- stage 2: assembly ------------------------------------------------------------
        placed = []
        for j in range(LANES):
            lane = Signal(BLOCK_BITS, name=f"placed{j}")
            # Lane j can only start at bytes 2..2+4j: a small mux per lane.
            with m.Switch(mid.p.offsets[j]):
                for o in range(TAG_VECTOR_BYTES, TAG_VECTOR_BYTES + 4 * j + 1):
                    with m.Case(o):
                        m.d.comb += lane.eq(mid.p.payloads[j] << (8 * o))
            placed.append(lane)
        block = Signal(BLOCK_BITS)
        with m.If(mid.p.raw):
            m.d.comb += block.eq(Cat(mid.p.payloads))
        with m.Else():
            # Payloads are zero above their width, so OR-ing them concatenates them.
            acc = mid.p.tags
            for lane in placed:
                acc = acc | lane
            m.d.comb += block.eq(acc)

        with register_stage(m, mid, self.o):
            m.d.sync += [
                self.o.p.bits.eq(block),
                self.o.p.width.eq(mid.p.width),
                self.o.p.raw.eq(mid.p.raw),
                self.o.p.keep.eq(mid.p.keep),
                self.o.p.last.eq(mid.p.last),
            ]
        return m
