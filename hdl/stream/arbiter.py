"""Packet streams onto one, a whole packet at a time, round-robin: the network front end's
replies onto the core's transmit stream, the wire's frames and the board's replies onto its
host port, the self-test's virtual workers into the aggregator.

One arbiter for all of them; ``registered`` picks how the granted beats leave:

- ``registered=False`` (the front end, the wire): straight through, no register on the data
  path; a granted input's beats go out as they come, and a packet's last beat frees the
  grant, which takes a clock to move to the next requester.
- ``registered=True`` (the self-test): through one output register, so that the
  aggregator's wide input starts from flip-flops; the grant moves on at a packet's last beat
  (and while nothing is granted) to the next input with a beat waiting, so the packets of
  different inputs leave back to back.

Both serve the inputs after the last granted one first, in circular order, the granted one
last (:func:`_round_robin`).
"""
from __future__ import annotations

from amaranth import Array, Cat, Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["PacketArbiter"]


def _round_robin(m, grant, count, requests, take):
    """For each value of ``grant``, ``take(k)`` under the ``If`` of every request
    ``requests[k]``, in reverse priority: the last ``If`` that applies wins, so the input
    just after ``grant`` is written last (served first) and ``grant`` itself first (served
    last)."""
    with m.Switch(grant):
        for g in range(count):
            with m.Case(g):
                # priority: g+1, g+2, ..., g (last)
                for offset in reversed(range(1, count + 1)):
                    k = (g + offset) % count
                    with m.If(requests[k]):
                        take(k)


class PacketArbiter(wiring.Component):
    """Round-robin between ``count`` packet streams; a granted packet goes whole.

    Parameters
    ----------
    count : int
        Inputs, at least 1.
    shape : data.StructLayout
        The beats' layout, with a ``last`` field that ends a packet.
    registered : bool
        ``False``: the granted input drives ``o`` directly (no register), a clock of
        arbitration after each packet. ``True``: ``o`` is a register, and the grant moves on
        at a packet's last beat, so packets of different inputs follow back to back.

    Members
    -------
    i<k> : In(stream.Signature(shape)), k < count
    o : Out(stream.Signature(shape))
    """

    def __init__(self, count, *, shape, registered=False):
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"PacketArbiter needs at least 1 input, not {count!r}")
        if not isinstance(shape, data.StructLayout) or "last" not in shape.members:
            raise TypeError(f"shape must be a StructLayout with a 'last' field, not {shape!r}")
        self.count, self.registered = count, bool(registered)
        super().__init__({
            **{f"i{k}": In(stream.Signature(shape)) for k in range(count)},
            "o": Out(stream.Signature(shape)),
        })

    @property
    def inputs(self):
        """The input streams, ``i0`` first."""
        return [getattr(self, f"i{k}") for k in range(self.count)]

    def elaborate(self, platform):
        m = Module()
        # `grant` is a register in both forms: it selects the data multiplexer directly (no
        # logic between the many mux selects and a flip-flop).
        grant = Signal(range(self.count))
        locked = Signal()                    # inside a packet of `grant`
        if self.registered:
            self._registered(m, grant, locked)
        else:
            self._pass_through(m, grant, locked)
        return m

    def _pass_through(self, m, grant, locked):
        """The granted input on ``o`` while ``locked``; a new grant a clock after a packet."""
        inputs, o = self.inputs, self.o
        with m.Switch(grant):
            for k, port in enumerate(inputs):
                with m.Case(k):
                    m.d.comb += [o.p.eq(port.p), o.valid.eq(port.valid & locked),
                                 port.ready.eq(o.ready & locked)]
        with m.If(locked):
            with m.If(o.valid & o.ready & o.p.last):
                m.d.sync += locked.eq(0)
        with m.Else():
            # The first requester after the last grant, in circular order.
            request = Signal(self.count)
            m.d.comb += request.eq(Cat(*(port.valid for port in inputs)))

            def take(k):
                m.d.sync += [grant.eq(k), locked.eq(1)]
            _round_robin(m, grant, self.count, request, take)

    def _registered(self, m, grant, locked):
        """The granted input's beats into the output register; the grant moves on at a
        packet's last beat, or while its input has nothing to send, to the next input with a
        beat waiting."""
        inputs = self.inputs
        valid = Array(s.valid for s in inputs)
        payload = Array(s.payload for s in inputs)
        following = Signal(range(self.count))    # next input after `grant` with a beat waiting
        m.d.comb += following.eq(grant)

        def follow(k):
            m.d.comb += following.eq(k)
        _round_robin(m, grant, self.count, [s.valid for s in inputs], follow)

        take = Signal()                      # the output register is free
        m.d.comb += take.eq(~self.o.valid | self.o.ready)
        for k, s in enumerate(inputs):
            m.d.comb += s.ready.eq(take & (grant == k))
        beat_taken = take & valid[grant]
        with m.If(take):
            m.d.sync += [self.o.valid.eq(valid[grant]), self.o.payload.eq(payload[grant])]
        with m.If(beat_taken):
            m.d.sync += locked.eq(~payload[grant].last)
            with m.If(payload[grant].last):
                m.d.sync += grant.eq(following)
        with m.Elif(~locked):
            m.d.sync += grant.eq(following)
