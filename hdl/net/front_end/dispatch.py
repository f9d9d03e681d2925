"""Dispatch by UDP destination port: one output per service, closed ports counted.

network.md section 2: each service listens on ``port_base + offset``
(``contract.network.SERVICE_OFFSETS``). A datagram to any other port, or to the port of a
service this bitstream does not have, goes nowhere and is counted once (``closed_port``),
unless the core has flagged it ``error`` (then the core counted it).
"""
from __future__ import annotations

from amaranth import Cat, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from contract.network import SERVICE_OFFSETS, Service
from hdl.net.front_end.layouts import WideBeat

__all__ = ["Dispatch"]


class Dispatch(wiring.Component):
    """Routes each datagram's beats to its service's output by ``meta.dst_port``.

    Parameters
    ----------
    port_base : int
        UDP port of the first service.
    services : iterable of Service
        The services this design has (the others' ports are closed).

    Members
    -------
    i : In(stream.Signature(WideBeat))
    <service.value> : Out(stream.Signature(WideBeat))
        One per service in ``services`` (``nic_tx``, ``nic_rx``, ``switch``, ``ctrl``).
    closed_port : Out(1)
        One strobe per good datagram to a closed port.
    """

    def __init__(self, *, port_base, services):
        services = tuple(services)
        if not all(isinstance(s, Service) for s in services) or len(set(services)) != len(services):
            raise ValueError(f"services must be distinct contract.network.Service members, "
                             f"not {services!r}")
        if not isinstance(port_base, int) or not 1 <= port_base <= 0xFFFF - 3:
            raise ValueError(f"port_base must be 1..{0xFFFF - 3}, not {port_base!r}")
        self.port_base, self.services = port_base, services
        super().__init__({
            "i": In(stream.Signature(WideBeat)),
            **{s.value: Out(stream.Signature(WideBeat)) for s in services},
            "closed_port": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        i = self.i
        m.d.comb += i.ready.eq(1)           # a closed port's beats are taken and dropped
        for service in self.services:
            out = getattr(self, service.value)
            port = self.port_base + SERVICE_OFFSETS[service]
            selected = i.p.meta.dst_port == port
            m.d.comb += [out.p.eq(i.p), out.valid.eq(i.valid & selected)]
            with m.If(selected):
                m.d.comb += i.ready.eq(out.ready)
        ports = [self.port_base + SERVICE_OFFSETS[s] for s in self.services]
        closed = Signal()
        m.d.comb += closed.eq(~Cat(*(i.p.meta.dst_port == p for p in ports)).any())
        m.d.sync += self.closed_port.eq(i.valid & i.ready & i.p.last & closed & ~i.p.error)
        return m
