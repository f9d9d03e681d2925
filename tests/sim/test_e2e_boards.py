"""``gradwire sim --boards N`` (``make sim BOARDS=N``): the in-network LHC path with every
job striped over N switches (``docs/protocol/network.md`` section 3), one per board: the
same training, bit for bit, as on one board, and the report says what each board
carried."""
import json

import pytest

from host.cli import main


def _sim(tmp_path, name, *args):
    out = tmp_path / name
    assert main(["sim", "--size", "small", "--workers", "3", "--steps", "2", "--seed", "4",
                 "--path", "lhc", "--out", str(out), *args]) == 0
    return json.loads((out / "report.json").read_text()), (out / "report.txt").read_text()


@pytest.mark.parametrize("backend", [
    "golden",
    "udp",
    pytest.param("verilator", marks=pytest.mark.cocotb),
])
def test_sim_over_two_boards_is_the_one_board_run(backend, tmp_path, capsys):
    one, one_text = _sim(tmp_path, "one", "--backend", backend)
    two, two_text = _sim(tmp_path, "two", "--backend", backend, "--boards", "2")
    assert "boards" not in one and "boards" not in one["lhc"]
    assert "board 0:" not in one_text
    assert two["boards"] == two["lhc"]["boards"] == 2 and two["ok"] and two["lhc"]["exact"]
    for key in ("loss_after", "totals"):
        assert two["lhc"][key] == one["lhc"][key]
    for a, b in zip(one["lhc"]["per_step"], two["lhc"]["per_step"]):
        assert (a["peeled"], a["union_nnz"], a["packets_sent"]) == \
            (b["peeled"], b["union_nnz"], b["packets_sent"])
    boards = two["lhc"]["per_board"]
    assert [b["board"] for b in boards] == [0, 1]
    assert sum(b["packets_in"] for b in boards) == sum(s["packets_sent"]
                                                       for s in two["lhc"]["per_step"])
    assert sum(b["counters"]["accepted"] for b in boards) == one["lhc"]["counters"]["accepted"]
    for b in boards:
        assert b["counters"]["accepted"] == b["packets_in"]
        assert 0.3 < b["share"] < 0.7
    assert "board 0:" in two_text and "board 1:" in two_text and "bytes in" in two_text
    if backend == "verilator":
        assert {"switch0_agg", "switch1_agg"} <= set(two["engines"])
        assert two["lhc"]["compared_with_golden"]["packets"] > 0


def test_sim_rejects_a_bad_board_count(tmp_path, capsys):
    assert main(["sim", "--backend", "golden", "--boards", "0", "--out", str(tmp_path)]) == 2
    assert "boards must be an integer in 1..8" in capsys.readouterr().err
