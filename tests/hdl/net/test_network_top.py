"""The network top on Verilator through its RGMII pins: the board's gateware end to end.

One Verilator build of ``sim/network_top.py`` (LiteEth core, ECP5 primitive models, front
end, the NIC and switch engines), cached by content, and one simulator run for all the cocotb tests
of ``sim/tb_network.py`` that this module's selected tests ask for (each simulator start
costs seconds: the model is large); each pytest test then reports its own cocotb test.
"""
import json

import pytest

from sim.runner import check_bench, run_selected_benches

pytestmark = [pytest.mark.cocotb, pytest.mark.slow]

#: cocotb test -> its parameters (seeds and sizes; small enough for CI, see docs/network.md)
BENCHES = {
    "arp_and_ping": {"seed": 1},
    "nic_services": {"seed": 2, "packets": 12, "max_values": 600},
    "control": {"seed": 3},
    "lhc_round": {"seed": 4},
    "drops": {"seed": 5},
    "golden_board": {"seed": 7},
    "line_rate": {"seed": 6, "per_service": 6},
}


@pytest.fixture(scope="module")
def benches(request, tmp_path_factory):
    """The selected benches, run in one simulator (:func:`sim.runner.run_selected_benches`)."""
    from sim.network_top import TOP, network_top_sources
    return run_selected_benches(request, tmp_path_factory.mktemp("network_top"), BENCHES, TOP,
                                network_top_sources("ecpix5"), "sim.tb_network")


check = check_bench


def test_arp_and_ping(benches):
    check(benches, "arp_and_ping")


def test_nic_services(benches):
    check(benches, "nic_services")


def test_control(benches):
    check(benches, "control")


def test_lhc_round(benches):
    check(benches, "lhc_round")


def test_drops(benches):
    check(benches, "drops")


def test_golden_board(benches):
    check(benches, "golden_board")


def test_line_rate(benches):
    check(benches, "line_rate")
    figures = json.loads((benches[1] / "line_rate.json").read_text())
    for service in ("nic_tx", "nic_rx", "switch", "ctrl"):
        assert figures[service]["datagrams"] == 6
    assert figures["mixed"]["datagrams"] == 24
