"""The LiteEth network core on Verilator through its RGMII pins: ARP, ping, UDP, drops.

One Verilator build of ``sim/eth_echo.py`` (the generated LiteEth core, the ECP5 primitive
models of ``sim/ecp5_models.v`` and a UDP echo), cached by content; each test runs one
cocotb test of ``sim/tb_eth.py`` against it.
"""
import json
import os

import pytest

from sim.runner import run_cocotb

#: The network top's benches (tests/hdl/net/test_network_top.py) run this same core with
#: every drop cause, ARP and ping; this bench of the core alone costs a Verilator build of
#: its own (about 1.5 minutes), so it runs on request: GRADWIRE_ECHO_BENCH=1.
pytestmark = [pytest.mark.cocotb, pytest.mark.slow,
              pytest.mark.skipif(os.environ.get("GRADWIRE_ECHO_BENCH") != "1",
                                 reason="the network top's benches cover the core; "
                                        "GRADWIRE_ECHO_BENCH=1 runs the core's own")]


def run(testcase, **params):
    from sim.eth_echo import TOP, echo_top_sources
    verilog, extra = echo_top_sources("ecpix5")
    run_cocotb(TOP, verilog, "sim.tb_eth", testcase=testcase, params=params,
               seed=params.get("seed"), extra_sources=extra)


def test_arp_and_ping():
    run("arp_and_ping", seed=1)


def test_udp_round_trip(tmp_path):
    speed_file = tmp_path / "speed.json"
    run("udp_round_trip", seed=2, speed_file=str(speed_file))
    speed = json.loads(speed_file.read_text())
    assert speed["datagrams"] > 30 and speed["sys_cycles"] > 0


def test_drops():
    run("drops", seed=3)
