"""The Verilated network top as a board backend: ``BOARD_BACKENDS["verilator"]``.

:class:`VerilatorBoard` is what :class:`host.board.virtual.VirtualBoard` puts behind its
sockets for ``gradwire board serve --backend verilator``: the gateware of a board (LiteEth,
the clock crossing, the network front end, the NIC and switch engines), simulated by the
compiled PHY harness (:mod:`sim.harness.network`) through its RGMII pins. Every datagram
from the sockets becomes an Ethernet/IPv4/UDP frame built by scapy, with the sender's real
address and port; every frame the gateware sends is parsed back by scapy, checked, and
becomes a datagram to the address it names.

The wire and its hosts:

- The senders keep their real addresses: on loopback every host is 127.0.0.1 and differs
  by UDP port, exactly as the golden board sees it, so the worker table the host writes
  (its own 127.0.0.1 address and ports) is what the gateware's source check compares.
  The gateware does not care that 127.0.0.1 is not on its subnet: it has no routing, it
  resolves any destination by ARP.
- Each sender IP has a MAC on the simulated wire, ``02:00`` followed by the four bytes of
  the address (locally administered, unique per address). A host asks for the board's MAC
  (an ARP request) before its first datagram, as a real host must, and the board caches
  the host from that request; the hosts also answer the board's ARP requests for their
  addresses (the harness stops a run at an ARP frame so that the answer goes in at once).
  ARP requests for addresses no host on the wire has go unanswered (the gateware counts
  ``arp_unreachable``).
- The gateware's service ports and key are those it was built with: the ports of the
  network configuration (``constraints/network.toml``; the socket side translates its own),
  the key given here (another key is another build, cached like the first).
"""
from __future__ import annotations

import ipaddress
from typing import Sequence

from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw

from contract.frames import IP_HEADER, IP_PROTO_UDP
from contract.network import GROUP_TTL, SERVICE_OFFSETS, Service, is_multicast, multicast_mac
from host.board.backend import BoardBackend, Datagram
from host.golden.ctrl_auth import control_key

from .network import IDLE_CYCLES, NetworkHarness

__all__ = ["VerilatorBoard", "host_mac"]

BROADCAST = "ff:ff:ff:ff:ff:ff"
#: runs of one delivery at most (each ARP exchange costs one more): a bound, not a limit
#: any traffic reaches (one ARP request per destination address, and the cache keeps them)
_MAX_RUNS = 64
_SWITCH_OFFSET = SERVICE_OFFSETS[Service.SWITCH]


def host_mac(ip: str) -> str:
    """The MAC of the host with IPv4 ``ip`` on the simulated wire: ``02:00:a:b:c:d``."""
    a, b, c, d = ipaddress.IPv4Address(ip).packed
    return f"02:00:{a:02x}:{b:02x}:{c:02x}:{d:02x}"


class VerilatorBoard(BoardBackend):
    """The Verilated network top behind the C++ RGMII PHY (see the module docstring).

    Parameters
    ----------
    key : int or bytes, optional
        The control key the gateware is built with (default the simulation tops' public
        ``hdl.net.top.SIMULATION_KEY``, whose build the tests share): a 64-bit ``int``
        (section 4) or 16 ``bytes`` (section 7's tags; ``host.golden.ctrl_auth``).
    port_base : int, optional
        The socket side's port base (the gateware's own ports are the configuration's;
        :class:`~host.board.virtual.VirtualBoard` translates).
    board : str
        Network configuration of the gateware (``constraints/network.toml``).
    idle : int
        Engine cycles of silence that end a delivery (``sim.harness.network.IDLE_CYCLES``).
    slots, lanes, max_workers, jobs : int, optional
        The switch's parameters (a build of its own; default the network top's: 64 slots,
        64 lanes, 4 jobs of up to 32 workers).
    max_count : int, optional
        The NIC's largest packet; only the built one (2048) is accepted.
    waves : bool, optional
        Record waveforms (``build/waves/network_top/``).
    rgmii_ps, rgmii_phase_ps : int
        The PHY clock's period and phase (default 125 MHz, starting in phase with the
        engine clock; ``sim.harness.network.NetworkHarness``).
    """

    #: A delivery takes simulated time: 15-40 ms for one small datagram, a second or more
    #: for a window of large ones. The transports of a virtual board wait accordingly
    #: before resending: a round-trip estimate from small requests would otherwise time
    #: out the next large window, and every spurious resend is more simulation.
    transport_options = {"timeout": 5.0, "min_timeout": 1.0, "max_timeout": 30.0}

    def __init__(self, key: int | bytes | None = None, *, port_base: int | None = None, board: str = "ecpix5",
                 idle: int = IDLE_CYCLES, waves=None, max_count: int | None = None,
                 rgmii_ps: int = 8000, rgmii_phase_ps: int = 0, **switch_params):
        if key is None:
            from hdl.net.top import SIMULATION_KEY
            key = SIMULATION_KEY
        key = control_key(key)
        unknown = set(switch_params) - {"slots", "lanes", "max_workers", "jobs"}
        if unknown:
            raise ValueError(f"the Verilated board has no parameter(s) {sorted(unknown)}")
        if max_count not in (None, 2048):
            raise ValueError(f"the network top's NIC takes packets of up to 2048 values; "
                             f"max_count={max_count} is not built")
        self.key = key
        self.idle = int(idle)
        self.harness = NetworkHarness(key=key, board=board, waves=waves,
                                      switch_params=switch_params or None,
                                      rgmii_ps=rgmii_ps, rgmii_phase_ps=rgmii_phase_ps)
        config = self.harness.config
        self.ip = str(ipaddress.IPv4Address(config.ip_address))
        self.mac = config.mac_address
        self.port_base = self.harness.port_base
        self.socket_port_base = port_base
        #: hosts on the wire: IP -> MAC (a sender becomes one when it first sends)
        self.hosts: dict[str, str] = {}
        self.stats = dict.fromkeys(("datagrams_in", "datagrams_out", "frames_in", "frames_out",
                                    "arp_answered", "arp_unanswered", "other_frames",
                                    "bad_frames", "runs", "cycles", "max_gap"), 0)

    def describe(self) -> str:
        p = self.harness.switch_params
        return (f"Verilated network top {self.ip} ({self.mac}) behind a C++ RGMII PHY, "
                f"engines {', '.join(self.harness.engines)}; switch {p['slots']} slots x "
                f"{p['lanes']} lanes, {p['jobs']} jobs of up to {p['max_workers']} workers; "
                f"harness {self.harness.build.executable.parent.name}"
                f"{' (cached)' if self.harness.build.cached else ''}")

    # -- frames --------------------------------------------------------------------------

    def _host(self, ip: str) -> str:
        mac = self.hosts.get(ip)
        if mac is None:
            mac = self.hosts[ip] = host_mac(ip)
        return mac

    def announce(self, ip: str) -> bytes:
        """Host ``ip`` asks for the board's MAC (what a host sends before its first datagram)."""
        mac = self._host(ip)
        return bytes(Ether(dst=BROADCAST, src=mac) / ARP(op=1, hwsrc=mac, psrc=ip, pdst=self.ip))

    def frame(self, d: Datagram) -> bytes:
        """The Ethernet frame that carries datagram ``d`` to the board (UDP checksum set)."""
        return bytes(Ether(dst=self.mac, src=self._host(d.src_ip)) /
                     IP(src=d.src_ip, dst=d.dst_ip) /
                     UDP(sport=d.src_port, dport=d.dst_port) / Raw(d.payload))

    def _arp_answer(self, packet) -> bytes | None:
        arp = packet[ARP]
        if arp.op != 1 or arp.psrc != self.ip:
            return None
        mac = self.hosts.get(arp.pdst)
        if mac is None:
            self.stats["arp_unanswered"] += 1
            return None
        self.stats["arp_answered"] += 1
        return bytes(Ether(dst=arp.hwsrc, src=mac) /
                     ARP(op=2, hwsrc=mac, psrc=arp.pdst, hwdst=arp.hwsrc, pdst=arp.psrc))

    def _datagram(self, packet) -> Datagram | None:
        """The datagram a frame from the board carries, after the checks a host's stack
        makes (its MAC and IP, the IPv4 checksum, the lengths); None for anything else."""
        ip, udp = packet[IP], packet[UDP]
        # a job's result group goes to the group's MAC, and stays on the segment (TTL 1)
        to = (multicast_mac(ip.dst) if is_multicast(ip.dst) and ip.ttl == GROUP_TTL
              else self.hosts.get(ip.dst))
        if (packet.src != self.mac or ip.src != self.ip or ip.proto != IP_PROTO_UDP or ip.ihl != 5
                or ip.frag or ip.flags.MF or packet.dst != to):
            self.stats["bad_frames"] += 1
            return None
        check = IP(bytes(ip)[:IP_HEADER])
        header_sum = check.chksum
        del check.chksum
        if IP(bytes(check)).chksum != header_sum or udp.len < 8 or ip.len != 20 + udp.len:
            self.stats["bad_frames"] += 1
            return None
        payload = bytes(udp.payload)[:udp.len - 8]
        return Datagram(ip.src, udp.sport, ip.dst, udp.dport, payload)

    # -- the wire ------------------------------------------------------------------------

    def deliver(self, datagrams: Sequence[Datagram]) -> list[Datagram]:
        frames = []
        for d in datagrams:
            if d.src_ip not in self.hosts:
                frames.append(self.announce(d.src_ip))
            frames.append(self.frame(d))
        self.stats["datagrams_in"] += len(datagrams)
        # NIC and control requests bring at most one reply each (none when dropped or
        # refused): once that many came, a short quiet time ends the delivery. The switch
        # sends any number of results, so a batch with switch datagrams waits out the
        # idle time.
        switch = self.port_base + _SWITCH_OFFSET
        expect = None if any(d.dst_port == switch for d in datagrams) else len(datagrams)
        return self._run(frames, expect)

    def _run(self, frames, expect=None):
        out = []
        for _ in range(_MAX_RUNS):
            result = self.harness.run(
                frames, idle=self.idle, stop_on_arp=True,
                expect=None if expect is None else max(0, expect - len(out)))
            self.stats["runs"] += 1
            self.stats["cycles"] += result.cycles
            self.stats["frames_in"] += len(frames)
            self.stats["frames_out"] += len(result.frames)
            self.stats["bad_frames"] += result.bad_frames
            self.stats["max_gap"] = max(self.stats["max_gap"], result.max_gap)
            frames = []
            for raw in result.frames:
                packet = Ether(raw)
                if ARP in packet:
                    # (the board's answers to the hosts' requests need nothing more)
                    answer = self._arp_answer(packet)
                    if answer is not None:
                        frames.append(answer)
                elif IP in packet and UDP in packet:
                    datagram = self._datagram(packet)
                    if datagram is not None:
                        out.append(datagram)
                else:
                    self.stats["other_frames"] += 1
            if not frames and not result.arp_stopped:
                break
        self.stats["datagrams_out"] += len(out)
        return out

    def counters(self) -> dict:
        """The network counters as the top's ``counters`` output shows them."""
        return self.harness.counters()

    def close(self) -> None:
        self.harness.close()


class ReaddressedBoard(BoardBackend):
    """A board backend seen at another address: ``ip`` and ``port_base`` in front of a
    backend whose own are fixed (the gateware's are built in).

    Datagrams to ``ip`` reach the backend at its own address and the same service offset;
    what it sends leaves from ``ip`` and the matching service port. Nothing else changes:
    the addresses the host writes into the board (worker tables, upstreams, groups) are the
    network's, and so are the destinations the backend sends to. The backend's hosts are
    its senders; ``peers`` are more addresses it may have to reach first (a tree's boards:
    a leaf sends its first aggregate to the root before the root ever sent it anything),
    announced to a :class:`VerilatorBoard` so that it answers their ARP requests.

    Parameters
    ----------
    backend : BoardBackend
    ip : str
    port_base : int
    peers : iterable of str
    """

    def __init__(self, backend: BoardBackend, ip: str, port_base: int, peers=()):
        self.backend = backend
        self.ip = str(ipaddress.IPv4Address(ip))
        self.port_base = int(port_base)
        self.key = backend.key
        self.transport_options = backend.transport_options
        for peer in peers:
            if isinstance(backend, VerilatorBoard):
                backend._host(peer)

    def describe(self) -> str:
        return f"{self.backend.describe()}, seen as {self.ip} ports {self.port_base}.."

    def deliver(self, datagrams: Sequence[Datagram]) -> list[Datagram]:
        inner = self.backend
        moved = [d._replace(dst_ip=inner.ip, dst_port=d.dst_port - self.port_base
                            + inner.port_base) for d in datagrams]
        return [d._replace(src_ip=self.ip, src_port=d.src_port - inner.port_base
                           + self.port_base) for d in inner.deliver(moved)]

    def counters(self) -> dict:
        return self.backend.counters()

    def close(self) -> None:
        self.backend.close()


def tree_board(address, *, peers=(), **switch_params) -> ReaddressedBoard:
    """A tree's board (``sim.e2e.TREE_BOARDS["verilator"]``): the Verilated network top
    at ``address`` (a :class:`host.switchml.tree.BoardAddress`), its own gateware instance
    (a harness process), built with the simulation tops' key."""
    return ReaddressedBoard(VerilatorBoard(**switch_params), address.host, address.port_base,
                            peers=peers)
