"""Compares a received AXI-Stream with the expected one, beat by beat, at one beat per clock.

Used by both self-test checkers: the NIC checker feeds it the quantised replay of the
gradient stream (:mod:`hdl.selftest.nic_checker`), the aggregator checker the expected sums
(:mod:`hdl.selftest.agg_traffic`).
"""
from amaranth import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from contract.header import LANES
from hdl.stream.axis import axis_signature

__all__ = ["StreamChecker"]


class StreamChecker(wiring.Component):
    """Takes one expected and one received beat together and counts the differences.

    A beat differs if ``last`` or ``keep`` differ, or any 32-bit lane that the expected
    ``keep`` marks valid differs (lanes beyond the end of the payload are not compared).

    Parameters
    ----------
    stall_limit : int
        Cycles an expected beat may wait for its received beat before the checker counts a
        stall error (and then one more every ``stall_limit`` cycles while the wait lasts):
        a hung engine shows up as errors, not just as counters that stop.

    Attributes
    ----------
    expected, received : In(axis_signature())
    beats, packets : Out(32)
        Beats and packets (by expected ``last``) compared; wrap around.
    errors : Out(32)
        Beats that differed, plus stall errors; saturates.
    bad_packets : Out(32)
        Packets with at least one differing beat; saturates.
    error : Out(1)
        ``errors != 0``.
    """

    def __init__(self, *, stall_limit=1 << 20):
        if not isinstance(stall_limit, int) or stall_limit < 2:
            raise ValueError(f"stall_limit must be an integer >= 2, not {stall_limit!r}")
        self.stall_limit = stall_limit
        super().__init__({
            "expected": In(axis_signature()),
            "received": In(axis_signature()),
            "beats": Out(32), "packets": Out(32),
            "errors": Out(32), "bad_packets": Out(32),
            "error": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        exp, rcv = self.expected, self.received
        fire = Signal()
        m.d.comb += [
            exp.ready.eq(rcv.valid),
            rcv.ready.eq(exp.valid),
            fire.eq(exp.valid & rcv.valid),
        ]

        # stage 1: hold the pair
        pair_valid = Signal()
        exp_r = Signal.like(exp.payload)
        rcv_r = Signal.like(rcv.payload)
        m.d.sync += pair_valid.eq(fire)
        with m.If(fire):
            m.d.sync += [exp_r.eq(exp.payload), rcv_r.eq(rcv.payload)]

        # stage 2: compare
        lane_differs = Signal(LANES)
        for j in range(LANES):
            lane = slice(32 * j, 32 * j + 32)
            m.d.comb += lane_differs[j].eq(exp_r.keep[4 * j]
                                           & (exp_r.data[lane] != rcv_r.data[lane]))
        differs = Signal()
        last = Signal()
        compared = Signal()
        m.d.sync += [
            compared.eq(pair_valid),
            last.eq(exp_r.last),
            differs.eq((lane_differs != 0) | (exp_r.keep != rcv_r.keep)
                       | (exp_r.last != rcv_r.last)),
        ]

        # stage 3: count
        stall_timer = Signal(range(self.stall_limit))
        stall_error = Signal()
        with m.If(exp.valid & ~rcv.valid):
            m.d.sync += stall_timer.eq(stall_timer + 1)
            with m.If(stall_timer == self.stall_limit - 1):
                m.d.sync += [stall_timer.eq(0), stall_error.eq(1)]
        with m.Else():
            m.d.sync += stall_timer.eq(0)
        with m.If(stall_error):
            m.d.sync += stall_error.eq(0)

        packet_bad = Signal()        # a beat of the current packet differed so far
        errors_next = Signal(33)
        m.d.comb += errors_next.eq(self.errors + (compared & differs) + stall_error)
        m.d.sync += self.errors.eq(Mux(errors_next[32], 0xFFFFFFFF, errors_next))  # saturate
        with m.If(compared):
            m.d.sync += [self.beats.eq(self.beats + 1), packet_bad.eq(packet_bad | differs)]
            with m.If(last):
                m.d.sync += [self.packets.eq(self.packets + 1), packet_bad.eq(0)]
                with m.If((packet_bad | differs) & (self.bad_packets != 0xFFFFFFFF)):
                    m.d.sync += self.bad_packets.eq(self.bad_packets + 1)
        m.d.comb += self.error.eq(self.errors != 0)
        return m
