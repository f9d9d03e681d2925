"""SwitchML workers on the simulated network (host/switchml/network.py): one phase, the LHC
all-reduce packet by packet, faults, the window bound, inconsistent answers."""
import numpy as np
import pytest

from host.golden.aggregator import AggregatorModel, model_transport
from host.golden import lhc
from contract.header import PacketType
from contract.packet import Packet
from host.switchml.network import (TickFaults, aggregate_phase, allreduce_over_transport,
                                 run_allreduce_packets)
from host.switchml.window import ProtocolError

ADD, OR = PacketType.AGG_ADD_I32, PacketType.AGG_OR32


def sparse_tensors(rng, n, length, density):
    return [(rng.standard_normal(length) * (rng.random(length) < density)).astype(np.float32)
            for _ in range(n)]


def same_bits(a, b):
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


# ---------------------------------------------------------------------------------------
# one phase over the model

@pytest.mark.parametrize("fault", [None, TickFaults(3, loss=0.2, dup=0.2, reorder=0.5)])
def test_aggregate_phase_or_and_wrapping_add(fault):
    rng = np.random.default_rng(2)
    n, size = 5, 1000
    model = AggregatorModel(slots=8, lanes=16, max_workers=8, jobs=2)
    model.configure_job(1, n, 2, 5)
    transport = model_transport(model)
    vectors = [rng.integers(0, 2**32, size, dtype=np.uint64).astype(np.uint32)
               for _ in range(n)]
    vector, exponent, stats = aggregate_phase(vectors, transport, op=OR,
                                              exponents=[-3, 5, -128, 0, 4], job=1,
                                              slot_base=2, slot_count=5, lanes=16, fault=fault)
    assert vector.tolist() == np.bitwise_or.reduce(vectors).tolist() and exponent == 5
    next_chunk = stats.next_chunk
    vector, exponent, _ = aggregate_phase(vectors, transport, op=ADD, job=1, slot_base=2,
                                          slot_count=5, lanes=16, fault=fault,
                                          first_chunk=next_chunk)
    expect = (np.sum([v.astype(np.uint64) for v in vectors], axis=0) % 2**32).astype(np.uint32)
    assert vector.tolist() == expect.tolist() and exponent == 0
    if fault is not None:
        assert fault.lost and fault.duplicated and fault.delayed
        assert model.counters["results_unicast"] and model.counters["retransmit_dropped"]


# ---------------------------------------------------------------------------------------
# the LHC all-reduce packet by packet

CASES = [  # workers, length, density, slots, lanes
    (1, 1, 1.0, 4, 8),
    (2, 1025, 0.3, 3, 16),
    (3, 5000, 0.05, 1, 64),
    (4, 5000, 0.05, 16, 64),
    (8, 2100, 0.01, 5, 32),
    (32, 1023, 0.001, 7, 16),
]


@pytest.mark.parametrize("n,length,density,slots,lanes", CASES)
def test_packet_allreduce_equals_golden_without_faults(n, length, density, slots, lanes):
    rng = np.random.default_rng(n * 7 + length)
    xs = sparse_tensors(rng, n, length, density)
    golden, golden_stats = lhc.allreduce(xs)
    model = AggregatorModel(slots=slots, lanes=lanes)
    result, stats = run_allreduce_packets(xs, model)
    assert same_bits(result, golden) and stats["lhc"] == golden_stats
    p = stats["packets"]
    assert p.resends == 0 and p.results_ignored == 0
    chunks = sum(p.chunks.values())
    assert p.packets_sent == n * chunks == model.counters["accepted"]
    assert model.counters["results_multicast"] == chunks == p.next_chunk
    assert model.counters["packets"] == model.counters["accepted"]
    assert p.chunks["index"] == -(-golden_stats.index_bytes // (4 * lanes))
    assert p.chunks["sketch"] == -(-golden_stats.rows * lhc.B // lanes)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("n,length,density,slots,lanes", CASES[1:])
def test_packet_allreduce_is_exact_under_loss_duplication_and_reordering(
        seed, n, length, density, slots, lanes):
    rng = np.random.default_rng(100 + seed)
    xs = sparse_tensors(rng, n, length, density)
    golden, golden_stats = lhc.allreduce(xs)
    model = AggregatorModel(slots=slots, lanes=lanes)
    fault = TickFaults(seed, loss=0.15, dup=0.15, reorder=0.4, max_delay=12)
    result, stats = run_allreduce_packets(xs, model, fault=fault)
    assert same_bits(result, golden) and stats["lhc"] == golden_stats
    p = stats["packets"]
    assert p.lost and p.duplicated and p.delayed and p.resends
    assert model.counters["results_unicast"] == p.results_unicast > 0
    assert sum(model.counters[k] for k in model.counters if k.startswith("drop_")) == 0


def test_fallback_round_goes_over_packets_too():
    rng = np.random.default_rng(5)
    xs = sparse_tensors(rng, 3, 3000, 0.3)
    golden, golden_stats = lhc.allreduce(xs, load=1e6)
    assert golden_stats.unpeeled > 100
    model = AggregatorModel(slots=6, lanes=16)
    result, stats = run_allreduce_packets(xs, model, load=1e6,
                                          fault=TickFaults(1, loss=0.1, dup=0.1, reorder=0.3))
    assert same_bits(result, golden)
    assert stats["packets"].chunks["fallback"] == -(-golden_stats.unpeeled // 16)


def test_all_zero_and_empty_tensors():
    for length in (0, 3000):
        xs = [np.zeros(length, np.float32), np.full(length, -0.0, np.float32)]
        result, stats = run_allreduce_packets(xs, AggregatorModel(slots=4, lanes=64))
        golden, golden_stats = lhc.allreduce(xs)
        assert same_bits(result, golden) and stats["lhc"] == golden_stats


def test_any_transport_works_byte_images_and_reversed_batches():
    """The engine only needs send(packets) -> emitted packets, e.g. over raw bytes."""
    rng = np.random.default_rng(6)
    xs = sparse_tensors(rng, 4, 4000, 0.05)
    golden, _ = lhc.allreduce(xs)
    model = AggregatorModel(slots=5, lanes=32, jobs=2)
    model.configure_job(1, 4, 1, 4)
    calls = []

    def bytes_transport(packets):
        calls.append(len(packets))
        out = []
        for p in reversed(packets):           # the switch may see a batch in any order
            out.extend(Packet.from_bytes(r.to_bytes()) for r in model.process(p.to_bytes()))
        return out

    result, stats = allreduce_over_transport(
        xs, bytes_transport, job=1, slot_base=1, slot_count=4, lanes=32,
        fault=TickFaults(9, loss=0.1, dup=0.1, reorder=0.5))
    assert same_bits(result, golden)
    assert max(calls) > 1                     # packets arriving together are batched


def test_back_to_back_messages_continue_the_chunk_count():
    rng = np.random.default_rng(7)
    model = AggregatorModel(slots=3, lanes=16)
    first = sparse_tensors(rng, 2, 2000, 0.1)
    _, stats = run_allreduce_packets(first, model)
    second = sparse_tensors(rng, 2, 2000, 0.1)
    result, _ = run_allreduce_packets(second, model, configure=False,
                                      first_chunk=stats["packets"].next_chunk,
                                      fault=TickFaults(2, loss=0.1, dup=0.1))
    assert same_bits(result, lhc.allreduce(second)[0])


def test_same_seed_same_run():
    rng = np.random.default_rng(8)
    xs = sparse_tensors(rng, 3, 2000, 0.1)
    runs = [run_allreduce_packets(xs, AggregatorModel(slots=4, lanes=16),
                                  fault=TickFaults(4, loss=0.2, dup=0.2, reorder=0.3))[1]
            for _ in range(2)]
    assert runs[0]["packets"] == runs[1]["packets"]


def test_without_the_window_bound_stale_copies_corrupt_the_result():
    """The fault injector's ordering rule is what makes the exactness test meaningful."""
    rng = np.random.default_rng(9)
    xs = sparse_tensors(rng, 2, 3000, 0.2)
    golden, _ = lhc.allreduce(xs)
    failures = 0
    for seed in range(6):
        fault = TickFaults(seed, dup=0.5, reorder=0.5, max_delay=40,
                              keep_window_order=False)
        try:
            result, _ = run_allreduce_packets(xs, AggregatorModel(slots=1, lanes=16),
                                              fault=fault, max_ticks=20_000)
            failures += not same_bits(result, golden)
        except (ProtocolError, RuntimeError, ValueError):
            failures += 1
    assert failures > 0


def test_inconsistent_switch_answers_are_detected():
    rng = np.random.default_rng(10)
    xs = sparse_tensors(rng, 2, 2000, 0.1)
    model = AggregatorModel(slots=4, lanes=16)
    model.configure_job(0, 2, 0, 4)

    def wrong_offset(packets):
        return [Packet(r.header.replace(offset=r.header.offset + 16), r.payload)
                for r in model_transport(model)(packets)]

    with pytest.raises(ProtocolError, match="does not answer"):
        allreduce_over_transport(xs, wrong_offset, slot_count=4, lanes=16)

    def black_hole(packets):
        return []

    with pytest.raises(ProtocolError, match="no completion"):
        allreduce_over_transport(xs, black_hole, slot_count=4, lanes=16, max_ticks=500)


def test_fault_injector_arguments():
    with pytest.raises(ValueError):
        TickFaults(loss=1.0)
    with pytest.raises(ValueError):
        TickFaults(dup=-0.1)
    with pytest.raises(ValueError):
        TickFaults(max_delay=0)
