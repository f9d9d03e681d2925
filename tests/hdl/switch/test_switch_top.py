"""The exported switch top (``switch_top``) on Verilator against the reference model: cocotb benches in
``sim/tb_switch.py``, one shared build (slots=16, P=64, 32 workers, 4 jobs).

Each test runs one cocotb bench (``testcase``) of the same Verilog, so the Verilator model
is built once (cached by content hash) and reused by every test, variant and by the LHC
all-reduce, which goes through the driver's Verilator transport and
``host/switchml/network.py``.
"""
import functools

import numpy as np
import pytest

from hdl.export import export_verilog, make_top
from sim.runner import run_cocotb
from sim.switch_traffic import EngineParams

pytestmark = [pytest.mark.cocotb, pytest.mark.slow]

TOP = "switch_top"
ENGINE = EngineParams(slots=16, lanes=64, max_workers=32, jobs=4)


@functools.lru_cache(maxsize=None)
def switch_verilog():
    return export_verilog(make_top(TOP, **ENGINE.as_dict()), TOP)


def run(testcase, **params):
    run_cocotb(TOP, switch_verilog(), "sim.tb_switch", testcase=testcase,
               params={"engine": ENGINE.as_dict(), **params}, seed=params.get("seed"))


@pytest.mark.parametrize("seed,p_in,p_out", [(1, 0.0, 0.0), (11, 0.3, 0.3), (21, 0.1, 0.7)])
def test_random_traffic(seed, p_in, p_out):
    run("random_traffic", seed=seed, p_in=p_in, p_out=p_out, packets=500)


@pytest.mark.parametrize("seed,p_in,p_out", [(2, 0.0, 0.0), (12, 0.2, 0.5)])
def test_hammer(seed, p_in, p_out):
    run("hammer", seed=seed, p_in=p_in, p_out=p_out, rounds=4, workers=[32, 2, 1, 17])


@pytest.mark.parametrize("seed,p_in,p_out", [(3, 0.0, 0.0), (13, 0.3, 0.4)])
def test_bad_packets(seed, p_in, p_out):
    run("bad_packets", seed=seed, p_in=p_in, p_out=p_out, repeats=3)


def test_chaos():
    run("chaos", seed=4, p_in=0.2, p_out=0.2, packets=300)


@pytest.mark.parametrize("seed,p_in,p_out", [(8, 0.0, 0.0), (18, 0.3, 0.4)])
def test_tree_leaf(seed, p_in, p_out):
    run("tree_leaf", seed=seed, p_in=p_in, p_out=p_out, packets=300)


def test_measure_smoke(tmp_path):
    """The benchmark's bench itself, small (full numbers: ``sim/benchmarks/switch.py``)."""
    import json
    report = tmp_path / "switch.json"
    run("measure", seed=5, rounds=2, packets=60, report=str(report))
    data = json.loads(report.read_text())
    assert data["hammer"]["in_beats_per_cycle"] == 1.0
    assert data["hammer"]["latency_min"] is not None


def sparse_tensors(rng, workers, elements, nnz):
    """Sparse float32 gradients with magnitudes over many binades (and a denormal)."""
    tensors = []
    for _ in range(workers):
        x = np.zeros(elements, np.float32)
        where = rng.choice(elements, nnz, replace=False)
        x[where] = (rng.normal(size=nnz) * rng.choice([1e-3, 1.0, 30.0], size=nnz)
                    ).astype(np.float32)
        x[where[0]] = np.float32(1e-40)
        tensors.append(x)
    return tensors


@pytest.mark.parametrize("faults", [False, True])
def test_lhc_allreduce_through_gateware(faults):
    """A full LHC all-reduce of 4 workers (index, sketch and fallback phases) through the
    Verilated switch, packet for packet in lockstep with the reference model (the driver's
    transports), must give the golden model's result bit for bit. With faults, packets are
    lost, duplicated and reordered on the way, so retransmissions and unicast answers go
    through the gateware too."""
    from host.driver.switch import SwitchInterface, open_switch
    from host.golden import lhc
    from host.switchml.network import TickFaults, allreduce_over_transport

    rng = np.random.default_rng(7)
    tensors = sparse_tensors(rng, 4, 2500, 200)
    want, want_stats = lhc.allreduce(tensors)
    assert want_stats.peeled > 0 and want_stats.unpeeled > 0   # all three phases run
    fault = TickFaults(seed=3, loss=0.05, dup=0.05, reorder=0.1) if faults else None
    with open_switch("verilator", check=True, **ENGINE.as_dict()) as transport:
        switch = SwitchInterface(transport)
        switch.configure_job(3, 2, 0, 4)          # another job on the pool, idle
        switch.configure_job(1, 4, 4, 8)
        # Not switch.allreduce(): its exchanges wait only 16 quiet cycles, and the bridge
        # counts them from the last *output* beat, so an exchange can end between a
        # packet's last beat and its result (reported); 200 covers every batch here.
        got, stats = allreduce_over_transport(
            tensors, lambda packets: transport.exchange("agg", packets, idle=200), job=1,
            slot_base=4, slot_count=8, lanes=ENGINE.lanes, fault=fault)
        counters = switch.counters()              # compared with the model's by lockstep
        compared = transport.compared
    assert np.array_equal(got.view(np.uint32), np.asarray(want, np.float32).view(np.uint32))
    stats = {**stats["lhc"].as_dict(), **stats["packets"].as_dict()}
    assert stats["unpeeled"] == want_stats.unpeeled and stats["rows"] == want_stats.rows
    assert compared["packets"] == counters["results_multicast"] + counters["results_unicast"]
    if faults:
        assert counters["results_unicast"] > 0 and stats["resends"] > 0
    else:
        assert counters["accepted"] == 4 * counters["results_multicast"]
