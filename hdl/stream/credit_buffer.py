"""A FIFO that grants its producer credit ahead of time, for free-running pipelines.

A pipeline whose stages all wait while the output is stalled (``advance = ~o.valid |
o.ready``) turns the consumer's ``ready`` into the clock enable of every register it
holds: thousands of flip-flops on one net, one clock after another stage's ``ready``. The
self-test's wide pipelines (the quantiser, the expected sums) instead move on every clock,
and a :class:`CreditBuffer` at their end absorbs what comes out: its ``space`` output, a
register, tells the producer whether a beat issued now still fits once the pipeline
``latency`` has passed, counting every beat that may still be in flight.

``space`` goes through ``space_delay`` more registers on its way out (counted as more beats
in flight), so the flip-flop the producer's enables come from can sit next to the producer,
however far the FIFO is: the producer's stall decision is then one gate from a local
register, not a wire across the pipeline it feeds.

On the consumer's side, the FIFO's output is by default a register (block RAM can hold the
entries); its load enable is then the consumer's ``ready``, on every bit of the item. With
``registered_output=False`` the entries sit in LUT RAM read through the read pointer, and
``ready`` only moves that pointer: for a consumer whose ``ready`` is logic (the compressor's
accumulator) in front of a wide item.
"""
from amaranth import Module, Shape, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFO, SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

__all__ = ["CreditBuffer"]


class CreditBuffer(wiring.Component):
    """FIFO with a registered "you may issue a beat now" for a pipeline of ``latency``.

    Parameters
    ----------
    shape : shape-like
        Payload of the streams.
    latency : int
        Clocks from the producer's decision to issue (``space`` seen high) to the beat's
        arrival at ``i``.
    depth : int or None
        FIFO entries; default ``2 * (latency + space_delay) + 5``: full throughput with a
        consumer that takes a beat every clock or one that stalls a clock now and then (16
        clocks in 17, the compressor's accumulator with all-raw blocks). One entry less and
        ``space``, which must assume a beat issued on every clock it was high, lets the FIFO
        run dry after such a stall.
    space_delay : int
        Extra registers on ``space`` (default 1).
    registered_output : bool
        ``o.payload`` from a register (default; :class:`~amaranth.lib.fifo.SyncFIFOBuffered`)
        or read combinationally from the FIFO memory at the read pointer
        (:class:`~amaranth.lib.fifo.SyncFIFO`): a beat is then out a clock earlier, and
        ``o.ready`` enables only the pointer and the level.

    Attributes
    ----------
    i : In(stream.Signature(shape))
        ``ready`` is high whenever there is room, which ``space`` guarantees; a producer that
        issues only on ``space`` never sees it low.
    o : Out(stream.Signature(shape))
    space : Out(1)
        A register: a beat issued this clock will find room.
    """

    def __init__(self, shape, *, latency, depth=None, space_delay=1, registered_output=True):
        if not isinstance(latency, int) or latency < 0:
            raise ValueError(f"latency must be a non-negative integer, not {latency!r}")
        if not isinstance(space_delay, int) or space_delay < 0:
            raise ValueError(f"space_delay must be a non-negative integer, not "
                             f"{space_delay!r}")
        in_flight = latency + space_delay
        depth = 2 * in_flight + 5 if depth is None else depth
        if depth < in_flight + 3:
            raise ValueError(f"depth {depth} cannot cover a latency of {latency} and a "
                             f"space delay of {space_delay} (needs at least {in_flight + 3})")
        self.shape, self.latency, self.depth = shape, latency, depth
        self.space_delay = space_delay
        self.registered_output = bool(registered_output)
        super().__init__({
            "i": In(stream.Signature(shape)),
            "o": Out(stream.Signature(shape)),
            "space": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        width = Shape.cast(self.shape).width
        fifo_class = SyncFIFOBuffered if self.registered_output else SyncFIFO
        m.submodules.fifo = fifo = fifo_class(width=width, depth=self.depth)
        m.d.comb += [
            fifo.w_data.eq(self.i.payload.as_value()),
            fifo.w_en.eq(self.i.valid),
            self.i.ready.eq(fifo.w_rdy),
            self.o.payload.as_value().eq(fifo.r_data),
            self.o.valid.eq(fifo.r_rdy),
            fifo.r_en.eq(self.o.ready),
        ]
        # `space` at clock t is computed from the level at t - 1 - space_delay, which does
        # not count the beats issued at t - 1 - space_delay - latency .. t - 1 (still in the
        # pipeline), nor the one issued at t: latency + space_delay + 2 beats at most (one
        # per clock), counted as stored already.
        in_flight = self.latency + self.space_delay + 2
        space = Signal(name="space_from_level")
        m.d.sync += space.eq(fifo.level + in_flight <= self.depth)
        for i in range(self.space_delay):
            delayed = Signal(name=f"space_delayed{i}")
            m.d.sync += delayed.eq(space)
            space = delayed
        m.d.comb += self.space.eq(space)
        return m
