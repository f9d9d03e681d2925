"""Simulation top of the network: :class:`hdl.net.top.NetworkTop` with its RGMII pins as
top-level ports (driven by cocotbext-eth in ``sim/tb_network.py``), the generated LiteEth
core and the behavioural ECP5 primitives of ``sim/ecp5_models.v``.

Clocks: ``clk`` (engines, front end: the board's network-top engine clock,
:func:`engine_period_ps`), ``eth_clk`` (LiteEth's user side: the configuration's
``sys_clk_hz``, 62.5 MHz), ``rgmii_rx_clk`` (the PHY, 125 MHz).
"""
from __future__ import annotations

import functools

from sim.eth_echo import MODELS

__all__ = ["TOP", "network_top_sources", "engine_period_ps"]

TOP = "network_top"


def engine_period_ps(board="ecpix5"):
    """The engine clock's period in the simulations of the board's network top, in
    picoseconds: the bitstream's default clock (``constraints/boards.toml``), rounded to an
    even number so that both halves of the period are whole picoseconds."""
    from hdl.board.boards import load_boards
    period = round(1e6 / load_boards()[board].engine_clock_mhz("network"))
    return period + period % 2


@functools.lru_cache(maxsize=None)
def network_top_sources(board="ecpix5"):
    """(Verilog of the top, extra Verilog files) for :func:`sim.runner.run_cocotb`."""
    from hdl.export import export_verilog
    from hdl.net.core.liteeth import load_network_config
    from hdl.net.top import NetworkTop
    top = NetworkTop(load_network_config(board))
    return export_verilog(top, TOP), (*top.verilog_sources, MODELS)
