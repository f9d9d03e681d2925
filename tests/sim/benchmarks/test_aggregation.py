"""``make bench``'s aggregation section, small (the real switch_top through the compiled
harness): every figure is there and consistent with its definition."""
import pytest

from sim.benchmarks import aggregation, links

pytestmark = pytest.mark.cocotb


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return aggregation.run(quick=True, out_dir=tmp_path_factory.mktemp("bench"))


def _seconds(case, names, mhz):
    return sum(case["rounds"][n]["cycles"] for n in names) / (mhz * 1e6)


def test_every_path_is_its_measured_rounds(results):
    mhz, values = results["clock_mhz"], results["values"]
    bits = 32 * values
    for n, by_density in results["cases"].items():
        for density, case in by_density.items():
            g = case["gbps"]
            assert g["dense"]["engine"] == pytest.approx(
                bits / _seconds(case, ("exponent", "dense"), mhz) / 1e9)
            assert g["sketch"]["engine"] == pytest.approx(
                bits / _seconds(case, ("index", "sketch", "fallback"), mhz) / 1e9)
            auto = ("index", "dense") if case["chosen"] == "dense" else \
                ("index", "sketch", "fallback")
            assert g["auto"]["engine"] == pytest.approx(bits / _seconds(case, auto, mhz) / 1e9)
            # the choice is the cheaper path in payload bytes, so never far below dense
            assert g["auto"]["engine"] >= 0.9 * min(g["dense"]["engine"], g["sketch"]["engine"])
            for gbps in links.LINKS_GBPS:            # a link can only slow a path down
                for path in ("dense", "sketch", "auto"):
                    assert g[path][f"{gbps}GbE"] <= g[path]["engine"] * (1 + 1e-12)
            rounds = case["rounds"]
            assert rounds["dense"]["chunks"] == -(-values // aggregation.ENGINE.lanes)
            assert rounds["exponent"]["chunks"] == 1
            assert rounds["sketch"]["chunks"] == case["rows"] * 1024 // aggregation.ENGINE.lanes
    choices = {case["chosen"] for by_d in results["cases"].values() for case in by_d.values()}
    assert choices == {"sketch", "dense"}


def test_engine_takes_one_beat_per_clock_and_scaling_is_linear(results):
    fit = results["fit_8_workers"]
    beats = 8 * (1 + aggregation.ENGINE.lanes // 8)         # 8 workers' 9-beat packets
    assert fit["b_cycles_per_packet"] == pytest.approx(beats, rel=1e-3)
    assert fit["max_deviation"] < aggregation.LINEARITY_TOLERANCE
    row = results["paper_row"]
    assert row["scaled"] and row["workers"] == 8 and row["chosen"] == "sketch"
    assert row["ratios"]["auto_vs_dense_engine"] > 1
    assert row["paper_speedup"] == 6.33


def test_plot_is_a_png(results):
    from pathlib import Path
    assert Path(results["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
