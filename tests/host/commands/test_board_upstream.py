"""``gradwire board configure-job JOB ... --upstream HOST:PORT --upstream-job J
--upstream-worker W`` and the upstreams ``gradwire board status`` shows, against a virtual
board (``aggregator-protocol.md`` section 4: the job becomes a leaf of the parent's job;
registers only here, no parent runs)."""
import json
import subprocess
import sys

import pytest

from contract.network import ip_to_int
from contract.registers import SWITCH_REGISTERS
from host.golden.aggregator import Upstream
from tests.host.commands.test_board import REPO, board, run, where  # noqa: F401 (fixture)

PARENT = "192.168.77.3:47572"
PARENT_UPSTREAM = Upstream(ip_to_int("192.168.77.3"), 47572, 2, 7)


def status_json(capsys, b):
    status, out, err = run(capsys, "board", "status", "--json", *where(b))
    assert status == 0, err
    return json.loads(out)


def test_configure_job_with_an_upstream_and_status_shows_it(board, capsys):
    status, out, err = run(capsys, "board", "configure-job", "1", "--workers", "2", "--slots",
                           "0:4", "--worker", "127.0.0.1:41000", "--worker", "127.0.0.1:41001",
                           "--upstream", PARENT, "--upstream-job", "2",
                           "--upstream-worker", "7", *where(board))
    assert status == 0, err
    assert out.strip() == ("job 1: 2 workers, slots 0..3, worker table 127.0.0.1:41000 "
                           f"127.0.0.1:41001, upstream {PARENT} job 2 worker 7")
    assert board.backend.aggregator.job_config(1).upstream == PARENT_UPSTREAM
    assert status_json(capsys, board)["switch"]["jobs"]["1"]["upstream"] == \
        {"address": PARENT, "job": 2, "worker": 7}
    status, out, _ = run(capsys, "board", "status", *where(board))
    assert status == 0 and f"    upstream {PARENT} job 2 worker 7 (a leaf" in out
    # a job without an upstream shows none
    run(capsys, "board", "configure-job", "2", "--workers", "1", "--slots", "4:4",
        *where(board))
    jobs = status_json(capsys, board)["switch"]["jobs"]
    assert jobs["2"]["upstream"] is None and jobs["1"]["upstream"]["job"] == 2
    status, out, _ = run(capsys, "board", "status", *where(board))
    assert out.count("    upstream ") == 1


@pytest.mark.parametrize("without", [[], ["--upstream", "0"]])
def test_configuring_a_job_again_without_an_upstream_clears_it(board, capsys, without):
    assert run(capsys, "board", "configure-job", "0", "--workers", "1", "--upstream", PARENT,
               "--upstream-job", "2", "--upstream-worker", "7", *where(board))[0] == 0
    assert board.backend.aggregator.job_config(0).upstream == PARENT_UPSTREAM
    status, out, _ = run(capsys, "board", "configure-job", "0", "--workers", "1", *without,
                         *where(board))
    assert status == 0 and "upstream" not in out
    assert board.backend.aggregator.job_config(0).upstream is None
    assert status_json(capsys, board)["switch"]["jobs"]["0"]["upstream"] is None


@pytest.mark.parametrize("options, message", [
    (["--upstream", PARENT], "--upstream needs --upstream-job J and --upstream-worker W (the "
                             "parent's job number and this job's worker number in it)"),
    (["--upstream", PARENT, "--upstream-job", "1"], "--upstream needs --upstream-worker W (the "
                                                     "parent's job number and this job's worker "
                                                     "number in it)"),
    (["--upstream-job", "1", "--upstream-worker", "0"],
     "--upstream-job and --upstream-worker need --upstream HOST:PORT"),
    (["--upstream", "0", "--upstream-worker", "0"],
     "--upstream-job and --upstream-worker need --upstream HOST:PORT"),
    (["--upstream", PARENT, "--upstream-job", "64", "--upstream-worker", "0"],
     "--upstream-job must be in 0..63, not 64"),
    (["--upstream", PARENT, "--upstream-job", "0", "--upstream-worker", "-1"],
     "--upstream-worker must be in 0..31, not -1"),
    (["--upstream", "192.168.77.3", "--upstream-job", "0", "--upstream-worker", "0"],
     "--upstream: give the upstream as HOST:PORT, the parent board's address and its port "
     "base + 2 (e.g. 192.168.77.3:47572), or 0 for none, not '192.168.77.3'"),
    (["--upstream", "192.168.77.3:70000", "--upstream-job", "0", "--upstream-worker", "0"],
     "--upstream: the upstream's port must be in 1..65535 (the parent board's port base + 2), "
     "not 70000"),
    (["--upstream", "239.1.2.3:47572", "--upstream-job", "0", "--upstream-worker", "0"],
     "--upstream: the upstream's address 239.1.2.3 is not a board's (a unicast IPv4 "
     "address)"),
])
def test_a_bad_upstream_is_a_one_line_error_and_nothing_is_written(board, capsys, options,
                                                                    message):
    status, out, err = run(capsys, "board", "configure-job", "0", "--workers", "1", *options,
                           *where(board))
    assert status == 2 and out == ""
    assert err == f"gradwire board: error: {message}\n"
    assert board.backend.aggregator.job_config(0) is None
    # not even a pending register
    assert board.backend.aggregator.read(SWITCH_REGISTERS["job"].address(0, "workers")) == 0
    assert board.backend.aggregator.read(SWITCH_REGISTERS["upstream"].address(0, "ip")) == 0


def test_clear_takes_no_upstream(board, capsys):
    status, _, err = run(capsys, "board", "configure-job", "0", "--clear", "--upstream",
                         PARENT, *where(board))
    assert status == 2 and "--clear takes no" in err and "--upstream" in err


def test_a_board_without_upstream_registers_is_refused_in_one_line(capsys, monkeypatch):
    from host.board import VirtualBoard
    from tests.host.driver.test_switch_upstream import BoardWithoutUpstream
    for name in ("GRADWIRE_BOARD", "GRADWIRE_PORT_BASE", "GRADWIRE_KEY", "GRADWIRE_MTU"):
        monkeypatch.delenv(name, raising=False)
    old = BoardWithoutUpstream(key=0x1234, slots=16)
    with VirtualBoard(old, port_base=None) as b:
        status, out, err = run(capsys, "board", "configure-job", "0", "--workers", "1",
                               "--upstream", PARENT, "--upstream-job", "2",
                               "--upstream-worker", "7", *where(b))
    assert status == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("gradwire board: error: --upstream: the switch does not hold job 0's "
                          "upstream registers: its gateware predates trees of aggregators")
    assert old.aggregator.job_config(0) is None


def test_configure_job_help_names_the_upstream_options():
    r = subprocess.run([sys.executable, "-m", "host.cli", "board", "configure-job", "--help"],
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    for option in ("--upstream HOST:PORT", "--upstream-job J", "--upstream-worker W"):
        assert option in text
    assert "its switch port (its port base + 2, 47572 by default)" in text
