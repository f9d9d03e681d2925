"""The exported NIC top (``nic_top``) on Verilator: cocotb benches in ``sim/tb_nic.py``, one shared build.

Each test runs one cocotb test (``testcase``) of the same Verilog, so the Verilator model is
built once (cached by content hash) and reused by every test and variant.
"""
import functools

import pytest

from hdl.export import export_verilog, make_top
from sim.runner import run_cocotb

pytestmark = [pytest.mark.cocotb, pytest.mark.slow]

TOP = "nic_top"


@functools.lru_cache(maxsize=None)
def nic_verilog():
    return export_verilog(make_top(TOP), TOP)


def run(testcase, **params):
    run_cocotb(TOP, nic_verilog(), "sim.tb_nic", testcase=testcase, params=params,
               seed=params.get("seed"))


@pytest.mark.parametrize("seed,p_in,p_out", [(1, 0.2, 0.2), (11, 0.0, 0.5), (21, 0.6, 0.0)])
def test_tx_bit_exact(seed, p_in, p_out):
    run("tx_bit_exact", seed=seed, p_in=p_in, p_out=p_out, packets=100)


@pytest.mark.parametrize("seed,p_in,p_out", [(2, 0.2, 0.2), (12, 0.0, 0.5), (22, 0.6, 0.0)])
def test_rx_bit_exact(seed, p_in, p_out):
    run("rx_bit_exact", seed=seed, p_in=p_in, p_out=p_out, packets=120)


def test_round_trip():
    run("round_trip", seed=3, p_in=0.2, p_out=0.3, packets=60)


def test_throughput_smoke():
    """The measurement bench itself (full numbers: ``sim/benchmarks/nic.py``)."""
    run("throughput", seed=4, packets=2, values=512, baseline_cycles=2000)
