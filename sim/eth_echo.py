"""Simulation top of the network core: the LiteEth core, a UDP echo, event counters.

The RGMII pins are top-level ports (``rgmii_tx_clk`` ...), driven by cocotbext-eth in
``sim/tb_eth.py``; ``clk``/``rst`` drive LiteEth's sys domain. Each core event has a 16-bit
counter ``count_<name>`` so that tests read totals instead of watching pulses.
"""
from __future__ import annotations

import functools
from pathlib import Path

from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import Out

from hdl.net.echo import UdpEcho
from hdl.net.eth_core import LiteEthCore
from hdl.net.liteeth import EVENTS, generate, load_network_config

__all__ = ["TOP", "MODELS", "EthEchoTop", "echo_top_sources"]

TOP = "eth_echo_top"
MODELS = Path(__file__).with_name("ecp5_models.v")


class EthEchoTop(wiring.Component):
    """LiteEthCore -> UdpEcho -> LiteEthCore, in the ``sync`` domain."""

    def __init__(self, core, *, echo_depth=4096):
        self._core, self._echo_depth = core, echo_depth
        super().__init__({
            **{f"count_{name}": Out(16) for name in EVENTS},
            "echoed": Out(32),
            "echo_dropped": Out(32),
            "link_up": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.eth = eth = LiteEthCore(self._core, domain="sync")
        m.submodules.echo = echo = UdpEcho(depth=self._echo_depth)
        wiring.connect(m, eth.rx, echo.rx)
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
    from sim.runner import export_verilog
    core = generate(load_network_config(board))
    return export_verilog(EthEchoTop(core), TOP), (core.verilog_path, MODELS)
