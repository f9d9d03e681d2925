"""ECP5 board top of the NIC in the wire: a two-port board between a host and the network.

What ``make bitstream BOARD=versa TOP=wire`` builds (``network.md`` section 6): port 0
(``constraints/network.toml``'s ``resource``) faces the host, port 1 (``port1_resource``)
the network, and :class:`hdl.wire.top.WireTop` runs between them. One PLL output clocks
everything: LiteEth's PHY-side logic and MAC, the wire's frame stores and the NIC engines,
at the configuration's ``sys_clk_hz`` (62.5 MHz; the board's ``engine_mhz`` for ``wire``
must be the same). Both PHY chips are held in reset for 10 ms after the clock is up.

LEDs (``constraints/boards.toml``, ``network_leds``; :data:`WireStatus`): heartbeat, PLL
unlocked, link (both ports), frames from the host, frames from the network, bad frames
(each activity LED lights for about 50 ms per event). The UART sends the wire's counters
once a second (115200 8N1), one line: ``wire <n>: p0_frames_in=... p1_dropped=...``, where
``dropped`` sums every ``drop_*`` counter of the port (``make program``'s bring-up guide,
``docs/bring-up.md``, reads it).
"""
from amaranth import Elaboratable, Module, Signal
from amaranth.lib import data, wiring

from contract.counters import WIRE_COUNTERS
from contract.network import WIRE_PORTS
from contract.registers import WIRE_REGISTERS
from hdl.board.clocking import board_clocks
from hdl.board.pins import pin_buffers
from hdl.board.status import BLINK_S, heartbeat, hold_phy_in_reset, stretch, uart_report
from hdl.net.core.eth_core import rgmii_ports
from hdl.selftest.counter_poller import CounterPoller
from hdl.wire.top import WireTop

__all__ = ["WireStatus", "REPORTED", "WireBoardTop", "report_totals", "report_template"]

#: LED status bits of the wire top (``network_leds`` in boards.toml names some of them:
#: the network top's names, read for the wire).
WireStatus = data.StructLayout({
    "heartbeat": 1,
    "pll_unlocked": 1,
    "link": 1,        # both ports have a link
    "rx": 1,          # a frame came in from the network (port 1)
    "tx": 1,          # a frame came in from the host (port 0)
    "drop": 1,        # a frame with a bad FCS (or a receive error) came in on either port
})

#: Counters of each port in the UART line; ``dropped`` is the sum of its drop causes. (Every
#: counter is read over the network: ``gradwire board wire-status``. Each field costs logic
#: on a full part: the line keeps what bring-up needs.)
REPORTED = ("frames_in", "frames_out", "compressed", "decompressed", "dropped")


def report_totals():
    """The line's fields -> the register addresses whose counters each sums."""
    totals = {}
    for p in WIRE_PORTS:
        block = WIRE_REGISTERS[f"port{p}"]
        for name in REPORTED:
            counters = [c for c in WIRE_COUNTERS if c.startswith("drop_")] \
                if name == "dropped" else [name]
            totals[f"p{p}_{name}"] = [block.address(c) for c in counters]
    return totals


def report_template():
    """The UART line: the reported counters of both ports by name."""
    return "wire {line}:" + "".join(f" {name}={{{name}}}" for name in report_totals()) + "\r\n"


class WireBoardTop(Elaboratable):
    """The NIC in the wire on a two-port board.

    Parameters
    ----------
    board : hdl.board.boards.Board
    config : hdl.net.core.liteeth.NetworkConfig
        The board's network configuration (with ``port1_resource``) and build options.
    key : int
        The control key (64 bits) of the board's ``CTRL`` service.
    engine_mhz : float, optional
        Default the board's ``engine_mhz`` for ``wire``; must be the configuration's
        ``sys_clk_hz`` (one clock runs LiteEth and the engines).

    Attributes
    ----------
    pll : hdl.board.clocking.EnginePLL (made at elaboration), wire : WireTop
    phy_count : int
        Ethernet PHYs the top drives, each with its receive clock (2).
    """
    phy_count = 2

    def __init__(self, board, config, *, key, engine_mhz=None):
        self.board, self.config = board, config
        self._key = key
        self.engine_mhz = float(board.engine_clock_mhz("wire") if engine_mhz is None
                                else engine_mhz)
        if abs(self.engine_mhz * 1e6 - config.sys_clk_hz) > 1:
            raise ValueError(f"the wire runs LiteEth and its engines on one clock: engine_mhz "
                             f"{self.engine_mhz:g} must be sys_clk_hz "
                             f"{config.sys_clk_hz / 1e6:g} MHz")
        if not config.two_ports:
            raise ValueError(f"board {board.name!r} has one RGMII port: no NIC in the wire")
        self.pll = None
        self.wire = None

    def __repr__(self):
        return f"WireBoardTop({self.board.name})"

    def elaborate(self, platform):
        m = Module()
        pin = pin_buffers(m, platform)
        self.pll = pll = board_clocks(m, platform, pin, engine_mhz=self.engine_mhz)
        clk_hz = round(pll.dividers["f_out_mhz"] * 1e6)

        rgmii = []
        for resource_name, pins in ((self.config.resource, self.config.pins),
                                    (self.config.port1_resource, self.config.port1_pins)):
            name, number = resource_name
            resource = platform.request(name, number, dir="-")
            ports = rgmii_ports(resource, pins)
            # each PHY's receive clock (RGMII at 1 Gb/s: 125 MHz) clocks its LiteEth PHY
            platform.add_clock_constraint(ports["rx_clk"], 125e6)
            hold_phy_in_reset(m, resource, clk_hz, "sync", name=f"phy{len(rgmii)}_reset")
            rgmii.append(ports)
        m.submodules.wire = self.wire = wire = WireTop(self.config, rgmii=tuple(rgmii),
                                                       key=self._key)

        # -- LEDs and the report ----------------------------------------------------------
        blink = round(BLINK_S * clk_hz)
        status = Signal(WireStatus)
        m.d.comb += [
            status.heartbeat.eq(heartbeat(m, clk_hz)),
            status.pll_unlocked.eq(~pll.locked),
            status.link.eq(wire.link_up.all()),
            status.rx.eq(stretch(m, wire.activity.frame_in1, blink, "rx")),
            status.tx.eq(stretch(m, wire.activity.frame_in0, blink, "tx")),
            status.drop.eq(stretch(m, wire.activity.bad_frame, blink, "drop")),
        ]
        for bit, spec in self.board.network_leds.items():
            m.d.comb += pin(spec, "o").o.eq(getattr(status, bit))

        m.submodules.poller = poller = CounterPoller(report_totals())
        m.d.comb += poller.enable.eq(wire.ctrl_free)     # CTRL requests read first
        wiring.connect(m, poller.ctrl, wire.ctrl)
        counters = {name: getattr(poller, name) for name in report_totals()}
        tx = uart_report(m, report_template(), counters, clk_hz)
        m.d.comb += pin(self.board.uart_tx, "o").o.eq(tx)
        return m
