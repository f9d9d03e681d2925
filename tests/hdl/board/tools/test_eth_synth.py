"""``python -m hdl.board.eth_synth``: the command starts and knows every board (its Yosys
run itself is a manual measurement, docs/network-core.md "Resources")."""
import pytest

from hdl.board.boards import load_boards
from hdl.board.eth_synth import main


def test_the_command_lists_every_board(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    help_text = capsys.readouterr().out
    for board in load_boards():
        assert board in help_text
