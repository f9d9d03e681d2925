"""The Ethernet frame contract (``docs/protocol/network.md`` sections 1 and 6): the sizes,
offsets, EtherTypes, IP protocols, FCS and checksums that the wire's classifier and board
service (``hdl/wire/``), its golden model (``host/board/wire_golden.py``), the wire ring
(``host/wire_ring/``) and the benches (``sim/``) all derive from, declared once.

Offsets count bytes from the first byte of the destination MAC address. The gateware and
the models handle untagged frames with 20-byte IPv4 headers only, so a UDP datagram's
fields sit at the same offsets in every frame they take.
"""
from __future__ import annotations

import struct
import zlib

__all__ = [
    "FCS_BYTES", "FCS_RESIDUE", "MIN_FRAME_BYTES", "MAX_FRAME_BYTES", "MIN_BODY_BYTES",
    "MAX_BODY_BYTES", "ETH_HEADER", "IP_HEADER", "UDP_HEADER", "ARP_BYTES", "IP_OFFSET",
    "UDP_OFFSET", "PAYLOAD_OFFSET", "ETHERTYPE_OFFSET", "IP_PROTOCOL_OFFSET", "ETHERTYPE_IPV4",
    "ETHERTYPE_ARP", "IP_PROTO_ICMP", "IP_PROTO_UDP", "with_fcs", "padded_with_fcs",
    "internet_checksum",
]

#: The frame check sequence: a CRC-32 after the payload, least significant byte first.
FCS_BYTES = 4
#: ``zlib.crc32`` of a frame with a good FCS, the FCS included (the CRC-32 residue).
FCS_RESIDUE = 0x2144DF1C
#: Ethernet frames the board accepts, FCS included (spec section 1): 64 to 9018 bytes.
MIN_FRAME_BYTES = 64
MAX_FRAME_BYTES = 9018
#: The same lengths as a MAC hands frames over (the FCS stripped): 60 to 9014 bytes.
MIN_BODY_BYTES = MIN_FRAME_BYTES - FCS_BYTES
MAX_BODY_BYTES = MAX_FRAME_BYTES - FCS_BYTES

#: Header sizes: Ethernet (two MAC addresses and the EtherType, untagged), IPv4 without
#: options, UDP, and an ARP packet for Ethernet/IPv4 addresses.
ETH_HEADER = 14
IP_HEADER = 20
UDP_HEADER = 8
ARP_BYTES = 28

#: Where each header starts in a frame, and where a UDP datagram's payload starts.
IP_OFFSET = ETH_HEADER                          # 14
UDP_OFFSET = ETH_HEADER + IP_HEADER             # 34
PAYLOAD_OFFSET = UDP_OFFSET + UDP_HEADER        # 42
#: The EtherType's two bytes, right after the MAC addresses (untagged frames).
ETHERTYPE_OFFSET = 12
#: The IPv4 header's protocol byte.
IP_PROTOCOL_OFFSET = IP_OFFSET + 9              # 23

ETHERTYPE_IPV4 = 0x0800
ETHERTYPE_ARP = 0x0806
IP_PROTO_ICMP = 1
IP_PROTO_UDP = 17


def with_fcs(frame: bytes) -> bytes:
    """``frame`` (Ethernet header to the end of its payload) with its FCS appended: the
    CRC-32 of the frame, least significant byte first, as it goes on the wire."""
    return bytes(frame) + zlib.crc32(frame).to_bytes(FCS_BYTES, "little")


def padded_with_fcs(frame: bytes) -> bytes:
    """What the MAC sends of ``frame``: zero-padded to 60 bytes, then its FCS."""
    return with_fcs(frame.ljust(MIN_BODY_BYTES, b"\0"))


def internet_checksum(data: bytes) -> int:
    """RFC 1071: the ones' complement of the ones' complement sum of ``data``'s 16-bit
    big-endian words (an odd byte padded with zero). 0 when ``data`` holds its own valid
    checksum."""
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f">{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF
