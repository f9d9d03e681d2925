"""The aggregator's per-beat arithmetic: eight 32-bit lanes of wrap-around ADD or OR.

One payload beat of a data packet meets the same beat of the slot's stored value. The
result is what the slot holds after this packet (if the packet turns out to be good):

- ``keep_old``: a retransmission; the stored value is kept (and re-sent if complete);
- ``first``: the first contribution of a new round; the payload replaces the stored value;
- otherwise ``old + payload`` (wrap-around, per lane) or ``old | payload``.

Purely combinational: one 32-bit adder per lane, so one pipeline stage of the engine.
"""
from amaranth import Cat, Module, Mux
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["LaneALU", "lane_alu_reference"]


class LaneALU(wiring.Component):
    """Combines one stored beat with one payload beat, lane by lane.

    Parameters
    ----------
    lanes : int
        Number of 32-bit lanes per beat (8 for a 256-bit AXI-Stream beat).

    Attributes
    ----------
    old, payload : Signal(32 * lanes), in
        Stored beat and payload beat; lane ``j`` in bits ``32j+31 .. 32j``.
    first, op_or, keep_old : Signal(1), in
        Select the operation (see the module docstring); ``keep_old`` wins over ``first``.
    result : Signal(32 * lanes), out
    """

    def __init__(self, *, lanes=8):
        if not isinstance(lanes, int) or lanes < 1:
            raise ValueError(f"Lane count must be a positive integer, not {lanes!r}")
        self._lanes = lanes
        super().__init__({
            "old": In(32 * lanes),
            "payload": In(32 * lanes),
            "first": In(1),
            "op_or": In(1),
            "keep_old": In(1),
            "result": Out(32 * lanes),
        })

    def elaborate(self, platform):
        m = Module()
        lanes = []
        for j in range(self._lanes):
            old = self.old[32 * j:32 * (j + 1)]
            new = self.payload[32 * j:32 * (j + 1)]
            # Slicing the 33-bit sum to 32 bits is the wrap-around of the int32 sketch cells.
            combined = Mux(self.op_or, old | new, (old + new)[:32])
            lanes.append(Mux(self.keep_old, old, Mux(self.first, new, combined)))
        m.d.comb += self.result.eq(Cat(*lanes))
        return m


def lane_alu_reference(old, payload, *, first, op_or, keep_old, lanes=8):
    """Software model of :class:`LaneALU` on integers (for tests)."""
    if keep_old:
        return old
    if first:
        return payload
    out = 0
    for j in range(lanes):
        a = (old >> (32 * j)) & 0xFFFF_FFFF
        b = (payload >> (32 * j)) & 0xFFFF_FFFF
        out |= ((a | b) if op_or else ((a + b) & 0xFFFF_FFFF)) << (32 * j)
    return out
