"""The boards' clocks: PLL dividers, the two-output PLL of the network top, and every
board's default clocks."""
import pytest

from hdl.board.boards import load_boards
from hdl.board.clocking import EnginePLL, pll_dividers
from hdl.net.core.liteeth import load_network_config

BOARDS = load_boards()


def test_every_default_clock_has_margin_over_the_port():
    """The 1 GbE port needs 1e9 / 256 bits = 3.9 MHz of the 256-bit engines; every default
    is a clock of the PLL, with the Ethernet clock beside it on the network top."""
    for board in BOARDS.values():
        for top, mhz in board.engine_mhz.items():
            assert 8 <= mhz <= 125, (board.name, top, mhz)
        if "network" not in board.tops:
            continue
        f_in = board.make_platform().default_clk_frequency / 1e6
        eth_mhz = load_network_config(board.name).sys_clk_hz / 1e6
        pll = EnginePLL(f_in_mhz=f_in, f_out_mhz=board.engine_clock_mhz("network"),
                        f_os_mhz=eth_mhz)
        assert pll.dividers["f_out_mhz"] == board.engine_clock_mhz("network")


@pytest.mark.parametrize("f_in, f_out, want", [
    (100, 125, dict(clki_div=4, clkfb_div=5, clkop_div=5)),    # what Trellis ecppll picks
    (25, 125, dict(clki_div=1, clkfb_div=5, clkop_div=5)),
])
def test_pll_dividers_match_ecppll(f_in, f_out, want):
    got = pll_dividers(f_in, f_out)
    assert {k: got[k] for k in want} == want
    assert got["f_out_mhz"] == f_out and got["f_vco_mhz"] == 625


@pytest.mark.parametrize("f_in, f_out", [(100, 100), (100, 150), (25, 60), (100, 33.333)])
def test_pll_dividers_stay_in_range(f_in, f_out):
    d = pll_dividers(f_in, f_out)
    assert 3.125 <= f_in / d["clki_div"] <= 400
    assert 400 <= d["f_vco_mhz"] <= 800
    assert abs(d["f_vco_mhz"] - d["f_out_mhz"] * d["clkop_div"]) < 1e-6
    assert abs(d["f_out_mhz"] - f_out) / f_out < 0.01


def test_pll_dividers_reject_impossible_clock():
    with pytest.raises(ValueError, match="cannot make 500"):
        pll_dividers(100, 500)


@pytest.mark.parametrize("f_in", [100, 25])
def test_pll_makes_both_clocks_from_one_vco(f_in):
    pll = EnginePLL(f_in_mhz=f_in, f_out_mhz=125, f_os_mhz=62.5)
    d = pll.dividers
    assert d["f_out_mhz"] == 125 and d["f_os_mhz"] == 62.5
    assert d["f_vco_mhz"] == d["clkos_div"] * 62.5
    with pytest.raises(ValueError, match="divided by an integer"):
        EnginePLL(f_in_mhz=f_in, f_out_mhz=125, f_os_mhz=60)
    # a slower engine clock (`--freq 100`): a VCO that makes both (500 MHz, not 600)
    slower = EnginePLL(f_in_mhz=f_in, f_out_mhz=100, f_os_mhz=62.5).dividers
    assert (slower["f_out_mhz"], slower["f_os_mhz"], slower["f_vco_mhz"]) == (100, 62.5, 500)
