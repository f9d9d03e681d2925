# amaranth: UnusedElaboratable=no
"""The whole self-test with the real engines (small parameters): zero errors clean, then
counted errors with the fault injected."""

import pytest

from hdl.selftest.top import SelfTest
from tests.amaranth_sim import run

# -- the whole self-test with the real engines --------------------------------------------------

SMALL = dict(clk_hz=1_000_000, baud=250_000, report_period=1 << 20, stall_limit=1500,
             nic={"max_count": 64}, nic_values=64,
             switch=dict(slots=8, lanes=16, max_workers=4, jobs=1),
             agg_traffic=dict(workers=3, window=4, clear_cycles=16))


def _selftest_run(engine, clean_cycles, fault_cycles):
    dut = SelfTest(engines=(engine,), **SMALL)
    seen = {}

    async def tb(ctx):
        await ctx.tick().repeat(clean_cycles)
        seen["clean"] = {n: ctx.get(c) for n, c in dut.counters.items()}
        seen["clean_status"] = ctx.get(dut.status)
        ctx.set(dut.inject_fault, 1)
        await ctx.tick().repeat(fault_cycles)
        seen["fault"] = {n: ctx.get(c) for n, c in dut.counters.items()}
        seen["fault_status"] = ctx.get(dut.status)

    run(dut, tb, period=1e-6)
    return seen


@pytest.mark.slow
def test_selftest_nic_engines_clean_then_fault_injected():
    seen = _selftest_run("nic", 2500, 500)
    clean, fault = seen["clean"], seen["fault"]
    assert clean["nic_errors"] == 0 and clean["nic_bad_packets"] == 0, clean
    assert clean["nic_drops"] == 0 and clean["faults"] == 0, clean
    assert clean["nic_packets"] > 300 and clean["nic_compressed"] > 200, clean
    # the NIC compresses: fewer beats on the wire than in
    assert clean["nic_wire_beats"] < clean["nic_in_beats"], clean
    assert seen["clean_status"].nic_ok and not seen["clean_status"].nic_error
    # injected: the checker catches it (every corrupted beat that reached it)
    assert fault["faults"] > 50, fault
    assert fault["nic_errors"] >= fault["faults"] - 10, fault
    assert fault["nic_bad_packets"] > 10, fault
    assert seen["fault_status"].nic_error and not seen["fault_status"].nic_ok


@pytest.mark.slow
def test_selftest_switch_engine_clean_then_fault_injected():
    seen = _selftest_run("switch", 2500, 500)
    clean, fault = seen["clean"], seen["fault"]
    assert clean["agg_errors"] == 0 and clean["agg_bad_packets"] == 0, clean
    assert clean["agg_drops"] == 0 and clean["faults"] == 0, clean
    # 3 workers, one packet each per result; about one beat per clock into the engine
    assert clean["agg_results"] > 150, clean
    assert clean["agg_accepted"] >= 3 * (clean["agg_results"] - 8), clean
    assert seen["clean_status"].agg_ok and not seen["clean_status"].agg_error
    assert fault["faults"] > 50 and fault["agg_errors"] > 10, fault
    assert seen["fault_status"].agg_error
