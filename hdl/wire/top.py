"""The NIC in the wire below its board: both ports' LiteEth PHY and MAC and the
:class:`~hdl.wire.engine.WireEngine` between them (``network.md`` section 6).

:class:`WireTop` is what the board top (:mod:`hdl.board.wire`) and the Verilator top
(``sim/wire_top.py``) put on their pins: port 0's RGMII pins face the host, port 1's the
network. One clock domain runs it all, LiteEth's ``sys`` and the engines alike: 32 bits at
the configuration's ``sys_clk_hz`` (62.5 MHz: twice the line rate per port) and the NIC
engines' 256-bit beats at the same clock, 16 times the line rate, so that the wire needs
no clock crossing of its own and its engines meet timing with margin on a full chip.
"""
from amaranth import Module, Signal
from amaranth.lib import data, wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import In, Out

from contract.network import SIMULATION_KEY, WIRE_GRADIENT_PORT, WIRE_PORTS
from hdl.ctrl_port import RegisterPort
from hdl.net.core.liteeth import NetworkConfig, generate, load_network_config
from hdl.wire.mac import LiteEthWireCore
from hdl.wire.engine import WireEngine
from hdl.wire.path import DEFAULT_FRAMES, DEFAULT_STORE_BYTES

__all__ = ["WireActivity", "WireTop"]

#: One-cycle strobes for the board's LEDs: a frame arrived on port ``p`` (``frame_in<p>``),
#: one arrived with an error (a bad FCS or a receive error, on either port).
WireActivity = data.StructLayout({
    **{f"frame_in{p}": 1 for p in WIRE_PORTS},
    "bad_frame": 1,
})


class WireTop(wiring.Component):
    """LiteEth's PHY and MAC on both ports and the wire's engine between them.

    Parameters
    ----------
    config : hdl.net.core.liteeth.NetworkConfig, optional
        A two-port board's network configuration (``port1_resource``): the PHY delays, the
        clock, and the board's own MAC and IP (the classifier's). Default the Versa's.
    rgmii : tuple of dict, optional
        Per port, the RGMII pins (:class:`hdl.wire.mac.LiteEthWireCore`); without
        it, top-level ports ``rgmii<p>_<pin>``.
    key, max_count, store_bytes, frames, gradient_port
        The engine's (:class:`hdl.wire.engine.WireEngine`); ``key`` default the public
        ``SIMULATION_KEY``.
    build_root : path, optional
        Where the generated core is cached (``hdl.net.core.liteeth.generate``).

    Members
    -------
    ctrl : In(RegisterPort(writable=False))
        The engine's counters (``contract.registers.WIRE_REGISTERS``), read in the cycles
        with ``ctrl_free`` high.
    ctrl_free : Out(1)
        The board's ``CTRL`` service is not reading the counters this cycle.
    link_up : Out(2)
        Bit ``p``: port ``p`` has a link, synchronised to ``sync``.
    activity : Out(WireActivity)
        Frame strobes for LEDs.
    """

    def __init__(self, config=None, *, rgmii=None, key=SIMULATION_KEY, max_count=2048,
                 store_bytes=DEFAULT_STORE_BYTES, frames=DEFAULT_FRAMES,
                 gradient_port=WIRE_GRADIENT_PORT, build_root=None):
        if config is None:
            config = load_network_config("versa")
        if not isinstance(config, NetworkConfig):
            raise TypeError(f"config must be a NetworkConfig, not {config!r}")
        self.config = config
        # generate() raises for a board with one port
        self._core = LiteEthWireCore(generate(config, build_root, kind="wire"), rgmii=rgmii)
        self._engine = WireEngine(key=key, max_count=max_count, store_bytes=store_bytes, frames=frames,
                                  mac=config.mac_address, ip=config.ip_address,
                                  gradient_port=gradient_port)
        super().__init__({
            "ctrl": In(RegisterPort(writable=False)),
            "ctrl_free": Out(1),
            "link_up": Out(len(WIRE_PORTS)),
            "activity": Out(WireActivity),
        })

    @property
    def verilog_sources(self):
        """Verilog files the design instantiates besides its own (the wire core)."""
        return (self._core.generated.verilog_path,)

    @property
    def rgmii(self):
        """Per port, the RGMII pins the core uses (top-level ports of a simulation top)."""
        return self._core.rgmii

    def elaborate(self, platform):
        m = Module()
        m.submodules.core = core = self._core
        m.submodules.engine = engine = self._engine
        for p in WIRE_PORTS:
            wiring.connect(m, getattr(core, f"port{p}_rx"), getattr(engine, f"port{p}_rx"))
            wiring.connect(m, getattr(engine, f"port{p}_tx"), getattr(core, f"port{p}_tx"))
        wiring.connect(m, wiring.flipped(self.ctrl), engine.ctrl)
        m.d.comb += self.ctrl_free.eq(engine.ctrl_free)
        m.submodules.link_sync = FFSynchronizer(core.link_up, self.link_up)

        bad = Signal()
        m.d.comb += bad.eq(0)
        for p in WIRE_PORTS:
            rx = getattr(core, f"port{p}_rx")
            m.d.sync += self.activity[f"frame_in{p}"].eq(rx.valid & rx.p.last)
            with m.If(rx.valid & rx.p.error):
                m.d.comb += bad.eq(1)
        m.d.sync += self.activity.bad_frame.eq(bad)
        return m
