"""ECP5 board top of the network: the engines served over the board's RGMII port.

What ``make bitstream TOP=network`` builds (``TOP=selftest`` is :mod:`hdl.board.top`'s
self-test). One PLL makes both clocks (:func:`hdl.board.clocking.board_clocks`): the
engines' (``sync``, CLKOP, the board's ``engine_mhz``) and LiteEth's (``eth``, CLKOS, the
network configuration's ``sys_clk_hz``); each domain leaves reset on its own clock once the
PLL has locked (and the board's reset button, if any, is released). The Ethernet PHY chip is
held in reset until then and for 10 ms after, as LiteX does.

LEDs (``constraints/boards.toml``, ``network_leds``): heartbeat, PLL unlocked, link,
datagrams in, datagrams out, drops (each activity LED lights for about 50 ms per event).
The UART sends every network counter once a second (115200 8N1), one line:
``net <n>: nic_tx_in=... drop_reply_full=...``.
"""
from __future__ import annotations

from amaranth import Elaboratable, Module, ResetSignal, Signal
from amaranth.lib import data

from contract.counters import NET_COUNTERS
from hdl.board.clocking import board_clocks
from hdl.board.pins import pin_buffers
from hdl.board.status import BLINK_S, heartbeat, hold_phy_in_reset, stretch, uart_report
from hdl.net.core.eth_core import rgmii_ports
from hdl.net.top import ENGINES, NetworkTop

__all__ = ["NetworkStatus", "NetworkBoardTop", "report_template"]

#: LED status bits of the network top (names used by ``network_leds`` in boards.toml).
NetworkStatus = data.StructLayout({
    "heartbeat": 1,
    "pll_unlocked": 1,
    "link": 1,
    "rx": 1,          # a datagram was taken by a service
    "tx": 1,          # a reply left
    "drop": 1,        # something was dropped and counted
})


def report_template():
    """The UART line: every network counter by name."""
    return "net {line}:" + "".join(f" {name}={{{name}}}" for name in NET_COUNTERS) + "\r\n"


class NetworkBoardTop(Elaboratable):
    """The network top on one board.

    Parameters
    ----------
    board : hdl.board.boards.Board
    config : hdl.net.core.liteeth.NetworkConfig
        The board's network configuration with the build's options (MAC, IP) applied.
    key : int
        The control key (64 bits).
    engines : tuple of str, optional
        Default the board's ``engines`` for the network top (what fits).
    engine_mhz : float, optional
        Default the board's for the network top.

    Attributes
    ----------
    pll : hdl.board.clocking.EnginePLL (made at elaboration), network : NetworkTop
    phy_count : int
        Ethernet PHYs the top drives, each with its receive clock (1).
    """
    phy_count = 1

    def __init__(self, board, config, *, key, engines=None, engine_mhz=None):
        self.board, self.config = board, config
        self.engines = tuple(board.engines_for("network") if engines is None else engines)
        if not self.engines or set(self.engines) - set(ENGINES):
            raise ValueError(f"engines must be some of {ENGINES}, not {self.engines!r}")
        self.engine_mhz = float(board.engine_clock_mhz("network") if engine_mhz is None
                                else engine_mhz)
        self.eth_mhz = config.sys_clk_hz / 1e6
        self._key = key
        self.pll = None
        self.network = None

    def __repr__(self):
        return f"NetworkBoardTop({self.board.name}, engines={self.engines})"

    def elaborate(self, platform):
        m = Module()
        pin = pin_buffers(m, platform)

        # -- clocks and resets ------------------------------------------------------------
        self.pll = pll = board_clocks(m, platform, pin, engine_mhz=self.engine_mhz,
                                     eth_mhz=self.eth_mhz)

        # -- the network ------------------------------------------------------------------
        name, number = self.config.resource
        rgmii_resource = platform.request(name, number, dir="-")
        rgmii = rgmii_ports(rgmii_resource, self.config.pins)
        # the PHY's receive clock (RGMII at 1 Gb/s: 125 MHz) clocks LiteEth's PHY side
        platform.add_clock_constraint(rgmii["rx_clk"], 125e6)
        m.submodules.network = self.network = network = NetworkTop(
            self.config, key=self._key, engines=self.engines, rgmii=rgmii)
        m.d.comb += [network.eth_clk.eq(pll.clk_os), network.eth_rst.eq(ResetSignal("eth_board"))]
        hold_phy_in_reset(m, rgmii_resource, self.eth_mhz * 1e6, "eth_board")

        # -- LEDs and the report ----------------------------------------------------------
        clk_hz = round(pll.dividers["f_out_mhz"] * 1e6)
        blink = round(BLINK_S * clk_hz)
        status = Signal(NetworkStatus)
        m.d.comb += [
            status.heartbeat.eq(heartbeat(m, clk_hz)),
            status.pll_unlocked.eq(~pll.locked),
            status.link.eq(network.link),
            status.rx.eq(stretch(m, network.status.rx_datagram, blink, "rx")),
            status.tx.eq(stretch(m, network.status.tx_datagram, blink, "tx")),
            status.drop.eq(stretch(m, network.status.drop, blink, "drop")),
        ]
        for bit, spec in self.board.network_leds.items():
            m.d.comb += pin(spec, "o").o.eq(getattr(status, bit))

        counters = {name: network.counters[name] for name in NET_COUNTERS}
        tx = uart_report(m, report_template(), counters, clk_hz)
        m.d.comb += pin(self.board.uart_tx, "o").o.eq(tx)
        return m
