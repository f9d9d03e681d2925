"""The one network fault model (host/switchml/faults.py) that the simulated network
(TickFaults) and the virtual board's wire (WireFaults) share."""
import pytest

from host.board.link_faults import WireFaults
from host.switchml.faults import NetworkFaults
from host.switchml.network import TickFaults


def test_ticks_and_seconds_draw_the_same_losses_and_copies():
    ticks = TickFaults(11, loss=0.3, dup=0.3)
    wire = WireFaults(seed=11, loss=0.3, dup=0.3, reorder=0.0)
    for now in range(500):
        assert len(ticks.arrivals(now)) == len(wire.arrivals(now / 1000))
    assert (ticks.lost, ticks.duplicated) == (wire.lost, wire.duplicated)
    assert ticks.lost and ticks.duplicated
    a, b = TickFaults(5, loss=0.2, dup=0.2, reorder=0.5), TickFaults(5, loss=0.2, dup=0.2,
                                                                     reorder=0.5)
    assert [a.arrivals(t) for t in range(300)] == [b.arrivals(t) for t in range(300)]


def test_delays_stay_within_their_bounds():
    ticks = NetworkFaults(seed=1, reorder=1.0, latency=2, max_delay=5, ticks=True)
    assert {t - 10 for _ in range(200) for t in ticks.arrivals(10)} == {3, 4, 5, 6, 7}
    seconds = NetworkFaults(seed=1, reorder=1.0, max_delay=0.5, ticks=False)
    assert all(0.0 <= t - 1.0 <= 0.5 for _ in range(200) for t in seconds.arrivals(1.0))
    assert seconds.arrivals(1.0, delay=False) == [1.0]        # a barrier is never delayed


@pytest.mark.parametrize("ticks, expect", [(True, [13]), (False, [12.0])])
def test_a_next_round_packet_waits_behind_the_last_copy_of_the_previous(ticks, expect):
    faults = NetworkFaults(max_delay=1, ticks=ticks)
    assert faults.hold_in_window_order("slot", 0, [12, 5]) == [12, 5]    # first round
    assert faults.hold_in_window_order("slot", 0, [3]) == [3]            # its resend
    # the next round may not arrive before (ticks: in the same batch as) the copy at 12
    assert faults.hold_in_window_order("slot", 1, [4]) == expect
    assert faults.held_back == 1
    assert faults.hold_in_window_order("other slot", 1, [4]) == [4]


def test_without_the_window_order_nothing_is_held():
    faults = NetworkFaults(max_delay=1, ticks=True, keep_window_order=False)
    faults.hold_in_window_order("slot", 0, [12])
    assert faults.hold_in_window_order("slot", 1, [4]) == [4] and faults.held_back == 0
