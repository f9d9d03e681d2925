"""The network top on Verilator through its RGMII pins: the board's gateware end to end.

One Verilator build of ``sim/network_top.py`` (LiteEth core, ECP5 primitive models, front
end, NicTop, SwitchTop), cached by content; each test runs one cocotb test of
``sim/tb_network.py`` against it.
"""
import json

import pytest

from sim.runner import run_cocotb

pytestmark = [pytest.mark.cocotb, pytest.mark.slow]


def run(testcase, **params):
    from sim.network_top import TOP, network_top_sources
    verilog, extra = network_top_sources("ecpix5")
    run_cocotb(TOP, verilog, "sim.tb_network", testcase=testcase, params=params,
               seed=params.get("seed"), extra_sources=extra)


def test_arp_and_ping():
    run("arp_and_ping", seed=1)


def test_nic_services():
    run("nic_services", seed=2, packets=12, max_values=600)


def test_control():
    run("control", seed=3)


def test_lhc_round():
    run("lhc_round", seed=4)


def test_drops():
    run("drops", seed=5)


def test_line_rate(tmp_path):
    report = tmp_path / "line_rate.json"
    run("line_rate", seed=6, per_service=6, report_file=str(report))
    figures = json.loads(report.read_text())
    for service in ("nic_tx", "nic_rx", "switch", "ctrl"):
        assert figures[service]["datagrams"] == 6
    assert figures["mixed"]["datagrams"] == 24
