"""A FIFO whose writes are posted: taken at ``w_en``, written a clock later from registers.

A packet buffer decides at a packet's last beat whether to queue its descriptor, from
logic (is the packet good, did it fit). Fed straight into a LUT-RAM FIFO, that decision is
the write enable of every LUT-RAM cell of the queue and the enable of its pointer: one of
the longest nets of the chip at the end of the longest logic. Here the decision and the
descriptor go into a register first, and the FIFO is written from there.

The producer sees exactly the room a :class:`~amaranth.lib.fifo.SyncFIFO` of the same depth
would give it: ``w_rdy`` counts the posted write (``used``, a register, is the FIFO's level
plus the write in flight). The reader sees an entry a clock later than from a SyncFIFO.
"""
from amaranth import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

__all__ = ["PostedWriteFIFO"]


class PostedWriteFIFO(wiring.Component):
    """Synchronous FIFO, writes landing a clock after ``w_en``.

    Parameters
    ----------
    width : int
        Bits per entry.
    depth : int
        Entries (at least 1).

    Members
    -------
    w_data : In(width)
    w_en : In(1)
        Takes ``w_data``; only while ``w_rdy`` (as for a SyncFIFO).
    w_rdy : Out(1)
        Room for one more entry, the posted one counted.
    r_data : Out(width)
    r_rdy : Out(1)
    r_en : In(1)
    """

    def __init__(self, *, width, depth):
        if not isinstance(width, int) or width < 1:
            raise ValueError(f"PostedWriteFIFO width must be a positive integer, not {width!r}")
        if not isinstance(depth, int) or depth < 1:
            raise ValueError(f"PostedWriteFIFO depth must be a positive integer, not {depth!r}")
        self.width, self.depth = width, depth
        super().__init__({
            "w_data": In(width),
            "w_en": In(1),
            "w_rdy": Out(1),
            "r_data": Out(width),
            "r_rdy": Out(1),
            "r_en": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.fifo = fifo = SyncFIFO(width=self.width, depth=self.depth)
        posted = Signal()
        posted_data = Signal(self.width)
        m.d.sync += [posted.eq(self.w_en), posted_data.eq(self.w_data)]
        used = Signal(range(self.depth + 1))     # stored + posted
        pop = Signal()
        m.d.comb += [
            fifo.w_en.eq(posted),
            fifo.w_data.eq(posted_data),
            self.r_data.eq(fifo.r_data),
            self.r_rdy.eq(fifo.r_rdy),
            pop.eq(self.r_en & fifo.r_rdy),
            fifo.r_en.eq(pop),
            self.w_rdy.eq(used != self.depth),
        ]
        with m.If(self.w_en & ~pop):
            m.d.sync += used.eq(used + 1)
        with m.Elif(~self.w_en & pop):
            m.d.sync += used.eq(used - 1)
        return m
