"""The golden NIC in the wire (``host/board/wire_golden.py``) against
``docs/protocol/network.md`` section 6: frames built and parsed with scapy, the packets
compared bit for bit with the golden codec (no sockets, no gateware)."""
import struct
import zlib

import numpy as np
import pytest
from scapy.layers.inet import ICMP, IP, TCP, UDP
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw

from contract.counters import WIRE_COUNTERS, WIRE_DROP_CAUSES
from contract.header import Flags, Header, PacketType
from contract.network import (DEFAULT_IP, DEFAULT_MAC, NET_REGISTERS, NIC_VALUES_PER_MTU,
                              CtrlOp, ip_to_int, network_address)
from contract.packet import Packet
from contract.registers import WIRE_REGISTERS
from host.board.wire_golden import GoldenWire, internet_checksum, with_fcs
from host.golden import inceptionn
from sim.frames import (A_IP, A_MAC, B_IP, B_MAC, KEY, MALFORMED, PASS_THROUGH, RX_PASSES,
                        SPECIALS, TX_PASSES, ctrl_request, frame, gradient, inc_bytes,
                        raw_packet, values)
from tests.helpers import bits, fresh_rng

#: classes that count a frame's fate (every arriving frame counts in exactly one)
OUTCOMES = [c for c in WIRE_COUNTERS if c not in ("frames_in", "frames_out")]
def check_counts(wire):
    for port in (0, 1):
        c = wire.counters[port]
        assert c["frames_in"] == sum(c[name] for name in OUTCOMES), (port, c)


def one(wire, port, data):
    """The single frame ``data`` on ``port`` becomes; (out_port, scapy Ether of it)."""
    out = wire.receive(port, data)
    check_counts(wire)
    assert len(out) == 1, out
    out_port, sent = out[0]
    assert zlib.crc32(sent) == 0x2144DF1C       # the CRC-32 residue: a good FCS
    return out_port, Ether(sent[:-4])


def check_headers(sent: Ether, original: Ether, payload: bytes):
    """``sent`` is ``original`` re-framed around ``payload``, as section 6 asks."""
    ip, udp = sent[IP], sent[UDP]
    assert bytes(udp.payload)[:ip.len - 28] == payload
    assert ip.len == 28 + len(payload) and udp.len == 8 + len(payload) and udp.chksum == 0
    recomputed = ip.copy()
    del recomputed.chksum
    assert IP(bytes(recomputed)).chksum == ip.chksum
    assert internet_checksum(bytes(ip)[:20]) == 0
    for layer, fields in ((Ether, ("src", "dst", "type")),
                          (IP, ("src", "dst", "tos", "id", "flags", "frag", "ttl", "proto")),
                          (UDP, ("sport", "dport"))):
        for name in fields:
            assert getattr(sent[layer], name) == getattr(original[layer], name), name


# -- frames that pass ------------------------------------------------------------------------

PASSES = ([(name, pkt, port) for name, pkt in PASS_THROUGH.items() for port in (0, 1)]
          + [(name, pkt, 0) for name, pkt in TX_PASSES.items()]
          + [(name, pkt, 1) for name, pkt in RX_PASSES.items()])


@pytest.mark.parametrize("name, pkt, port", PASSES, ids=[f"{n}-{p}" for n, _, p in PASSES])
def test_pass_through_byte_for_byte(name, pkt, port):
    wire = GoldenWire(KEY)
    data = frame(pkt)
    assert wire.receive(port, data) == [(1 - port, data)]
    assert wire.counters[port]["passed"] == 1 and wire.counters[1 - port]["frames_out"] == 1
    check_counts(wire)


# -- gradient datagrams --------------------------------------------------------------------

@pytest.mark.parametrize("k", [1, 7, 10, 15])
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 100, NIC_VALUES_PER_MTU])
def test_compress_then_decompress_bit_exact(n, k):
    rng = fresh_rng()
    words = values(rng, n)
    if k <= 4:     # coarse bounds leave most values below 2^-k: give some larger ones
        words[SPECIALS.size:] = (rng.standard_normal(max(0, n - SPECIALS.size)) * 4).astype(
            np.float32).view(np.uint32)
    raw = raw_packet(words, k)
    original = gradient(raw)
    wire = GoldenWire(KEY)
    inc = Packet(Header.parse(raw).replace(type=PacketType.INC_F32), inceptionn.encode(words, k))
    out = wire.receive(0, frame(original))
    if len(inc.to_bytes()) > len(raw):          # the values do not compress
        assert n < 7                            # (one value: 8 bytes of INC_F32 payload)
        assert out == [(1, frame(original))] and wire.counters[0]["incompressible"] == 1
        return
    assert len(out) == 1 and out[0][0] == 1
    sent = Ether(out[0][1][:-4])
    check_headers(sent, original, inc.to_bytes())
    assert wire.counters[0]["compressed"] == 1 and wire.nic.counters["tx"]["compressed"] == 1

    back_port, back = one(wire, 1, out[0][1])
    assert back_port == 0 and wire.counters[1]["decompressed"] == 1
    quantized = bits(inceptionn.quantize(words.view(np.float32), k))
    check_headers(back, original, raw[:32] + quantized.astype("<u4").tobytes())
    got = np.frombuffer(bytes(back[UDP].payload)[32:len(raw)], dtype="<u4")
    assert np.array_equal(got, bits(inceptionn.decode(inc.payload, n, k)))
    raw_words = (words >> 23 & 0xFF) == 0xFF                   # Inf, NaN (payloads kept)
    assert np.array_equal(got[raw_words], words[raw_words])
    assert not got[(words == 0x8000_0000) | (words >> 23 & 0xFF == 0)].any()  # -0, denormals


def test_incompressible_values_pass_raw():
    wire = GoldenWire(KEY)
    data = frame(gradient(raw_packet(np.full(64, 0x4049_0FDB, np.uint32))))  # pi: all raw
    assert wire.receive(0, data) == [(1, data)]
    assert wire.counters[0]["incompressible"] == 1 and wire.counters[0]["compressed"] == 0


def test_round_trip_host_a_to_host_b():
    """Host A -> wire A -> wire B -> host B: B gets A's frame, UDP checksum 0 (section 6),
    values that survive the codec unchanged (already quantized) bit for bit."""
    rng = fresh_rng()
    words = bits(inceptionn.quantize(values(rng, NIC_VALUES_PER_MTU).view(np.float32), 10))
    original = gradient(raw_packet(words, 10, job=3), id=777, tos=0x28, flags="DF", ttl=9)
    assert len(original[IP]) == 1500
    wire_a, wire_b = GoldenWire(KEY), GoldenWire(KEY)
    [(port_a, on_network)] = wire_a.receive(0, frame(original))
    assert port_a == 1 and len(on_network) < len(frame(original))
    [(port_b, at_b)] = wire_b.receive(1, on_network)
    assert port_b == 0
    expected = original.copy()
    expected[UDP].chksum = 0
    assert at_b == frame(expected)
    # a sender that sends no checksum gets its frame back byte for byte
    original[UDP].chksum = 0
    [(_, on_network)] = wire_a.receive(0, frame(original))
    assert wire_b.receive(1, on_network) == [(0, frame(original))]


def test_custom_gradient_port():
    wire = GoldenWire(KEY, gradient_port=50000)
    raw = raw_packet(np.zeros(64, np.uint32))
    default = frame(gradient(raw))
    assert wire.receive(0, default) == [(1, default)]
    port, sent = one(wire, 0, frame(gradient(raw, dport=50000)))
    assert port == 1 and Header.parse(bytes(sent[UDP].payload)).type == PacketType.INC_F32


@pytest.mark.parametrize("name", MALFORMED)
def test_network_side_drops_what_the_receive_path_drops(name):
    payload, cause = MALFORMED[name]
    wire = GoldenWire(KEY)
    assert wire.receive(1, frame(gradient(payload))) == []
    assert wire.counters[1]["drop_malformed"] == 1 and wire.counters[0]["frames_out"] == 0
    if cause is not None:
        assert wire.nic.counters["rx"][cause] == 1
    check_counts(wire)


@pytest.mark.parametrize("port", [0, 1])
def test_udp_checksum_on_the_gradient_port(port):
    wire = GoldenWire(KEY)
    payload = raw_packet(SPECIALS) if port == 0 else inc_bytes()
    good = gradient(payload)
    good[UDP].chksum = Ether(bytes(good))[UDP].chksum        # computed by scapy
    assert good[UDP].chksum != 0
    assert len(wire.receive(port, frame(good))) == 1
    bad = good.copy()
    bad[UDP].chksum ^= 1
    assert wire.receive(port, frame(bad)) == []
    assert wire.receive(port, frame(gradient(payload, checksum=False)))     # zero: accepted
    assert wire.counters[port]["drop_udp_checksum"] == 1
    check_counts(wire)


@pytest.mark.parametrize("port", [0, 1])
def test_udp_length_disagreeing_with_ip_is_dropped(port):
    wire = GoldenWire(KEY)
    pkt = gradient(raw_packet(SPECIALS) if port == 0 else inc_bytes(), checksum=False)
    pkt[UDP].len = 8 + 4
    long_ip = gradient(raw_packet(SPECIALS), checksum=False)
    long_ip[IP].len = 2000
    for bad in (pkt, long_ip):
        assert wire.receive(port, frame(bad)) == []
    assert wire.counters[port]["drop_udp_length"] == 2
    check_counts(wire)


def test_ethernet_padding_is_not_part_of_the_datagram():
    """A frame padded beyond its IPv4 packet: the padding does not reach the engine, and
    the rewritten frame carries none."""
    wire = GoldenWire(KEY)
    pkt = gradient(raw_packet(np.zeros(8, np.uint32)))
    port, sent = one(wire, 0, with_fcs(bytes(pkt) + b"\xee" * 30))
    assert port == 1 and wire.counters[0]["compressed"] == 1
    assert bytes(sent[UDP].payload) == Header.parse(raw_packet(np.zeros(8))).replace(
        type=PacketType.INC_F32).pack() + bytes(4)
    assert len(sent) == 14 + 28 + 36


# -- bad frames ----------------------------------------------------------------------------

@pytest.mark.parametrize("port", [0, 1])
def test_bad_frames_counted_on_their_port(port):
    wire = GoldenWire(KEY)
    good = frame(gradient(raw_packet(SPECIALS)))
    bad_fcs = good[:-1] + bytes([good[-1] ^ 1])
    runt = with_fcs(bytes(PASS_THROUGH["tcp"]).ljust(59, b"\0"))
    oversize = with_fcs(bytes(gradient(b"\0" * (9018 - 45))))
    assert len(runt) == 63 and len(oversize) == 9019
    for data in (bad_fcs, runt, oversize, b"", b"\x01\x02"):
        assert wire.receive(port, data) == []
    c = wire.counters[port]
    assert (c["drop_fcs"], c["drop_runt"], c["drop_oversize"]) == (1, 3, 1)
    assert wire.counters[1 - port] == dict.fromkeys(WIRE_COUNTERS, 0)
    assert wire.receive(port, with_fcs(bytes(gradient(bytes(9018 - 46), dport=9))))  # 9018
    check_counts(wire)


# -- the board itself ----------------------------------------------------------------------

def test_network_side_cannot_reach_the_board():
    wire = GoldenWire(KEY)
    for pkt in (Ether(src=B_MAC, dst="ff:ff:ff:ff:ff:ff") / ARP(psrc=B_IP, pdst=DEFAULT_IP),
                Ether(src=B_MAC, dst=DEFAULT_MAC) / IP(src=B_IP, dst=DEFAULT_IP) / ICMP(),
                Ether(src=B_MAC, dst=DEFAULT_MAC) / IP(src=B_IP, dst=B_IP) / UDP(dport=47573)
                / Raw(ctrl_request([(network_address("net", 0), 0)]))):
        assert wire.receive(1, frame(pkt)) == []
    assert wire.counters[1]["drop_board_address"] == 3
    assert wire.counters[0]["frames_out"] == 0


def test_arp_reply():
    wire = GoldenWire(KEY)
    port, reply = one(wire, 0, frame(Ether(src=A_MAC, dst="ff:ff:ff:ff:ff:ff")
                                     / ARP(hwsrc=A_MAC, psrc=A_IP, pdst=DEFAULT_IP)))
    assert port == 0 and wire.counters[0]["answered"] == 1
    assert (reply.dst, reply.src) == (A_MAC, DEFAULT_MAC)
    arp = reply[ARP]
    assert (arp.op, arp.hwsrc, arp.psrc, arp.hwdst, arp.pdst) == (2, DEFAULT_MAC, DEFAULT_IP,
                                                                  A_MAC, A_IP)
    assert bytes(reply)[42:] == bytes(18)           # the MAC's zero padding


def test_ping_reply():
    wire = GoldenWire(KEY)
    request = Ether(src=A_MAC, dst=DEFAULT_MAC) / IP(src=A_IP, dst=DEFAULT_IP, ttl=3) \
        / ICMP(id=0x1234, seq=9) / Raw(bytes(range(100)))
    port, reply = one(wire, 0, frame(request))
    assert port == 0 and (reply.dst, reply.src) == (A_MAC, DEFAULT_MAC)
    assert (reply[IP].src, reply[IP].dst, reply[IP].ttl, reply[IP].id) == (DEFAULT_IP, A_IP,
                                                                          128, 0)
    assert internet_checksum(bytes(reply[IP])[:20]) == 0
    icmp = reply[ICMP]
    assert (icmp.type, icmp.id, icmp.seq, bytes(icmp.payload)) == (0, 0x1234, 9,
                                                                   bytes(range(100)))
    assert internet_checksum(bytes(icmp)) == 0
    big = request.copy()
    big[Raw].load = bytes(129)                      # beyond LiteEth's 128-byte buffer
    assert wire.receive(0, frame(big)) == []
    assert wire.counters[0]["drop_unanswered"] == 1


def wire_address(block, counter):
    return network_address("wire", WIRE_REGISTERS[block].address(counter))


def test_ctrl_answered_on_the_host_side():
    wire = GoldenWire(KEY)
    # some traffic first, so that the counters read are not all zero
    wire.receive(0, frame(Ether(src=A_MAC, dst=B_MAC) / IP(src=A_IP, dst=B_IP) / TCP()))
    wire.receive(1, frame(Ether(src=B_MAC, dst=A_MAC) / IP(src=B_IP, dst=A_IP) / TCP()))
    ip_register = network_address("net", NET_REGISTERS["ip"].address)
    pairs = [(wire_address("port0", "frames_in"), 7), (wire_address("port0", "answered"), 0),
             (wire_address("port1", "passed"), 0), (wire_address("tx", "packets"), 0),
             (ip_register, 0), (network_address("wire", 0xFFFF), 0)]
    request = Ether(src=A_MAC, dst=DEFAULT_MAC) / IP(src=A_IP, dst=DEFAULT_IP) \
        / UDP(sport=41000, dport=47573) / Raw(ctrl_request(pairs, op=CtrlOp.WRITE))
    port, reply = one(wire, 0, frame(request))
    assert port == 0 and (reply.dst, reply.src) == (A_MAC, DEFAULT_MAC)
    assert (reply[IP].src, reply[IP].dst, reply[IP].ttl, reply[UDP].sport, reply[UDP].dport,
            reply[UDP].chksum) == (DEFAULT_IP, A_IP, 128, 47573, 41000, 0)
    assert internet_checksum(bytes(reply[IP])[:20]) == 0
    payload = bytes(reply[UDP].payload)
    sent = ctrl_request(pairs, op=CtrlOp.WRITE)
    assert payload[:32] == sent[:3] + bytes([Flags.RESULT]) + sent[4:32]
    # the wire's counters (this request's frame is in frames_in, not yet answered), writes
    # ignored, the network top's registers and unmapped addresses 0
    assert payload[32:] == b"".join(struct.pack("<II", a, v) for (a, _), v
                                    in zip(pairs, (2, 0, 1, 0, 0, 0)))
    assert wire.counters[0]["answered"] == 1
    for bad in (ctrl_request(pairs, key=KEY ^ 1),                   # wrong key: no reply
                b"not ctrl"):                                        # too short: none either
        pkt = Ether(bytes(request))
        pkt[UDP].remove_payload()
        del pkt[IP].len, pkt[IP].chksum, pkt[UDP].len, pkt[UDP].chksum
        assert wire.receive(0, frame(pkt / Raw(bad))) == []
    other_port = Ether(bytes(request))
    other_port[UDP].dport = 47570
    del other_port[UDP].chksum
    assert wire.receive(0, frame(other_port)) == []
    assert wire.counters[0]["drop_unanswered"] == 3
    assert wire.board.counters["drop_bad_key"] == 1
    check_counts(wire)


# -- parameters ----------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, match", [
    (dict(key=-1), "control key"),
    (dict(key=1 << 64), "control key"),
    (dict(gradient_port=0), "gradient_port"),
    (dict(gradient_port=70000), "gradient_port"),
    (dict(gradient_port=True), "gradient_port"),
    (dict(gradient_port=47573), "control port"),
    (dict(max_count=0), "max_count"),
    (dict(max_count=4096), "max_count"),
    (dict(mac="02:47"), "MAC address"),
    (dict(ip="192.168.1"), "octets"),
])
def test_parameters_checked(kwargs, match):
    kwargs = {"key": KEY, **kwargs}
    with pytest.raises(ValueError, match=match):
        GoldenWire(kwargs.pop("key"), **kwargs)


def test_port_checked_and_counter_names_shared():
    wire = GoldenWire(KEY)
    with pytest.raises(ValueError, match="ports 0"):
        wire.receive(2, frame(PASS_THROUGH["tcp"]))
    assert list(wire.counters[0]) == list(WIRE_COUNTERS)
    assert WIRE_DROP_CAUSES[0] == "full" and wire.counters[1]["drop_full"] == 0
    assert tuple(f"drop_{c}" for c in WIRE_DROP_CAUSES) == WIRE_COUNTERS[-len(WIRE_DROP_CAUSES):]
