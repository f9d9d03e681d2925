"""The NIC in the wire on Verilator through both ports' RGMII pins: the wire board's gateware
end to end against the golden wire (``sim/tb_wire.py``).

One Verilator build of ``sim/wire_top.py`` (both ports' LiteEth PHY and MAC, ECP5 primitive
models, the wire's engine), cached by content under ``build/sim``, and one simulator run for
all the cocotb tests of ``sim/tb_wire.py`` that this module's selected tests ask for; each
pytest test then reports its own cocotb test.
"""
import json

import pytest

from sim.runner import check_bench, run_selected_benches

pytestmark = [pytest.mark.cocotb, pytest.mark.slow]

#: cocotb test -> its parameters (seeds and counts: tens of frames a burst)
BENCHES = {
    "pass_through": {"seed": 1},
    "compress": {"seed": 2},
    "decompress": {"seed": 3},
    "bad_frames": {"seed": 4},
    "board_service": {"seed": 8},
    "line_rate": {"seed": 6},
    "reset_mid_frame": {"seed": 7},
}
#: the line-rate report's bursts, and each one's directions
BURSTS = {"pass_64": ("0->1", "1->0"), "pass_1514": ("0->1", "1->0"),
          "jumbo_9014": ("0->1", "1->0"), "compress_360_k10": ("0->1",),
          "decompress_360_k10": ("1->0",), "mixed": ("0->1", "1->0")}


@pytest.fixture(scope="module")
def benches(request, tmp_path_factory):
    """The selected benches, run in one simulator (:func:`sim.runner.run_selected_benches`)."""
    from sim.wire_top import TOP, wire_top_sources
    return run_selected_benches(request, tmp_path_factory.mktemp("wire_top"), BENCHES, TOP,
                                wire_top_sources(), "sim.tb_wire")


check = check_bench


def test_pass_through(benches):
    check(benches, "pass_through")


def test_compress(benches):
    check(benches, "compress")


def test_board_service(benches):
    check(benches, "board_service")


def test_decompress(benches):
    check(benches, "decompress")


def test_bad_frames(benches):
    check(benches, "bad_frames")


def test_line_rate(benches):
    check(benches, "line_rate")
    report = json.loads((benches[1] / "line_rate.json").read_text())
    for burst, directions in BURSTS.items():
        assert set(report[burst]) == set(directions), burst
        for direction in directions:
            figures = report[burst][direction]
            assert figures["frames"] >= 6, (burst, direction, figures)
            if burst.startswith(("pass", "jumbo")):
                # back to back at the sending PHY's rate (port 1's clock is 500 ppm fast,
                # port 0's 500 ppm slow), and out as fast as they came in
                assert figures["in_of_limit"] > 0.999, (burst, direction, figures)
                assert figures["out_of_limit"] > 0.999, (burst, direction, figures)


def test_reset_mid_frame(benches):
    check(benches, "reset_mid_frame")
