"""Board tops: the board table, PLL dividers, and the elaboration of every board's top."""
from pathlib import Path

import pytest

from hdl.board.top import BoardTop, load_boards, pll_dividers

REPO = Path(__file__).resolve().parents[3]
BOARDS = load_boards()
#: the smallest valid board entry
ENTRY = ('[x]\nplatform = "a:b"\npart = "p"\nengines = ["nic"]\n'
         'engine_mhz = { network = 75, selftest = 50 }\nuart_tx = "uart:0.tx"\n')


def test_board_table_names_the_required_boards():
    assert {"ecpix5", "versa", "colorlight"} <= set(BOARDS)
    assert BOARDS["ecpix5"].part == "LFE5UM5G-85F"
    assert set(BOARDS["ecpix5"].engines_for("network")) == {"nic", "switch"}
    # the Versa's part takes one engine per top: the aggregator beside the network front end
    assert BOARDS["versa"].engines == {"network": ("switch",), "selftest": ("switch",)}
    for board in BOARDS.values():
        platform = board.make_platform()         # also checks the part against the platform
        assert platform.default_clk_frequency > 0


def test_board_table_rejects_unknown_keys(tmp_path):
    bad = tmp_path / "boards.toml"
    bad.write_text(ENTRY + 'colour = "red"\n')
    with pytest.raises(ValueError, match="unknown keys.*colour"):
        load_boards(bad)
    bad.write_text('[x]\nplatform = "a:b"\n')
    with pytest.raises(ValueError, match="lacks the key 'part'"):
        load_boards(bad)


def test_board_table_gives_each_top_its_clock(tmp_path):
    table = tmp_path / "boards.toml"
    table.write_text(ENTRY + 'seed = 3\nprogram = { board = "b", cable = "c" }\n')
    board = load_boards(table)["x"]
    assert board.engine_clock_mhz("network") == 75.0
    assert board.engine_clock_mhz("selftest") == 50.0
    assert board.seed == 3 and board.program == {"board": "b", "cable": "c"}
    assert board.tops == ("network", "selftest") and board.default_top == "network"
    with pytest.raises(ValueError, match="'x' does not build the 'wire' top"):
        board.engine_clock_mhz("wire")
    # a board whose part the network top does not fit builds the self-test top only
    table.write_text(ENTRY.replace("network = 75, ", "") + 'notes = "too small"\n')
    small = load_boards(table)["x"]
    assert small.tops == ("selftest",) and small.default_top == "selftest"
    with pytest.raises(ValueError, match="does not build the 'network' top .*too small"):
        small.engine_clock_mhz("network")
    assert board.engines_for("network") == board.engines_for("selftest") == ("nic",)
    table.write_text(ENTRY.replace('["nic"]', '{ network = ["switch"], selftest = ["nic"] }'))
    assert load_boards(table)["x"].engines == {"network": ("switch",), "selftest": ("nic",)}
    for engines in ('{ network = ["switch"] }', '{ network = [], selftest = ["nic"] }',
                    '["nic", "dsp"]', '"nic"'):
        table.write_text(ENTRY.replace('["nic"]', engines))
        with pytest.raises(ValueError, match="board 'x'.*engine"):
            load_boards(table)
    for clocks, seed, program in (("125", "1", "{}"), ("{}", "1", "{}"),
                                  ("{ network = 75, wire = 75 }", "1", "{}"),
                                  ("{ network = 75, selftest = 0 }", "1", "{}"),
                                  ("{ network = 75, selftest = true }", "1", "{}"),
                                  ("{ network = 75, selftest = 75 }", "-1", "{}"),
                                  ("{ network = 75, selftest = 75 }", "1.5", "{}"),
                                  ("{ network = 75, selftest = 75 }", "1", "{ port = 'x' }"),
                                  ("{ network = 75, selftest = 75 }", "1", "{ board = 3 }")):
        table.write_text(ENTRY.replace("{ network = 75, selftest = 50 }", clocks)
                         + f"seed = {seed}\nprogram = {program}\n")
        with pytest.raises(ValueError, match="board 'x'"):
            load_boards(table)


def test_every_default_clock_has_margin_over_the_port():
    """The 1 GbE port needs 1e9 / 256 bits = 3.9 MHz of the 256-bit engines; every default
    is a clock of the PLL, with the Ethernet clock beside it on the network top."""
    from hdl.board.network import NetworkPLL
    from hdl.net.core.liteeth import load_network_config
    for board in BOARDS.values():
        for top, mhz in board.engine_mhz.items():
            assert 8 <= mhz <= 125, (board.name, top, mhz)
        if "network" not in board.tops:
            continue
        f_in = board.make_platform().default_clk_frequency / 1e6
        eth_mhz = load_network_config(board.name).sys_clk_hz / 1e6
        pll = NetworkPLL(f_in_mhz=f_in, f_out_mhz=board.engine_clock_mhz("network"),
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
