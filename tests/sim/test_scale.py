"""Scale on the Verilated gateware: the dense and auto paths through switch_top, several
jobs at once with every bit of the 32-worker bitmap in use, and both network paths of the
end-to-end simulation with 32 workers (a lean version of ``make sim --workers 32``)."""
import numpy as np
import pytest

from host.driver.switch import SwitchInterface, open_switch
from host.golden import lhc
from host.switchml.network import TickFaults
from tests.helpers import bits

pytestmark = pytest.mark.cocotb


def sparse(rng, n, length, density):
    return [(rng.standard_normal(length) * (rng.random(length) < density)).astype(np.float32)
            for _ in range(n)]


def test_dense_and_sketch_at_once_on_the_gateware_with_32_workers():
    rng = np.random.default_rng(31)
    sets = [sparse(rng, 32, 8000, 0.0005),    # auto: sketch, 32 workers
            sparse(rng, 32, 3000, 0.9),       # auto: dense, 32 workers
            sparse(rng, 5, 2000, 0.3)]        # forced dense
    paths = ["auto", "auto", "dense"]
    with open_switch("verilator") as transport:      # every packet checked against the model
        switch = SwitchInterface(transport)
        runs = switch.allreduce_jobs(sets, path=paths, slot_counts=[24, 24, 16],
                                     fault=TickFaults(6, loss=0.05, dup=0.05, reorder=0.2))
        chosen = []
        for tensors, path, (result, stats) in zip(sets, paths, runs):
            golden, golden_stats = lhc.allreduce(tensors, path=path)
            assert np.array_equal(bits(result), bits(golden))
            assert stats["path"] == golden_stats.path
            chosen.append(stats["path"])
        assert chosen == ["sketch", "dense", "dense"]
        assert transport.compared["packets"] > 0 and transport.compared["registers"] > 0
        counters = switch.counters()
        assert sum(v for k, v in counters.items() if k.startswith("drop_")) == 0
        assert transport.stats["agg"].busy_cycles > 0


def test_end_to_end_with_32_workers_on_both_paths(tmp_path):
    from sim.e2e import run

    report = run(workers=32, k=8, steps=1, seed=3, backend="verilator", out_dir=tmp_path,
                 size="small")
    assert report["ok"], report
    ring = report["inceptionn"]
    assert ring["workers"] == 32 and ring["within_error_bound"]
    assert ring["bit_identical_on_all_workers"]
    assert report["lhc"]["exact"] and report["lhc"]["workers"] == 32
    for path in ("inceptionn", "lhc"):
        assert report[path]["compared_with_golden"]["packets"] > 0
    assert report["wire"]["bit_exact"] and report["wire"]["workers"] == 32


def test_receive_waits_for_the_decoding_of_an_all_zero_packet():
    """An all-zero 2048-value packet is 17 beats into the receive path, then 256 clocks of
    decoding before any beat comes out: the exchange must not end in that quiet time."""
    from host.driver.nic import NicInterface, open_nic

    x = np.zeros(2048, np.float32)
    x[-1] = 0.5
    with open_nic("verilator") as transport:       # checked against the model in lockstep
        nic = NicInterface(transport)
        for values in (np.zeros(2048, np.float32), x, np.zeros(1000, np.float32)):
            back = nic.receive(nic.transmit(values, 10), values.size)
            assert np.array_equal(bits(back), bits(values))
