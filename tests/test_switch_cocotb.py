"""The switch top on Verilator against the reference model: cocotb benches in
``sim/tb_switch.py``, one shared build (slots=16, P=64, 32 workers, 4 jobs).

Each test runs one cocotb bench (``testcase``) of the same Verilog, so the Verilator model
is built once (cached by content hash) and reused by every test, variant and by the LHC
all-reduce, which goes through the driver's Verilator transport and
``host/switch_packets.py``.
"""
import functools

import numpy as np
import pytest

from sim.runner import export_verilog, run_cocotb
from sim.switch_traffic import EngineParams

pytestmark = [pytest.mark.cocotb, pytest.mark.slow]

TOP = "switch_top"
ENGINE = EngineParams(slots=16, lanes=64, max_workers=32, jobs=4)


@functools.lru_cache(maxsize=None)
def switch_verilog():
    from hdl.switch_top import SwitchTop
    return export_verilog(SwitchTop(**ENGINE.as_dict()), TOP)


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


def test_measure_smoke(tmp_path):
    """The benchmark's bench itself, small (full numbers: ``host/benchmarks/switch.py``)."""
    import json
    report = tmp_path / "switch.json"
    run("measure", seed=5, rounds=2, packets=60, report=str(report))
    data = json.loads(report.read_text())
    assert data["hammer"]["in_beats_per_cycle"] == 1.0
    assert data["hammer"]["latency_min"] is not None
