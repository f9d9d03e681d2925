"""MAC-side stimulus of the NIC in the wire, shared by its simulator tests
(``tests/hdl/wire/test_path.py``: one direction, ``tests/hdl/wire/test_engine.py``: the
whole wire) and its cocotb bench (``sim/tb_wire.py``): named cases of every kind, beats
scheduled as a LiteEth MAC delivers them, and frames gathered back from a MAC-side output
stream. The frames themselves are :mod:`sim.frames`'.

A case is ``(name, data)`` (a frame with its FCS), ``(name, data, error_beat)`` (a receive
error on that beat) or ``("pause", cycles)`` (the input idle that long).
"""
import random

import numpy as np
from scapy.layers.inet import ICMP, IP
from scapy.layers.l2 import ARP, Ether

from contract.frames import MAX_BODY_BYTES, MIN_BODY_BYTES, with_fcs
from contract.header import Header, PacketType
from contract.network import DEFAULT_IP, DEFAULT_MAC, network_address
from contract.packet import Packet
from contract.registers import WIRE_REGISTERS
from host.golden import inceptionn
from sim.frames import (A_IP, A_MAC, MALFORMED, PASS_THROUGH, RX_PASSES, SPECIALS, TX_PASSES,
                        bad_fcs, body_of, frame, gradient, mac_beats, no_udp_checksum,
                        raw_packet, values)

__all__ = ["MAX_COUNT", "same_frames", "gateware_counters", "beat_schedule", "spaced",
           "FrameCollector", "inc_packet", "checksummed", "gradient_cases", "pass_cases",
           "malformed_cases", "bad_cases"]

#: the NIC receive path's largest packet in these tests (an MTU's 360 values fit)
MAX_COUNT = 512


def same_frames(got, want, what="frame"):
    """``got`` (frames, bytes) equal to ``want``, in order; a mismatch names each frame that
    differs."""
    assert len(got) == len(want), f"{len(got)} {what}s, golden {len(want)}"
    wrong = [f"{what} {n}: {len(g)} bytes, golden {len(w)}"
             for n, (g, w) in enumerate(zip(got, want)) if g != w]
    assert not wrong, "\n".join(wrong)


def gateware_counters(wire):
    """A :class:`~host.board.wire_golden.GoldenWire`'s counters by ``WIRE_REGISTERS`` block
    and name, as the gateware's register port reads them."""
    return {entry.name: {name: wire.read(network_address("wire", address))
                         for name, address in entry.items()} for entry in WIRE_REGISTERS}


# -- the MAC side ----------------------------------------------------------------------------

def beat_schedule(cases, rng, layout, *, p_idle, gap, line_rate=False):
    """Per cycle, the value (``layout``'s integer) of the beat a MAC delivers then, or None
    (idle): ``cases`` one after the other, ``gap`` (a ``(low, high)`` range) idle cycles
    before each frame and an idle cycle before a beat with probability ``p_idle`` (again and
    again), or with ``line_rate`` exactly one (1 GbE at 62.5 MHz: a 32-bit beat every two
    clocks)."""
    offsets = {name: field.offset for name, field in layout}
    schedule = []
    for case in cases:
        data, error_beat = case[1], case[2] if len(case) > 2 else None
        if isinstance(data, int):            # ("pause", cycles)
            schedule += [None] * data
            continue
        schedule += [None] * rng.randint(*gap)
        for beat in mac_beats(data, rng, error_beat=error_beat):
            if line_rate:
                schedule.append(None)
            while not line_rate and rng.random() < p_idle:
                schedule.append(None)
            schedule.append(sum(value << offsets[name] for name, value in beat.items()))
    return schedule


def spaced(cases, pause):
    """``cases`` with ``("pause", pause)`` after every frame of more than 4000 bytes. A
    jumbo frame whose payload goes through the NIC path unshrunk holds its path for about
    two clocks a word after its last beat (payload to the NIC path, then the frame out);
    small frames arriving at line rate behind it all that time need more descriptor slots
    than a path has, and would be ``drop_full``."""
    out = []
    for case in cases:
        out.append(case)
        if not isinstance(case[1], int) and len(case[1]) > 4000:
            out.append(("pause", pause))
    return out


class FrameCollector:
    """Frames (bytes, no FCS) from the words a MAC-side output hands over, each sampled as
    ``layout``'s integer: ``last_be`` must be one-hot on a frame's last word."""

    def __init__(self, layout):
        self._fields = {name: (field.offset, field.shape.width) for name, field in layout}
        self.frames, self._current = [], bytearray()

    def _field(self, value, name):
        offset, width = self._fields[name]
        return (value >> offset) & ((1 << width) - 1)

    def word(self, value):
        """One word taken (``valid & ready``)."""
        data = self._field(value, "data").to_bytes(4, "little")
        if self._field(value, "last"):
            last_be = self._field(value, "last_be")
            assert last_be and last_be & (last_be - 1) == 0, "last_be not one-hot"
            self._current.extend(data[:last_be.bit_length()])
            self.frames.append(bytes(self._current))
            self._current.clear()
        else:
            self._current.extend(data)

    @property
    def unfinished(self):
        """Whether a frame has begun and not ended."""
        return bool(self._current)


# -- the frames ----------------------------------------------------------------------------

def inc_packet(words, k):
    words = np.asarray(words, dtype=np.uint32)
    return Packet(Header(type=PacketType.INC_F32, k=k, count=words.size),
                  inceptionn.encode(words, k)).to_bytes()


def checksummed(pkt, rng):
    """A frame of ``pkt`` with its UDP checksum computed, or zero (no checksum)."""
    return frame(pkt if rng.random() < 0.5 else no_udp_checksum(pkt))


def gradient_cases(direction, *, mtu=True):
    """Gradient datagrams of several sizes and ``k``: compressible, incompressible (tx),
    odd sizes, payloads that are no packet at all."""
    rng = np.random.default_rng(11)
    pick = random.Random(12)
    sizes = [0, 1, 2, 7, 8, 9, 13, 31, 64] + ([360] if mtu else [])   # 360 values: MTU
    cases = []
    for n, k in zip(sizes, [1, 5, 10, 15, 3, 10, 8, 12, 10, 10]):
        vals = values(rng, n)
        packet = raw_packet(vals, k) if direction == "tx" else inc_packet(vals, k)
        cases.append((f"gradient {n} k={k}", checksummed(gradient(packet), pick)))
    noise = rng.integers(0, 1 << 32, 360, dtype=np.uint64).astype(np.uint32)
    big = noise | 0x4000_0000       # |value| >= 2: every value stays raw, 34 bytes a block
    if direction == "tx":
        cases += [("incompressible 40", frame(gradient(raw_packet(big[:40], 15)))),
                  ("incompressible 3", frame(gradient(raw_packet(big[:3], 1))))]
        if mtu:
            cases.append(("incompressible 360", frame(gradient(raw_packet(big, 12)))))
    else:
        cases.append(("noise decompressed", frame(gradient(inc_packet(noise[:40], 15)))))
    for extra in (1, 2, 3, 5):           # odd sizes: bytes past the packet's last word
        packet = raw_packet(values(rng, 9), 10) if direction == "tx" \
            else inc_packet(values(rng, 9), 10)
        cases.append((f"odd +{extra}", checksummed(gradient(packet + b"\x5a" * extra), pick)))
    for size in (0, 1, 3, 5, 31, 33, 101):
        cases.append((f"junk {size}", frame(gradient(bytes(rng.integers(0, 256, size,
                                                                         dtype=np.uint8))))))
    return cases


def pass_cases(direction):
    passes = TX_PASSES if direction == "tx" else RX_PASSES
    cases = [(f"pass: {name}", frame(pkt)) for name, pkt in PASS_THROUGH.items()
             if name != "jumbo"]
    cases += [(f"nic pass: {name}", frame(pkt)) for name, pkt in passes.items()]
    cases += [
        ("arp request for the board", frame(Ether(src=A_MAC, dst="ff:ff:ff:ff:ff:ff")
                                            / ARP(hwsrc=A_MAC, psrc=A_IP, pdst=DEFAULT_IP))),
        ("ping the board", frame(Ether(src=A_MAC, dst=DEFAULT_MAC)
                                 / IP(src=A_IP, dst=DEFAULT_IP) / ICMP() / b"ping")),
    ]
    return cases


def malformed_cases():
    return [(f"malformed: {name}", frame(gradient(payload)))
            for name, (payload, _) in MALFORMED.items()]


def bad_cases():
    """Bad FCS, runts, oversize, a receive error mid-frame: each followed by a good
    gradient datagram."""
    good = frame(gradient(raw_packet(SPECIALS, 10)))
    bad = [("bad fcs", bad_fcs(good)),
           ("runt 59", with_fcs(bytes(gradient(bytes(17))).ljust(MIN_BODY_BYTES - 1, b"\0"))),
           ("runt 5 bytes", with_fcs(b"\x01\x02\x03\x04\x05")),
           ("oversize", body_of(MAX_BODY_BYTES + 1)),
           ("error mid-frame", bad_fcs(good), 5)]
    cases = []
    for case in bad:
        cases += [case, (f"after {case[0]}", good)]
    return cases
