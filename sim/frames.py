"""The frames every bench and simulator test of the NIC in the wire sends: one builder for
stimulus (``tests/hdl/wire/``, ``tests/host/board/test_wire_golden.py`` and the cocotb
bench ``sim/tb_wire.py`` all take their frames from here, so every kind of bench sees the
same cases).

Frames are built with scapy and handed over as bytes **with their FCS**
(:func:`frame`): what arrives on a port. The sizes, offsets and FCS are
:mod:`contract.frames`'. :mod:`sim.wire_stimulus` schedules them as a MAC delivers them.
"""
import struct

import numpy as np
from scapy.layers.inet import ICMP, IP, TCP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import ARP, Dot1Q, Ether
from scapy.packet import Raw

from contract.frames import FCS_BYTES, MIN_BODY_BYTES, PAYLOAD_OFFSET, with_fcs
from contract.header import Flags, Header, PacketType
from contract.network import (DEFAULT_IP, DEFAULT_MAC, WIRE_GRADIENT_PORT, CtrlOp, Service,
                              service_ports)
from contract.packet import Packet
from host.board.wire_golden import ICMP_MAX_DATA
from host.golden import inceptionn

__all__ = ["KEY", "A_MAC", "B_MAC", "OTHER_MAC", "A_IP", "B_IP", "BROADCAST", "CTRL_PORT",
           "SPECIALS", "frame", "gradient", "raw_packet", "values", "inc_bytes", "ctrl_request",
           "PASS_THROUGH", "TX_PASSES", "RX_PASSES", "MALFORMED", "with_udp_checksum",
           "no_udp_checksum", "wrong_udp_checksum", "rebuilt", "bad_fcs", "padded", "body_of",
           "trailing", "random_frame", "mac_beats", "to_board", "ctrl_payload", "ctrl",
           "arp_cases", "ping_cases"]

#: the control key of the stimulus (a test board's; the benches use ``SIMULATION_KEY``)
KEY = 0x0123_4567_89AB_CDEF


A_MAC, B_MAC, OTHER_MAC = "02:00:00:00:00:0a", "02:00:00:00:00:0b", "02:00:00:00:00:0c"


A_IP, B_IP = "10.0.0.1", "10.0.0.2"


SPECIALS = np.array([0x7FC0_0001, 0xFFA0_1234, 0x7F80_0000, 0xFF80_0000, 0x8000_0000, 0,
                     0x0000_0001, 0x807F_FFFF, 0x3F80_0000, 0x3E99_999A, 0xBE99_999A,
                     0x3A80_0001, 0x3F7F_FFFF], dtype=np.uint32)


def frame(pkt, *, pad=True) -> bytes:
    """``pkt`` (scapy) as it arrives on a port: padded to 60 bytes as a MAC pads, FCS."""
    raw = bytes(pkt)
    return with_fcs(raw.ljust(MIN_BODY_BYTES, b"\0") if pad else raw)


def gradient(payload, *, src=(A_MAC, A_IP), dst=(B_MAC, B_IP), dport=WIRE_GRADIENT_PORT,
             checksum=True, **ip):
    udp = UDP(sport=40000, dport=dport)
    if not checksum:
        udp.chksum = 0
    return Ether(src=src[0], dst=dst[0]) / IP(src=src[1], dst=dst[1], **ip) / udp / Raw(payload)


def wrong_udp_checksum(pkt):
    pkt = Ether(bytes(pkt))             # checksums computed
    pkt[UDP].chksum ^= 0x5555
    return pkt


def raw_packet(words, k=10, *, compress=True, **fields) -> bytes:
    words = np.asarray(words, dtype=np.uint32)
    flags = Flags.COMPRESS if compress else Flags.NONE
    header = Header(type=PacketType.RAW_F32, flags=flags, k=k, count=words.size, seq=5,
                    offset=1234, **fields)
    return header.pack() + words.astype("<u4").tobytes()


def values(rng, n):
    """Gradient-like fp32 words (most compress), with the special values among them."""
    out = (rng.standard_normal(n) * 0.05).astype(np.float32).view(np.uint32)
    out[:min(n, SPECIALS.size)] = SPECIALS[:n]
    return out


# -- named frames ---------------------------------------------------------------------------

#: frames neither NIC path touches: both directions
PASS_THROUGH = {
    "arp for another host": Ether(src=A_MAC, dst="ff:ff:ff:ff:ff:ff") / ARP(psrc=A_IP, pdst=B_IP),
    "icmp echo": Ether(src=A_MAC, dst=B_MAC) / IP(src=A_IP, dst=B_IP) / ICMP() / b"ping",
    "tcp": Ether(src=A_MAC, dst=B_MAC) / IP(src=A_IP, dst=B_IP) / TCP(dport=WIRE_GRADIENT_PORT),
    "other udp port": gradient(raw_packet(SPECIALS), dport=WIRE_GRADIENT_PORT + 1),
    "udp wrong checksum, other port": wrong_udp_checksum(gradient(b"x" * 40, dport=9)),
    "ipv6 udp": Ether(src=A_MAC, dst=B_MAC) / IPv6() / UDP(dport=WIRE_GRADIENT_PORT)
    / Raw(raw_packet(SPECIALS)),
    "vlan tagged": Ether(src=A_MAC, dst=B_MAC) / Dot1Q(vlan=7) / IP(src=A_IP, dst=B_IP)
    / UDP(dport=WIRE_GRADIENT_PORT) / Raw(raw_packet(SPECIALS)),
    "ip options": gradient(raw_packet(SPECIALS), options=b"\x01\x01\x01\x00"),
    "fragment": gradient(raw_packet(SPECIALS), flags="MF"),
    "fragment offset": gradient(raw_packet(SPECIALS), frag=100),
    "bad ip checksum": gradient(raw_packet(SPECIALS), chksum=0x1234),
    "jumbo": gradient(b"\x55" * (9018 - 46), dport=9),
    "broadcast to the board's ip": Ether(src=A_MAC, dst="ff:ff:ff:ff:ff:ff")
    / IP(src=A_IP, dst=DEFAULT_IP) / UDP(dport=47573) / b"hello",
    "not compress": gradient(raw_packet(SPECIALS, compress=False)),
    "aggregator packet": gradient(Header(type=PacketType.AGG_ADD_I32, count=2).pack() + bytes(8)),
}


#: gradient datagrams the transmit path passes (from the host only)
TX_PASSES = {
    "inc_f32": gradient(Packet(Header(type=PacketType.INC_F32, k=10, count=8),
                               inceptionn.encode(SPECIALS[:8], 10)).to_bytes()),
    "bad k": gradient(raw_packet(SPECIALS, k=0)),
    "too large": gradient(raw_packet(np.ones(2049, np.uint32))),
    "short, no header": gradient(b"\x47\x01\x00\x01"),
}


#: gradient datagrams the receive path passes (from the network only)
RX_PASSES = {
    "raw_f32 compress": gradient(raw_packet(SPECIALS)),
    "raw_f32 too large": gradient(raw_packet(np.ones(2049, np.uint32))),
    "ctrl": gradient(Header(type=PacketType.CTRL, count=1).pack() + bytes(8)),
}


def inc_bytes(count=8, k=10, words=SPECIALS[:8], **fields):
    """An INC_F32 packet's bytes: ``words`` encoded with ``k``, header fields as given."""
    header = Header(type=PacketType.INC_F32, k=k, count=count, **fields)
    return header.pack() + inceptionn.encode(words, k if 1 <= k <= 15 else 10)


MALFORMED = {
    "short": (b"\x47\x01\x01\x00" + bytes(20), None),
    "bad magic": (b"\x46" + inc_bytes()[1:], "drop_bad_header"),
    "bad version": (b"\x47\x02" + inc_bytes()[2:], "drop_bad_header"),
    "not this protocol": (b"hello, world" * 4, "drop_bad_header"),
    "bad k": (inc_bytes(k=0), "drop_bad_k"),
    "too large": (inc_bytes(count=2049), "drop_too_large"),
    "truncated": (inc_bytes(count=64), "drop_truncated"),
    "overlong": (inc_bytes() + bytes(8), "drop_overlong"),
}


def ctrl_request(pairs, *, key=KEY, op=CtrlOp.READ):
    header = bytearray(Header(type=PacketType.CTRL, count=len(pairs), seq=11).pack())
    header[4] = op
    header[24:32] = key.to_bytes(8, "little")
    return bytes(header) + b"".join(struct.pack("<II", a, v) for a, v in pairs)


# -- the MAC side -------------------------------------------------------------------------

def mac_beats(data, rng, *, error_beat=None):
    """The beats a LiteEth MAC delivers for ``data`` (a frame with its FCS, 5 bytes or more):
    the FCS stripped, ``error`` on the last beat if the FCS is bad (or on beat
    ``error_beat``), garbage in the lanes past the end and in ``last_be`` before the end."""
    body = data[:-FCS_BYTES]
    bad = with_fcs(body) != data
    count = -(-len(body) // 4)
    beats = []
    for n in range(count):
        chunk = body[4 * n:4 * n + 4]
        last = n == count - 1
        raw = chunk + bytes(rng.getrandbits(8) for _ in range(4 - len(chunk)))
        beats.append({
            "data": int.from_bytes(raw, "little"),
            "last_be": 1 << (len(chunk) - 1) if last else rng.getrandbits(4),
            "last": int(last),
            "error": int(n == error_beat if error_beat is not None else bad and last),
        })
    return beats


# -- changed frames -------------------------------------------------------------------------

def with_udp_checksum(pkt):
    """``pkt`` with the UDP checksum scapy computes (never zero)."""
    pkt = Ether(bytes(pkt))
    assert pkt[UDP].chksum != 0
    return pkt


def no_udp_checksum(pkt):
    pkt = Ether(bytes(pkt))
    pkt[UDP].chksum = 0
    return pkt


def rebuilt(pkt, **fields):
    """``pkt`` (Ether/IP/UDP) with IPv4 or UDP fields set after its checksums were
    computed: the IPv4 header checksum recomputed, the UDP one kept."""
    pkt = Ether(bytes(pkt))
    for name, value in fields.items():
        layer, field = name.split("_", 1)
        setattr(pkt[{"ip": IP, "udp": UDP}[layer]], field, value)
    del pkt[IP].chksum
    return pkt


def bad_fcs(data):
    return data[:-1] + bytes([data[-1] ^ 0x01])


def padded(pkt, extra, fill=b"\xee"):
    """``pkt`` with ``extra`` bytes of (non-zero) Ethernet padding after its IPv4 packet."""
    return with_fcs(bytes(pkt) + fill * extra)


def body_of(size, *, dport=9):
    """A UDP frame of exactly ``size`` bytes without the FCS (``size`` >= 42)."""
    return with_fcs(bytes(gradient(bytes(size - PAYLOAD_OFFSET), dport=dport)))


def random_frame(rng):
    """One frame from a mix that reaches every decision: gradient datagrams of random sizes
    and checksums, mutated headers, cut frames, padding, ARP, frames for the board, other
    EtherTypes, bad FCS."""
    choice = rng.random()
    if choice < 0.1:
        target = DEFAULT_IP if rng.random() < 0.5 else B_IP
        dst = rng.choice([DEFAULT_MAC, "ff:ff:ff:ff:ff:ff", B_MAC])
        body = bytes(Ether(src=A_MAC, dst=dst) / ARP(op=rng.choice([1, 2]), psrc=A_IP,
                                                     pdst=target))
    elif choice < 0.2:
        size = rng.choice([rng.randrange(1, 80), rng.randrange(14, 1600)])
        body = bytes(rng.getrandbits(8) for _ in range(size))
        if rng.random() < 0.3:
            body = bytes.fromhex("024757000001") + body[6:]
    else:
        size = rng.choice([rng.randrange(0, 64), rng.randrange(0, 1473)] * 16
                          + [rng.randrange(8900, 8980)])
        payload = bytes(rng.getrandbits(8) for _ in range(size))
        dport = WIRE_GRADIENT_PORT if rng.random() < 0.85 else rng.randrange(1, 0x10000)
        dst = (DEFAULT_MAC if rng.random() < 0.05 else B_MAC, B_IP)
        pkt = gradient(payload, dport=dport, dst=dst, id=rng.randrange(0x10000),
                       ttl=rng.randrange(1, 256), tos=rng.randrange(256),
                       flags=rng.choice(["", "DF", "DF", "MF"]))
        pkt = rng.choice([with_udp_checksum, no_udp_checksum, wrong_udp_checksum])(pkt)
        if rng.random() < 0.15:
            pkt = rebuilt(pkt, **rng.choice([{"udp_len": rng.randrange(0x10000)},
                                             {"ip_len": rng.randrange(0x10000)},
                                             {"ip_len": len(pkt[IP]) + rng.choice([-1, 1])},
                                             {"udp_len": len(pkt[UDP]) + rng.choice([-1, 1])}]))
        body = bytes(pkt)
        if rng.random() < 0.15:                   # one header byte changed
            at = rng.randrange(42)
            body = body[:at] + bytes([rng.getrandbits(8)]) + body[at + 1:]
        if rng.random() < 0.15:
            body += bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 40)))
        if rng.random() < 0.1:
            body = body[:rng.randrange(1, len(body) + 1)]
    body = body if len(body) >= 60 or rng.random() < 0.3 else body.ljust(60, b"\0")
    data = with_fcs(body)
    return bad_fcs(data) if rng.random() < 0.05 else data


# -- the board's own address (host side of the wire) ---------------------------------------

#: the board's control port (``Service.CTRL``)
CTRL_PORT = service_ports()[Service.CTRL]


BROADCAST = "ff:ff:ff:ff:ff:ff"


def to_board(payload_layer, **ip):
    return Ether(src=A_MAC, dst=DEFAULT_MAC) / IP(src=A_IP, dst=DEFAULT_IP, **ip) / payload_layer


def ctrl_payload(pairs, *, key=KEY, op=CtrlOp.READ, count=None, seq=0x1234_5678, **fields):
    header = bytearray(Header(type=fields.pop("type", PacketType.CTRL),
                              count=len(pairs) if count is None else count, seq=seq,
                              **fields).pack())
    header[4] = op
    header[24:32] = key.to_bytes(8, "little")
    return bytes(header) + b"".join(struct.pack("<II", a, v) for a, v in pairs)


def ctrl(pairs, *, sport=41000, **kwargs):
    return to_board(UDP(sport=sport, dport=CTRL_PORT) / Raw(ctrl_payload(pairs, **kwargs)))


def arp_cases():
    request = dict(hwsrc=OTHER_MAC, psrc="10.9.8.7", pdst=DEFAULT_IP)
    return [
        ("broadcast", frame(Ether(src=A_MAC, dst=BROADCAST) / ARP(**request))),
        ("to the board's mac", frame(Ether(src=A_MAC, dst=DEFAULT_MAC) / ARP(**request))),
        ("padded with junk", frame(Ether(src=A_MAC, dst=BROADCAST) / ARP(**request)
                                   / Raw(b"\xa5" * 30))),
        # not answered: a reply, another target, another destination MAC, not Ethernet/IPv4
        ("a reply", frame(Ether(src=A_MAC, dst=BROADCAST) / ARP(op=2, **request))),
        ("to another mac", frame(Ether(src=A_MAC, dst=OTHER_MAC) / ARP(**request))),
        # (to the board's MAC: for the board whatever their layout)
        ("hardware type 6", frame(Ether(src=A_MAC, dst=DEFAULT_MAC) / ARP(hwtype=6, **request))),
        ("ipv6-sized", frame(Ether(src=A_MAC, dst=DEFAULT_MAC) / ARP(plen=16, **request))),
        ("to the board, for another ip", frame(Ether(src=A_MAC, dst=DEFAULT_MAC)
                                               / ARP(hwsrc=A_MAC, psrc=A_IP, pdst="10.0.0.9"))),
    ]


def ping_cases(rng):
    cases = []
    for size in (0, 1, 2, 3, 5, 56, 100, ICMP_MAX_DATA - 1, ICMP_MAX_DATA):
        data = bytes(rng.getrandbits(8) for _ in range(size))
        cases.append((f"ping {size}", frame(to_board(ICMP(id=rng.getrandbits(16),
                                                          seq=rng.getrandbits(16)) / data,
                                                     ttl=rng.randint(1, 255)))))
    # checksums across the end-around carry of the adjustment (0xF800 and above)
    for checksum in (0x0000, 0x07FF, 0xF7FF, 0xF800, 0xF801, 0xFFFF):
        cases.append((f"ping checksum {checksum:#06x}",
                      frame(to_board(ICMP(chksum=checksum) / b"x"))))
    cases += [
        ("ping too big", frame(to_board(ICMP() / bytes(ICMP_MAX_DATA + 1)))),
        ("icmp timestamp", frame(to_board(ICMP(type=13)))),
        ("icmp echo code 1", frame(to_board(ICMP(code=1)))),
        ("ping to another ip", frame(Ether(src=A_MAC, dst=DEFAULT_MAC)
                                     / IP(src=A_IP, dst="10.0.0.9") / ICMP())),
        ("ping, ip options", frame(to_board(ICMP(), options=b"\x01\x01\x01\x01"))),
        ("ping, a fragment", frame(to_board(ICMP() / bytes(40), flags="MF"))),
        ("ping, bad ip checksum", frame(to_board(ICMP(), chksum=0x1234))),
        ("ping, ip longer than the frame", frame(to_board(ICMP() / bytes(20), len=200))),
        ("ping, trailing bytes", frame(trailing(to_board(ICMP(id=7) / b"abc"), 40))),
        ("tcp to the board", frame(to_board(TCP(dport=CTRL_PORT)))),
        ("ipv6 to the board's mac", frame(Ether(src=A_MAC, dst=DEFAULT_MAC) / IPv6() / ICMP())),
    ]
    return cases


def trailing(pkt, n):
    """``pkt`` with ``n`` bytes after its IPv4 packet (Ethernet padding, not its payload)."""
    return Ether(bytes(pkt) + b"\x5a" * n)
