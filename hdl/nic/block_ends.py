"""Block ends: for every byte of a compressed beat, where a block starting there would end.

An INCEPTIONN block is a 16-bit tag vector and then 0, 1, 2 or 4 payload bytes per lane, so
its length follows from the two bytes it starts with. The unpacker's block-pointer loop
should only *select* a block's end, never compute it, so these two stages compute the end
of a block at each of the 32 byte positions of a beat before the beat enters the unpacker's
window. Ends are measured from the start of the beat holding the block's first
byte (``position + 2 + payload bytes``, 2..65); the unpacker adds the position of the window
slot the beat is written into.

The block starting at byte 31 needs the next beat's byte 0 for its tag vector; its end is
computed when that next beat passes (entry 31 of the *next* beat's ``ends``, with the byte 31
kept from the beat before).
"""
from amaranth import Cat, Module, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from contract.header import BEAT_BYTES, LANES
from hdl.header import HeaderLayout
from hdl.stream.axis import DATA_BITS
from hdl.stream.stage import register_stage

#: Bit offset of the header's ``count`` field in a beat.
HEADER_COUNT_OFFSET = HeaderLayout["count"].offset

__all__ = ["UnpackRequest", "BeatWithEnds", "END_BITS", "HALF_BITS", "PAIR_BYTES",
           "block_payload_bytes", "block_end_halves", "block_end", "BlockEnds"]

#: One input beat of a packet the front end did not drop.
UnpackRequest = data.StructLayout({
    "data": unsigned(DATA_BITS),
    "keep": unsigned(BEAT_BYTES),
    "last": unsigned(1),
    "bypass": unsigned(1),     # pass the beat through untouched
})

#: Width of a block end (at most 31 + 34 = 65).
END_BITS = 7
#: Width of the payload bytes of four lanes (at most 16).
HALF_BITS = 5

#: Decoded ahead so that the unpacker's control decisions start from registers.
_DECODED_FIELDS = {
    "bytes": range(BEAT_BYTES + 1),        # bytes in the beat (from tkeep)
    "empty": unsigned(1),                  # as a header: count == 0
    "blocks": unsigned(14),                # as a header: ceil(count / 8)
    "one_block": unsigned(1),              # as a header: 1 <= count <= 8
}

#: An :data:`UnpackRequest` with, for every byte position (entry ``j < 31``: byte ``j`` of
#: this beat; entry 31: byte 31 of the beat before), the block end ``ends``, whether that
#: block is all in this beat (``fits``; entry 31: in the two beats), and the end of the
#: block if it were the packet's last, lanes past ``count`` masked, rounded up to whole
#: 32-bit words (``last_ends``: where a good packet ends).
BeatWithEnds = data.StructLayout({
    **dict(UnpackRequest.members),
    "ends": data.ArrayLayout(unsigned(END_BITS), BEAT_BYTES),
    "fits": unsigned(BEAT_BYTES),
    "last_ends": data.ArrayLayout(unsigned(END_BITS), BEAT_BYTES),
    **_DECODED_FIELDS,
})

#: Payload bytes of two lanes from their 4 tag bits (tags 00/01/10/11 -> 0/1/2/4 bytes).
PAIR_BYTES = [(0, 1, 2, 4)[v & 3] + (0, 1, 2, 4)[v >> 2] for v in range(16)]


def _pair_lookup(m, bits, table, width, name):
    """``table[bits]`` for a 4-bit ``bits`` (such as two lanes' tags): one LUT level per
    output bit."""
    out = Signal(width, name=name)
    with m.Switch(bits):
        for v in range(16):
            with m.Case(v):
                m.d.comb += out.eq(table[v])
    return out


def block_payload_bytes(m, tags, name):
    """Payload bytes of a block from its 16-bit tag vector (tags 00/01/10/11 -> 0/1/2/4).

    Returns ``(total, widths)``. The total is summed from four 4-bit lane pairs, each a
    plain 4-input function (one LUT level), so the adder tree is only two levels deep.
    """
    widths = []
    for j in range(LANES):
        w = Signal(3, name=f"{name}_w{j}")
        tag = tags[2 * j:2 * j + 2]
        # 00 -> 0, 01 -> 1, 10 -> 2, 11 -> 4
        m.d.comb += w.eq(Cat(tag[0] & ~tag[1], tag[1] & ~tag[0], tag[0] & tag[1]))
        widths.append(w)
    pairs = [_pair_lookup(m, tags[4 * i:4 * i + 4], PAIR_BYTES, 4, f"{name}_pair{i}")
             for i in range(LANES // 2)]
    total = Signal(6, name=name)
    m.d.comb += total.eq((pairs[0] + pairs[1]) + (pairs[2] + pairs[3]))
    return total, widths


def block_end_halves(m, tags, start, name):
    """``start + 2 + payload bytes`` of the block with tag vector ``tags``, as two halves
    whose sum it is: ``(start + 2 + lanes 0-3's bytes, lanes 4-7's bytes)``.

    ``start`` is a constant, folded into the first lane pair's lookup, so each half is one
    LUT level and one small add.
    """
    if not isinstance(start, int) or start < 0:
        raise TypeError(f"start must be a non-negative integer, not {start!r}")
    first = _pair_lookup(m, tags[0:4], [start + 2 + b for b in PAIR_BYTES], END_BITS,
                         f"{name}_first")
    pairs = [_pair_lookup(m, tags[4 * i:4 * i + 4], PAIR_BYTES, 4, f"{name}_pair{i}")
             for i in range(1, LANES // 2)]
    low = Signal(END_BITS, name=f"{name}_low")
    high = Signal(HALF_BITS, name=f"{name}_high")
    m.d.comb += [low.eq(first + pairs[0]), high.eq(pairs[1] + pairs[2])]
    return low, high


def block_end(m, tags, start, name):
    """``start + 2 + payload bytes`` of the block with tag vector ``tags`` (a two-level adder
    tree, see :func:`block_end_halves`)."""
    low, high = block_end_halves(m, tags, start, name)
    end = Signal(END_BITS, name=name)
    m.d.comb += end.eq(low + high)
    return end


#: A beat between the two stages of :class:`BlockEnds`: each block end still as the two
#: halves of :func:`block_end_halves`, the header fields already decoded.
_HalvedEnds = data.StructLayout({
    **dict(UnpackRequest.members),
    "end_low": data.ArrayLayout(unsigned(END_BITS), BEAT_BYTES),
    "end_high": data.ArrayLayout(unsigned(HALF_BITS), BEAT_BYTES),
    "last_end_low": data.ArrayLayout(unsigned(END_BITS), BEAT_BYTES),
    "last_end_high": data.ArrayLayout(unsigned(HALF_BITS), BEAT_BYTES),
    **_DECODED_FIELDS,
})


class BlockEnds(wiring.Component):
    """Two pipeline stages adding the block end of every byte position to each beat.

    Every beat gets ends, whatever it is (header, bypassed, bitstream): the unpacker only
    looks at those of bitstream beats. The lane mask of ``last_ends`` comes from the
    ``count`` of the packet's header beat (the first beat of a packet not bypassed).

    The first stage looks the tag vectors up (each end as two halves, one LUT level and a
    small add each) and decodes the header fields; the second adds the halves, rounds the
    last ends and compares the ends with the beat's bytes. Neither stage's logic then meets
    the fan-out of the input beat's bytes (each feeds four lookups) and a whole adder tree
    in one clock.

    Ports
    -----
    i : In(stream.Signature(UnpackRequest))
    o : Out(stream.Signature(BeatWithEnds))
    """

    def __init__(self):
        super().__init__({
            "i": In(stream.Signature(UnpackRequest)),
            "o": Out(stream.Signature(BeatWithEnds)),
        })

    def elaborate(self, platform):
        m = Module()
        halved = stream.Signature(_HalvedEnds).create(path=("halved",))
        self._lookup_stage(m, halved)
        self._sum_stage(m, halved)
        return m

    def _lookup_stage(self, m, halved):
        """Tag vectors to halved ends; header fields decoded."""
        beat = self.i.p
        byte = [beat.data[8 * j:8 * j + 8] for j in range(BEAT_BYTES)]
        previous_byte31 = Signal(8)
        first_beat = Signal(init=1)                 # the next beat starts a packet
        last_tag_mask = Signal(2 * LANES)           # tags of the lanes below count

        tags = [Cat(byte[j], byte[j + 1]) for j in range(BEAT_BYTES - 1)]
        tags.append(Cat(previous_byte31, byte[0]))
        ends = [block_end_halves(m, tags[j], j, f"end_at{j}") for j in range(BEAT_BYTES)]
        last_ends = [block_end_halves(m, tags[j] & last_tag_mask, j, f"last_end_at{j}")
                     for j in range(BEAT_BYTES)]
        # Bytes in the beat: 4 per valid lane, counted as two 4-lane lookups (one LUT level
        # each) and one small add, not a chain of adds.
        lane_valid = Cat(beat.keep[4 * j] for j in range(LANES))
        half_counts = [_pair_lookup(m, lane_valid[4 * h:4 * h + 4],
                                    [bin(v).count("1") for v in range(16)], 3,
                                    f"lanes_in_half{h}")
                       for h in range(2)]

        with register_stage(m, self.i, halved):
            m.d.sync += [
                halved.p.data.eq(beat.data),
                halved.p.keep.eq(beat.keep),
                halved.p.last.eq(beat.last),
                halved.p.bypass.eq(beat.bypass),
                halved.p.bytes.eq((half_counts[0] + half_counts[1]) << 2),
            ]
            for j in range(BEAT_BYTES):
                m.d.sync += [
                    halved.p.end_low[j].eq(ends[j][0]),
                    halved.p.end_high[j].eq(ends[j][1]),
                    halved.p.last_end_low[j].eq(last_ends[j][0]),
                    halved.p.last_end_high[j].eq(last_ends[j][1]),
                ]
            count = beat.data[HEADER_COUNT_OFFSET:HEADER_COUNT_OFFSET + 16]
            m.d.sync += [
                halved.p.empty.eq(count == 0),
                halved.p.blocks.eq((count + LANES - 1) >> 3),
                halved.p.one_block.eq((count != 0) & (count <= LANES)),
            ]
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [previous_byte31.eq(byte[BEAT_BYTES - 1]), first_beat.eq(beat.last)]
            with m.If(first_beat & ~beat.bypass):
                # A header: the last block holds count % 8 lanes (8 if none are left over).
                lanes_left = beat.data[HEADER_COUNT_OFFSET:HEADER_COUNT_OFFSET + 3]
                with m.Switch(lanes_left):
                    for n in range(LANES):
                        with m.Case(n):
                            m.d.sync += last_tag_mask.eq((1 << 2 * (n or LANES)) - 1)

    def _sum_stage(self, m, halved):
        """Halves summed into ends; last ends rounded; whether each block fits the beat."""
        beat = halved.p
        ends = []
        for j in range(BEAT_BYTES):
            end = Signal(END_BITS, name=f"end_at{j}")
            m.d.comb += end.eq(beat.end_low[j] + beat.end_high[j])
            ends.append(end)
        fits = Signal(BEAT_BYTES)
        for j in range(BEAT_BYTES - 1):
            m.d.comb += fits[j].eq(ends[j] <= beat.bytes)
        m.d.comb += fits[BEAT_BYTES - 1].eq(ends[BEAT_BYTES - 1] <= BEAT_BYTES + beat.bytes)

        with register_stage(m, halved, self.o):
            m.d.sync += [
                self.o.p.data.eq(beat.data),
                self.o.p.keep.eq(beat.keep),
                self.o.p.last.eq(beat.last),
                self.o.p.bypass.eq(beat.bypass),
                self.o.p.fits.eq(fits),
                self.o.p.bytes.eq(beat.bytes),
                self.o.p.empty.eq(beat.empty),
                self.o.p.blocks.eq(beat.blocks),
                self.o.p.one_block.eq(beat.one_block),
            ]
            m.d.sync += [self.o.p.ends[j].eq(ends[j]) for j in range(BEAT_BYTES)]
            m.d.sync += [
                self.o.p.last_ends[j].eq((beat.last_end_low[j] + beat.last_end_high[j] + 3) & ~3)
                for j in range(BEAT_BYTES)]
