"""SipHash24 (``hdl/crypto/siphash.py``) on Verilator: the cocotb benches of
``sim/tb_siphash.py``, one cached build of the component's own Verilog."""
import functools
import secrets

import pytest

from hdl.crypto.siphash import SipHash24
from hdl.export import export_verilog
from sim.runner import run_cocotb

pytestmark = [pytest.mark.cocotb, pytest.mark.slow]

TOP = "siphash24"


@functools.lru_cache(maxsize=None)
def siphash_verilog():
    return export_verilog(SipHash24(), TOP)


def run(testcase, **params):
    run_cocotb(TOP, siphash_verilog(), "sim.tb_siphash", testcase=testcase, params=params,
               seed=params.get("seed"))


@pytest.mark.parametrize("p_stall,p_key_stall,p_block", [(0.0, 0.0, 0.0), (0.3, 0.5, 0.3)])
def test_reference_vectors(p_stall, p_key_stall, p_block):
    run("reference_vectors", seed=48, p_stall=p_stall, p_key_stall=p_key_stall,
        p_block=p_block)


def test_random_messages():
    seed = secrets.randbits(31)
    print(f"seed {seed}")
    run("random_messages", seed=seed, count=150, max_bytes=300)
