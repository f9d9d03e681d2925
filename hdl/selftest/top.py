"""Built-in self-test: traffic sources, the engines, checkers, counters and the text report.

This module is the *board-independent* part of the board top: everything runs in the
``sync`` domain (the engine clock) and talks to the board only through :class:`SelfTest`'s
ports (UART TX bit, fault-injection input, status bits for LEDs), so the Amaranth
simulator can run it as is (``tests/hdl/selftest/test_top.py``).

Data paths (every arrow is a 256-bit AXI-Stream of :data:`hdl.stream.axis.AxisBeat`):

* NIC: ``GradientGenerator -> NicEngine.tx_in``; ``tx_out -> rx_in`` (the wire: here a
  loopback through a skid buffer); ``rx_out -> [fault injection] -> NicChecker``. The checker's expected beats come from a second ``GradientGenerator``
  with the same seed, through the independent :class:`hdl.selftest.lane_quantizer.QuantizeStream`.
* Switch: ``AggTraffic`` (virtual workers and an arbiter) ``-> [fault injection] ->
  Aggregator.i``; ``o -> AggTraffic`` result checker; its register port configured by
  ``AggTraffic`` at start, then read by a counter poller.

To put an Ethernet MAC + UDP front end in place of the self-test later, replace the sources
and sinks by the front end's streams; the engines and their connections stay the same.
"""
from amaranth import Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from contract.registers import NIC_REGISTERS, SWITCH_REGISTERS
from hdl.nic.engine import NicEngine
from hdl.selftest.agg_traffic import AggTraffic
from hdl.selftest.counter_poller import CounterPoller
from hdl.selftest.fault_inject import FaultInjector
from hdl.selftest.gradient_gen import GradientGenerator
from hdl.selftest.nic_checker import NicChecker
from hdl.selftest.report import Report
from hdl.selftest.uart_tx import UartTx, uart_divisor
from hdl.stream.axis import AxisBeat
from hdl.stream.skid_buffer import SkidBuffer
from hdl.switch.aggregator import Aggregator

__all__ = ["ENGINES", "SelfTestStatus", "SelfTest"]

#: Engines the self-test can hold.
ENGINES = ("nic", "switch")

#: Status bits for LEDs (names used by constraints/boards.toml).
SelfTestStatus = data.StructLayout({
    "heartbeat": 1,        # toggles every report period (a second on the board)
    "pll_unlocked": 1,     # driven by the board top (the self-test runs only when locked)
    "nic_ok": 1,           # NIC packets checked, no error so far
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
    nic : dict
        NIC engine parameters (:class:`hdl.nic.engine.NicEngine`; default ``max_count=2048``).
    nic_values : int
        Largest packet the gradient generator makes (values, a power of two).
    switch : dict
        Aggregator parameters (:class:`hdl.switch.aggregator.Aggregator`; default: 64 slots, 64 lanes,
        32 workers, 4 jobs, the contract's engine).
    agg_traffic : dict
        :class:`hdl.selftest.agg_traffic.AggTraffic` parameters (default 4 workers, a window of 8
        slots); ``lanes`` is taken from ``switch``.
    stall_limit : int
        Cycles a checker waits for an expected beat before it counts a stall error.
    seed : int
        Seeds of the traffic.

    Attributes
    ----------
    uart_tx : Out(1)
        The report, 8N1, idle high.
    inject_fault : In(1)
        While high, bit 0 of lane 0 of every payload beat is flipped between the engines and
        their checkers (NIC: after the decompressor; switch: in front of the aggregator),
        so the checkers must count errors.
    status : Out(SelfTestStatus)

    Every counter of the report is also an attribute after elaboration:
    :attr:`counters` maps its name to the signal.
    """

    def __init__(self, *, engines=ENGINES, clk_hz, baud=115200, report_period=None,
                 nic=None, nic_values=256, switch=None, agg_traffic=None,
                 stall_limit=1 << 20, seed=1):
        engines = tuple(engines)
        unknown = set(engines) - set(ENGINES)
        if unknown:
            raise ValueError(f"Unknown engine(s) {sorted(unknown)}; the self-test knows "
                             f"{list(ENGINES)}")
        self.engines = engines
        self.clk_hz = int(clk_hz)
        self.divisor = uart_divisor(self.clk_hz, baud)
        self.report_period = self.clk_hz if report_period is None else int(report_period)
        self.nic_params = {"max_count": 2048, **(nic or {})}
        if nic_values > self.nic_params["max_count"]:
            raise ValueError(f"nic_values {nic_values} exceeds the NIC's max_count "
                             f"{self.nic_params['max_count']}: its packets would be dropped")
        self.nic_values = nic_values
        self.switch_params = {"slots": 64, "lanes": 64, "max_workers": 32, "jobs": 4,
                              **(switch or {})}
        self.agg_params = {"workers": 4, "window": 8, **(agg_traffic or {}),
                           "lanes": self.switch_params["lanes"]}
        if self.agg_params["window"] > self.switch_params["slots"]:
            raise ValueError(f"agg_traffic window {self.agg_params['window']} exceeds the "
                             f"aggregator's {self.switch_params['slots']} slots")
        if self.agg_params["workers"] > self.switch_params["max_workers"]:
            raise ValueError(f"agg_traffic workers {self.agg_params['workers']} exceeds the "
                             f"aggregator's max_workers {self.switch_params['max_workers']}")
        self.stall_limit, self.seed = stall_limit, seed
        self.counters = {}
        super().__init__({
            "uart_tx": Out(1, init=1),
            "inject_fault": In(1),
            "status": Out(SelfTestStatus),
        })

    def report_template(self):
        """The report line (``t`` is the line number: seconds on the board)."""
        parts = ["gradwire t={line}s"]
        if "nic" in self.engines:
            parts.append("| nic pkts={nic_packets} in={nic_in_beats} wire={nic_wire_beats} "
                         "out={nic_beats} comp={nic_compressed} drop={nic_drops} "
                         "err={nic_errors} badpk={nic_bad_packets}")
        if "switch" in self.engines:
            parts.append("| agg sent={agg_sent} acc={agg_accepted} res={agg_results} "
                         "drop={agg_drops} err={agg_errors} badpk={agg_bad_packets}")
        parts.append("| fault={faults}")
        return " ".join(parts) + "\r\n"

    def elaborate(self, platform):
        m = Module()
        counters = self.counters
        counters["faults"] = faults = Signal(32)

        if "nic" in self.engines:
            self._nic(m, counters)
        if "switch" in self.engines:
            self._switch(m, counters)

        # every injected beat: what the fault counter shows (0 unless someone injects)
        fault_sources = [c for n, c in counters.items() if n.endswith("_flipped")]
        if fault_sources:
            total = fault_sources[0]
            for c in fault_sources[1:]:
                total = total + c
            m.d.comb += faults.eq(total)
        m.d.comb += self.status.fault_injected.eq(self.inject_fault)

        m.submodules.report = report = Report(self.report_template(),
                                              period=self.report_period)
        for name in report.fields:
            if name != "line":
                m.d.comb += getattr(report, name).eq(counters[name])
        with m.If(report.tick):
            m.d.sync += self.status.heartbeat.eq(~self.status.heartbeat)
        m.submodules.uart = uart = UartTx(divisor=self.divisor)
        # a register between the report's text decoder and the UART's frame loader
        m.submodules.report_skid = report_skid = SkidBuffer(8)
        wiring.connect(m, report.o, report_skid.i)
        wiring.connect(m, report_skid.o, uart.data)
        m.d.comb += self.uart_tx.eq(uart.tx)
        return m

    def _nic(self, m, counters):
        """Generator -> TX -> (loopback wire) -> RX -> fault injector -> checker."""
        m.submodules.nic = nic = NicEngine(**self.nic_params)
        m.submodules.nic_source = source = GradientGenerator(seed=self.seed,
                                                             max_count=self.nic_values)
        m.submodules.nic_inject = inject = FaultInjector()
        m.submodules.nic_check = check = NicChecker(seed=self.seed,
                                                    max_count=self.nic_values,
                                                    stall_limit=self.stall_limit)
        # the NIC's tready must not be the clock enable of the generator's registers
        m.submodules.nic_source_skid = source_skid = SkidBuffer(AxisBeat)
        wiring.connect(m, source.o, source_skid.i)
        wiring.connect(m, source_skid.o, nic.tx_in)
        # the wire: TX output into RX input, through a register both ways (as a MAC would
        # be), so neither engine's handshake logic runs on into the other's
        m.submodules.nic_wire = wire = SkidBuffer(AxisBeat)
        wiring.connect(m, nic.tx_out, wire.i)
        wiring.connect(m, wire.o, nic.rx_in)
        wiring.connect(m, nic.rx_out, inject.i)
        wiring.connect(m, inject.o, check.received)
        m.d.comb += inject.enable.eq(self.inject_fault)

        in_beats, wire_beats = Signal(32), Signal(32)
        with m.If(nic.tx_in.valid & nic.tx_in.ready):
            m.d.sync += in_beats.eq(in_beats + 1)
        with m.If(nic.tx_out.valid & nic.tx_out.ready):
            m.d.sync += wire_beats.eq(wire_beats + 1)

        m.submodules.nic_poll = poll = CounterPoller({
            "compressed": [NIC_REGISTERS["tx"].address("compressed")],
            "drops": [address for name, address in NIC_REGISTERS["rx"].items()
                      if name.startswith("drop_")],
        })
        wiring.connect(m, poll.ctrl, nic.ctrl)
        m.d.comb += poll.enable.eq(1)

        counters.update(nic_packets=check.packets, nic_beats=check.beats,
                        nic_errors=check.errors, nic_bad_packets=check.bad_packets,
                        nic_in_beats=in_beats, nic_wire_beats=wire_beats,
                        nic_compressed=poll.compressed, nic_drops=poll.drops,
                        nic_flipped=inject.flipped)
        m.d.comb += [self.status.nic_ok.eq((check.packets != 0) & ~check.error),
                     self.status.nic_error.eq(check.error)]

    def _switch(self, m, counters):
        """Virtual workers -> fault injector -> aggregator -> result checker."""
        m.submodules.switch = switch = Aggregator(**self.switch_params)
        m.submodules.agg_traffic = traffic = AggTraffic(seed=self.seed + 1,
                                                        stall_limit=self.stall_limit,
                                                        **self.agg_params)
        wiring.connect(m, traffic.o, switch.i)
        wiring.connect(m, switch.o, traffic.results)
        m.d.comb += traffic.inject_fault.eq(self.inject_fault)

        m.submodules.agg_poll = poll = CounterPoller({
            "accepted": [SWITCH_REGISTERS["counter"].address("accepted")],
            "drops": [address for name, address in SWITCH_REGISTERS["counter"].items()
                      if name.startswith("drop_") or name == "retransmit_dropped"],
        })
        m.d.comb += [
            poll.enable.eq(traffic.configured),
            # the traffic source owns the control port until the job is configured
            switch.ctrl.addr.eq(Mux(traffic.configured, poll.ctrl.addr, traffic.ctrl.addr)),
            switch.ctrl.wdata.eq(traffic.ctrl.wdata),
            switch.ctrl.we.eq(traffic.ctrl.we),
            switch.ctrl.re.eq(poll.ctrl.re),
            poll.ctrl.rdata.eq(switch.ctrl.rdata),
            traffic.ctrl.rdata.eq(switch.ctrl.rdata),
        ]
        counters.update(agg_sent=traffic.sent, agg_results=traffic.packets,
                        agg_errors=traffic.errors, agg_bad_packets=traffic.bad_packets,
                        agg_accepted=poll.accepted, agg_drops=poll.drops,
                        agg_flipped=traffic.flipped)
        m.d.comb += [self.status.agg_ok.eq((traffic.packets != 0) & ~traffic.error),
                     self.status.agg_error.eq(traffic.error)]
