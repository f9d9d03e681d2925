"""A two-entry skid buffer: a pipeline register that also registers ``ready``.

A plain pipeline register (``i.ready = ~o.valid | o.ready``) passes ``ready`` through
combinationally, so a chain of them is one long path from the last consumer's ``ready``
back to the first producer. A skid buffer cuts that path: its ``i.ready`` is a register
(the spare entry is empty), and a beat that arrives while the output is stalled waits in
the spare entry. Throughput stays one beat per clock; latency is one clock.
"""
from amaranth import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["SkidBuffer"]


class SkidBuffer(wiring.Component):
    """Register both directions of a stream.

    Parameters
    ----------
    shape : shape-like
        Payload shape of the stream.

    Ports
    -----
    i : In(stream.Signature(shape))
    o : Out(stream.Signature(shape))
    """

    def __init__(self, shape):
        self._shape = shape
        super().__init__({
            "i": In(stream.Signature(shape)),
            "o": Out(stream.Signature(shape)),
        })

    def elaborate(self, platform):
        m = Module()
        # The data registers load whether or not a beat is there (a payload only matters
        # while its valid is set), so their enables never wait for ``i.valid``. (Not
        # reset-less: with it, Yosys 0.70's ABC9 step fails an assertion on the compressor.)
        spare = Signal(self._shape)
        spare_valid = Signal()
        m.d.comb += self.i.ready.eq(~spare_valid)

        with m.If(~spare_valid):
            m.d.sync += spare.eq(self.i.p)
        with m.If(~self.o.valid | self.o.ready):
            # The output register is free this cycle: refill it, spare entry first.
            m.d.sync += [self.o.p.eq(Mux(spare_valid, spare, self.i.p)),
                         self.o.valid.eq(spare_valid | self.i.valid),
                         spare_valid.eq(0)]
        with m.Elif(self.i.valid & ~spare_valid):
            # Output stalled: the beat that was already on its way waits in the spare entry.
            m.d.sync += spare_valid.eq(1)
        return m
