"""The host driver over the reference-model transports (fast), and its misuse errors."""
import numpy as np
import pytest

from contract.header import Header, PacketType
from contract.packet import Packet
from host.driver.lockstep import LockstepTransport, MismatchError
from host.driver.models import NicModelTransport, SwitchModelTransport
from host.driver.nic import NicInterface
from host.driver.switch import SwitchInterface
from host.golden import inceptionn, lhc
from host.golden.ring import ring_allreduce, ring_error_bound
from host.switchml.network import TickFaults
from tests.helpers import bits


def test_nic_transmit_receive_round_trip_matches_quantize():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(5000) * 0.05).astype(np.float32)
    x[:4] = [np.nan, np.inf, -0.0, 1e-40]
    nic = NicInterface(NicModelTransport(), packet_values=700)
    wire = nic.transmit(x, 9, worker=3, offset=100)
    assert [p.header.type for p in wire] == [PacketType.INC_F32] * 8
    assert [p.header.offset for p in wire] == [100 + 700 * i for i in range(8)]
    got = nic.receive(wire[::-1], x.size, offset=100)          # any arrival order
    assert np.array_equal(bits(got), bits(inceptionn.quantize(x, 9)))
    c = nic.counters()
    assert c["tx"]["packets"] == c["tx"]["compressed"] == 8
    assert c["rx"]["decompressed"] == 8


def test_nic_misuse_errors():
    nic = NicInterface(NicModelTransport())
    with pytest.raises(TypeError, match="float32"):
        nic.transmit(np.zeros(4, np.float64))
    with pytest.raises(ValueError, match="k"):
        nic.transmit(np.zeros(4, np.float32), 16)
    with pytest.raises(ValueError, match="packet_values"):
        NicInterface(NicModelTransport(), packet_values=4096)
    with pytest.raises(ValueError, match="streams"):
        NicModelTransport().exchange("nope", [])


@pytest.mark.parametrize("workers,k", [(2, 4), (3, 10), (5, 15)])
def test_ring_allreduce_identical_and_within_bound(workers, k):
    rng = np.random.default_rng(workers)
    tensors = [(rng.standard_normal(1001) * 0.1).astype(np.float32) for _ in range(workers)]
    results, stats = ring_allreduce(tensors, NicInterface(NicModelTransport(), packet_values=128), k)
    for r in results[1:]:
        assert np.array_equal(bits(r), bits(results[0]))
    exact = np.sum(np.array(tensors, np.float64), axis=0)
    slack = workers * float(np.spacing(np.float32(np.abs(exact).max() * 2)))
    assert np.abs(results[0] - exact).max() < ring_error_bound(workers, k) + slack
    assert stats.hops == 2 * workers * (workers - 1)
    assert stats.wire_bytes < stats.raw_bytes


def test_ring_rejects_bad_input():
    nic = NicInterface(NicModelTransport())
    with pytest.raises(ValueError, match="at least 2"):
        ring_allreduce([np.zeros(3, np.float32)], nic)
    with pytest.raises(ValueError, match="worker 1"):
        ring_allreduce([np.zeros(3, np.float32), np.zeros(4, np.float32)], nic)


def sparse_tensors(rng, workers, n, density):
    out = []
    for _ in range(workers):
        t = np.zeros(n, np.float32)
        hot = rng.random(n) < density
        t[hot] = rng.standard_normal(hot.sum()).astype(np.float32) * 0.01
        out.append(t)
    return out


@pytest.mark.parametrize("fault", [None, TickFaults(7, loss=0.1, dup=0.1, reorder=0.2)])
def test_switch_allreduce_exact_over_model(fault):
    rng = np.random.default_rng(3)
    tensors = sparse_tensors(rng, 4, 5000, 0.05)
    switch = SwitchInterface(SwitchModelTransport(slots=8))
    result, stats = switch.allreduce(tensors, slot_base=2, slot_count=4, fault=fault)
    want, _ = lhc.allreduce(tensors)
    assert np.array_equal(bits(result), bits(want))
    if fault is not None:
        assert stats["resends"] > 0 and stats["lost"] > 0
    # A second message on the same job continues the version alternation.
    result2, _ = switch.allreduce(tensors[::-1], slot_base=2, slot_count=4, configure=False)
    assert np.array_equal(bits(result2), bits(lhc.allreduce(tensors[::-1])[0]))
    counters = switch.counters()
    assert counters["results_multicast"] > 0
    assert all(v == 0 for k, v in counters.items() if k.startswith("drop_"))


def test_switch_misuse_errors():
    switch = SwitchInterface(SwitchModelTransport(slots=8))
    with pytest.raises(ValueError, match="pool"):
        switch.configure_job(0, 4, 6, 4)
    with pytest.raises(ValueError, match="workers"):
        switch.configure_job(0, 0, 0, 4)
    with pytest.raises(RuntimeError, match="not configured"):
        switch.allreduce([np.zeros(8, np.float32)] * 2, job=1, configure=False)
    with pytest.raises(ValueError, match="NaN|Inf|finite"):
        switch.allreduce([np.full(8, np.nan, np.float32)] * 2)


def test_unconfigured_job_packets_are_counted_drops():
    switch = SwitchInterface(SwitchModelTransport(slots=8))
    packet = Packet(Header(type=PacketType.AGG_ADD_I32, job=3, count=64), bytes(256))
    assert switch.send([packet]) == []
    assert switch.counters()["drop_unconfigured_job"] == 1


def test_lockstep_reports_the_first_difference():
    class Corrupting(NicModelTransport):
        def _exchange(self, stream, packets, options):
            reply = super()._exchange(stream, packets, options)
            reply["frames"][-1] = reply["frames"][-1][:-1] + b"\x55"
            return reply

    nic = NicInterface(LockstepTransport(Corrupting(), NicModelTransport()))
    with pytest.raises(MismatchError, match="packet 0"):
        nic.transmit(np.ones(9, np.float32) * 0.3)
