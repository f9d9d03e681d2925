# amaranth: UnusedElaboratable=no
"""The board's own service on the host side of the wire (``hdl/wire/service.py``), behind
the host-side path as in the wire's engine, against the golden wire: ARP, ping and ``CTRL``
requests, and every way of not being one, each reply byte for byte the golden model's
(``GoldenWire._answer``) and each frame counted ``answered`` or ``drop_unanswered`` as the
golden model counts it. ``CTRL`` reads are served from a random register file, the same one
the golden model reads.
"""
import random

import pytest
from scapy.layers.inet import ICMP, IP, TCP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from contract.header import PacketType
from contract.network import CTRL_MAX_PAIRS, DEFAULT_MAC, CtrlOp, network_address
from contract.registers import WIRE_REGISTERS
from hdl.wire.service import BUFFER_WORDS, BoardService
from sim.frames import (A_IP, A_MAC, CTRL_PORT, KEY, OTHER_MAC, arp_cases, ctrl, ctrl_payload,
                        frame, ping_cases, to_board, trailing)
from tests.hdl.wire.test_path import check, simulate

def registers(seed):
    """Every ``WIRE_REGISTERS`` address with a random value."""
    rng = random.Random(seed)
    return {address: rng.getrandbits(32) for entry in WIRE_REGISTERS
            for address, _, _ in entry.addresses()}


def wire_address(local):
    return network_address("wire", local)


def random_pairs(rng, n):
    """``n`` pairs: mapped wire registers, unmapped wire addresses, other regions."""
    mapped = [a for entry in WIRE_REGISTERS for a, _, _ in entry.addresses()]
    pairs = []
    for _ in range(n):
        pick = rng.random()
        if pick < 0.6:
            address = wire_address(rng.choice(mapped))
        elif pick < 0.8:
            address = wire_address(rng.getrandbits(16))
        else:
            address = rng.getrandbits(32)
        pairs.append((address, rng.getrandbits(32)))
    return pairs


# -- ARP and ping ----------------------------------------------------------------------------

def test_arp_and_ping_answered_as_the_golden_model():
    rng = random.Random(31)
    counts = check("tx", arp_cases() + ping_cases(rng), seed=31)
    assert counts["answered"] == 3 + 15 + 1 and counts["drop_unanswered"] == 5 + 10


# -- CTRL ------------------------------------------------------------------------------------

def ctrl_cases(rng):
    cases = [(f"read {n}", frame(ctrl(random_pairs(rng, n), sport=rng.getrandbits(16))))
             for n in (1, 2, 3, 7, CTRL_MAX_PAIRS)]
    cases += [
        ("write", frame(ctrl(random_pairs(rng, 5), op=CtrlOp.WRITE))),
        ("udp checksum zero", frame(to_board(UDP(sport=7, dport=CTRL_PORT, chksum=0)
                                             / Raw(ctrl_payload(random_pairs(rng, 2)))))),
        ("trailing bytes", frame(trailing(ctrl(random_pairs(rng, 2)), 9))),
        # refused: the header alone with ERROR
        ("count 0", frame(ctrl([], count=0))),
        ("count 65", frame(ctrl(random_pairs(rng, 2), count=CTRL_MAX_PAIRS + 1))),
        ("count 2^32-1", frame(ctrl(random_pairs(rng, 2), count=(1 << 32) - 1))),
        ("count past the pairs", frame(ctrl(random_pairs(rng, 2), count=3))),
        ("count short of the pairs", frame(ctrl(random_pairs(rng, 3), count=2))),
        ("op 2", frame(ctrl(random_pairs(rng, 1), op=2))),
        ("bad magic", frame(ctrl(random_pairs(rng, 1), magic=0x46))),
        ("bad version", frame(ctrl(random_pairs(rng, 1), version=2))),
        ("type raw", frame(ctrl(random_pairs(rng, 1), type=PacketType.RAW_F32))),
        ("65 pairs", frame(ctrl(random_pairs(rng, CTRL_MAX_PAIRS + 1)))),
        ("header and 4 bytes", frame(to_board(UDP(sport=5, dport=CTRL_PORT)
                                              / Raw(ctrl_payload([]) + b"\1\2\3\4")))),
        # no answer: the key, a short request, the UDP checks, another port
        ("wrong key", frame(ctrl(random_pairs(rng, 2), key=KEY ^ 1 << 63))),
        ("31 bytes", frame(to_board(UDP(dport=CTRL_PORT) / Raw(ctrl_payload([])[:31])))),
        ("wrong udp checksum", frame(wrong_checksum(ctrl(random_pairs(rng, 2))))),
        ("udp length short", frame(to_board(UDP(dport=CTRL_PORT, len=40)
                                            / Raw(ctrl_payload(random_pairs(rng, 1)))))),
        ("to another port", frame(to_board(UDP(dport=CTRL_PORT + 1)
                                           / Raw(ctrl_payload(random_pairs(rng, 1)))))),
        ("to another ip", frame(Ether(src=A_MAC, dst=DEFAULT_MAC)
                                / IP(src=A_IP, dst="10.0.0.9") / UDP(dport=CTRL_PORT)
                                / Raw(ctrl_payload(random_pairs(rng, 1))))),
    ]
    return cases


def wrong_checksum(pkt):
    pkt = Ether(bytes(pkt))
    pkt[UDP].chksum ^= 0x0F0F
    return pkt


def test_ctrl_answered_as_the_golden_model():
    rng = random.Random(41)
    cases = ctrl_cases(rng)
    counts = check("tx", cases, seed=41, registers=registers(41))
    assert counts["answered"] == 8 + 11 and counts["drop_unanswered"] == 6


def test_requests_back_to_back_behind_one_another():
    """Requests with no gap, among frames that pass: each waits in the store while the
    service answers the one before, none is lost, the replies in order."""
    rng = random.Random(51)
    requests = arp_cases()[:2] + ping_cases(rng)[:4] + ctrl_cases(rng)[:5]
    passing = [(f"pass {n}", frame(Ether(src=A_MAC, dst=OTHER_MAC) / IP(src=A_IP) / TCP()
                                   / bytes(n))) for n in range(0, 400, 40)]
    cases = requests + passing
    rng.shuffle(cases)
    counts = check("tx", cases, seed=51, registers=registers(51), p_idle=0, gap=(0, 0),
                   p_ready=0.6)
    assert counts["answered"] == len(requests) and counts["passed"] == len(passing)


def test_a_request_longer_than_the_buffer_is_not_answered_and_the_next_is():
    """A frame for the board longer than the service's buffer: its words past it are
    dropped, it gets no answer; the request after it is answered exact."""
    long_ping = frame(to_board(ICMP() / bytes(4 * BUFFER_WORDS)))
    counts = check("tx", [("long", long_ping), ("ping", frame(to_board(ICMP() / b"after")))],
                   seed=61)
    assert counts["answered"] == 1 and counts["drop_unanswered"] == 1


def test_the_reply_waits_for_the_host_port():
    """The replies' output held back for a while: the service keeps the reply, sends it
    whole when the port takes it; frames behind it wait in the store."""
    rng = random.Random(71)
    replies = []
    cases = ctrl_cases(rng)[:3] + arp_cases()[:1]
    frames, counts = simulate("tx", cases, seed=71, p_ready=0.05, replies=replies,
                              registers=registers(71))
    assert counts["answered"] == 4 and len(replies) == 4


@pytest.mark.parametrize("kwargs, match", [
    (dict(key=-1), "control key"),
    (dict(key=1 << 64), "control key"),
    (dict(key=True), "control key"),
    (dict(key=1, mac="02:00"), "mac"),
    (dict(key=1, ip="10.0.0.256"), "ip"),
    (dict(key=1, ip=1 << 32), "ip"),
])
def test_parameters_checked(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BoardService(**kwargs)


def test_the_key_stays_out_of_the_repr():
    assert f"{KEY:x}" not in repr(BoardService(key=KEY)) and "secret" in repr(
        BoardService(key=KEY))
