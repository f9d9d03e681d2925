"""LiteEth's PHY and MAC on both ports of a two-port board, in Amaranth: the NIC in the
wire's Ethernet side (``network.md`` section 6).

:class:`LiteEthWireCore` instantiates the generated ``liteeth_wire`` (``kind="wire"`` of
:func:`hdl.net.core.liteeth.generate`): per port ``p`` its RGMII pins, the frames its MAC
received (``port<p>_rx``) and the frames it sends (``port<p>_tx``), 32 bits a beat in one
Amaranth clock domain that drives LiteEth's ``sys``. The MAC has checked and stripped each
received frame's preamble and FCS (a bad FCS sets ``error`` on the last beat) and adds
them, and the padding of short frames, to each sent one. Everything above the MAC (what a
frame is, whether it is for the board) is the wire's (:mod:`hdl.wire`).

Receive cannot wait: LiteEth holds a frame in a 32-word clock-crossing FIFO and then loses
bytes, so ``port<p>_rx`` is ``always_ready`` and whatever takes it drops frames whole
instead. Transmit must not run dry within a frame (the RGMII side sends a byte every
8 ns whatever comes): a frame's beats must follow each other at least at the line rate,
a beat every 32 ns (two cycles at 62.5 MHz), once its first is given.
"""
from __future__ import annotations

from amaranth import ClockSignal, Const, Instance, Module, ResetSignal, unsigned
from amaranth.lib import data, io, stream, wiring
from amaranth.lib.wiring import In, Out

from contract.network import WIRE_PORTS
from hdl.net.core.eth_core import RGMII_INSTANCE_PORTS
from hdl.net.core.liteeth import CORE_MODULES, RGMII_PINS, GeneratedCore

__all__ = ["BEAT_BYTES", "MacBeat", "LiteEthWireCore"]

BEAT_BYTES = 4

#: One beat of a frame to or from a LiteEth MAC (its ``eth_phy_description`` at 32 bits,
#: without the FCS): frame byte ``4n + j`` is ``data[8j:8j+8]`` of beat ``n``. ``last_be``
#: is one-hot on the last beat and marks its last byte (ignored on other beats, and so are
#: the bytes past it). ``error`` (receive only) makes the frame bad: LiteEth sets it on the
#: last beat for a bad FCS, and its PHY may set it on an earlier beat for a receive error.
MacBeat = data.StructLayout({
    "data": unsigned(8 * BEAT_BYTES),
    "last_be": unsigned(BEAT_BYTES),
    "last": unsigned(1),
    "error": unsigned(1),
})


def _instance_port(p, pin):
    """The generated wire core's port of RGMII ``pin`` on port ``p``: (name, dir, width)."""
    name, direction, width = RGMII_INSTANCE_PORTS[pin]
    return name.replace("rgmii", f"rgmii{p}", 1), direction, width


class LiteEthWireCore(wiring.Component):
    """The generated wire core with typed frame streams on each port.

    Parameters
    ----------
    core : GeneratedCore
        From ``hdl.net.core.liteeth.generate(config, kind="wire")``.
    domain : str
        Clock domain of the streams; drives LiteEth's sys clock and reset (at least
        31.25 MHz for 32 bits at 1 Gb/s; the configuration's ``sys_clk_hz``).
    rgmii : tuple of dict, optional
        Per port, pin name -> I/O value for its six RGMII pins
        (:func:`hdl.net.core.eth_core.rgmii_ports` on a board). Without it each port gets
        fresh ``io.IOPort``s named ``rgmii<p>_<pin>``, top-level ports of an exported design
        (simulation tops).

    Members
    -------
    port0_rx, port1_rx : Out(stream.Signature(MacBeat, always_ready=True))
        Frames the port's MAC received, FCS stripped.
    port0_tx, port1_tx : In(stream.Signature(MacBeat))
        Frames to send from the port (``error`` ignored).
    link_up : Out(2)
        Bit ``p``: port ``p``'s PHY reports a link (in-band RGMII status), in that port's
        receive clock domain: synchronise before use.
    """

    def __init__(self, core: GeneratedCore, *, domain: str = "sync", rgmii=None):
        if not isinstance(core, GeneratedCore) or core.module != CORE_MODULES["wire"]:
            raise TypeError(f"core must be the wire core from hdl.net.core.liteeth.generate("
                            f"config, kind='wire'), not {core!r}")
        if not isinstance(domain, str) or not domain:
            raise TypeError(f"domain must be a clock domain name, not {domain!r}")
        self._check_ports(core)
        self._core, self._domain = core, domain
        if rgmii is None:
            rgmii = tuple({pin: io.IOPort(width, name=f"rgmii{p}_{pin}")
                           for pin, (_, _, width) in RGMII_INSTANCE_PORTS.items()}
                          for p in WIRE_PORTS)
        if len(rgmii) != len(WIRE_PORTS) or any(set(pins) != set(RGMII_PINS) for pins in rgmii):
            raise ValueError(f"rgmii must be one dict per port, each mapping exactly "
                             f"{', '.join(RGMII_PINS)}")
        self.rgmii = tuple(rgmii)
        members = {"link_up": Out(len(WIRE_PORTS))}
        for p in WIRE_PORTS:
            members[f"port{p}_rx"] = Out(stream.Signature(MacBeat, always_ready=True))
            members[f"port{p}_tx"] = In(stream.Signature(MacBeat))
        super().__init__(members)

    @property
    def config(self):
        return self._core.config

    @property
    def generated(self):
        """The generated core (:class:`~hdl.net.core.liteeth.GeneratedCore`) it wraps."""
        return self._core

    @staticmethod
    def _check_ports(core):
        want = {"sys_clock": ("i", 1), "sys_reset": ("i", 1)}
        for p in WIRE_PORTS:
            want.update({name: (direction, width) for name, direction, width in
                         (_instance_port(p, pin) for pin in RGMII_INSTANCE_PORTS)})
            for side, direction in (("rx", "o"), ("tx", "i")):
                back = "i" if direction == "o" else "o"
                want.update({f"{side}{p}_valid": (direction, 1), f"{side}{p}_ready": (back, 1),
                             f"{side}{p}_last": (direction, 1),
                             f"{side}{p}_data": (direction, 8 * BEAT_BYTES),
                             f"{side}{p}_last_be": (direction, BEAT_BYTES)})
            want[f"rx{p}_error"] = ("o", 1)
            want[f"status{p}_link_up"] = ("o", 1)
        have = {port.name: (port.direction, port.width) for port in core.ports}
        if have != want:
            diff = sorted(set(have.items()) ^ set(want.items()))
            raise ValueError(f"{core.module} in {core.verilog_path} does not have the ports "
                             f"this wrapper expects (differences: {diff})")

    def elaborate(self, platform):
        m = Module()
        ports = {"i_sys_clock": ClockSignal(self._domain),
                 "i_sys_reset": ResetSignal(self._domain)}
        for p in WIRE_PORTS:
            rx, tx = getattr(self, f"port{p}_rx"), getattr(self, f"port{p}_tx")
            ports.update({
                f"o_rx{p}_valid": rx.valid, f"i_rx{p}_ready": Const(1),
                f"o_rx{p}_last": rx.p.last, f"o_rx{p}_data": rx.p.data,
                f"o_rx{p}_last_be": rx.p.last_be, f"o_rx{p}_error": rx.p.error,
                f"i_tx{p}_valid": tx.valid, f"o_tx{p}_ready": tx.ready,
                f"i_tx{p}_last": tx.p.last, f"i_tx{p}_data": tx.p.data,
                f"i_tx{p}_last_be": tx.p.last_be,
                f"o_status{p}_link_up": self.link_up[p],
            })
            for pin in RGMII_INSTANCE_PORTS:
                name, direction, _ = _instance_port(p, pin)
                ports[f"{direction}_{name}"] = self.rgmii[p][pin]
        m.submodules.liteeth = Instance(self._core.module, **ports)
        if platform is not None and hasattr(platform, "add_file"):
            name = f"{self._core.module}.v"
            if name not in getattr(platform, "extra_files", {}):
                platform.add_file(name, self._core.verilog())
        return m
