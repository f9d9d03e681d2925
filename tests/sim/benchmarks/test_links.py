"""The link model of the throughput tables (sim/benchmarks/links.py) and the vectorised
packets of the aggregation bench (sim/benchmarks/aggregation.py)."""
import numpy as np
import pytest

from contract.header import PacketType
from host.golden.ring import ring_chunk_bounds
from host.switchml.window import make_packets
from sim.benchmarks import links
from sim.benchmarks.aggregation import phase_frames


@pytest.mark.parametrize("op", [PacketType.AGG_OR32, PacketType.AGG_ADD_I32])
def test_phase_frames_are_the_packets_of_make_packets(op):
    rng = np.random.default_rng(1)
    words = rng.integers(0, 2**32, (5, 203), dtype=np.uint64).astype(np.uint32)
    exponents = [-126, -3, 0, 5, 127]
    frames = phase_frames(words, op=op, job=2, slot_base=3, slot_count=4, lanes=16,
                          first_chunk=7, exponents=exponents)
    assert frames.shape == (13, 5)
    for w in range(5):
        want = make_packets(words[w], op=op, job=2, worker=w, slot_base=3, slot_count=4,
                            lanes=16, first_chunk=7, exponent=exponents[w])
        assert [frames[g, w].tobytes() for g in range(13)] == [p.to_bytes() for p in want]


def test_wire_bytes_and_link_time():
    assert links.wire_bytes(3, 768) == 768 + 3 * (32 + 66)
    assert links.link_seconds(1.25e9, 10) == pytest.approx(1.0)


@pytest.mark.parametrize("values, workers", [(2**20, 8), (1000, 3), (5, 4), (2**27, 32)])
def test_fp32_ring_model_counts_every_step(values, workers):
    sizes = [b - a for a, b in ring_chunk_bounds(values, workers)]
    step = max(sizes)
    per_step = 4 * step + -(-step // 2048) * 98
    assert links.ring_fp32_seconds(values, workers, 10) == \
        pytest.approx(2 * (workers - 1) * 8 * per_step / 10e9)
    # every worker sends 2 (N - 1) chunks: all of them but one twice
    total = sum(4 * s + -(-s // 2048) * 98 for s in sizes if s)
    assert links.ring_fp32_wire_bytes(values, workers) == round(total * 2 * (workers - 1)
                                                                / workers)
