"""The wire board top (the NIC in the wire on the Versa): its elaboration as far as the
generated build files, without the tools; the report line; the build's options."""
import re

import pytest

from contract.counters import WIRE_COUNTERS
from contract.network import SIMULATION_KEY
from contract.registers import WIRE_REGISTERS
from hdl.board.boards import load_boards
from hdl.board.build import main as build_main
from hdl.board.wire import REPORTED, WireBoardTop, report_template, report_totals
from hdl.net.core.liteeth import load_network_config

BOARDS = load_boards()
WIRE_BOARDS = sorted(b for b in BOARDS if "wire" in BOARDS[b].tops)


def test_the_versa_builds_the_wire():
    assert WIRE_BOARDS == ["versa"]
    assert BOARDS["versa"].engines_for("wire") == ("nic",)


@pytest.mark.parametrize("board", WIRE_BOARDS)
def test_wire_board_top_elaborates(board, tmp_path):
    entry = BOARDS[board]
    config = load_network_config(board, ip_address="10.1.2.3")
    platform = entry.make_platform()
    top = WireBoardTop(entry, config, key=SIMULATION_KEY)
    plan = platform.build(top, name="gradwire", build_dir=str(tmp_path), do_build=False,
                          add_preferences=entry.preferences)
    files = plan.files
    text = lambda name: files[name].decode() if isinstance(files[name], bytes) else files[name]
    lpf, il = text("gradwire.lpf"), text("gradwire.il")
    # one PLL output clocks everything, at LiteEth's sys clock; both PHYs' receive clocks
    assert f'FREQUENCY NET "pll.clk_out" {62.5e6}' in lpf
    assert "clk_os" not in lpf
    assert len(re.findall(r'FREQUENCY PORT "eth_rgmii_[01]__rx_clk__io" 125000000', lpf)) == 2
    assert "liteeth_wire" in il and "liteeth_wire.v" in files and "liteeth_core" not in il
    # the build's addresses reach the wire (its classifier: frames for the board stop there)
    assert top.wire.config.ip_address == "10.1.2.3"
    assert "compressor" in il.lower() and "aggregator" not in il.lower()
    # both PHY resets, and every LED the board names for the top
    for number in (0, 1):
        assert f"eth_rgmii_{number}__rst" in lpf
    for spec in entry.network_leds.values():
        assert f'"{spec.split(":")[0]}_{spec.split(":")[1].split(".")[0]}' in lpf


def test_report_line_sums_every_drop_cause():
    line = report_template()
    assert line.startswith("wire {line}:") and line.endswith("\r\n")
    totals = report_totals()
    for p in (0, 1):
        block = WIRE_REGISTERS[f"port{p}"]
        for name in REPORTED:
            assert f" p{p}_{name}={{p{p}_{name}}}" in line
        drops = [block.address(c) for c in WIRE_COUNTERS if c.startswith("drop_")]
        assert totals[f"p{p}_dropped"] == drops and len(drops) >= 9
        assert totals[f"p{p}_frames_in"] == [block.address("frames_in")]


def test_wire_top_options_checked(capsys):
    entry = BOARDS["versa"]
    config = load_network_config("versa")
    with pytest.raises(ValueError, match="one clock"):
        WireBoardTop(entry, config, key=SIMULATION_KEY, engine_mhz=75)
    with pytest.raises(ValueError, match="one RGMII port"):
        WireBoardTop(entry, config.replace(port1_resource=None, port1_pins=None),
                     key=SIMULATION_KEY)
    # boards without a second port, and engines the wire does not run, are refused early
    assert build_main(["--board", "ecpix5", "--top", "wire"]) == 2
    assert "has no wire top" in capsys.readouterr().err
    assert build_main(["--board", "versa", "--top", "wire", "--engine", "switch"]) == 2
    assert "NIC engines" in capsys.readouterr().err
