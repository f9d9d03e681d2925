"""The self-test board top: the elaboration of every board's, as far as the generated build
files."""
import pytest

from hdl.board.boards import load_boards
from hdl.board.top import BoardTop

BOARDS = load_boards()


@pytest.mark.parametrize("board", sorted(BOARDS))
def test_board_top_elaborates(board, tmp_path):
    """The whole design (engines that fit, self-test, PLL, pins) for every board, as far
    as the generated build files, without running the tools."""
    entry = BOARDS[board]
    platform = entry.make_platform()
    top = BoardTop(entry)
    plan = platform.build(top, name="gradwire", build_dir=str(tmp_path), do_build=False,
                          add_preferences=entry.preferences)
    files = plan.files
    lpf = files["gradwire.lpf"]
    lpf = lpf.decode() if isinstance(lpf, bytes) else lpf
    # the engine clock is constrained by name, at the PLL's real output frequency
    hz = top.pll.dividers["f_out_mhz"] * 1e6
    assert f'FREQUENCY NET "pll.clk_out" {hz}' in lpf
    il = files["gradwire.il"]
    il = il.decode() if isinstance(il, bytes) else il
    assert "EHXPLLL" in il
    assert "DCCA" in il              # the reset goes over a global network
    assert ("compress" in il.lower()) == ("nic" in entry.engines_for("selftest"))
    assert ("aggregator" in il.lower() or "agg_traffic" in il) == \
        ("switch" in entry.engines_for("selftest"))
    for spec in entry.leds.values():
        assert f'"{spec.split(":")[0]}_{spec.split(":")[1].split(".")[0]}' in lpf
