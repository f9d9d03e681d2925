"""The LiteEth core in Amaranth: RGMII pins on one side, typed UDP streams on the other.

:class:`LiteEthCore` instantiates the generated ``liteeth_core`` (:mod:`hdl.net.core.liteeth`)
with ``Instance``. Its streams run in one Amaranth clock domain (``domain``), which drives
LiteEth's ``sys`` clock and reset; the RGMII receive clock comes from the PHY chip and also
clocks the transmitter (LiteEth's ECP5 PHY forwards it, delayed, as the transmit clock).

Receive (``rx``, core to user): one datagram per packet of beats. ``meta`` (source IP and
port, destination port, UDP payload ``length`` in bytes) is valid and constant from the
first beat to the last; ``data`` carries payload bytes little-endian (byte 0 of the
datagram in ``data[0:8]``); ``last_be`` is one-hot on the last beat and marks its last
payload byte (zero for an empty datagram, a single beat). ``error`` is meaningful on the
last beat: 1 means drop the datagram (bad FCS, runt, oversize frame, inconsistent lengths,
wrong UDP checksum), already counted by one of ``events``. **Never stall ``rx`` for long**:
LiteEth cannot hold a frame back from the wire, so back-pressure fills its 32-word
receive FIFO and then loses bytes mid-frame; keep ``rx.ready`` high and drop (and count)
in the front end instead.

Transmit (``tx``, user to core): same layout without ``error``. ``meta.length`` must be the
payload byte count the beats carry (LiteEth writes it into the UDP and IP headers as
given) and ``last_be`` marks the last byte on the last beat; ``meta`` must be held for the
whole datagram. The UDP checksum is sent as 0 (no checksum, network.md section 1).
``tx.ready`` drops while LiteEth looks the destination MAC up: up to ``arp_entries``
cycles. A miss costs the copy of the datagram into the core's parking slot (one word per
cycle) while its ARP exchange runs; the datagrams behind it go on to cached destinations.
The parked one leaves when the host answers, or is dropped after 8 unanswered requests
(``events.arp_unreachable``); a miss while the slot is taken is dropped at once
(``events.arp_busy_drop``).
"""
from __future__ import annotations

from amaranth import ClockSignal, Instance, Module, ResetSignal, Shape
from amaranth.lib import data, io, stream, wiring
from amaranth.lib.wiring import In, Out

from hdl.net.core.liteeth import CORE_NAME, EVENTS, RGMII_PINS, GeneratedCore

__all__ = ["DATA_WIDTH", "UdpMeta", "RxBeat", "TxBeat", "CoreEvents", "LiteEthCore",
           "RGMII_INSTANCE_PORTS", "rgmii_ports"]

DATA_WIDTH = 32

#: Per-datagram parameters: the remote end (source on rx, destination on tx) and length.
UdpMeta = data.StructLayout({
    "ip_address": 32,    # rx: the sender; tx: the destination
    "src_port": 16,
    "dst_port": 16,
    "length": 16,        # UDP payload bytes
})

RxBeat = data.StructLayout({
    "data": DATA_WIDTH,
    "last_be": DATA_WIDTH // 8,
    "last": 1,
    "error": 1,
    "meta": UdpMeta,
})

TxBeat = data.StructLayout({
    "data": DATA_WIDTH,
    "last_be": DATA_WIDTH // 8,
    "last": 1,
    "meta": UdpMeta,
})

#: One-cycle pulses (``domain``), one field per drop cause: see ``hdl.net.core.liteeth.EVENTS``.
CoreEvents = data.StructLayout({name: 1 for name in EVENTS})

#: RGMII pin -> (the generated core's port, direction, width); the wire core's ports are
#: these with ``rgmii<p>`` for ``rgmii`` (:mod:`hdl.wire.mac`).
RGMII_INSTANCE_PORTS = {
    "tx_clk": ("rgmii_clocks_tx", "o", 1),
    "tx_ctl": ("rgmii_tx_ctl", "o", 1),
    "tx_data": ("rgmii_tx_data", "o", 4),
    "rx_clk": ("rgmii_clocks_rx", "i", 1),
    "rx_ctl": ("rgmii_rx_ctl", "i", 1),
    "rx_data": ("rgmii_rx_data", "i", 4),
}


def rgmii_ports(resource, pins) -> dict:
    """The RGMII I/O values of a board resource requested with ``dir="-"``.

    ``pins`` maps the core's pin names (:data:`hdl.net.core.liteeth.RGMII_PINS`) to the
    resource's subsignal names (a board's ``pins`` table in ``constraints/network.toml``).
    The core's DDR registers and delays must sit right at the pads, so no buffer is put in
    between: the toolchain inserts the I/O cells.
    """
    ports = {}
    for pin in RGMII_PINS:
        port = getattr(resource, pins[pin])
        if port.invert != (False,) * len(port):
            raise ValueError(f"RGMII pin {pins[pin]} is inverted on this board; "
                             "the LiteEth core cannot invert at its DDR pads")
        ports[pin] = port.io
    return ports


class LiteEthCore(wiring.Component):
    """The generated LiteEth core with typed UDP streams.

    Parameters
    ----------
    core : GeneratedCore
        From :func:`hdl.net.core.liteeth.generate`.
    domain : str
        Clock domain of the streams and events; drives LiteEth's sys clock and reset (its
        frequency must be the configuration's ``sys_clk_hz``: ARP timers count it).
    rgmii : dict, optional
        Pin name -> I/O value for the six RGMII pins (:func:`rgmii_ports` on a board).
        Without it the core gets fresh ``io.IOPort``s named ``rgmii_<pin>``, which become
        top-level ports of an exported design (simulation tops).

    Members
    -------
    rx : Out(stream.Signature(RxBeat))
        Datagrams received (see the module docstring for the timing).
    tx : In(stream.Signature(TxBeat))
        Datagrams to send.
    events : Out(CoreEvents)
        Drop and ARP event pulses.
    arp_clear_enable : In(1)
        While high, LiteEth wipes its ARP cache every second (its default behaviour); held
        low, entries stay until overwritten, so replies to known hosts never wait for ARP.
    link_up, link_speed : Out(1), Out(2)
        The PHY's in-band RGMII status (speed 2 = 1000 Mb/s, the only one LiteEth's ECP5
        PHY supports), in the RGMII receive clock domain: synchronise before use.
    """

    def __init__(self, core: GeneratedCore, *, domain: str = "sync", rgmii: dict | None = None):
        if not isinstance(core, GeneratedCore):
            raise TypeError(f"core must be a GeneratedCore from hdl.net.core.liteeth.generate, "
                            f"not {core!r}")
        if not isinstance(domain, str) or not domain:
            raise TypeError(f"domain must be a clock domain name, not {domain!r}")
        self._check_ports(core)
        self._core, self._domain = core, domain
        if rgmii is None:
            rgmii = {pin: io.IOPort(width, name=f"rgmii_{pin}")
                     for pin, (_, _, width) in RGMII_INSTANCE_PORTS.items()}
        elif set(rgmii) != set(RGMII_PINS):
            raise ValueError(f"rgmii must map exactly {', '.join(RGMII_PINS)}; "
                             f"got {', '.join(sorted(rgmii))}")
        self.rgmii = rgmii
        super().__init__({
            "rx": Out(stream.Signature(RxBeat)),
            "tx": In(stream.Signature(TxBeat)),
            "events": Out(CoreEvents),
            "arp_clear_enable": In(1),
            "link_up": Out(1),
            "link_speed": Out(2),
        })

    @property
    def config(self):
        return self._core.config

    @staticmethod
    def _check_ports(core):
        want = {f"ev_{name}": ("o", 1) for name in EVENTS}
        want.update({port: (direction, width)
                     for port, direction, width in RGMII_INSTANCE_PORTS.values()})
        want.update({"sys_clock": ("i", 1), "sys_reset": ("i", 1),
                     "arp_clear_enable": ("i", 1),
                     "status_link_up": ("o", 1), "status_link_speed": ("o", 2)})
        for side, direction in (("rx", "o"), ("tx", "i")):
            back = "i" if direction == "o" else "o"
            want.update({f"udp_{side}_valid": (direction, 1), f"udp_{side}_ready": (back, 1),
                         f"udp_{side}_last": (direction, 1),
                         f"udp_{side}_data": (direction, DATA_WIDTH),
                         f"udp_{side}_last_be": (direction, DATA_WIDTH // 8)})
            want.update({f"udp_{side}_{field}": (direction, Shape.cast(field_.shape).width)
                         for field, field_ in UdpMeta})
        want["udp_rx_error"] = ("o", 1)
        have = {p.name: (p.direction, p.width) for p in core.ports}
        if have != want:
            diff = sorted(set(have.items()) ^ set(want.items()))
            raise ValueError(f"{CORE_NAME} in {core.verilog_path} does not have the ports this "
                             f"wrapper expects (differences: {diff})")

    def elaborate(self, platform):
        m = Module()
        rx, tx = self.rx, self.tx
        ports = {
            "i_sys_clock": ClockSignal(self._domain),
            "i_sys_reset": ResetSignal(self._domain),
            "i_arp_clear_enable": self.arp_clear_enable,
            "o_status_link_up": self.link_up,
            "o_status_link_speed": self.link_speed,
            "o_udp_rx_valid": rx.valid, "i_udp_rx_ready": rx.ready,
            "o_udp_rx_last": rx.p.last, "o_udp_rx_data": rx.p.data,
            "o_udp_rx_last_be": rx.p.last_be, "o_udp_rx_error": rx.p.error,
            "i_udp_tx_valid": tx.valid, "o_udp_tx_ready": tx.ready,
            "i_udp_tx_last": tx.p.last, "i_udp_tx_data": tx.p.data,
            "i_udp_tx_last_be": tx.p.last_be,
        }
        for field in ("ip_address", "src_port", "dst_port", "length"):
            ports[f"o_udp_rx_{field}"] = rx.p.meta[field]
            ports[f"i_udp_tx_{field}"] = tx.p.meta[field]
        for name in EVENTS:
            ports[f"o_ev_{name}"] = self.events[name]
        for pin, (port, direction, _) in RGMII_INSTANCE_PORTS.items():
            ports[f"{direction}_{port}"] = self.rgmii[pin]
        m.submodules.liteeth = Instance(CORE_NAME, **ports)
        # A board build needs the core's Verilog beside the design (once per platform).
        if platform is not None and hasattr(platform, "add_file"):
            name = f"{CORE_NAME}.v"
            if name not in getattr(platform, "extra_files", {}):
                platform.add_file(name, self._core.verilog())
        return m
