"""The frame contract (``contract/frames.py``) against scapy's Ethernet, IPv4, UDP and ARP:
every size, offset and constant is where scapy puts it, the checksum and FCS are the
standard ones."""
import zlib

from scapy.layers.inet import ICMP, IP, UDP
from scapy.layers.l2 import ARP, Ether

from contract import frames
from contract.frames import (ARP_BYTES, ETH_HEADER, ETHERTYPE_ARP, ETHERTYPE_IPV4,
                             ETHERTYPE_OFFSET, FCS_BYTES, FCS_RESIDUE, IP_HEADER, IP_OFFSET,
                             IP_PROTO_ICMP, IP_PROTO_UDP, IP_PROTOCOL_OFFSET, MAX_BODY_BYTES,
                             MAX_FRAME_BYTES, MIN_BODY_BYTES, MIN_FRAME_BYTES, PAYLOAD_OFFSET,
                             UDP_HEADER, UDP_OFFSET, internet_checksum, padded_with_fcs,
                             with_fcs)


def test_offsets_are_where_scapy_puts_the_fields():
    pkt = Ether(src="02:00:00:00:00:0a", dst="02:00:00:00:00:0b") \
        / IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=1, dport=2) / b"payload"
    raw = bytes(pkt)
    assert len(Ether()) == ETH_HEADER and len(IP()) == IP_HEADER and len(UDP()) == UDP_HEADER
    assert len(ARP()) == ARP_BYTES
    assert raw[ETHERTYPE_OFFSET:ETHERTYPE_OFFSET + 2] == ETHERTYPE_IPV4.to_bytes(2, "big")
    assert raw[IP_OFFSET:UDP_OFFSET] == bytes(pkt[IP])[:IP_HEADER]
    assert raw[IP_PROTOCOL_OFFSET] == IP_PROTO_UDP == pkt[IP].proto
    assert raw[UDP_OFFSET:UDP_OFFSET + 2] == (1).to_bytes(2, "big")
    assert raw[PAYLOAD_OFFSET:] == b"payload"
    assert bytes(Ether() / ARP())[ETHERTYPE_OFFSET:ETHERTYPE_OFFSET + 2] \
        == ETHERTYPE_ARP.to_bytes(2, "big")
    assert IP(bytes(IP() / ICMP())).proto == IP_PROTO_ICMP


def test_frame_lengths():
    assert (MIN_FRAME_BYTES, MAX_FRAME_BYTES, FCS_BYTES) == (64, 9018, 4)
    assert (MIN_BODY_BYTES, MAX_BODY_BYTES) == (60, 9014)


def test_fcs_and_checksum():
    pkt = Ether() / IP(src="10.0.0.1", dst="10.0.0.2") / UDP() / b"x"
    body = bytes(pkt)
    framed = with_fcs(body)
    assert framed[:-FCS_BYTES] == body and zlib.crc32(framed) == FCS_RESIDUE
    assert padded_with_fcs(b"\x01") == with_fcs(b"\x01" + bytes(MIN_BODY_BYTES - 1))
    header = bytes(pkt[IP])[:IP_HEADER]
    assert internet_checksum(header) == 0
    assert internet_checksum(header[:10] + b"\0\0" + header[12:]) == IP(header).chksum
    assert internet_checksum(b"\x01") == 0xFEFF        # an odd byte padded with zero


def test_exports():
    assert all(hasattr(frames, name) for name in frames.__all__)
