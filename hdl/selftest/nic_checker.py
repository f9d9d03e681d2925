"""The NIC self-test's checking side: what the NIC must deliver, compared with what it did.

The expected beats are not stored: a second :class:`hdl.selftest.gradient_gen.GradientGenerator`
with the traffic source's seed replays the packets, the independent
:class:`hdl.selftest.lane_quantizer.QuantizeStream` turns every compressed packet's values into what
they must be after compress -> decompress, and :class:`hdl.selftest.stream_checker.StreamChecker`
compares that with the NIC's receive output beat by beat (header beats included: the
NIC must restore every header field).
"""
from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hdl.selftest.gradient_gen import GradientGenerator
from hdl.selftest.lane_quantizer import QuantizeStream
from hdl.selftest.stream_checker import StreamChecker
from hdl.stream.axis import axis_signature

__all__ = ["NicChecker"]


class NicChecker(wiring.Component):
    """Checks the NIC's receive output against the replayed, quantised gradient stream.

    Parameters
    ----------
    seed, max_count : int
        Those of the :class:`hdl.selftest.gradient_gen.GradientGenerator` feeding the NIC.
    stall_limit : int
        See :class:`hdl.selftest.stream_checker.StreamChecker`.

    Attributes
    ----------
    received : In(axis_signature())
        The NIC receive path's output (``rx_m_axis``).
    beats, packets, errors, bad_packets : Out(32)
    error : Out(1)
        As in :class:`hdl.selftest.stream_checker.StreamChecker`.
    """

    def __init__(self, *, seed=1, max_count=256, stall_limit=1 << 20):
        self.seed, self.max_count, self.stall_limit = seed, max_count, stall_limit
        super().__init__({
            "received": In(axis_signature()),
            "beats": Out(32), "packets": Out(32),
            "errors": Out(32), "bad_packets": Out(32),
            "error": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.replay = replay = GradientGenerator(seed=self.seed,
                                                         max_count=self.max_count)
        m.submodules.quantise = quantise = QuantizeStream()
        m.submodules.compare = compare = StreamChecker(stall_limit=self.stall_limit)
        # (the quantiser's input ready is a register: the replay's clock enables stay one
        # gate away from flip-flops)
        wiring.connect(m, replay.o, quantise.i)
        wiring.connect(m, quantise.o, compare.expected)
        wiring.connect(m, wiring.flipped(self.received), compare.received)
        for name in ("beats", "packets", "errors", "bad_packets", "error"):
            m.d.comb += getattr(self, name).eq(getattr(compare, name))
        return m
