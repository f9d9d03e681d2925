"""A packet buffer whose reader sees only committed packets.

A stage that learns only at a packet's end whether the packet is good (the decompressor's
verdict on a truncated or over-long bitstream) writes its beats here as they come, then
commits or rewinds: a bad packet disappears whole and never spills into the next one.
"""
from amaranth import Cat, Module, Signal, unsigned
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from contract.header import BEAT_BYTES
from hdl.stream.axis import DATA_BITS, AxisBeat

__all__ = ["End", "BufferItem", "PacketBuffer"]


class End(enum.Enum, shape=2):
    """What the output packet buffer does after writing an item."""
    NONE = 0      # packet goes on
    COMMIT = 1    # make everything written so far visible to the reader
    REWIND = 2    # forget everything written since the last commit (malformed packet)


#: What the decoder hands the output packet buffer: one output beat (if ``write``) and the
#: packet verdict to apply after it.
BufferItem = data.StructLayout({
    "data": unsigned(DATA_BITS),
    "keep": unsigned(BEAT_BYTES),
    "last": unsigned(1),
    "write": unsigned(1),
    "end": End,
})


class PacketBuffer(wiring.Component):
    """A FIFO of output beats whose reader only sees committed packets.

    Each input item may write one beat and then apply its ``end``: ``COMMIT`` publishes all
    beats written so far, ``REWIND`` forgets the beats written since the last commit
    (including the item's own). The reader side is a first-word-fall-through stream out of a
    synchronous block-RAM read port, one beat per clock.

    Parameters
    ----------
    depth : int
        Beats held; a power of two, at least 2.
    headroom : int
        Free entries that :attr:`room` promises.

    Ports
    -----
    i : In(stream.Signature(BufferItem))
    o : Out(stream.Signature(AxisBeat))
    room : Out(1)
        A register: at least ``headroom`` entries were free at the last clock. A producer
        whose items reach the buffer within ``headroom - 1`` clocks of deciding on ``room``
        never meets a full buffer, so ``i.ready`` need not reach back into its pipeline.
    """

    def __init__(self, *, depth, headroom=1):
        if not isinstance(depth, int) or depth < 2 or depth & (depth - 1):
            raise ValueError(f"PacketBuffer depth must be a power of two >= 2, not {depth!r}")
        if not isinstance(headroom, int) or not 1 <= headroom < depth:
            raise ValueError(f"PacketBuffer headroom must be an integer in 1..{depth - 1}, "
                             f"not {headroom!r}")
        self._depth = depth
        self._headroom = headroom
        super().__init__({
            "i": In(stream.Signature(BufferItem)),
            "o": Out(stream.Signature(AxisBeat)),
            "room": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        depth = self._depth
        abits = (depth - 1).bit_length()
        m.submodules.memory = memory = Memory(shape=AxisBeat, depth=depth, init=[])
        write = memory.write_port()
        read = memory.read_port()

        # Pointers carry one extra bit so that full (difference == depth) and empty differ.
        write_ptr = Signal(abits + 1)
        commit_ptr = Signal(abits + 1)
        read_ptr = Signal(abits + 1)   # next entry to move into the output register

        item = self.i.p
        has_room = Signal()
        used = Signal(abits + 1)
        m.d.comb += used.eq(write_ptr - read_ptr)
        m.d.sync += self.room.eq(used <= depth - self._headroom)
        m.d.comb += [
            has_room.eq(used < depth),
            self.i.ready.eq(~item.write | has_room),
            write.addr.eq(write_ptr[:abits]),
            write.data.eq(Cat(item.data, item.keep, item.last)),
        ]
        with m.If(self.i.valid & self.i.ready):
            written = write_ptr + item.write
            m.d.comb += write.en.eq(item.write)
            m.d.sync += write_ptr.eq(written)
            with m.If(item.end == End.COMMIT):
                m.d.sync += commit_ptr.eq(written)
            with m.Elif(item.end == End.REWIND):
                m.d.sync += write_ptr.eq(commit_ptr)

        # Reader: the read port's data register is the output register; it holds its value
        # while `en` is low, so an unaccepted beat stays put.
        load = Signal()
        m.d.comb += [
            load.eq((read_ptr != commit_ptr) & (~self.o.valid | self.o.ready)),
            read.addr.eq(read_ptr[:abits]),
            read.en.eq(load),
            self.o.p.eq(read.data),
        ]
        with m.If(load):
            m.d.sync += [read_ptr.eq(read_ptr + 1), self.o.valid.eq(1)]
        with m.Elif(self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        return m
