"""``gradwire sim --tree LxW`` (``make sim TREE=LxW``): the NCF model's training through a
tree of aggregators (``aggregator-protocol.md`` section 4) on golden or gateware boards, every step bit
for bit the flat golden all-reduce over every worker of the tree, with faults on both
levels; the report counts datagrams and resends per level and the boards' tree counters."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from host.cli import main

REPO = Path(__file__).resolve().parents[2]


def _sim(tmp_path, *args):
    out = tmp_path / "tree"
    status = main(["sim", "--backend", "golden", "--steps", "2", "--seed", "3",
                   "--out", str(out), *args])
    return status, out


def test_a_tree_trains_bit_exact_and_the_report_counts_each_level(tmp_path, capsys):
    status, out = _sim(tmp_path, "--tree", "3x4", "--tree-fault-rate", "0.05",
                       "--tree-fault-seed", "7")
    assert status == 0
    report = json.loads((out / "report.json").read_text())
    text = (out / "report.txt").read_text()
    tree = report["tree"]
    assert report["ok"] and tree["exact"] and report["workers"] == 12
    assert set(report) >= {"tree"} and not {"lhc", "inceptionn", "wire"} & set(report)
    assert (tree["leaves"], tree["workers_per_leaf"], tree["workers"]) == (3, 4, 12)
    assert tree["faults"] == {"rate": 0.05, "seed": 7}
    levels, counters = tree["levels"], tree["board_counters"]
    first_up = levels["workers"]["first_up"]
    assert first_up == sum(s["packets_sent"] for s in tree["per_step"]) > 0
    assert levels["upstream"]["first_up"] * 4 == first_up
    assert counters["leaves"]["upstream_sent"] == levels["upstream"]["first_up"]
    assert counters["leaves"]["results_upstream"] == counters["leaves"]["upstream_sent"]
    assert counters["root"]["accepted"] == counters["leaves"]["upstream_sent"]
    assert counters["leaves"]["results_multicast"] == 0
    for name in ("workers", "upstream"):
        assert levels[name]["resends_up"] > 0 and levels[name]["lost"] > 0
    assert "Tree of aggregators: 3 leaves x 4 workers = 12 workers and a root (golden " \
           "boards)" in text
    assert "exact (bit for bit vs the flat golden all-reduce over all 12 workers): yes" in text
    assert "  upstream " in text and "RESULT: every path bit-exact" in text


def test_a_tree_without_faults_resends_nothing(tmp_path, capsys):
    status, out = _sim(tmp_path, "--tree", "2x2", "--tree-fault-rate", "0", "--steps", "1")
    assert status == 0
    tree = json.loads((out / "report.json").read_text())["tree"]
    assert tree["exact"] and tree["faults"]["rate"] == 0
    for level in tree["levels"].values():
        assert level["resends_up"] == level["lost"] == level["unicast_down"] == 0


@pytest.mark.parametrize("args, message", [
    (["--tree", "4"], "give a tree as LxW (leaves x workers per leaf, e.g. 4x8), not '4'"),
    (["--tree", "0x8"], "a tree's leaves must be an integer in 1..32, not 0"),
    (["--tree", "4x33"], "a tree's workers per leaf must be an integer in 1..32, not 33"),
    (["--tree", "1x1"], "a tree of one worker aggregates nothing"),
    (["--tree", "2x2", "--workers", "4"], "--tree runs the tree alone, its workers its "
                                          "leaves': drop --workers"),
    (["--tree", "2x2", "--boards", "2", "--path", "lhc"], "drop --path, --boards"),
    (["--tree", "2x2", "--tree-fault-rate", "1.5"], "fault rate must be in [0, 1)"),
])
def test_bad_tree_options_are_one_line_errors(tmp_path, capsys, args, message):
    status, _ = _sim(tmp_path, *args)
    assert status == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.slow
def test_a_tree_on_the_gateware_trains_bit_exact(tmp_path, capsys):
    """Every board the Verilated network top (its own harness process), faults on both
    levels: the same exactness, and the gateware's own tree counters."""
    assert main(["sim", "--backend", "verilator", "--tree", "2x2", "--steps", "1",
                 "--tree-fault-rate", "0.05", "--out", str(tmp_path / "tree")]) == 0
    report = json.loads((tmp_path / "tree" / "report.json").read_text())
    tree = report["tree"]
    assert report["ok"] and tree["exact"] and tree["backend"] == "verilator"
    leaves = tree["board_counters"]["leaves"]
    assert leaves["upstream_sent"] == leaves["results_upstream"] > 0
    assert tree["board_counters"]["root"]["accepted"] == leaves["upstream_sent"]


def test_make_sim_tree_runs_the_tree_on_the_gateware():
    venv = Path(sys.prefix)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    dry = subprocess.run(["make", "--no-print-directory", "-n", "-o",
                          str(venv / ".gradwire-installed"), "sim", "TREE=4x8",
                          f"VENV={venv}", f"PYTHON={sys.executable}"], cwd=REPO,
                         capture_output=True, text=True, env=env)
    assert dry.returncode == 0, dry.stderr
    command = " ".join(dry.stdout.replace("\\\n", " ").replace("\\", " ").split())
    assert "-m host.cli sim --backend verilator --tree 4x8" in command
    plain = subprocess.run(["make", "--no-print-directory", "-n", "-o",
                            str(venv / ".gradwire-installed"), "sim", f"VENV={venv}"],
                           cwd=REPO, capture_output=True, text=True, env=env)
    assert "sim --backend verilator" in " ".join(plain.stdout.split())
    assert "host.cli sim" in command
    assert "--tree" not in plain.stdout
