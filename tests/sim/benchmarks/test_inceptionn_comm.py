"""``make bench``'s inceptionn_comm section, small (the real nic_top through the compiled
harness): every figure is there and consistent with its definition."""
import pytest

from sim.benchmarks import inceptionn_comm, links

pytestmark = pytest.mark.cocotb


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return inceptionn_comm.run(quick=True, out_dir=tmp_path_factory.mktemp("bench"))


def test_every_gradient_set_and_k_has_its_figures(results):
    mhz = results["clock_mhz"]
    ceiling = 256 * mhz * 1e6 / 1e9                  # one 256-bit beat per clock, Gb/s
    assert {"make sim DenseMLP", "make sim NcfModel", "synthetic"} <= set(results["sets"])
    for name, by_k in results["sets"].items():
        assert set(by_k) == {str(k) for k in inceptionn_comm.QUICK["k"]}
        for k, r in by_k.items():
            assert r["compression_ratio"] > 1, (name, k)
            assert r["compression_ratio_with_headers"] < r["compression_ratio"]
            assert 0 < r["ring_wire_vs_fp32"] < 1
            for engine in ("tx", "rx"):
                assert 0.3 * ceiling < r["engines"][engine]["gbps"] <= ceiling
            codec = r["cpu_codec"]
            assert codec["encode_s_per_value"] > 0 and codec["decode_s_per_value"] > 0
            for gbps in links.LINKS_GBPS:
                t = r["time"][f"{gbps}GbE"]
                # the fp32 time is the ring model of the same chunks, step by step
                assert t["fp32_s"] == pytest.approx(
                    links.ring_fp32_seconds(r["values"], r["workers"], gbps))
                assert t["nic_vs_fp32"] == pytest.approx(t["fp32_s"] / t["nic_s"])
                # the NIC is never slower than its engines, nor faster than its wire
                values_per_s = min(r["engines"][e]["values_per_cycle"]
                                   for e in ("tx", "rx")) * mhz * 1e6
                assert t["nic_s"] >= 2 * (r["workers"] - 1) * (
                    r["values"] // r["workers"]) / values_per_s * (1 - 1e-9)
    # smaller error bound, more bits: k = 10 never compresses better than k = 8
    for by_k in results["sets"].values():
        assert by_k["10"]["compression_ratio"] <= by_k["8"]["compression_ratio"]


def test_plot_is_a_png(results):
    from pathlib import Path
    assert Path(results["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
