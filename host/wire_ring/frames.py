"""Ethernet II / IPv4 / UDP frames as a host sends and reads them (FCS included).

The hosts of the ring build their datagrams here; the frame's layout, FCS and checksum are
:mod:`contract.frames`' and the checks :mod:`host.board.wire_golden`'s (the same code the
golden wire board runs), so a frame a host sends is one the board accepts, and a frame the
board sends is one a host reads.
"""
from __future__ import annotations

import dataclasses
import functools
import ipaddress
import struct

from contract.frames import (ETH_HEADER, ETHERTYPE_IPV4, FCS_BYTES, IP_HEADER, IP_OFFSET,
                             IP_PROTO_UDP, IP_PROTOCOL_OFFSET, UDP_HEADER, UDP_OFFSET,
                             internet_checksum, padded_with_fcs, with_fcs)
from contract.network import mac_to_int
from host.board.wire_golden import ipv4_length, udp_payload

__all__ = ["Endpoint", "UdpDatagram", "udp_frame", "parse_udp_frame", "dst_mac", "src_mac",
           "BROADCAST_MAC"]

BROADCAST_MAC = b"\xff" * 6
_ETHERTYPE_IPV4 = ETHERTYPE_IPV4.to_bytes(2, "big")
_PROTO_UDP = IP_PROTO_UDP
#: what a host's IPv4 header says beyond addresses and length: version 4, IHL 5, TOS 0,
#: don't fragment (the datagrams fit the MTU), TTL 64
_IP = struct.Struct(">BBHHHBBH4s4s")
_DONT_FRAGMENT = 0x4000
_TTL = 64
_UDP = struct.Struct(">HHHH")


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """A host's or a board's addresses: a unicast MAC and an IPv4 address.

    Parameters
    ----------
    mac : str
        ``"02:47:57:01:00:00"``; a group address (least significant bit of the first byte
        set) is refused: no station sends from one.
    ip : str
        Dotted IPv4.
    """

    mac: str
    ip: str

    def __post_init__(self):
        mac = mac_to_int(self.mac)          # raises ValueError with the address in it
        if mac >> 40 & 1:
            raise ValueError(f"{self.mac} is a group (multicast) MAC address, not a station's")
        ipaddress.IPv4Address(self.ip)     # raises ValueError for a bad address

    @functools.cached_property      # (every frame a host builds or reads needs them)
    def mac_bytes(self) -> bytes:
        return mac_to_int(self.mac).to_bytes(6, "big")

    @functools.cached_property
    def ip_bytes(self) -> bytes:
        return ipaddress.IPv4Address(self.ip).packed


@dataclasses.dataclass(frozen=True)
class UdpDatagram:
    """What :func:`parse_udp_frame` reads from a frame."""
    dst_mac: bytes
    src_mac: bytes
    src_ip: bytes
    dst_ip: bytes
    src_port: int
    dst_port: int
    payload: bytes


def udp_frame(src: Endpoint, dst: Endpoint, src_port: int, dst_port: int, payload: bytes,
              *, ident: int = 0) -> bytes:
    """One UDP datagram from ``src`` to ``dst`` as a frame on the wire: Ethernet II, IPv4
    without options (identification ``ident``, don't fragment, TTL 64), UDP with its
    checksum (so the board's check of a non-zero checksum is exercised), padded to 60
    bytes, FCS."""
    payload = bytes(payload)
    udp_length = UDP_HEADER + len(payload)
    ip = bytearray(_IP.pack(0x45, 0, IP_HEADER + udp_length, ident & 0xFFFF, _DONT_FRAGMENT,
                            _TTL, _PROTO_UDP, 0, src.ip_bytes, dst.ip_bytes))
    ip[10:12] = internet_checksum(bytes(ip)).to_bytes(2, "big")
    pseudo = src.ip_bytes + dst.ip_bytes + bytes((0, _PROTO_UDP)) + udp_length.to_bytes(2, "big")
    checksum = internet_checksum(pseudo + _UDP.pack(src_port, dst_port, udp_length, 0)
                                 + payload) or 0xFFFF     # RFC 768: 0 is sent as all ones
    udp = _UDP.pack(src_port, dst_port, udp_length, checksum)
    return padded_with_fcs(dst.mac_bytes + src.mac_bytes + _ETHERTYPE_IPV4 + bytes(ip) + udp
                           + payload)


def dst_mac(frame: bytes) -> bytes:
    """An Ethernet frame's destination MAC, 6 bytes."""
    return bytes(frame[0:6])


def src_mac(frame: bytes) -> bytes:
    """An Ethernet frame's source MAC, 6 bytes."""
    return bytes(frame[6:12])


def parse_udp_frame(frame: bytes) -> UdpDatagram | None:
    """The UDP datagram in ``frame`` (FCS included), or None when the frame is not one a
    host takes: a bad FCS, not untagged IPv4/UDP, IPv4 options or fragments, a bad IPv4
    header checksum, lengths that disagree, a wrong non-zero UDP checksum."""
    if len(frame) < ETH_HEADER + IP_HEADER + UDP_HEADER + FCS_BYTES \
            or with_fcs(frame[:-FCS_BYTES]) != frame:
        return None
    body = frame[:-FCS_BYTES]
    total = ipv4_length(body)
    if total is None or body[IP_PROTOCOL_OFFSET] != _PROTO_UDP:
        return None
    payload = udp_payload(body, total)
    if isinstance(payload, str):
        return None
    src_port, dst_port = struct.unpack_from(">HH", body, UDP_OFFSET)
    return UdpDatagram(dst_mac=body[0:6], src_mac=body[6:12],
                       src_ip=body[IP_OFFSET + 12:IP_OFFSET + 16],
                       dst_ip=body[IP_OFFSET + 16:IP_OFFSET + 20],
                       src_port=src_port, dst_port=dst_port, payload=payload)
