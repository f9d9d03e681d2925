# amaranth: UnusedElaboratable=no
"""The frame classifier (``hdl/wire/classify.py``) against the golden NIC in the wire
(``host/board/wire_golden.py``): every frame goes through both, and the classifier's verdict
must be the golden model's decision for it, field for field.

The reference is the golden model itself, not a second implementation: a frame's class is
the counter ``GoldenWire.receive`` counts it in, and whether it was a gradient datagram is
whether the golden model took it to ``GoldenWire._gradient``. Where the golden model's
counter depends on a later block, the mapping is (:data:`GOLDEN_CLASS`): ``answered`` and
``drop_unanswered`` (the board's own service decides) are ``FOR_BOARD``; ``compressed``,
``decompressed``, ``incompressible`` and ``drop_malformed`` (the NIC engine decides) are
``GRADIENT``, and so is ``passed`` when the golden model handed the datagram to a NIC path.
"""
import random

import numpy as np
import pytest
from amaranth import Module
from amaranth.back import verilog
from amaranth.hdl import Fragment
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out
from scapy.layers.inet import ICMP, IP, TCP, UDP
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw

from contract.counters import WIRE_COUNTERS, WIRE_DROP_CAUSES
from contract.network import DEFAULT_IP, DEFAULT_MAC, WIRE_GRADIENT_PORT
from hdl.wire.classify import (DIRECTIONS, MAX_BODY_BYTES, MIN_BODY_BYTES, PAYLOAD_OFFSET,
                               FrameClass, FrameClassifier, MacBeat, Verdict)
from host.board.wire_golden import FCS_BYTES, GoldenWire, udp_payload, with_fcs
from sim.frames import (A_IP, A_MAC, B_IP, B_MAC, KEY, MALFORMED, PASS_THROUGH, RX_PASSES,
                        SPECIALS, TX_PASSES, bad_fcs, body_of, ctrl_request, frame, gradient,
                        mac_beats, no_udp_checksum, padded, random_frame, raw_packet, rebuilt,
                        values, with_udp_checksum, wrong_udp_checksum)
from tests.amaranth_sim import run

#: golden counter -> the classifier's class (``passed``: see :func:`golden_verdict`)
GOLDEN_CLASS = {
    "answered": FrameClass.FOR_BOARD,
    "drop_unanswered": FrameClass.FOR_BOARD,
    "compressed": FrameClass.GRADIENT,
    "decompressed": FrameClass.GRADIENT,
    "incompressible": FrameClass.GRADIENT,
    "drop_malformed": FrameClass.GRADIENT,
    **{c.name.lower(): c for c in FrameClass if c.name.startswith("DROP_")},
}
#: random frames per direction
RANDOM_FRAMES = 200
#: a frame's fates the golden model decides (``drop_full``, a frame the store had no room
#: for, is the wire's frame store's, never the golden model's)
FATES = [c for c in WIRE_COUNTERS if c not in ("frames_in", "frames_out", "drop_full")]


class SpyWire(GoldenWire):
    """The golden wire, remembering whether its last frame reached a NIC path's door (the
    gradient test of ``_one``) and the UDP payload it found there."""

    def _gradient(self, port, body, total):
        self.seen_gradient = True
        self.payload = udp_payload(body, total)
        return super()._gradient(port, body, total)


def golden_verdict(wire, port, data):
    """``(FrameClass, UDP payload or None)`` the golden model decides for ``data``."""
    wire.seen_gradient, wire.payload = False, None
    before = dict(wire.counters[port])
    wire.receive(port, data)
    [fate] = [c for c in FATES if wire.counters[port][c] != before[c]]
    if fate == "passed":
        kind = FrameClass.GRADIENT if wire.seen_gradient else FrameClass.PASS
    else:
        kind = GOLDEN_CLASS[fate]
    payload = wire.payload if kind == FrameClass.GRADIENT else None
    return kind, payload


def simulate(dut, frames, rng, *, p_idle):
    """Each ``(data, error_beat)`` of ``frames`` into ``dut`` with idle cycles before a beat
    with probability ``p_idle``; the verdicts, in order, as dicts."""
    got = []
    # one testbench that drives and watches, and beats as the payload's integer value:
    # this test runs tens of thousands of cycles
    layout = dut.i.p.shape()
    offsets = {name: field.offset for name, field in layout}
    streams = [[sum(value << offsets[name] for name, value in beat.items())
                for beat in mac_beats(data, rng, error_beat=error_beat)]
               for data, error_beat in frames]

    def collect(ctx):
        if ctx.get(dut.o.valid):
            p = ctx.get(dut.o.p)
            got.append({"kind": FrameClass(p.kind), "length": int(p.length),
                        "ip_total": int(p.ip_total), "payload_length": int(p.payload_length),
                        "ip_sum": int(p.ip_sum)})

    async def bench(ctx):
        payload = dut.i.p.as_value()
        for beats in streams:
            for beat in beats:
                while rng.random() < p_idle:
                    ctx.set(dut.i.valid, 0)
                    ctx.set(payload, rng.getrandbits(len(payload)))   # ignored: not valid
                    await ctx.tick()
                    collect(ctx)
                ctx.set(dut.i.valid, 1)
                ctx.set(payload, beat)
                await ctx.tick()
                collect(ctx)
        ctx.set(dut.i.valid, 0)
        for _ in range(3):                     # the last verdict: two cycles after its frame
            await ctx.tick()
            collect(ctx)

    run(dut, bench)
    return got


def fold(x):
    while x >> 16:
        x = (x & 0xFFFF) + (x >> 16)
    return x


def check(direction, cases, *, seed, p_idle=0.2):
    """Run ``cases`` (``(name, data)`` or ``(name, data, error_beat)``) through a classifier
    and the golden model; assert that every verdict is the golden model's decision."""
    rng = random.Random(seed)
    port = DIRECTIONS[direction]
    wire = SpyWire(KEY)
    cases = [(c[0], c[1], c[2] if len(c) > 2 else None) for c in cases]
    expected = [golden_verdict(wire, port, data) for _, data, _ in cases]
    got = simulate(FrameClassifier(direction=direction), [(d, e) for _, d, e in cases], rng,
                   p_idle=p_idle)
    assert len(got) == len(cases), f"{len(got)} verdicts for {len(cases)} frames"
    wrong = []
    for (name, data, _), (kind, payload), verdict in zip(cases, expected, got):
        body = data[:-FCS_BYTES]
        want = {"kind": kind, "length": min(len(body), 1 << 14)}
        have = {"kind": verdict["kind"], "length": verdict["length"]}
        if kind == FrameClass.GRADIENT:
            total = int.from_bytes(body[16:18], "big")
            want.update(ip_total=total, payload_length=len(payload), checksum=body[24:26])
            # the rewrite stage's header checksum for the frame's own total length: the
            # received one (the header is valid), and the golden re-framing's for a new one
            new_payload = bytes(len(payload) // 2 + 3)
            new_total = PAYLOAD_OFFSET - 14 + len(new_payload)
            want["new_checksum"] = GoldenWire._reframe(body, new_payload)[24:26]
            have.update(ip_total=verdict["ip_total"],
                        payload_length=verdict["payload_length"],
                        checksum=(~fold(verdict["ip_sum"] + total) & 0xFFFF).to_bytes(2, "big"),
                        new_checksum=(~fold(verdict["ip_sum"] + new_total)
                                      & 0xFFFF).to_bytes(2, "big"))
            assert body[PAYLOAD_OFFSET:PAYLOAD_OFFSET + len(payload)] == payload
        if have != want:
            wrong.append(f"{name} ({len(body)} bytes): classifier {have}, golden {want}")
    assert not wrong, f"{len(wrong)} of {len(cases)} frames differ:\n" + "\n".join(wrong[:10])
    return [kind for kind, _ in expected]


# -- the frames ----------------------------------------------------------------------------

def gradient_sizes():
    """Gradient datagrams of many payload sizes, odd ones included, up to the jumbo frame
    (9000-byte IPv4 packet, 9018-byte frame), each with a good, a zero and a wrong UDP
    checksum."""
    rng = np.random.default_rng(7)
    cases = []
    for n in (0, 1, 2, 3, 4, 5, 6, 7, 17, 18, 19, 31, 32, 33, 35, 100, 101, 1471, 1472,
              4001, 8971, 8972):
        payload = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        pkt = gradient(payload)
        cases.append((f"gradient {n}: checksum", frame(with_udp_checksum(pkt))))
        if n < 4000 or n == 8972:       # (the long ones cost simulation time)
            cases += [(f"gradient {n}: zero checksum", frame(no_udp_checksum(pkt))),
                      (f"gradient {n}: wrong checksum", frame(wrong_udp_checksum(pkt)))]
    for n in (0, 8, 360):   # NIC packets: raw (the host side compresses) and INC_F32
        cases.append((f"raw_f32 {n}", frame(gradient(raw_packet(values(rng, n))))))
    assert len(bytes(gradient(bytes(8972)))) == MAX_BODY_BYTES
    return cases


def length_cases():
    """UDP lengths other than the IPv4 payload's, IPv4 packets longer than their frame,
    Ethernet padding after the packet (to be ignored, non-zero, any alignment)."""
    pkt = with_udp_checksum(gradient(raw_packet(SPECIALS)))
    size = len(pkt[UDP])
    cases = [(f"udp length {n}", frame(rebuilt(pkt, udp_len=n)))
             for n in (0, 7, 8, 12, size - 1, size + 1, 0xFFFF)]
    cases += [(f"ip length {n}", frame(rebuilt(pkt, ip_len=n)))
              for n in (0, 19, 20, 27, 28, size + 19, size + 21, 2000, 0xFFFF)]
    short = with_udp_checksum(gradient(b""))                 # 42 bytes: padded to 60
    cases += [("udp length 7, ip length 27", frame(rebuilt(short, ip_len=27, udp_len=7))),
              ("udp length 8, ip length 28 (padded)", frame(short)),
              ("ip length past the padding", frame(rebuilt(short, ip_len=28 + 19, udp_len=27)))]
    cases += [(f"padding {extra}", padded(pkt, extra)) for extra in (1, 2, 3, 4, 5, 30)]
    odd = with_udp_checksum(gradient(b"\x01\x02\x03"))
    cases += [(f"odd datagram, padding {extra}", padded(odd, extra, b"\xff"))
              for extra in (15, 16, 17, 18)]
    wrong = wrong_udp_checksum(gradient(raw_packet(SPECIALS)))
    cases.append(("wrong checksum, padding", padded(wrong, 3)))
    # the golden model's rule: the padding is not summed, so a checksum that would be right
    # with it in is wrong
    cases.append(("frame cut inside the datagram", with_fcs(bytes(pkt)[:-5])))
    return cases


def checksum_cases():
    """IPv4 headers whose words (but the length and checksum) sum past 16 bits twice, so that
    the verdict's ``ip_sum`` needs both end-around carries, and UDP sums of all sizes."""
    cases = []
    for src, dst in (("254.254.254.254", "253.253.253.253"), ("255.255.255.255", "0.0.0.255")):
        base = gradient(b"0123456789", src=(A_MAC, src), dst=(B_MAC, dst), ttl=255, tos=0xFF)
        words = bytes(base[IP])[:20]
        rest = sum(int.from_bytes(words[k:k + 2], "big") for k in range(0, 20, 2)
                   if k not in (2, 10)) - int.from_bytes(words[4:6], "big")     # no id
        for ident in range(0x10000):     # the first id whose sum carries out of the fold
            total = rest + ident
            if (total & 0xFFFF) + (total >> 16) > 0xFFFF:
                break
        pkt = with_udp_checksum(rebuilt(base, ip_id=ident))
        cases += [(f"ip sum carries twice, id {ident:#x}", frame(pkt)),
                  (f"ip sum carries twice, id {ident:#x}, wrong checksum",
                   frame(wrong_udp_checksum(pkt)))]
    return cases


def bad_frames():
    """Bad FCS, runts (59/60 bytes without the FCS), oversize (9014/9015)."""
    good = frame(gradient(raw_packet(SPECIALS)))
    tcp = bytes(PASS_THROUGH["tcp"])
    cases = [("bad fcs", bad_fcs(good)),
             ("bad fcs, runt", bad_fcs(with_fcs(tcp.ljust(40, b"\0")))),
             ("bad fcs, oversize", bad_fcs(body_of(MAX_BODY_BYTES + 1))),
             ("bad fcs, to the board", bad_fcs(frame(Ether(dst=DEFAULT_MAC) / (b"x" * 50)))),
             ("runt 59", with_fcs(tcp.ljust(MIN_BODY_BYTES - 1, b"\0"))),
             ("ok 60", with_fcs(tcp.ljust(MIN_BODY_BYTES, b"\0"))),
             ("runt gradient 59", with_fcs(bytes(no_udp_checksum(gradient(bytes(17)))))),
             ("gradient 60", with_fcs(bytes(no_udp_checksum(gradient(bytes(18)))))),
             ("runt to the board", with_fcs(bytes(Ether(dst=DEFAULT_MAC) / (b"x" * 40)))),
             ("runt 1 byte", with_fcs(b"\x01")),
             ("runt 4 bytes", with_fcs(b"\x01\x02\x03\x04")),
             ("runt 5 bytes", with_fcs(b"\x01\x02\x03\x04\x05")),
             ("max 9014", body_of(MAX_BODY_BYTES)),
             ("oversize 9015", body_of(MAX_BODY_BYTES + 1)),
             ("oversize gradient", with_fcs(bytes(no_udp_checksum(gradient(bytes(8973))))))]
    # a PHY receive error flagged on an earlier beat (the FCS broken too, so that the
    # golden model, which knows only the FCS, sees the frame as bad)
    cases.append(("error mid-frame", bad_fcs(good), 5))
    return cases


def board_frames():
    """Frames for the board (host side: FOR_BOARD; network side: DROP_BOARD_ADDRESS), and
    near misses that are not."""
    return [
        ("arp request for the board", frame(Ether(src=A_MAC, dst="ff:ff:ff:ff:ff:ff")
                                            / ARP(hwsrc=A_MAC, psrc=A_IP, pdst=DEFAULT_IP))),
        ("arp reply to the board's ip", frame(Ether(src=A_MAC, dst=B_MAC)
                                              / ARP(op=2, psrc=A_IP, pdst=DEFAULT_IP))),
        ("arp for another ip, to the board's mac", frame(Ether(src=A_MAC, dst=DEFAULT_MAC)
                                                         / ARP(psrc=A_IP, pdst=B_IP))),
        ("arp for a neighbour of the board's ip", frame(Ether(src=A_MAC, dst="ff:ff:ff:ff:ff:ff")
                                                        / ARP(psrc=A_IP, pdst="192.168.77.3"))),
        ("arp for 192.168.0.2", frame(Ether(src=A_MAC, dst="ff:ff:ff:ff:ff:ff")
                                      / ARP(psrc=A_IP, pdst="192.168.0.2"))),
        ("ping the board", frame(Ether(src=A_MAC, dst=DEFAULT_MAC)
                                 / IP(src=A_IP, dst=DEFAULT_IP) / ICMP() / b"ping")),
        ("ctrl", frame(Ether(src=A_MAC, dst=DEFAULT_MAC) / IP(src=A_IP, dst=DEFAULT_IP)
                       / UDP(sport=41000, dport=47573) / Raw(ctrl_request([(0, 0)])))),
        ("gradient to the board's mac", frame(gradient(raw_packet(SPECIALS),
                                                       dst=(DEFAULT_MAC, B_IP)))),
        ("tcp to the board's mac", frame(Ether(src=A_MAC, dst=DEFAULT_MAC)
                                         / IP(src=A_IP, dst=DEFAULT_IP) / TCP())),
        ("to a mac one bit off the board's", frame(Ether(src=A_MAC, dst="02:47:57:00:00:03")
                                                   / IP(src=A_IP, dst=DEFAULT_IP) / TCP())),
        ("to a mac with the board's last bytes", frame(Ether(src=A_MAC, dst="12:47:57:00:00:01")
                                                       / IP(src=A_IP, dst=DEFAULT_IP) / TCP())),
        ("gradient to the board's ip", frame(gradient(raw_packet(SPECIALS),
                                                      dst=(B_MAC, DEFAULT_IP)))),
    ]


def named_frames(direction):
    cases = [(f"pass: {name}", frame(pkt)) for name, pkt in PASS_THROUGH.items()]
    passes = TX_PASSES if direction == "tx" else RX_PASSES
    cases += [(f"nic pass: {name}", frame(pkt)) for name, pkt in passes.items()]
    cases += [(f"malformed: {name}", frame(gradient(payload)))
              for name, (payload, _) in MALFORMED.items()]
    cases += [("other gradient port", frame(gradient(raw_packet(SPECIALS),
                                                     dport=WIRE_GRADIENT_PORT - 1)))]
    return (cases + gradient_sizes() + length_cases() + checksum_cases() + bad_frames()
            + board_frames())


# -- random frames -------------------------------------------------------------------------

# -- tests ---------------------------------------------------------------------------------

@pytest.mark.parametrize("direction", DIRECTIONS)
def test_named_frames_match_the_golden_model(direction):
    kinds = check(direction, named_frames(direction), seed=1)
    other_side = FrameClass.DROP_BOARD_ADDRESS if direction == "tx" else FrameClass.FOR_BOARD
    assert set(kinds) == set(FrameClass) - {other_side}       # every class of this side


def test_frame_lengths_saturate():
    """Frames longer than the beat counter counts: still oversize, lengths capped at 2^14
    (the boundary of the counter's saturation on both sides)."""
    check("tx", [(f"oversize {n}", body_of(n)) for n in (16380, 16381, 16384, 16385, 16388,
                                                         16389, 20001)]
          + [("after them", frame(gradient(raw_packet(SPECIALS))))], seed=6, p_idle=0)


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_back_to_back_frames(direction):
    """No idle cycle between frames nor beats, single-beat frames among them."""
    rng = random.Random(2)
    cases = [(f"tiny {n}", with_fcs(bytes(rng.getrandbits(8) for _ in range(n))))
             for n in (1, 2, 3, 4, 1, 4, 5, 8)]
    named = named_frames(direction)
    cases += [case for case in named if len(case[1]) < 3000]
    cases += cases[:8] + [(f"short {n}", body_of(60)) for n in range(3)]
    check(direction, cases, seed=3, p_idle=0)


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_random_frames(direction):
    rng = random.Random(4 + DIRECTIONS[direction])
    cases = [(f"random {n}", random_frame(rng)) for n in range(RANDOM_FRAMES)]
    kinds = check(direction, cases, seed=5)
    # the mix reaches every class the classifier decides on this side
    board = FrameClass.FOR_BOARD if direction == "tx" else FrameClass.DROP_BOARD_ADDRESS
    assert {FrameClass.PASS, FrameClass.GRADIENT, board, FrameClass.DROP_FCS,
            FrameClass.DROP_RUNT, FrameClass.DROP_UDP_LENGTH,
            FrameClass.DROP_UDP_CHECKSUM} <= set(kinds), set(kinds)


def test_classes_are_the_wire_counters():
    """Each drop class is a ``WIRE_COUNTERS`` counter, in ``WIRE_DROP_CAUSES``' priority
    order; the causes the classifier cannot decide are the frame store's, the NIC engine's
    and the board's."""
    drops = [c.name.lower() for c in FrameClass if c.name.startswith("DROP_")]
    assert all(name in WIRE_COUNTERS for name in drops)
    assert drops == [f"drop_{c}" for c in WIRE_DROP_CAUSES
                     if c not in ("full", "unanswered", "malformed")]
    assert set(GOLDEN_CLASS) | {"passed"} == set(FATES)


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_elaborates_to_verilog(direction):
    dut = FrameClassifier(direction=direction, mac="02:00:00:00:00:01", ip="10.1.2.3",
                          gradient_port=50000)
    # the always-ready members are constants, which cannot be ports: name the others
    text = verilog.convert(dut, name="classify",
                           ports=[dut.i.valid, dut.i.p.as_value(), dut.o.valid,
                                  dut.o.p.as_value()])
    assert "module classify" in text


def test_connects_only_to_streams_that_never_wait():
    """``i`` and ``o`` are ``always_ready``: a MAC stream that can be held back, or a
    verdict consumer that can hold back, is a wiring error, not a lost beat."""
    class Top(wiring.Component):
        def __init__(self, always_ready):
            self._always_ready = always_ready
            super().__init__({
                "frames": In(stream.Signature(MacBeat, always_ready=always_ready)),
                "verdicts": Out(stream.Signature(Verdict, always_ready=always_ready)),
            })

        def elaborate(self, platform):
            m = Module()
            m.submodules.classify = classify = FrameClassifier(direction="rx")
            wiring.connect(m, wiring.flipped(self.frames), classify.i)
            wiring.connect(m, classify.o, wiring.flipped(self.verdicts))
            return m

    Fragment.get(Top(True), None)
    with pytest.raises(wiring.ConnectionError, match="constant value 1"):
        Fragment.get(Top(False), None)


@pytest.mark.parametrize("kwargs, match", [
    (dict(direction="up"), "direction must be one of 'tx', 'rx'"),
    (dict(direction=0), "direction"),
    (dict(direction="tx", gradient_port=0), "gradient_port"),
    (dict(direction="tx", gradient_port=70000), "gradient_port"),
    (dict(direction="tx", gradient_port=True), "gradient_port"),
    (dict(direction="tx", gradient_port=47573), "control port"),
    (dict(direction="tx", mac="02:47:57:00:00"), "mac must be a MAC address"),
    (dict(direction="tx", mac=1 << 48), "mac must be a MAC address"),
    (dict(direction="tx", ip="192.168.77"), "ip must be an IPv4 address"),
    (dict(direction="tx", ip=-1), "ip must be an IPv4 address"),
    (dict(direction="tx", ip=3.0), "ip must be an IPv4 address"),
])
def test_bad_parameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FrameClassifier(**kwargs)


def test_addresses_as_integers():
    dut = FrameClassifier(direction="tx", mac=0x02_47_57_00_00_01, ip=0xC0A8_4D02)
    assert (dut.mac, dut.ip, dut.port) == (0x02_47_57_00_00_01, 0xC0A8_4D02, 0)
