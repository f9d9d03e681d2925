"""The golden aggregator as a leaf of a tree (``host/golden/aggregator.py``,
``aggregator-protocol.md`` section 4): what a result from upstream does to a (slot,
version) that is pending, final or neither, round after round on one slot.

The engine takes any result from upstream for a pending (slot, v), whatever its ``seq``:
a copy of the result of the round two back on the same slot and version (the same
(slot, v)), arriving while the leaf waits for the current round's, would be taken for it.
``test_a_result_two_rounds_late_is_not_taken_for_the_pending_round`` says what the
contract should do and is expected to fail until the engine compares the result's ``seq``
with the pending round's (the completing packet's, which the engine has when it sends the
aggregate up); the tree's network rule (``host/switchml/tree_network.py``) keeps such
copies out meanwhile."""
import numpy as np
import pytest

from contract.header import Flags, Header, PacketType
from contract.packet import Packet
from host.golden.aggregator import AggregatorModel, Upstream

LANES = 8
UP = Upstream(ip=0x0A000001, port=47572, job=5, worker=3)


def contribution(worker, seq, value, *, version):
    return Packet(Header(type=PacketType.AGG_ADD_I32, job=0, worker=worker, slot=0,
                         slot_version=version, seq=seq, count=LANES),
                  np.full(LANES, value, "<u4").tobytes())


def parent_result(seq, value, *, version):
    """The parent's result for round ``seq`` as the front end hands it to the engine (its
    job rewritten to the leaf's)."""
    return Packet(Header(type=PacketType.AGG_ADD_I32, flags=Flags.RESULT, job=0, worker=0xFF,
                         slot=0, slot_version=version, seq=seq, count=LANES),
                  np.full(LANES, value, "<u4").tobytes())


def leaf():
    model = AggregatorModel(slots=1, lanes=LANES, max_workers=32, jobs=1)
    model.configure_job(0, 2, 0, 1, upstream=UP)
    return model


def round_trip(model, seq, version, parent_value):
    """Both workers' packets of round ``seq`` (the second completes: one packet upstream),
    then the parent's result: the leaf's multicast to its workers."""
    assert model.process(contribution(0, seq, 1, version=version)) == []
    (up,) = model.process(contribution(1, seq, 2, version=version))
    assert (up.header.job, up.header.worker, up.header.seq) == (UP.job, UP.worker, seq)
    assert not up.header.flags & Flags.RESULT
    assert np.all(np.frombuffer(up.payload, "<u4") == 3)
    (down,) = model.process(parent_result(seq, parent_value, version=version))
    assert down.header.worker == 0xFF and down.header.seq == seq
    return np.frombuffer(down.payload, "<u4")


def test_rounds_on_one_slot_take_the_parents_results_and_drop_copies():
    model = leaf()
    assert np.all(round_trip(model, 0, 0, 100) == 100)
    # a copy of round 0's result while round 1 (the other version) is under way: final
    assert model.process(parent_result(0, 100, version=0)) == []
    assert model.counters["drop_result_duplicate"] == 1
    assert np.all(round_trip(model, 1, 1, 200) == 200)
    # round 2 reuses version 0: a copy of round 0's result while it fills is unexpected
    assert model.process(contribution(0, 2, 1, version=0)) == []
    assert model.process(parent_result(0, 100, version=0)) == []
    assert model.counters["drop_result_unexpected"] == 1
    assert model.counters["results_upstream"] == 2 and model.counters["upstream_sent"] == 2


def test_a_retransmission_for_a_pending_slot_goes_up_again_and_for_a_final_one_is_answered():
    model = leaf()
    model.process(contribution(0, 0, 1, version=0))
    model.process(contribution(1, 0, 2, version=0))
    (again,) = model.process(contribution(0, 0, 1, version=0))
    assert not again.header.flags & Flags.RESULT and again.header.worker == UP.worker
    assert model.counters["upstream_resent"] == 1
    model.process(parent_result(0, 7, version=0))
    (answer,) = model.process(contribution(1, 0, 2, version=0))
    assert answer.header.worker == 1 and np.all(np.frombuffer(answer.payload, "<u4") == 7)


@pytest.mark.xfail(strict=True, reason="aggregator-protocol.md section 4: versions tell a "
                                       "round only from the one before it; a result two "
                                       "rounds late is beyond the delivery bound, and the "
                                       "engine keeps no seq to refuse it")
def test_a_result_two_rounds_late_is_not_taken_for_the_pending_round():
    model = leaf()
    round_trip(model, 0, 0, 100)
    round_trip(model, 1, 1, 200)
    # round 2 on version 0 again, pending: round 0's result comes late
    model.process(contribution(0, 2, 1, version=0))
    model.process(contribution(1, 2, 2, version=0))
    assert model.process(parent_result(0, 100, version=0)) == []
    assert model.counters["drop_result_unexpected"] == 1
    (down,) = model.process(parent_result(2, 300, version=0))
    assert np.all(np.frombuffer(down.payload, "<u4") == 300)
