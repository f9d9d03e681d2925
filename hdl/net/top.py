"""The network top: LiteEth core, clock crossing, front end, NIC and switch engine tops.

::

    RGMII pins <-> LiteEthCore ("eth" domain, 62.5 MHz) <-> EthCrossing
               <-> NetworkFrontEnd ("sync", the engine clock) <-> NicEngine, Aggregator

Clocks: the design has two domains, ``sync`` (the engines and the front end) and ``eth``
(LiteEth's user side; its frequency is the configuration's ``sys_clk_hz``, which LiteEth's
ARP timers count), which comes in on the ports ``eth_clk``/``eth_rst``. A board top makes
both from one PLL (:mod:`hdl.board.network`); the simulation top (``make verilog``:
``network_top.v`` beside ``liteeth_core.v``) has them as ports ``clk``/``rst`` and
``eth_clk``/``eth_rst``, and the PHY's receive clock on the RGMII pins. Why two domains: :mod:`hdl.net.core.cdc`.

The engines are the typed components that ``make verilog`` exports behind flat ports
(``nic_top``, ``switch_top``), composed here directly: the NIC engine's ``rx_dropped`` serves
the front end's one-request-in-flight rule (:mod:`hdl.net.front_end.reply`), the switch engine's
``drained`` the front end's copy of the jobs' configuration (:mod:`hdl.net.front_end.job_workers`).
"""
from __future__ import annotations

from amaranth import ClockDomain, ClockSignal, Module, ResetSignal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from contract.network import SIMULATION_KEY, Service, mac_to_int, service_ports
from hdl.net.core.cdc import EthCrossing
from hdl.net.core.eth_core import LiteEthCore
from hdl.net.core.liteeth import NetworkConfig, generate, load_network_config
from hdl.net.front_end.front_end import BufferSizes, FrontEndStatus, NetworkFrontEnd
from hdl.nic.engine import NicEngine
from hdl.switch.aggregator import Aggregator

__all__ = ["SIMULATION_KEY", "ENGINES", "port_base_of", "NetworkTop"]

ENGINES = ("nic", "switch")
#: The names ``constraints/network.toml`` gives the services' ports.
_PORT_NAMES = {Service.NIC_TX: "nic_tx", Service.NIC_RX: "nic_rx", Service.SWITCH: "switch",
               Service.CTRL: "control"}


def port_base_of(config: NetworkConfig) -> int:
    """The first service port of a network configuration, checked: the four ports must be
    ``port_base + 0..3`` in the contract's order."""
    ports = {service: config.udp_ports.get(name) for service, name in _PORT_NAMES.items()}
    base = ports[Service.NIC_TX]
    if base is None or ports != service_ports(base):
        raise ValueError(f"network config of {config.board!r}: udp_ports {dict(config.udp_ports)} "
                         f"must be {', '.join(_PORT_NAMES.values())} = port_base + 0..3")
    return base


class NetworkTop(wiring.Component):
    """The engines on the network.

    Parameters
    ----------
    config : NetworkConfig, optional
        The board's network configuration (``constraints/network.toml``, with build
        options applied); default the ECPIX-5's.
    key : int
        The 64-bit control key (default :data:`SIMULATION_KEY`).
    engines : tuple of str
        ``"nic"``, ``"switch"`` (what fits the board).
    switch_params : dict, optional
        For :class:`hdl.switch.aggregator.Aggregator` (default the exported top's: 64 slots, 64 lanes, 32
        workers, 4 jobs).
    sizes : BufferSizes
    rgmii : dict, optional
        The board's RGMII pins (:func:`hdl.net.core.eth_core.rgmii_ports`); default top-level
        ports ``rgmii_*`` (simulation).

    Members
    -------
    eth_clk, eth_rst : In(1)
        The ``eth`` domain's clock and synchronous reset (a domain of this top's own: the
        exported top's ports are then in a fixed order).
    status : Out(FrontEndStatus)
        Activity and drop strobes (for LEDs).
    link : Out(1)
    counters : Out(...)
        Every network counter (``contract.counters.NET_COUNTERS``).
    """

    def __init__(self, config=None, *, key=SIMULATION_KEY, engines=ENGINES,
                 switch_params=None, sizes=BufferSizes(), rgmii=None):
        self.config = config if config is not None else load_network_config("ecpix5")
        engines = tuple(engines)
        if not engines or set(engines) - set(ENGINES):
            raise ValueError(f"engines must be some of {ENGINES}, not {engines!r}")
        self.engines = engines
        self.port_base = port_base_of(self.config)
        self.switch_params = {"slots": 64, "lanes": 64, "max_workers": 32, "jobs": 4,
                              **(switch_params or {})}
        self.core = generate(self.config)
        self._key, self._sizes, self._rgmii = key, sizes, rgmii
        self.front_end = NetworkFrontEnd(
            mac=mac_to_int(self.config.mac_address), ip=self.config.ip_int,
            port_base=self.port_base, key=key, nic="nic" in engines,
            switch="switch" in engines, jobs=self.switch_params["jobs"],
            max_workers=self.switch_params["max_workers"], slots=self.switch_params["slots"],
            sizes=sizes)
        super().__init__({
            "eth_clk": In(1),
            "eth_rst": In(1),
            "status": Out(FrontEndStatus),
            "link": Out(1),
            "counters": Out(self.front_end.signature.members["counters"].shape),
        })

    def __repr__(self):
        return (f"NetworkTop({self.config.board}, engines={self.engines}, "
                f"port_base={self.port_base})")

    @property
    def verilog_sources(self):
        """Verilog files the design instantiates besides its own (the LiteEth core)."""
        return (self.core.verilog_path,)

    def elaborate(self, platform):
        m = Module()
        m.domains.eth = ClockDomain("eth", local=True)
        m.d.comb += [ClockSignal("eth").eq(self.eth_clk), ResetSignal("eth").eq(self.eth_rst)]
        m.submodules.eth = eth = LiteEthCore(self.core, domain="eth", rgmii=self._rgmii)
        m.submodules.crossing = crossing = EthCrossing(eth_domain="eth", domain="sync")
        m.submodules.front_end = front = self.front_end
        wiring.connect(m, eth.rx, crossing.core_rx)
        wiring.connect(m, crossing.core_tx, eth.tx)
        m.d.comb += [crossing.core_events.eq(eth.events), crossing.core_link.eq(eth.link_up),
                     eth.arp_clear_enable.eq(0)]
        wiring.connect(m, crossing.rx, front.rx)
        wiring.connect(m, front.tx, crossing.tx)
        m.d.comb += [front.core_events.eq(crossing.events), front.link.eq(crossing.link),
                     self.link.eq(crossing.link), self.counters.eq(front.counters)]
        wiring.connect(m, front.status, wiring.flipped(self.status))

        if "nic" in self.engines:
            m.submodules.nic = nic = NicEngine()
            wiring.connect(m, front.nic_tx_in, nic.tx_in)
            wiring.connect(m, nic.tx_out, front.nic_tx_out)
            wiring.connect(m, front.nic_rx_in, nic.rx_in)
            wiring.connect(m, nic.rx_out, front.nic_rx_out)
            wiring.connect(m, front.nic_ctrl, nic.ctrl)
            m.d.comb += front.nic_rx_dropped.eq(nic.rx_dropped)
        if "switch" in self.engines:
            m.submodules.switch = switch = Aggregator(**self.switch_params)
            wiring.connect(m, front.switch_in, switch.i)
            wiring.connect(m, switch.o, front.switch_out)
            wiring.connect(m, front.switch_ctrl, switch.ctrl)
            m.d.comb += front.switch_drained.eq(switch.drained)
        return m
