"""Packet streams onto one, a packet at a time: the services' replies onto the core's
transmit stream, the wire's frames and the board's replies onto its host port."""
from __future__ import annotations

from amaranth import Cat, Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hdl.net.front_end.layouts import TxBeat

__all__ = ["TxArbiter"]


class TxArbiter(wiring.Component):
    """Round-robin between ``count`` packet streams; a granted packet goes whole.

    Parameters
    ----------
    count : int
        Inputs, at least 1.
    shape : data.StructLayout
        The beats' layout, with a ``last`` field that ends a packet (default the network
        core's :data:`~hdl.net.front_end.layouts.TxBeat`).

    Members
    -------
    i<k> : In(stream.Signature(shape)), k < count
    o : Out(stream.Signature(shape))
    """

    def __init__(self, count, *, shape=TxBeat):
        if not isinstance(count, int) or count < 1:
            raise ValueError(f"TxArbiter needs at least 1 input, not {count!r}")
        if not isinstance(shape, data.StructLayout) or "last" not in shape.members:
            raise TypeError(f"shape must be a StructLayout with a 'last' field, not {shape!r}")
        self.count = count
        super().__init__({
            **{f"i{k}": In(stream.Signature(shape)) for k in range(count)},
            "o": Out(stream.Signature(shape)),
        })

    def inputs(self):
        return [getattr(self, f"i{k}") for k in range(self.count)]

    def elaborate(self, platform):
        m = Module()
        inputs, o = self.inputs(), self.o
        grant = Signal(range(self.count))
        locked = Signal()
        with m.Switch(grant):
            for k, port in enumerate(inputs):
                with m.Case(k):
                    m.d.comb += [o.p.eq(port.p), o.valid.eq(port.valid & locked),
                                 port.ready.eq(o.ready & locked)]
        with m.If(locked):
            with m.If(o.valid & o.ready & o.p.last):
                m.d.sync += locked.eq(0)
        with m.Else():
            # The first requester after the last grant, in circular order (of the Ifs
            # below, the last that applies wins: offset 1 is written last).
            request = Signal(self.count)
            m.d.comb += request.eq(Cat(*(port.valid for port in inputs)))
            with m.Switch(grant):
                for g in range(self.count):
                    with m.Case(g):
                        # priority: g+1, g+2, ..., g (last)
                        for offset in reversed(range(1, self.count + 1)):
                            k = (g + offset) % self.count
                            with m.If(request[k]):
                                m.d.sync += [grant.eq(k), locked.eq(1)]
        return m
