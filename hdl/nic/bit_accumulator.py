"""Bit accumulator: append variable-length blocks to an output stream of 256-bit words.

Two components, one per stage:

1. :class:`BlockRotator` shifts the block left by its byte position inside the current
   output word. That position is just the running sum of the packet's block widths modulo
   32 bytes (every emitted word removes exactly 32 bytes), so it does not depend on
   back-pressure: the rotator can sit in a pipeline that never stalls, before the buffer
   that absorbs the accumulator's back-pressure. The shift is a 5-level byte shifter (all
   block widths are whole bytes), registered on its own so the accumulator is only a
   word-select and an OR.
2. :class:`BitAccumulator` holds up to 528 bits (a partial word below 32 bytes plus one
   block of up to 34 bytes). Whenever it holds a full word (or the packet's last block has
   arrived: flush), that word is offered on the output; it accepts the next block when,
   after this cycle's output word, less than one word is left. Blocks of up to 32 bytes
   therefore flow at one per clock; 34-byte blocks (all raw) throttle the input to the
   output rate, 16/17 block per clock.

At the packet's last item the remainder is padded with zero bits to whole 32-bit words
(``tkeep`` marks them) and emitted with ``tlast``. Raw items (headers, bypassed beats) are
32-byte blocks at byte position 0; a raw last beat keeps its own ``tkeep``.

The accumulator's ``ready`` (a function of its fill level) is what a stalling pipeline
would spread over every register before it. In the compressor it reaches only the read
pointer of a LUT-RAM FIFO (:class:`~hdl.stream.credit_buffer.CreditBuffer` with
``registered_output=False``) between the rotator and the accumulator.
"""
from amaranth import Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from contract.header import BEAT_BYTES
from hdl.nic.block_packer import BlockItem
from hdl.nic.layouts import BLOCK_BITS
from hdl.stream.axis import DATA_BITS, AxisBeat
from hdl.stream.stage import register_stage

__all__ = ["ACC_BITS", "RotatedItem", "shift_left_bytes", "BlockRotator", "BitAccumulator"]

#: A partial word (< 32 bytes) plus one longest block.
ACC_BITS = DATA_BITS + BLOCK_BITS
assert ACC_BITS == 528

RotatedItem = data.StructLayout({
    "bits": unsigned(ACC_BITS),      # the block at its byte position in the output word
    "width": unsigned(6),
    "raw": unsigned(1),
    "keep": unsigned(BEAT_BYTES),
    "last": unsigned(1),
})


def shift_left_bytes(m, value, amount, width, name):
    """A logarithmic left shift of ``value`` by ``amount`` whole bytes, ``width`` bits wide.

    Written out level by level (one 2:1 mux per bit and level) so synthesis sees byte
    granularity, instead of a bit-granular shifter indexed by ``amount * 8``.
    """
    level = Signal(width, name=f"{name}_l0")
    m.d.comb += level.eq(value)
    for i in range(len(amount)):
        nxt = Signal(width, name=f"{name}_l{i + 1}")
        m.d.comb += nxt.eq(Mux(amount[i], level << (8 << i), level))
        level = nxt
    return level


def keep_for_bytes(m, nbytes, name):
    """``tkeep`` of a last beat holding ``nbytes`` bytes, rounded up to whole 32-bit words."""
    keep = Signal(BEAT_BYTES, name=name)
    words = Signal(4, name=f"{name}_words")
    m.d.comb += words.eq((nbytes + 3) >> 2)
    with m.Switch(words):
        for w in range(BEAT_BYTES // 4 + 1):
            with m.Case(w):
                m.d.comb += keep.eq((1 << (4 * w)) - 1)
    return keep


class BlockRotator(wiring.Component):
    """Shift each block to its byte position in the output word (one register stage).

    Ports
    -----
    i : In(stream.Signature(BlockItem))
        Blocks, right-aligned, with their width in bytes.
    o : Out(stream.Signature(RotatedItem))
        The same blocks, shifted left by the bytes of the packet before them modulo 32.
        Fed into a buffer that always has room (``o.ready`` tied high), the stage moves on
        every clock and its registers have no enable.
    """

    def __init__(self):
        super().__init__({
            "i": In(stream.Signature(BlockItem)),
            "o": Out(stream.Signature(RotatedItem)),
        })

    def elaborate(self, platform):
        m = Module()
        position = Signal(5)          # bytes already in the current output word
        shifted = shift_left_bytes(m, self.i.p.bits, position, ACC_BITS, "rotate")
        with register_stage(m, self.i, self.o):
            m.d.sync += [
                self.o.p.bits.eq(shifted),
                self.o.p.width.eq(self.i.p.width),
                self.o.p.raw.eq(self.i.p.raw),
                self.o.p.keep.eq(self.i.p.keep),
                self.o.p.last.eq(self.i.p.last),
            ]
        with m.If(self.i.valid & self.i.ready):
            # modulo 32 by truncation; a new packet starts at position 0
            m.d.sync += position.eq(Mux(self.i.p.last, 0, position + self.i.p.width))
        return m


class BitAccumulator(wiring.Component):
    """Append rotated blocks to the output word stream; flush and pad at the packet's end.

    Ports
    -----
    i : In(stream.Signature(RotatedItem))
        Blocks from a :class:`BlockRotator`. ``ready`` is a few gates from registers (the
        fill level, the flush flag, ``o.ready``).
    o : Out(stream.Signature(AxisBeat))
        The packed stream: full 256-bit words, the last one padded to whole 32-bit words.
    """

    def __init__(self):
        super().__init__({
            "i": In(stream.Signature(RotatedItem)),
            "o": Out(stream.Signature(AxisBeat)),
        })

    def elaborate(self, platform):
        m = Module()
        rot = self.i

        acc = Signal(ACC_BITS)        # bits above `fill` bytes are always zero
        fill = Signal(7)              # bytes held, 0..65
        flush = Signal()              # the packet's last item is in: drain and pad
        tail_raw = Signal()           # ... and it was a raw beat with its own tkeep
        tail_keep = Signal(BEAT_BYTES)

        out_last = Signal()
        m.d.comb += [
            self.o.valid.eq((fill >= BEAT_BYTES) | flush),
            out_last.eq(flush & (fill <= BEAT_BYTES)),
            self.o.p.data.eq(acc[:DATA_BITS]),
            self.o.p.last.eq(out_last),
        ]
        padded_keep = keep_for_bytes(m, fill, "padded_keep")
        with m.If(~out_last):
            m.d.comb += self.o.p.keep.eq(Const((1 << BEAT_BYTES) - 1, BEAT_BYTES))
        with m.Elif(tail_raw):
            m.d.comb += self.o.p.keep.eq(tail_keep)
        with m.Else():
            m.d.comb += self.o.p.keep.eq(padded_keep)

        # State after this cycle's output word, before this cycle's input block.
        emit = Signal()
        acc_after = Signal(ACC_BITS)
        fill_after = Signal(7)
        flush_after = Signal()
        m.d.comb += emit.eq(self.o.valid & self.o.ready)
        with m.If(emit & out_last):
            m.d.comb += [acc_after.eq(0), fill_after.eq(0), flush_after.eq(0)]
        with m.Elif(emit):
            m.d.comb += [acc_after.eq(acc >> DATA_BITS), fill_after.eq(fill - BEAT_BYTES),
                         flush_after.eq(flush)]
        with m.Else():
            m.d.comb += [acc_after.eq(acc), fill_after.eq(fill), flush_after.eq(flush)]

        # Room for one more block when less than a word is left after this cycle's output
        # (`fill_after < 32`); a packet's items never mix with the next packet's, so nothing
        # enters while a flush is pending (`~flush_after`). Written out as the same function
        # of the registers `fill`, `flush` and the output's ready (case by case: no flush,
        # the word out leaves fill - 32; a flush, the last word out empties it): through
        # `fill_after` it was seven logic levels deep.
        m.d.comb += rot.ready.eq(Mux(flush,
                                     self.o.ready & (fill <= BEAT_BYTES),
                                     (fill < BEAT_BYTES) |
                                     (self.o.ready & (fill < 2 * BEAT_BYTES))))
        with m.If(rot.valid & rot.ready):
            # The block was rotated to byte `fill_after` (see BlockRotator), the first free
            # byte.
            m.d.sync += [
                acc.eq(acc_after | rot.p.bits),
                fill.eq(fill_after + rot.p.width),
                flush.eq(rot.p.last),
                tail_raw.eq(rot.p.raw),
                tail_keep.eq(rot.p.keep),
            ]
        with m.Else():
            m.d.sync += [acc.eq(acc_after), fill.eq(fill_after), flush.eq(flush_after)]
        return m
