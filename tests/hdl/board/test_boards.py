"""The boards table (``constraints/boards.toml``): every board's entry, and the checks
:func:`hdl.board.boards.load_boards` makes."""
import pytest

from hdl.board.boards import load_boards

BOARDS = load_boards()
#: the smallest valid board entry
ENTRY = ('[x]\nplatform = "a:b"\npart = "p"\nengines = ["nic"]\n'
         'engine_mhz = { network = 75, selftest = 50 }\nuart_tx = "uart:0.tx"\n')


def test_board_table_names_the_required_boards():
    assert {"ecpix5", "versa", "colorlight"} <= set(BOARDS)
    assert BOARDS["ecpix5"].part == "LFE5UM5G-85F"
    assert set(BOARDS["ecpix5"].engines_for("network")) == {"nic", "switch"}
    # the Versa's part takes one engine per top: the aggregator beside the network front end
    assert BOARDS["versa"].engines == {"network": ("switch",), "selftest": ("switch",),
                                       "wire": ("nic",)}
    # the NIC in the wire: its engines run at LiteEth's own clock, on its two ports
    assert BOARDS["versa"].tops == ("network", "selftest", "wire")
    assert BOARDS["versa"].engine_clock_mhz("wire") == 62.5
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
                                  ("{ network = 75, bridge = 75 }", "1", "{}"),
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
