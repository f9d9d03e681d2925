"""``gradwire board configure-job JOB ... --group ADDR:PORT`` and the groups ``gradwire board
status`` shows, against a virtual board (registers only: nothing joins a group or sends
multicast here)."""
import json
import subprocess
import sys

import pytest

from contract.network import ip_to_int
from tests.host.commands.test_board import REPO, board, run, where  # noqa: F401 (fixture)

GROUP = "239.77.0.1:47580"


def status_json(capsys, b):
    status, out, err = run(capsys, "board", "status", "--json", *where(b))
    assert status == 0, err
    return json.loads(out)


def test_configure_job_with_a_group_and_status_shows_it(board, capsys):
    status, out, err = run(capsys, "board", "configure-job", "1", "--workers", "2", "--slots",
                           "0:4", "--worker", "127.0.0.1:41000", "--worker", "127.0.0.1:41001",
                           "--group", GROUP, *where(board))
    assert status == 0, err
    assert out.strip() == ("job 1: 2 workers, slots 0..3, worker table 127.0.0.1:41000 "
                           f"127.0.0.1:41001, result group {GROUP}")
    assert board.backend.groups[1] == (ip_to_int("239.77.0.1"), 47580)
    assert status_json(capsys, board)["switch"]["jobs"]["1"]["group"] == GROUP
    status, out, _ = run(capsys, "board", "status", *where(board))
    assert status == 0 and f"    result group {GROUP} (each multicast result once)" in out
    # a job without a group shows none
    run(capsys, "board", "configure-job", "2", "--workers", "1", "--slots", "4:4",
        *where(board))
    jobs = status_json(capsys, board)["switch"]["jobs"]
    assert jobs["2"]["group"] is None and jobs["1"]["group"] == GROUP


@pytest.mark.parametrize("without", [[], ["--group", "0"]])
def test_configuring_a_job_again_without_a_group_clears_it(board, capsys, without):
    assert run(capsys, "board", "configure-job", "0", "--workers", "1", "--group", GROUP,
               *where(board))[0] == 0
    status, out, _ = run(capsys, "board", "configure-job", "0", "--workers", "1", *without,
                         *where(board))
    assert status == 0 and "result group" not in out
    assert board.backend.groups[0] == (0, 0)
    assert status_json(capsys, board)["switch"]["jobs"]["0"]["group"] is None


@pytest.mark.parametrize("group, message", [
    ("10.1.2.3:5000", "--group: the result group's address 10.1.2.3 is not IPv4 multicast "
                      "(224.0.0.0/4; use 239.0.0.0/8, administratively scoped)"),
    ("239.1.2.3:0", "--group: the result group's port must be in 1..65535, not 0"),
    ("239.1.2.3", "--group: give a result group as ADDR:PORT (e.g. 239.1.2.3:47580) or 0 "
                  "for none, not '239.1.2.3'"),
])
def test_a_bad_group_is_a_one_line_error_and_nothing_is_written(board, capsys, group, message):
    status, out, err = run(capsys, "board", "configure-job", "0", "--workers", "1", "--group",
                           group, *where(board))
    assert status == 2 and out == ""
    assert err == f"gradwire board: error: {message}\n"
    assert not board.backend.groups and board.backend.aggregator.job_config(0) is None
    status, _, err = run(capsys, "board", "configure-job", "0", "--clear", "--group", GROUP,
                         *where(board))
    assert status == 2 and "--clear takes no" in err and "--group" in err


def test_configure_job_help_names_the_group_option():
    r = subprocess.run([sys.executable, "-m", "host.cli", "board", "configure-job", "--help"],
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    assert "[--group ADDR:PORT]" in text
    assert ("--group ADDR:PORT the job's result group: each multicast result leaves the "
            "board once, to this IPv4 multicast address and UDP port (use 239.0.0.0/8; the "
            "workers join it), instead of once per worker; 0 or absent: no group") in text
