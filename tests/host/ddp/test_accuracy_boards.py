"""``gradwire accuracy --backend udp`` over several boards: ``--boards N`` starts N virtual
boards (a ``gradwire board serve`` process each, on its own port base) and the LHC row's
switch job spans them (``LhcHook(boards=[...])``): the same training, bit for bit, as on
one board, half of the bytes on each board."""
import json

import pytest

pytest.importorskip("torch", reason="PyTorch is not installed (the 'ddp' extra)")
pytest.importorskip("sklearn", reason="scikit-learn is not installed (the 'ddp' extra)")
pytest.importorskip("matplotlib", reason="matplotlib is not installed (the 'ddp' extra)")

from host.cli import main  # noqa: E402

QUICK = ["--backend", "udp", "--quick", "--codecs", "lhc", "--tasks", "ncf", "--world-size",
         "2", "--steps", "3"]


def test_the_lhc_row_over_two_virtual_boards_is_the_one_board_row(tmp_path, capsys):
    assert main(["accuracy", *QUICK, "--out", str(tmp_path / "one")]) == 0
    assert main(["accuracy", *QUICK, "--boards", "2", "--out", str(tmp_path / "two")]) == 0
    out = capsys.readouterr().out
    assert "2 virtual boards (the LHC job over all of them)" in out
    one = json.loads((tmp_path / "one" / "accuracy.json").read_text())
    two = json.loads((tmp_path / "two" / "accuracy.json").read_text())
    a, b = one["runs"][0], two["runs"][0]
    assert a["train_loss"] == b["train_loss"] and a["final_test_loss"] == b["final_test_loss"]
    assert b["backend"].startswith("udp (switch of 2 boards: ")
    hardware = b["hardware"]
    assert hardware["boards"] == 2 and hardware["packets_in"] == a["hardware"]["packets_in"]
    assert hardware["bytes_in"] == hardware["bytes_in_board0"] + hardware["bytes_in_board1"]
    assert 0.4 < hardware["bytes_in_board1"] / hardware["bytes_in"] < 0.6
    assert len(two["board"]["boards"]) == 2


def test_board_options_are_checked(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("GRADWIRE_BOARD", raising=False)
    monkeypatch.delenv("GRADWIRE_KEY", raising=False)
    assert main(["accuracy", "--boards", "2", "--quick"]) != 0
    assert "--board, --boards and --key are for --backend udp" in capsys.readouterr().err
    assert main(["accuracy", "--backend", "udp", "--boards", "2", "--board", "127.0.0.1",
                 "--quick"]) != 0
    assert "give it without --board" in capsys.readouterr().err
    assert main(["accuracy", "--backend", "udp", "--board", "127.0.0.1:20000", "--board",
                 "127.0.0.1:20010", "--key", "1", "--key", "2", "--key", "3", "--quick"]) != 0
    assert "3 keys for 2 boards" in capsys.readouterr().err
