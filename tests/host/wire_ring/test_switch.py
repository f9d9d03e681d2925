"""The learning switch between the wire boards (``host/wire_ring/switch.py``): it learns,
floods what it does not know, never sends a frame back where it came from, stays
bounded."""
import pytest
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from host.board.wire_golden import with_fcs
from host.wire_ring.switch import SWITCH_COUNTERS, LearningSwitch

A, B, C = "02:00:00:00:00:0a", "02:00:00:00:00:0b", "02:00:00:00:00:0c"
BROADCAST, MULTICAST = "ff:ff:ff:ff:ff:ff", "01:00:5e:00:00:01"


def frame(src, dst):
    return with_fcs(bytes(Ether(src=src, dst=dst, type=0x88B5) / Raw(b"\0" * 46)))


def ports(out):
    return sorted(p for p, _ in out)


def test_unknown_destination_is_flooded_then_learnt_and_forwarded():
    s = LearningSwitch(4)
    ab = frame(A, B)
    out = s.receive(0, ab)
    assert ports(out) == [1, 2, 3] and all(f == ab for _, f in out)   # flooded, unchanged
    assert s.port_of(bytes.fromhex("02000000000a")) == 0                # A learnt on port 0
    assert ports(s.receive(2, frame(B, A))) == [0]                      # A known: one port
    assert ports(s.receive(0, frame(A, B))) == [2]                      # B learnt on port 2
    c = s.counters
    assert (c["flooded"], c["forwarded"], c["learned"], c["frames_out"]) == (1, 2, 2, 5)


@pytest.mark.parametrize("dst", [BROADCAST, MULTICAST])
def test_group_destinations_are_flooded_even_when_known(dst):
    s = LearningSwitch(3)
    s.receive(1, frame(A, B))
    assert ports(s.receive(1, frame(A, dst))) == [0, 2]


def test_never_sent_back_on_its_ingress_port():
    s = LearningSwitch(3)
    s.receive(1, frame(B, A))                   # B is behind port 1
    assert s.receive(1, frame(A, B)) == []      # A on the same segment: filtered
    assert s.counters["filtered"] == 1
    # flooding leaves the ingress port out too
    assert 1 not in ports(s.receive(1, frame(A, C)))


def test_a_station_that_moves_is_relearnt():
    s = LearningSwitch(3)
    s.receive(0, frame(A, B))
    s.receive(2, frame(A, B))
    assert s.port_of(bytes.fromhex("02000000000a")) == 2 and s.counters["moved"] == 1
    assert ports(s.receive(1, frame(B, A))) == [2]


def test_table_is_bounded_least_recently_seen_goes_first():
    s = LearningSwitch(4, table_size=2)
    s.receive(0, frame(A, BROADCAST))
    s.receive(1, frame(B, BROADCAST))
    s.receive(0, frame(A, BROADCAST))           # A seen again: B is now the oldest
    s.receive(2, frame(C, BROADCAST))
    assert len(s.table) == 2 and s.counters["evicted"] == 1
    assert s.port_of(bytes.fromhex("02000000000b")) is None
    assert s.port_of(bytes.fromhex("02000000000a")) == 0


def test_entries_age_out_in_simulated_time():
    s = LearningSwitch(3, aging=1.0)
    s.receive(0, frame(A, BROADCAST), now=0.0)
    assert ports(s.receive(1, frame(B, A), now=0.5)) == [0]
    assert ports(s.receive(1, frame(B, A), now=1.2)) == [0, 2]      # forgotten: flooded
    assert s.counters["aged"] == 1


def test_bad_frames_and_group_sources():
    s = LearningSwitch(3)
    bad = bytearray(frame(A, B))
    bad[-1] ^= 1
    assert s.receive(0, bytes(bad)) == [] and s.receive(0, b"\0" * 10) == []
    assert s.counters["dropped"] == 2 and not s.table
    s.receive(0, frame(MULTICAST, B))           # a group source is never learnt
    assert not s.table
    c = s.counters
    assert c["frames_in"] == c["forwarded"] + c["flooded"] + c["filtered"] + c["dropped"]
    assert set(c) == set(SWITCH_COUNTERS)


@pytest.mark.parametrize("kwargs, message", [
    (dict(ports=1), "2..1024 ports"), (dict(ports=True), "2..1024 ports"),
    (dict(ports=4, table_size=0), "table_size"), (dict(ports=4, aging=0), "aging"),
])
def test_bad_parameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LearningSwitch(**kwargs)
    with pytest.raises(ValueError, match="ports 0..2"):
        LearningSwitch(3).receive(3, frame(A, B))
