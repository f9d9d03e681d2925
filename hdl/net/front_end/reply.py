"""Request/reply services (NIC transmit, NIC receive, control): where each reply goes.

A reply goes to the requester: the request's source IP address and port, from the
service's own port (network.md sections 1 and 2). The engines keep no addresses, so the
front end keeps them, and it keeps **one**: a service lets the next request into its engine
only when the previous one is finished, i.e. its output's last beat has left the engine or
the engine has dropped it (its drop strobe). The engines are in order and never hang, and
the network is far slower than they are (1 Gb/s against the engines' 32 Gb/s at 125 MHz),
so this costs no line rate; it keeps the reply address in one register, and a reply can
never be paired with the wrong requester.
"""
from __future__ import annotations

from amaranth import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from hdl.net.front_end.layouts import ReplyTag, ServiceBeat, TxBeat, egress_word

__all__ = ["OneInFlight", "ReplyPort"]


class OneInFlight(wiring.Component):
    """Admits one request at a time into an engine and holds its reply address.

    Members
    -------
    i : In(stream.Signature(ServiceBeat))
        Requests, from the service's input buffer.
    o : Out(stream.Signature(ServiceBeat))
        To the engine: a request's first beat waits until the previous request is done.
    reply : Out(ReplyTag)
        The reply address of the request in flight, valid from the clock after its first
        beat is offered to the engine until its output is done.
    output_done : In(1)
        The engine's output's last beat is taken (the request produced its output).
    dropped : In(1)
        The engine dropped the request: no output will come.
    busy : Out(1)
        A request is in the engine.
    """

    def __init__(self):
        super().__init__({
            "i": In(stream.Signature(ServiceBeat)),
            "o": Out(stream.Signature(ServiceBeat)),
            "reply": Out(ReplyTag),
            "output_done": In(1),
            "dropped": In(1),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        i, o = self.i, self.o
        admit = Signal()
        m.d.comb += [
            admit.eq(~i.p.first | ~self.busy),
            o.p.eq(i.p),
            o.valid.eq(i.valid & admit),
            i.ready.eq(o.ready & admit),
        ]
        input_done = Signal()
        result_done = Signal()
        early = Signal()      # the engine answered a request it has not taken yet
        taken = i.valid & i.ready
        strobe = self.output_done | self.dropped
        input_now = input_done | (taken & i.p.last)
        result_now = result_done | strobe
        # The reply address is loaded while a first beat waits at the gate (nothing is in
        # flight then), so it is there from the clock after the request is first offered,
        # even for an engine that answers in the clock it takes the request.
        with m.If(i.valid & i.p.first & ~self.busy):
            m.d.sync += [
                self.reply.ip_address.eq(i.p.meta.ip_address),
                self.reply.src_port.eq(i.p.meta.dst_port),
                self.reply.dst_port.eq(i.p.meta.src_port),
            ]
        with m.If(taken & i.p.first):
            # An engine may decide before it takes a request's first beat or as it takes
            # it (the control service answers a refused request, or drops one with a wrong
            # key, from its header beat): such a strobe counts for this request.
            first_result = early | strobe
            with m.If(~(i.p.last & first_result)):
                m.d.sync += self.busy.eq(1)
            m.d.sync += [input_done.eq(i.p.last), result_done.eq(first_result), early.eq(0)]
        with m.Elif(self.busy):
            with m.If(input_now & result_now):
                m.d.sync += [self.busy.eq(0), input_done.eq(0), result_done.eq(0)]
            with m.Else():
                m.d.sync += [input_done.eq(input_now), result_done.eq(result_now)]
        with m.Elif(i.valid & i.p.first & strobe):
            m.d.sync += early.eq(1)
        return m


class ReplyPort(wiring.Component):
    """An output buffer's words addressed to the requester, as the core's transmit beats.

    Members
    -------
    i : In(stream.Signature(egress_word(ReplyTag)))
    o : Out(stream.Signature(TxBeat))
    sent : Out(1)
        One strobe per reply handed on (its last word taken).
    """

    def __init__(self):
        super().__init__({
            "i": In(stream.Signature(egress_word(ReplyTag))),
            "o": Out(stream.Signature(TxBeat)),
            "sent": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        i, o = self.i, self.o
        m.d.comb += [
            o.valid.eq(i.valid),
            i.ready.eq(o.ready),
            o.p.data.eq(i.p.data),
            o.p.last.eq(i.p.last),
            # whole words; an empty reply's one word keeps no byte
            o.p.last_be.eq(Mux(i.p.last & (i.p.length != 0), 0b1000, 0)),
            o.p.meta.ip_address.eq(i.p.tag.ip_address),
            o.p.meta.src_port.eq(i.p.tag.src_port),
            o.p.meta.dst_port.eq(i.p.tag.dst_port),
            o.p.meta.length.eq(i.p.length),
        ]
        m.d.sync += self.sent.eq(o.valid & o.ready & o.p.last)
        return m
