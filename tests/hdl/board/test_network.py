"""The network board top: the elaboration of every board's network top (as far
as the generated build files, without the tools); the build's key handling."""
import json
import os
import stat
import subprocess

from pathlib import Path

import pytest

from hdl.board.boards import load_boards
from hdl.board.build import classify_clocks, parse_key, write_private
from hdl.board.network import NetworkBoardTop, report_template
from hdl.net.core.liteeth import load_network_config

BOARDS = load_boards()
KEY = 0x9E3779B97F4A7C15


@pytest.mark.parametrize("board", sorted(b for b in BOARDS if "network" in BOARDS[b].tops))
def test_network_board_top_elaborates(board, tmp_path):
    entry = BOARDS[board]
    config = load_network_config(board, ip_address="10.1.2.3")
    platform = entry.make_platform()
    top = NetworkBoardTop(entry, config, key=KEY)
    plan = platform.build(top, name="gradwire", build_dir=str(tmp_path), do_build=False,
                          add_preferences=entry.preferences)
    files = plan.files
    text = lambda name: files[name].decode() if isinstance(files[name], bytes) else files[name]
    lpf, il = text("gradwire.lpf"), text("gradwire.il")
    # both PLL outputs and the PHY's receive clock are constrained
    assert f'FREQUENCY NET "pll.clk_out" {entry.engine_clock_mhz("network") * 1e6}' in lpf
    assert f'FREQUENCY NET "pll.clk_os" {62.5e6}' in lpf
    assert "FREQUENCY PORT" in lpf and str(125e6) in lpf
    assert "EHXPLLL" in il and "CLKOS" in il and "DCCA" in il
    assert "liteeth_core" in il and "liteeth_core.v" in files
    # the configuration's addresses went into the core, the key into the control service
    assert "10.1.2.3" in text("liteeth_core.v") or "167838211" in text("liteeth_core.v") \
        or "32'd167838211" in text("liteeth_core.v")
    assert format(KEY, "064b") in il
    assert ("compressor" in il.lower()) == ("nic" in entry.engines_for("network"))
    assert ("aggregator" in il.lower()) == ("switch" in entry.engines_for("network"))
    for spec in entry.network_leds.values():
        assert f'"{spec.split(":")[0]}_{spec.split(":")[1].split(".")[0]}' in lpf


def test_every_counter_is_in_the_report_line():
    from contract.counters import NET_COUNTERS
    line = report_template()
    assert line.startswith("net {line}:") and line.endswith("\r\n")
    for name in NET_COUNTERS:
        assert f" {name}={{{name}}}" in line


def test_keys_and_the_private_summary(tmp_path):
    assert parse_key("0x0123456789abcdef") == 0x0123456789ABCDEF
    assert parse_key("FF") == 255
    assert parse_key("00" * 15 + "0f") == bytes(15) + b"\x0f"      # section 7: 16 bytes
    for bad in ("", "0x", "12345678901234567", "xyz", "1" * 31, "1" * 33):
        with pytest.raises(ValueError):
            parse_key(bad)
    path = tmp_path / "summary.json"
    path.write_text("{}")
    path.chmod(0o644)
    write_private(path, json.dumps({"key": "00"}))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == {"key": "00"}


def test_clocks_are_told_apart_by_net():
    fmax = {"$glbnet$pll.clk_out": {"achieved_mhz": 130.0}, "pll.clk_os": {"achieved_mhz": 90.0},
            "$glbnet$eth.rgmii_rx_clk": {"achieved_mhz": 200.0}}
    kinds = classify_clocks(fmax)
    assert set(kinds) == {"engine", "eth", "rgmii_rx"}
    assert list(kinds["eth"]) == ["pll.clk_os"]
    # as a routed network top's report names them (nextpnr's global nets)
    routed = {"$glbnet$clk_os": {"achieved_mhz": 73.3}, "$glbnet$clk_out": {"achieved_mhz": 75.1},
              "$glbnet$eth_rgmii_0__rx_clk__io$TRELLIS_IO_IN": {"achieved_mhz": 179.2}}
    kinds = classify_clocks(routed, 125.0)
    assert {kind: list(clocks) for kind, clocks in kinds.items()} == {
        "engine": ["$glbnet$clk_out"], "eth": ["$glbnet$clk_os"],
        "rgmii_rx": ["$glbnet$eth_rgmii_0__rx_clk__io$TRELLIS_IO_IN"]}


def test_network_is_the_default_top():
    from hdl.board.build import _arguments
    from hdl.board.boards import load_boards
    boards = load_boards()
    assert boards["ecpix5"].default_top == boards["versa"].default_top == "network"
    assert _arguments([], boards).top is None                 # the board's default top
    assert _arguments(["--top", "selftest", "--seed", "2,1"], boards).seed == (2, 1)
    # `make bitstream` passes no TOP unless the user does
    for options, top in (((), None), (("TOP=selftest",), "selftest")):
        dry = subprocess.run(["make", "-n", "bitstream", *options],
                             cwd=Path(__file__).resolve().parents[3], capture_output=True,
                             text=True, env=dict(os.environ, MAKEFLAGS=""))
        line = next(l for l in dry.stdout.splitlines() if "hdl.board.build" in l)
        assert ("--top" in line) == (top is not None) and (top is None or f"--top {top}" in line)


def test_summary_timing_needs_the_engine_and_the_ethernet_clock(tmp_path):
    """The network top's summary records both clocks' Fmax; timing_met needs both (and is
    false when the Ethernet clock is missing from the report); the self-test top's
    engine clock is found by its constraint where its net name is not in the report."""
    from types import SimpleNamespace

    from hdl.board.build import _summary
    from hdl.board.boards import load_boards
    board = load_boards()["ecpix5"]
    args = SimpleNamespace(router="router1")
    (tmp_path / "gradwire.tim").write_text("Info: constraining clock net 'pll.clk_out' "
                                           "to 125.00 MHz\n")
    pll = SimpleNamespace(dividers={"f_out_mhz": 125.0})
    network = SimpleNamespace(engine_mhz=125.0, eth_mhz=62.5, pll=pll, phy_count=1)

    def summary(top, clocks):
        report = {"fmax": {name: {"achieved": a, "constraint": c}
                           for name, (a, c) in clocks.items()}, "utilization": {}}
        (tmp_path / "report.json").write_text(json.dumps(report))
        return _summary(tmp_path, "gradwire", board, ("nic", "switch"), [], top, 1.0, args,
                        None, 1)

    # the names a routed network top's report gives its clocks
    clocks = {"$glbnet$clk_out": (131.2, 125.0), "$glbnet$clk_os": (88.0, 62.5),
              "$glbnet$eth_rgmii_0__rx_clk__io$TRELLIS_IO_IN": (160.0, 125.0)}
    good = summary(network, clocks)
    assert (good["engine_fmax_mhz"], good["eth_fmax_mhz"], good["rgmii_rx_fmax_mhz"]) == \
        (131.2, 88.0, 160.0)
    assert good["timing_met"]
    slow_eth = summary(network, clocks | {"$glbnet$clk_os": (60.1, 62.5)})
    assert slow_eth["eth_fmax_mhz"] == 60.1 and not slow_eth["timing_met"]
    no_eth = summary(network, {k: v for k, v in clocks.items() if "clk_os" not in k})
    assert no_eth["eth_fmax_mhz"] is None and not no_eth["timing_met"]
    no_rgmii = summary(network, {k: v for k, v in clocks.items() if "rx_clk" not in k})
    assert no_rgmii["rgmii_rx_fmax_mhz"] is None and not no_rgmii["timing_met"]
    selftest = summary(SimpleNamespace(engine_mhz=125.0, pll=pll), {"clk": (127.0, 125.0)})
    assert selftest["engine_fmax_mhz"] == 127.0 and selftest["timing_met"]
    assert "eth_fmax_mhz" not in selftest
