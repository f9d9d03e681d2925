"""Simulation top of the network core: the LiteEth core, a UDP echo, event counters.

The RGMII pins are top-level ports (``rgmii_tx_clk`` ...), driven by cocotbext-eth in
``sim/tb_eth.py``; ``clk``/``rst`` drive LiteEth's sys domain. Each core event has a 16-bit
counter ``count_<name>`` so that tests read totals instead of watching pulses.
"""
from __future__ import annotations

import functools
from pathlib import Path

from amaranth import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from hdl.net.core.echo import UdpEcho
from hdl.net.core.eth_core import LiteEthCore, RxBeat, UdpMeta
from hdl.net.core.liteeth import EVENTS, generate, load_network_config

__all__ = ["TOP", "MODELS", "RxContractMonitor", "EthEchoTop", "echo_top_sources"]

TOP = "eth_echo_top"
MODELS = Path(__file__).with_name("ecp5_models.v")


class RxContractMonitor(wiring.Component):
    """Counts received datagrams that break the ``rx`` contract of ``LiteEthCore``.

    Watches the stream without driving it. A datagram without ``error`` must have
    ``max(1, ceil(length / 4))`` beats, ``last_be`` one-hot on the last payload byte (zero
    for length 0) and the same ``meta`` on every beat.
    """

    def __init__(self):
        super().__init__({"rx": In(stream.Signature(RxBeat)), "violations": Out(16)})

    def elaborate(self, platform):
        m = Module()
        rx = self.rx
        first = Signal(init=1)
        beats = Signal(16)
        meta = Signal(UdpMeta)
        bad = Signal()
        length = Signal(16)
        m.d.comb += length.eq(Mux(first, rx.p.meta.length, meta.length))
        want_beats = Signal(16)
        want_last_be = Signal(4)
        m.d.comb += want_beats.eq(Mux(length == 0, 1, (length + 3) >> 2))
        with m.Switch(length[:2]):
            for tail in range(4):
                with m.Case(tail):
                    m.d.comb += want_last_be.eq(1 << ((tail - 1) % 4))
        with m.If(length == 0):
            m.d.comb += want_last_be.eq(0)
        with m.If(rx.valid & rx.ready):
            m.d.sync += first.eq(rx.p.last)
            with m.If(first):
                m.d.sync += [meta.eq(rx.p.meta), beats.eq(1), bad.eq(0)]
            with m.Else():
                m.d.sync += beats.eq(beats + 1)
                with m.If(rx.p.meta.as_value() != meta.as_value()):
                    m.d.sync += bad.eq(1)
            with m.If(rx.p.last & ~rx.p.error):
                count = Mux(first, 1, beats + 1)
                changed = ~first & (rx.p.meta.as_value() != meta.as_value())
                with m.If(bad | changed | (count != want_beats) | (rx.p.last_be != want_last_be)):
                    m.d.sync += self.violations.eq(self.violations + 1)
        return m


class EthEchoTop(wiring.Component):
    """LiteEthCore -> UdpEcho -> LiteEthCore, in the ``sync`` domain."""

    def __init__(self, core, *, echo_depth=4096):
        self._core, self._echo_depth = core, echo_depth
        super().__init__({
            **{f"count_{name}": Out(16) for name in EVENTS},
            "echoed": Out(32),
            "echo_dropped": Out(32),
            "link_up": Out(1),
            "rx_contract_violations": Out(16),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.eth = eth = LiteEthCore(self._core, domain="sync")
        m.submodules.echo = echo = UdpEcho(depth=self._echo_depth)
        wiring.connect(m, eth.rx, echo.rx)
        m.submodules.monitor = monitor = RxContractMonitor()
        m.d.comb += [
            monitor.rx.valid.eq(eth.rx.valid),
            monitor.rx.ready.eq(eth.rx.ready),
            monitor.rx.p.eq(eth.rx.p),
            self.rx_contract_violations.eq(monitor.violations),
        ]
        wiring.connect(m, echo.tx, eth.tx)
        m.d.comb += [
            eth.arp_clear_enable.eq(0),
            self.echoed.eq(echo.echoed),
            self.echo_dropped.eq(echo.dropped),
            self.link_up.eq(eth.link_up),
        ]
        for name in EVENTS:
            counter = getattr(self, f"count_{name}")
            with m.If(eth.events[name]):
                m.d.sync += counter.eq(counter + 1)
        return m


@functools.lru_cache(maxsize=None)
def echo_top_sources(board="ecpix5"):
    """(Verilog of the top, extra Verilog files) for :func:`sim.runner.run_cocotb`."""
    from hdl.export import export_verilog
    core = generate(load_network_config(board))
    return export_verilog(EthEchoTop(core), TOP), (core.verilog_path, MODELS)
