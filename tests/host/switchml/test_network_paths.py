"""The dense and auto paths over packets, and several jobs at once on one switch
(host/switchml/network.py: ``lhc_protocol`` by path, ``run_jobs``,
``allreduce_jobs_over_transport``), through the reference aggregator."""
import numpy as np
import pytest

from host.golden.aggregator import AggregatorModel, model_transport
from host.driver.switch import SwitchInterface, open_switch
from host.golden import lhc
from host.switchml.network import (JobSpec, Phase, TickFaults, allreduce_jobs_over_transport,
                                 allreduce_over_transport, run_allreduce_packets, run_jobs)
from host.switchml.window import ProtocolError
from contract.header import PacketType


def sparse_tensors(rng, n, length, density):
    return [(rng.standard_normal(length) * (rng.random(length) < density)).astype(np.float32)
            for _ in range(n)]


def same_bits(a, b):
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("fault", [None, TickFaults(3, loss=0.15, dup=0.15, reorder=0.4)])
@pytest.mark.parametrize("path, density, phases", [
    ("dense", 0.05, {"exponent", "dense"}),
    ("auto", 0.9, {"index", "dense"}),
    ("auto", 0.01, {"index", "sketch"}),
])
def test_every_path_over_packets_equals_golden(path, density, phases, fault):
    rng = np.random.default_rng(int(density * 100))
    xs = sparse_tensors(rng, 5, 20_000, density)
    golden, golden_stats = lhc.allreduce(xs, path=path)
    assert same_bits(golden, lhc.allreduce(xs)[0])
    model = AggregatorModel(slots=7, lanes=32)
    result, stats = run_allreduce_packets(xs, model, path=path, fault=fault)
    assert same_bits(result, golden) and stats["lhc"] == golden_stats
    chunks = stats["packets"].chunks
    assert set(chunks) <= phases | {"fallback"} and phases <= set(chunks)
    if "dense" in chunks:
        assert chunks["dense"] == -(-20_000 // 32)
    if "exponent" in chunks:
        assert chunks["exponent"] == 1
    assert sum(model.counters[k] for k in model.counters if k.startswith("drop_")) == 0


def test_empty_and_all_zero_tensors_on_every_path():
    for length in (0, 3000):
        xs = [np.zeros(length, np.float32), np.full(length, -0.0, np.float32)]
        for path in lhc.PATHS:
            result, stats = run_allreduce_packets(xs, AggregatorModel(slots=4, lanes=64),
                                                  path=path)
            golden, golden_stats = lhc.allreduce(xs, path=path)
            assert same_bits(result, golden) and stats["lhc"] == golden_stats


def _job_sets(rng):
    """Three jobs: 32 workers (every bit of the worker bitmap), 3 and 9 workers; sizes and
    densities that make auto pick both paths."""
    return [sparse_tensors(rng, 32, 6000, 0.001), sparse_tensors(rng, 3, 2500, 0.95),
            sparse_tensors(rng, 9, 12_000, 0.4)]


@pytest.mark.parametrize("fault", [None, TickFaults(5, loss=0.1, dup=0.1, reorder=0.4)])
def test_several_jobs_at_once_each_exact(fault):
    rng = np.random.default_rng(21)
    sets = _job_sets(rng)
    model = AggregatorModel(slots=30, lanes=32, jobs=4)
    ranges = [(2, 0, 10), (0, 10, 8), (3, 18, 12)]            # (job, slot_base, slot_count)
    paths = ["auto", "auto", "dense"]
    for (job, base, count), tensors in zip(ranges, sets):
        model.configure_job(job, len(tensors), base, count)
    batches = []

    def transport(packets):
        batches.append({p.header.job for p in packets})
        return model_transport(model)(packets)

    runs = allreduce_jobs_over_transport(
        [dict(tensors=t, job=job, slot_base=base, slot_count=count, path=path)
         for t, (job, base, count), path in zip(sets, ranges, paths)],
        transport, lanes=32, fault=fault)
    chosen = []
    for tensors, path, (result, stats) in zip(sets, paths, runs):
        golden, golden_stats = lhc.allreduce(tensors, path=path)
        assert same_bits(result, golden) and stats["lhc"] == golden_stats
        chosen.append(golden_stats.path)
    assert chosen == ["sketch", "dense", "dense"]
    assert any(len(jobs) == 3 for jobs in batches), "the jobs' packets should share exchanges"
    assert sum(model.counters[k] for k in model.counters if k.startswith("drop_")) == 0


def test_switch_interface_runs_jobs_at_once_and_continues_them():
    rng = np.random.default_rng(22)
    switch = SwitchInterface(open_switch("golden", slots=16, lanes=64))
    sets = [sparse_tensors(rng, 32, 5000, 0.01), sparse_tensors(rng, 2, 5000, 0.8)]
    for configure in (True, False):
        runs = switch.allreduce_jobs(sets, jobs=[1, 3], path="auto", configure=configure)
        for tensors, (result, stats) in zip(sets, runs):
            golden, golden_stats = lhc.allreduce(tensors, path="auto")
            assert same_bits(result, golden) and stats["path"] == golden_stats.path
    assert [stats["slot_count"] for _, stats in runs] == [8, 8]
    with pytest.raises(ValueError, match="paths"):
        switch.allreduce_jobs(sets, path=["auto"])
    with pytest.raises(RuntimeError, match="not configured"):
        switch.allreduce_jobs(sets, jobs=[0, 2], configure=False)


def test_run_jobs_checks_its_jobs():
    def proto():
        yield Phase("p", PacketType.AGG_OR32, np.ones(3, np.uint32))

    def run(specs):
        model = AggregatorModel(slots=8, lanes=8, jobs=4)
        return run_jobs(specs, model_transport(model), lanes=8)

    with pytest.raises(ValueError, match="twice"):
        run([JobSpec([proto()], job=1, slot_count=2), JobSpec([proto()], job=1, slot_base=4)])
    with pytest.raises(ValueError, match="share slots"):
        run([JobSpec([proto()], job=0, slot_count=3), JobSpec([proto()], job=1, slot_base=2)])
    with pytest.raises(ValueError, match="no job"):
        run([])
    model = AggregatorModel(slots=8, lanes=8, jobs=4)
    model.configure_job(2, 1, 0, 4)

    def wrong_job(packets):
        return [r.__class__(r.header.replace(job=3), r.payload)
                for r in model_transport(model)(packets)]

    with pytest.raises(ProtocolError, match="not running"):
        allreduce_over_transport([np.ones(10, np.float32)], wrong_job, job=2, slot_count=4,
                                 lanes=8)
