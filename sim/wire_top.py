"""Simulation top of the NIC in the wire: :class:`hdl.wire.top.WireTop` (the Versa's
configuration) with both ports' RGMII pins as top-level ports (``rgmii0_*`` facing the host,
``rgmii1_*`` the network), the generated wire core and the behavioural ECP5 primitives of
``sim/ecp5_models.v``.

Clocks: ``clk`` (LiteEth's sys and the wire's engines: the configuration's ``sys_clk_hz``,
62.5 MHz, the bitstream's one clock), ``rgmii0_rx_clk`` and ``rgmii1_rx_clk`` (each PHY,
125 MHz). The register port is ``ctrl__addr``/``ctrl__re``/``ctrl__rdata``
(``contract.registers.WIRE_REGISTERS``).
"""
from __future__ import annotations

import functools

from sim.eth_echo import MODELS

__all__ = ["TOP", "wire_top_sources"]

TOP = "wire_top"


@functools.lru_cache(maxsize=None)
def wire_top_sources(board="versa"):
    """(Verilog of the top, extra Verilog files) for :func:`sim.runner.run_cocotb`."""
    from hdl.export import export_verilog
    from hdl.net.core.liteeth import load_network_config
    from hdl.wire.top import WireTop
    top = WireTop(load_network_config(board))
    return export_verilog(top, TOP), (*top.verilog_sources, MODELS)
