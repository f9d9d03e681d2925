"""The golden model of the NIC in the wire: ``docs/protocol/network.md`` section 6.

:class:`GoldenWire` is a two-port board frame by frame: port 0 faces the host, port 1 the
network. :meth:`GoldenWire.receive` takes one Ethernet frame as it arrives on a port,
**FCS included** (so that bad-FCS drops are modelled), and returns the frames the board
sends, each ``(port, frame)`` with its FCS, byte for byte what the gateware sends (the MAC
appends the FCS and pads a frame to 60 bytes before it). :func:`with_fcs` gives a frame
its FCS.

What it does with a frame, in this order (each frame counts once, ``WIRE_COUNTERS``):

1. Bad frames: a bad FCS, a runt (< 64 bytes) or an oversize frame (> 9018 bytes) is
   dropped, counted on the port where it arrived.
2. Frames for the board. Host side: an ARP request for the board's IP is answered, an
   ICMP echo request to its MAC and IP is answered (LiteEth's way: the checksum adjusted
   for the new type, no reply beyond 128 bytes of data), a ``CTRL`` datagram to its port
   (section 4) goes to :class:`~host.board.golden.GoldenBoard`'s control service, which
   reads the wire's registers (:meth:`GoldenWire.read`, region ``wire``); replies
   go to the requesting frame's source MAC, IPv4 as LiteEth sends (identification 0, no
   flags, TTL 128, UDP checksum 0). Anything else to the board's MAC is dropped
   (``drop_unanswered``). Network side: a frame to the board's MAC or ARP for its IP is
   dropped (``drop_board_address``).
3. Gradient datagrams (untagged IPv4 without options, not a fragment, a valid header
   checksum, UDP to the gradient port): the UDP payload goes through the NIC path of the
   frame's direction (:meth:`host.driver.models.NicModelTransport.process`, on the packet
   the engine takes: :func:`~host.board.golden.nic_packet`), and a replaced datagram is
   re-framed with the new IPv4 total length and header checksum, UDP length, UDP checksum
   0, and no Ethernet padding of its own. A UDP length other than the IPv4 payload's, or
   an IPv4 packet longer than its frame, is ``drop_udp_length``; a wrong non-zero UDP
   checksum ``drop_udp_checksum``.
4. Everything else passes to the other port unchanged.

The gateware also drops, before all of these, a frame that finds no room in its frame
store (``drop_full``); the model stores nothing, so its ``drop_full`` stays 0.
"""
from __future__ import annotations

import ipaddress
import struct

from contract.counters import WIRE_COUNTERS
from contract.frames import (ARP_BYTES, ETH_HEADER, ETHERTYPE_ARP, ETHERTYPE_IPV4,
                             ETHERTYPE_OFFSET, FCS_BYTES, IP_HEADER, IP_OFFSET,
                             IP_PROTO_ICMP, IP_PROTO_UDP, IP_PROTOCOL_OFFSET, MAX_FRAME_BYTES,
                             MIN_FRAME_BYTES, UDP_HEADER, UDP_OFFSET, internet_checksum,
                             padded_with_fcs, with_fcs)
from contract.header import HEADER_BYTES
from contract.network import (DEFAULT_IP, DEFAULT_MAC, PORT_BASE, SERVICE_OFFSETS,
                              WIRE_GRADIENT_PORT, WIRE_PORTS, Service, decode_network_address,
                              mac_to_int)
from contract.registers import WIRE_REGISTERS

from .backend import Datagram
from .golden import GoldenBoard, nic_packet

__all__ = ["GoldenWire", "with_fcs", "padded_with_fcs", "internet_checksum", "FCS_BYTES",
           "ETH_HEADER", "IP_HEADER", "UDP_HEADER", "ipv4_length", "udp_payload"]

# (the frame's sizes, offsets, FCS and checksum: contract.frames, re-exported here)
_IP, _UDP = IP_OFFSET, UDP_OFFSET
_ETHERTYPE = slice(ETHERTYPE_OFFSET, ETHERTYPE_OFFSET + 2)
_ETHERTYPE_IPV4 = ETHERTYPE_IPV4.to_bytes(2, "big")
_ETHERTYPE_ARP = ETHERTYPE_ARP.to_bytes(2, "big")
_PROTO_ICMP, _PROTO_UDP = IP_PROTO_ICMP, IP_PROTO_UDP
#: a request for Ethernet/IPv4 addresses: htype 1, ptype 0x0800, hlen 6, plen 4, op 1
_ARP_REQUEST = bytes.fromhex("0001 0800 06 04 0001")
#: LiteEth answers pings with at most this much ICMP data (``icmp_fifo_depth``)
ICMP_MAX_DATA = 128
#: the IPv4 header LiteEth sends: version 4, IHL 5, TOS 0, (length), id 0, no flags, TTL 128
_REPLY_TTL = 128
_WORD = (1 << 32) - 1


def ipv4_length(body: bytes) -> int | None:
    """The IPv4 total length of an untagged IPv4 frame ``body`` (no FCS) that the NIC or the
    board may handle (version 4, no options, a valid header checksum, not a fragment); else
    None."""
    if body[_ETHERTYPE] != _ETHERTYPE_IPV4 or len(body) < _UDP or body[_IP] != 0x45:
        return None
    header = body[_IP:_UDP]
    if internet_checksum(header) or int.from_bytes(header[6:8], "big") & 0x3FFF:
        return None         # bad checksum; more fragments or an offset (DF is fine)
    return int.from_bytes(header[2:4], "big")


def udp_payload(body: bytes, total: int) -> bytes | str:
    """The UDP payload of an IPv4/UDP frame ``body`` (no FCS) of IPv4 total length
    ``total``, or the drop cause: ``"drop_udp_length"`` for lengths that disagree,
    ``"drop_udp_checksum"`` for a wrong non-zero checksum."""
    udp_length = int.from_bytes(body[_UDP + 4:_UDP + 6], "big")
    if total > len(body) - _IP or udp_length < UDP_HEADER or udp_length != total - IP_HEADER:
        return "drop_udp_length"
    datagram = body[_UDP:_IP + total]
    if datagram[6:8] != b"\0\0":
        pseudo = body[_IP + 12:_IP + 20] + bytes((0, _PROTO_UDP)) + datagram[4:6]
        if internet_checksum(pseudo + datagram):
            return "drop_udp_checksum"
    return datagram[UDP_HEADER:]


class _WireControl(GoldenBoard):
    """The wire's control service: :class:`GoldenBoard`'s ``CTRL`` requests (key, checks,
    replies) on the wire's registers (:meth:`GoldenWire.read`), none of them writable."""

    def __init__(self, wire: "GoldenWire", key: int, **options):
        super().__init__(key, services=(Service.CTRL,), **options)
        self._wire = wire

    def read(self, address: int) -> int:
        return self._wire.read(address)

    def write(self, address: int, value: int) -> None:
        """Every register of the wire is a counter: writes are ignored."""


def _mac_bytes(mac: str) -> bytes:
    return mac_to_int(mac).to_bytes(6, "big")


class GoldenWire:
    """A two-port board with the NIC engines in the wire, frame by frame.

    Parameters
    ----------
    key : int
        The 64-bit control key the board is built with (``CTRL`` requests, section 4).
    ip, mac : str
        The board's own addresses, reachable from the host side (port 0) only.
    gradient_port : int
        UDP destination port of gradient datagrams (spec section 6's build option).
    max_count : int
        The NIC receive path's largest packet (values), 1..2048.

    Attributes
    ----------
    counters : dict
        ``counters[port][name]`` for each port (0, 1) and ``contract.counters.WIRE_COUNTERS``
        name, 32-bit and wrapping. ``drop_full`` stays 0: the model holds no frame store
        that could fill (the gateware's does, when frames arrive faster than they leave).
    nic : host.driver.models.NicModelTransport
        The NIC engines: their own counters count the gradient datagrams they process.
    board : host.board.golden.GoldenBoard
        The control service behind the ``CTRL`` port.
    """

    def __init__(self, key: int, *, ip: str = DEFAULT_IP, mac: str = DEFAULT_MAC,
                 gradient_port: int = WIRE_GRADIENT_PORT, max_count: int = 2048):
        from host.driver.models import NicModelTransport

        if isinstance(gradient_port, bool) or not isinstance(gradient_port, int) \
                or not 1 <= gradient_port <= 0xFFFF:
            raise ValueError(f"gradient_port must be a UDP port 1..65535, not {gradient_port!r}")
        ctrl_port = PORT_BASE + SERVICE_OFFSETS[Service.CTRL]
        if gradient_port == ctrl_port:
            raise ValueError(f"gradient_port {gradient_port} is the control port")
        if isinstance(max_count, bool) or not isinstance(max_count, int) \
                or not 1 <= max_count <= 2048:
            raise ValueError(f"max_count must be an integer 1..2048, not {max_count!r}")
        # GoldenBoard checks the key and the addresses, and serves CTRL on the wire's
        # registers
        self.board = _WireControl(self, key, ip=ip, mac=mac, max_count=max_count)
        self.key, self.ip, self.mac = key, self.board.ip, mac
        self.gradient_port = gradient_port
        self.ctrl_port = ctrl_port
        self.nic = NicModelTransport(max_count=max_count)
        self.counters = {port: dict.fromkeys(WIRE_COUNTERS, 0) for port in WIRE_PORTS}
        self._mac = _mac_bytes(mac)
        self._ip = ipaddress.IPv4Address(self.ip).packed

    def describe(self) -> str:
        return (f"golden model NIC in the wire, board {self.ip} ({self.mac}) on port 0, "
                f"gradient UDP port {self.gradient_port}, NIC max {self.nic.max_count} values")

    # -- the registers ------------------------------------------------------------------

    def read(self, address: int) -> int:
        """One 32-bit ``CTRL`` address: the ``wire`` region is ``WIRE_REGISTERS`` (the NIC
        engines' counters and each port's); every other address reads 0."""
        where = decode_network_address(address)
        if where is None or where[0].name != "wire":
            return 0
        decoded = WIRE_REGISTERS.decode(where[1])
        if decoded is None:
            return 0
        block, counter = decoded.entry.name, decoded.counter
        if block in ("tx", "rx"):
            return self.nic.counters[block][counter] & _WORD
        return self.counters[int(block[-1])][counter]

    # -- frames in, frames out -----------------------------------------------------------

    def receive(self, port: int, frame: bytes) -> list[tuple[int, bytes]]:
        """One frame (FCS included) arriving on ``port``; the ``(port, frame)`` the board
        sends in answer, each frame with its FCS."""
        if port not in WIRE_PORTS:
            raise ValueError(f"the wire has ports 0 (host) and 1 (network), not {port!r}")
        frame = bytes(frame)
        self._count(port, "frames_in")
        cause, out = self._one(port, frame)
        self._count(port, cause)
        for out_port, _ in out:
            self._count(out_port, "frames_out")
        return out

    def _count(self, port: int, name: str) -> None:
        self.counters[port][name] = (self.counters[port][name] + 1) & _WORD

    def _one(self, port: int, frame: bytes) -> tuple[str, list]:
        if len(frame) >= FCS_BYTES and with_fcs(frame[:-FCS_BYTES]) != frame:
            return "drop_fcs", []       # (a frame too short to hold an FCS is a runt)
        if len(frame) < MIN_FRAME_BYTES:
            return "drop_runt", []
        if len(frame) > MAX_FRAME_BYTES:
            return "drop_oversize", []
        body = frame[:-FCS_BYTES]
        other = 1 - port
        if self._for_board(body):
            if port == 1:
                return "drop_board_address", []
            reply = self._answer(body)
            return ("answered", [(0, reply)]) if reply else ("drop_unanswered", [])
        total = ipv4_length(body)      # (a frame of 64 bytes or more holds a UDP header)
        if total is not None and body[IP_PROTOCOL_OFFSET] == _PROTO_UDP \
                and int.from_bytes(body[_UDP + 2:_UDP + 4], "big") == self.gradient_port:
            cause, new_body = self._gradient(port, body, total)
            if new_body is not None:
                return cause, [(other, padded_with_fcs(new_body))]
            return cause, [] if cause.startswith("drop_") else [(other, frame)]
        return "passed", [(other, frame)]

    def _for_board(self, body: bytes) -> bool:
        """Addressed to the board: its MAC, or ARP whose target is its IP."""
        if body[0:6] == self._mac:
            return True
        return body[_ETHERTYPE] == _ETHERTYPE_ARP and len(body) >= ETH_HEADER + ARP_BYTES \
            and body[ETH_HEADER + 24:ETH_HEADER + ARP_BYTES] == self._ip

    # -- gradient datagrams --------------------------------------------------------------

    def _gradient(self, port: int, body: bytes, total: int):
        """``(cause, new frame body or None)``: None sends the frame on unchanged, unless
        the cause is a drop."""
        payload = udp_payload(body, total)
        if isinstance(payload, str):
            return payload, None
        if port == 0:
            out, cause = self.nic.process("tx", nic_packet(payload))
            if cause not in ("compressed", "length_mismatch"):
                return "passed", None
            image = out.to_bytes()
            if len(image) > len(payload):
                return "incompressible", None
            return "compressed", self._reframe(body, image)
        if len(payload) < HEADER_BYTES:
            return "drop_malformed", None   # shorter than a header (spec section 6)
        out, cause = self.nic.process("rx", nic_packet(payload))
        if out is None:
            return "drop_malformed", None
        if cause != "decompressed":
            return "passed", None
        return "decompressed", self._reframe(body, out.to_bytes())

    @staticmethod
    def _reframe(body: bytes, payload: bytes) -> bytes:
        """``body``'s Ethernet, IPv4 and UDP headers around a new UDP payload: IPv4 total
        length and header checksum, UDP length rewritten, UDP checksum 0."""
        ip = bytearray(body[_IP:_UDP])
        ip[2:4] = (IP_HEADER + UDP_HEADER + len(payload)).to_bytes(2, "big")
        ip[10:12] = b"\0\0"
        ip[10:12] = internet_checksum(bytes(ip)).to_bytes(2, "big")
        udp = body[_UDP:_UDP + 4] + (UDP_HEADER + len(payload)).to_bytes(2, "big") + b"\0\0"
        return body[:_IP] + bytes(ip) + udp + payload

    # -- the board's own address (host side) ---------------------------------------------

    def _answer(self, body: bytes) -> bytes | None:
        """The reply frame (with its FCS) to a frame for the board, or None."""
        if body[_ETHERTYPE] == _ETHERTYPE_ARP:
            arp = body[ETH_HEADER:ETH_HEADER + ARP_BYTES]
            if body[0:6] not in (self._mac, b"\xff" * 6) or arp[:8] != _ARP_REQUEST \
                    or arp[24:28] != self._ip:
                return None
            sender_mac, sender_ip = arp[8:14], arp[14:18]
            reply = _ARP_REQUEST[:7] + b"\x02" + self._mac + self._ip + sender_mac + sender_ip
            return padded_with_fcs(sender_mac + self._mac + _ETHERTYPE_ARP + reply)
        total = ipv4_length(body)
        if total is None or body[_IP + 16:_IP + 20] != self._ip \
                or not IP_HEADER + UDP_HEADER <= total <= len(body) - _IP:
            return None
        protocol, src_ip = body[IP_PROTOCOL_OFFSET], body[_IP + 12:_IP + 16]
        if protocol == _PROTO_ICMP:
            icmp = body[_UDP:_IP + total]
            if icmp[0:2] != b"\x08\x00" or len(icmp) - 8 > ICMP_MAX_DATA:
                return None     # not an echo request, or more than LiteEth's buffer holds
            # LiteEth adds 0x0800 to the checksum (the type went from 8 to 0), end carry in
            checksum = int.from_bytes(icmp[2:4], "big")
            checksum = (checksum + 0x0800 + (checksum >= 0xF800)) & 0xFFFF
            return self._ip_reply(body, _PROTO_ICMP, b"\0\0" + checksum.to_bytes(2, "big")
                                  + icmp[4:])
        if protocol != _PROTO_UDP or int.from_bytes(body[_UDP + 2:_UDP + 4], "big") \
                != self.ctrl_port:
            return None
        payload = udp_payload(body, total)
        if isinstance(payload, str):
            return None
        src_port = int.from_bytes(body[_UDP:_UDP + 2], "big")
        request = Datagram(str(ipaddress.IPv4Address(src_ip)), src_port, self.ip,
                           self.ctrl_port, payload)
        replies = self.board.deliver([request])
        if not replies:
            return None
        r = replies[0]
        udp = struct.pack(">HHHH", r.src_port, r.dst_port, UDP_HEADER + len(r.payload), 0)
        return self._ip_reply(body, _PROTO_UDP, udp + r.payload)

    def _ip_reply(self, body: bytes, protocol: int, payload: bytes) -> bytes:
        """An IPv4 frame from the board to the sender of ``body``, as LiteEth sends it."""
        ip = bytearray(struct.pack(">BBHHHBBH4s4s", 0x45, 0, IP_HEADER + len(payload), 0, 0,
                                   _REPLY_TTL, protocol, 0, self._ip, body[_IP + 12:_IP + 16]))
        ip[10:12] = internet_checksum(bytes(ip)).to_bytes(2, "big")
        return padded_with_fcs(body[6:12] + self._mac + _ETHERTYPE_IPV4 + bytes(ip) + payload)
