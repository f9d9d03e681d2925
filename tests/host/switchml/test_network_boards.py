"""One job over several boards on the simulated network (``host.switchml.network.run_jobs``
with one transport per board, ``host.driver.striped.StripedSwitchInterface``): bit for bit
the one-board all-reduce, under loss, duplication and reordering too, with every board's
switch seeing exactly its chunks (``docs/protocol/network.md`` section 3)."""
import numpy as np
import pytest

from host.driver.striped import StripedSwitchInterface
from host.driver.switch import SwitchInterface, open_switch
from host.golden import lhc
from host.golden.aggregator import AggregatorModel, model_transport
from host.switchml import stripe
from host.switchml.network import TickFaults, allreduce_over_transport
from tests.helpers import fresh_rng

LANES = 64


def _tensors(rng, workers, n, density=0.1):
    return [np.where(rng.random(n) < density, rng.standard_normal(n) * 2.0 ** rng.integers(
        -20, 4, n), 0).astype(np.float32) for _ in range(workers)]


@pytest.mark.parametrize("boards", [2, 3])
@pytest.mark.parametrize("path", ["sketch", "dense", "auto"])
@pytest.mark.parametrize("n", [1, 5, 100, 2049, 20000])
def test_a_job_over_several_boards_is_the_one_board_allreduce(boards, path, n):
    rng = fresh_rng()
    tensors = _tensors(rng, 3, n)
    models = [AggregatorModel(slots=8, lanes=LANES) for _ in range(boards)]
    for m in models:
        m.configure_job(0, 3, 0, 8)
    result, stats = allreduce_over_transport(
        tensors, [model_transport(m) for m in models], slot_count=8, lanes=LANES, path=path)
    want = lhc.allreduce(tensors, path=path)[0]
    np.testing.assert_array_equal(result.view(np.uint32), want.view(np.uint32))
    packets = stats["packets"]
    chunks = sum(packets.chunks.values())
    assert packets.packets_sent == 3 * chunks == sum(packets.board_packets_sent)
    # each board folded in exactly its share of every phase's chunks (phases of 1..B-1
    # chunks leave boards idle)
    for b, m in enumerate(models):
        assert m.counters["accepted"] == packets.board_packets_sent[b]
    assert packets.board_packets_sent[0] >= packets.board_packets_sent[-1]


@pytest.mark.parametrize("seed", [1, 2])
def test_several_boards_under_loss_duplication_and_reordering(seed):
    rng = fresh_rng()
    tensors = _tensors(rng, 4, 6000)
    models = [AggregatorModel(slots=4, lanes=LANES) for _ in range(2)]
    for m in models:
        m.configure_job(0, 4, 0, 4)
    fault = TickFaults(seed, loss=0.1, dup=0.1, reorder=0.2)
    result, stats = allreduce_over_transport(
        tensors, [model_transport(m) for m in models], slot_count=4, lanes=LANES, fault=fault,
        path="sketch")
    np.testing.assert_array_equal(result.view(np.uint32),
                                  lhc.allreduce(tensors, path="sketch")[0].view(np.uint32))
    assert stats["packets"].resends == sum(stats["packets"].board_resends) > 0


def test_the_striped_interface_continues_each_boards_chunk_count_and_counts_per_board():
    rng = fresh_rng()
    one = SwitchInterface(open_switch("golden", slots=8))
    two = StripedSwitchInterface([SwitchInterface(open_switch("golden", slots=8))
                                  for _ in range(2)])
    for configure in (True, False, False):
        sets = [_tensors(rng, 2, n) for n in (3, 700, 9000)]
        want = one.allreduce_jobs(sets, path="auto", configure=configure)
        got = two.allreduce_jobs(sets, path="auto", configure=configure)
        for (r1, s1), (r2, s2) in zip(want, got):
            np.testing.assert_array_equal(r2.view(np.uint32), r1.view(np.uint32))
            assert s2["packets_sent"] == s1["packets_sent"] == sum(s2["board_packets_sent"])
    accepted = [c["accepted"] for c in two.board_counters()]
    assert sum(accepted) == one.counters()["accepted"] == two.counters()["accepted"]
    assert [s["packets"] for s in two.sent] == accepted
    assert 0.4 < accepted[1] / sum(accepted) < 0.6
    with pytest.raises(ValueError, match="must agree on slots: board 0 has 8, board 1 has 16"):
        StripedSwitchInterface([SwitchInterface(open_switch("golden", slots=8)),
                                SwitchInterface(open_switch("golden", slots=16))])


def test_split_of_a_phase_matches_the_chunk_rule():
    # the simulated workers split with the same function the UDP workers use
    assert stripe.board_chunks(5 * LANES + 1, LANES, 2) == [3, 3]
    assert stripe.board_chunks(LANES, LANES, 3) == [1, 0, 0]
