"""Built-in self-test: traffic sources, the engines, checkers, counters and the text report.

This module is the *board-independent* part of the board top: everything runs in the
``sync`` domain (the engine clock) and talks to the board only through :class:`SelfTest`'s
ports (UART TX bit, fault-injection input, status bits for LEDs), so the Amaranth
simulator can run it as is (``tests/test_selftest.py``).

Data paths (every arrow is a 256-bit AXI-Stream of :data:`hdl.axis.AxisBeat`):

* NIC: ``GradientGenerator -> nic_top.tx_s_axis``; ``tx_m_axis -> rx_s_axis`` (the
  wire: here a loopback); ``rx_m_axis -> [fault injection] -> NicChecker``. The checker's
  expected beats come from a second ``GradientGenerator`` with the same seed, through the
  independent :class:`hdl.lane_quantizer.QuantizeStream`.
* Switch: ``AggTraffic`` (virtual workers and an arbiter) ``-> [fault injection] ->
  switch_top.s_axis``; ``m_axis -> AggTraffic`` result checker; ``ctrl_*`` configured by
  ``AggTraffic`` at start.

To put an Ethernet MAC + UDP front end in place of the self-test later, replace the sources
and sinks by the front end's streams; the engines and their connections stay the same.
"""
from amaranth import Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hdl.report import Report
from hdl.uart_tx import UartTx, uart_divisor

__all__ = ["ENGINES", "SelfTestStatus", "SelfTest"]

#: Engines the self-test can hold.
ENGINES = ("nic", "switch")

#: Status bits for LEDs (names used by constraints/boards.toml).
SelfTestStatus = data.StructLayout({
    "heartbeat": 1,        # toggles every second
    "pll_unlocked": 1,     # driven by the board top (the self-test runs only when locked)
    "nic_ok": 1,           # NIC traffic checked, no error so far
    "nic_error": 1,        # the NIC checker saw an error (sticky)
    "agg_ok": 1,
    "agg_error": 1,
    "fault_injected": 1,   # the fault-injection input is asserted
})


class SelfTest(wiring.Component):
    """The self-test around the engines, minus the board (clock, reset, pins).

    Parameters
    ----------
    engines : tuple of str
        Subset of :data:`ENGINES` to build (an empty tuple gives just the report: a board
        bring-up design).
    clk_hz : int
        The ``sync`` clock frequency: sets the UART divisor and the one-second period.
    baud : int
        UART rate of the report.
    report_period : int or None
        Cycles between report lines; default ``clk_hz`` (one line per second).

    Attributes
    ----------
    uart_tx : Out(1)
        The report, 8N1, idle high.
    inject_fault : In(1)
        While high, one bit of every checked payload beat is flipped between the engines
        and their checkers (NIC: after the decompressor; switch: in front of the
        aggregator), so the checkers must count errors.
    status : Out(SelfTestStatus)
    """

    def __init__(self, *, engines=ENGINES, clk_hz, baud=115200, report_period=None):
        engines = tuple(engines)
        unknown = set(engines) - set(ENGINES)
        if unknown:
            raise ValueError(f"Unknown engine(s) {sorted(unknown)}; the self-test knows "
                             f"{list(ENGINES)}")
        self.engines = engines
        self.clk_hz = int(clk_hz)
        self.divisor = uart_divisor(self.clk_hz, baud)
        self.report_period = self.clk_hz if report_period is None else int(report_period)
        super().__init__({
            "uart_tx": Out(1, init=1),
            "inject_fault": In(1),
            "status": Out(SelfTestStatus),
        })

    def report_template(self):
        """The report line: ``t`` is seconds since reset (lines since reset)."""
        fields = ["gradwire t={seconds}"]
        return " ".join(fields) + "\r\n"

    def elaborate(self, platform):
        m = Module()

        seconds = Signal(32)
        second_timer = Signal(range(self.report_period), init=self.report_period - 1)
        m.d.sync += second_timer.eq(second_timer - 1)
        with m.If(second_timer == 0):
            m.d.sync += [
                second_timer.eq(self.report_period - 1),
                seconds.eq(seconds + 1),
                self.status.heartbeat.eq(~self.status.heartbeat),
            ]
        m.d.comb += self.status.fault_injected.eq(self.inject_fault)

        m.submodules.report = report = Report(self.report_template(),
                                              period=self.report_period)
        m.submodules.uart = uart = UartTx(divisor=self.divisor)
        wiring.connect(m, report.o, uart.data)
        m.d.comb += [report.seconds.eq(seconds), self.uart_tx.eq(uart.tx)]
        return m
