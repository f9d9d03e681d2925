"""A stream stage that can corrupt payload beats on purpose.

The self-test puts one on each checked path (NIC: between the decompressor and its checker;
switch: in front of the aggregator), so that a test, or a switch on the board, can prove
the checkers catch a wrong bit. With ``enable`` low it is a plain
:class:`hdl.stream.skid_buffer.SkidBuffer` (which also cuts the timing paths, ``ready`` included,
between the blocks it joins).
"""
from amaranth import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hdl.stream.axis import AxisBeat, axis_signature
from hdl.stream.skid_buffer import SkidBuffer

__all__ = ["FaultInjector"]


class FaultInjector(wiring.Component):
    """Passes beats through a skid buffer; flips bit 0 of lane 0 of every payload beat (not
    header beats) taken while ``enable`` is high.

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
        m.submodules.buffer = buffer = SkidBuffer(AxisBeat)
        wiring.connect(m, buffer.o, wiring.flipped(self.o))
        first = Signal(init=1)       # the next beat is a header
        flip = Signal()
        m.d.comb += [
            flip.eq(self.enable & ~first),
            buffer.i.valid.eq(self.i.valid),
            buffer.i.payload.eq(self.i.payload),
            buffer.i.payload.data[0].eq(self.i.payload.data[0] ^ flip),
            self.i.ready.eq(buffer.i.ready),
        ]
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += first.eq(self.i.payload.last)
            with m.If(flip):
                m.d.sync += self.flipped.eq(self.flipped + 1)
        return m
