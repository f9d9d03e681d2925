"""A registered AXI-Stream stage that can corrupt payload beats on purpose.

The self-test puts one on each checked path (NIC: between the decompressor and its checker;
switch: in front of the aggregator), so that a test, or a switch on the board, can prove
the checkers catch a wrong bit. With ``enable`` low it is a plain register slice (which
also cuts the timing path between the blocks it joins).
"""
from amaranth import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hdl.axis import axis_signature

__all__ = ["FaultInjector"]


class FaultInjector(wiring.Component):
    """Passes beats through one register; flips bit 0 of lane 0 of every payload beat (not
    header beats) while ``enable`` is high.

    Attributes
    ----------
    i : In(axis_signature())
    o : Out(axis_signature())
    enable : In(1)
    flipped : Out(32)
        Beats corrupted so far (wraps).
    """

    def __init__(self):
        super().__init__({
            "i": In(axis_signature()),
            "o": Out(axis_signature()),
            "enable": In(1),
            "flipped": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        first = Signal(init=1)       # the next beat is a header
        m.d.comb += self.i.ready.eq(~self.o.valid | self.o.ready)
        with m.If(self.i.ready):
            m.d.sync += [self.o.valid.eq(self.i.valid), self.o.payload.eq(self.i.payload)]
            with m.If(self.i.valid):
                m.d.sync += first.eq(self.i.payload.last)
                with m.If(self.enable & ~first):
                    m.d.sync += [self.o.payload.data[0].eq(~self.i.payload.data[0]),
                                 self.flipped.eq(self.flipped + 1)]
        return m
