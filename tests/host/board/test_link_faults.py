"""The link fault injector (``host/board/link_faults.py``): seeded, its rates, and its three
rules."""
import numpy as np
import pytest

from contract.header import Header, PacketType
from contract.packet import Packet
from host.board.link_faults import INBOUND, OUTBOUND, WireFaults

SRC = ("127.0.0.1", 40000)


def agg(seq, slot=3, worker=1):
    return Packet(Header(type=PacketType.AGG_ADD_I32, job=0, worker=worker, count=64,
                         slot=slot, seq=seq), bytes(256)).to_bytes()


def test_seeded_and_reproducible():
    runs = []
    for _ in range(2):
        faults = WireFaults(0.2, seed=11)
        runs.append([faults.schedule(INBOUND, SRC, b"x" * 40, float(i)) for i in range(500)])
    assert runs[0] == runs[1]
    assert runs[0] != [WireFaults(0.2, seed=12).schedule(INBOUND, SRC, b"x" * 40, float(i))
                       for i in range(500)]


def test_rates_are_the_given_probabilities():
    faults = WireFaults(loss=0.1, dup=0.2, reorder=0.3, seed=1, max_delay=0.01)
    n = 20000
    arrivals = [faults.schedule(OUTBOUND, SRC, b"x", 0.0) for _ in range(n)]
    lost = sum(not a for a in arrivals)
    doubled = sum(len(a) == 2 for a in arrivals)
    delays = [t for a in arrivals for t in a]
    assert lost == faults.lost and doubled == faults.duplicated
    assert abs(lost / n - 0.1) < 0.01
    assert abs(doubled / (n - lost) - 0.2) < 0.015
    delayed = sum(t > 0 for t in delays)
    assert abs(delayed / len(delays) - 0.3) < 0.015 and max(delays) <= 0.01


def test_control_requests_are_never_delayed():
    faults = WireFaults(0.5, seed=3)
    times = [faults.schedule(INBOUND, SRC, b"c" * 40, 5.0, barrier=True) for _ in range(2000)]
    assert all(t == 5.0 for copies in times for t in copies)
    assert any(len(copies) == 2 for copies in times)


def test_window_order_holds_back_the_next_round_behind_every_copy_of_the_last():
    faults = WireFaults(dup=0.9, reorder=0.9, seed=5, max_delay=0.5)
    first = faults.schedule(INBOUND, SRC, agg(seq=0), 0.0, switch=True)
    assert first and max(first) > 0.0
    second = faults.schedule(INBOUND, SRC, agg(seq=8), 0.001, switch=True)
    assert second and min(second) >= max(first)
    assert faults.held_back > 0
    # other slots, workers and sources are not held back behind it
    for other in (agg(seq=9, slot=4), agg(seq=9, worker=2)):
        times = WireFaults(seed=5).schedule(INBOUND, SRC, other, 0.001, switch=True)
        assert times == [0.001]
    # copies of the same packet (a resend) may overtake each other
    rng = np.random.default_rng(0)
    resend = faults.schedule(INBOUND, SRC, agg(seq=8), 0.002 + rng.random() * 1e-3, switch=True)
    assert min(resend) >= max(first)


def test_the_window_rule_can_be_seen_to_matter():
    # without the switch flag (what the rule guards), a later round overtakes the earlier
    faults = WireFaults(reorder=0.99, seed=2, max_delay=0.5)
    late = faults.schedule(INBOUND, SRC, agg(seq=0), 0.0)
    early = WireFaults(seed=2).schedule(INBOUND, SRC, agg(seq=8), 0.001)
    assert min(early) < max(late)


@pytest.mark.parametrize("kwargs", [dict(rate=1.0), dict(loss=-0.1), dict(dup=1.5),
                                    dict(reorder=True), dict(max_delay=0)])
def test_bad_parameters_are_refused(kwargs):
    rate = kwargs.pop("rate", 0.0)
    with pytest.raises(ValueError):
        WireFaults(rate, **kwargs)
