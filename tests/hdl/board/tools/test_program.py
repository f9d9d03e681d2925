"""``make program``: the openFPGALoader command for every board, and a one-line error (never a
traceback) for no build, a loader that cannot start, and no board on the cable."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hdl.board.program import (ProgramError, build_folder, loader_path, main,
                               program_command)
from hdl.board.boards import load_boards

REPO = Path(__file__).resolve().parents[4]
BOARDS = load_boards()


def _loader_runs():
    """Whether the shipped openFPGALoader starts here (it needs libusb and libftdi)."""
    result = subprocess.run([loader_path(), "--Version"], capture_output=True, text=True)
    return result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("board", sorted(BOARDS))
def test_command_for_every_board(board):
    names = BOARDS[board].program
    bit = Path("/b/gradwire.bit")
    command = program_command(BOARDS[board], bit, loader="L")
    cable = ["--cable", names["cable"]] if "cable" in names else []
    assert command == ["L", "--board", names["board"], *cable, "--write-sram", str(bit)]
    flash = program_command(BOARDS[board], bit, flash=True, cable="dirtyJtag", loader="L")
    assert flash == ["L", "--board", names["board"], "--cable", "dirtyJtag", "--write-flash",
                     str(bit)]


def test_build_folders_are_those_make_bitstream_writes():
    root = Path("/r")
    assert build_folder("ecpix5", root=root) == root / "ecpix5"
    assert build_folder("versa", "selftest", "nic", root=root) == root / "versa-selftest-nic"
    assert build_folder("ecpix5", "network", "switch", root=root) == root / "ecpix5-switch"


def test_openfpgaloader_knows_every_board_name():
    runs, output = _loader_runs()
    if not runs:
        pytest.skip(f"the shipped openFPGALoader cannot start here: {output.strip()[:200]}")
    listed = subprocess.run([loader_path(), "--list-boards"], capture_output=True,
                            text=True).stdout
    known = {line.split()[0] for line in listed.splitlines() if line.strip()}
    cables = subprocess.run([loader_path(), "--list-cables"], capture_output=True,
                            text=True).stdout
    known_cables = {line.split()[0] for line in cables.splitlines() if line.strip()}
    for board in BOARDS.values():
        assert board.program["board"] in known, board.name
        if "cable" in board.program:
            assert board.program["cable"] in known_cables, board.name


def _make_program(*options, cwd=REPO, dry_run=False):
    """``make program OPTIONS`` with the virtualenv running the tests (never set up again
    here: its stamp is taken as up to date); ``dry_run``: ``make -n``, the command only."""
    venv = Path(sys.prefix)
    return subprocess.run(["make", "--no-print-directory", *(["-n"] if dry_run else []),
                           "-o", str(venv / ".gradwire-installed"), "program", *options,
                           f"VENV={venv}", f"PYTHON={sys.executable}"], cwd=cwd,
                          capture_output=True, text=True, env=_outside_make())


def _outside_make():
    """The environment as a user's shell has it: under ``make test`` the outer make's
    ``MAKEFLAGS`` and ``MAKELEVEL`` would reach the inner one (which then says ``make[1]``)."""
    return {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}


def test_no_build_is_one_line_and_says_what_to_run(tmp_path, capsys):
    assert main(["--board", "versa", "--top", "selftest", "--build-root",
                 str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    # the reason, nothing else (the command is printed only when it has run)
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("make program: no bitstream at ")
    assert "make bitstream BOARD=versa TOP=selftest" in err


def test_dry_run_prints_the_command_only(tmp_path, capsys):
    assert main(["--board", "colorlight", "--flash", "--dry-run",
                 "--build-root", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    # the Colorlight builds the self-test top only, so that is its default
    assert out == (f"openFPGALoader --board colorlight --cable ft232RL --write-flash "
                   f"{tmp_path / 'colorlight-selftest' / 'gradwire.bit'}\n") and err == ""


def test_a_top_the_board_does_not_build_is_one_line(tmp_path, capsys):
    assert main(["--board", "colorlight", "--top", "network", "--dry-run",
                 "--build-root", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err == ("make program: colorlight has no network top (it builds "
                                 "selftest)\n")


def test_no_board_on_the_cable_is_one_line(tmp_path):
    """The real loader with a build present and no board attached (as on this machine)."""
    runs, output = _loader_runs()
    if not runs:
        pytest.skip(f"the shipped openFPGALoader cannot start here: {output.strip()[:200]}")
    (tmp_path / "ecpix5").mkdir()
    (tmp_path / "ecpix5" / "gradwire.bit").write_bytes(b"\xff" * 64)
    result = subprocess.run([sys.executable, "-m", "hdl.board.program", "--build-root",
                             str(tmp_path)], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("make program: openFPGALoader failed: ")
    assert "no board on the cable" in result.stderr


def test_loader_that_cannot_start_is_one_line(tmp_path):
    """Without its USB libraries the loader cannot even start: say which, and how to get it."""
    fake = tmp_path / "openFPGALoader"
    fake.write_text("#!/bin/sh\necho \"$0: error while loading shared libraries: "
                    "libusb-1.0.so.0: cannot open shared object file: No such file or "
                    "directory\" >&2\nexit 127\n")
    fake.chmod(0o755)
    (tmp_path / "ecpix5").mkdir()
    (tmp_path / "ecpix5" / "gradwire.bit").write_bytes(b"\xff" * 64)
    code = (f"import hdl.board.program as p; p.loader_path = lambda: {str(fake)!r}; "
            f"raise SystemExit(p.main(['--build-root', {str(tmp_path)!r}]))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=REPO)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr == ("make program: openFPGALoader cannot start: libusb-1.0.so.0 is "
                             "missing (as root: apt-get install libusb-1.0-0 libftdi1-2)\n")


def test_make_program_passes_the_options():
    """``make program``'s recipe hands every option to ``hdl.board.program``."""
    result = _make_program("BOARD=colorlight", "TOP=selftest", "FLASH=1", "CABLE=dirtyJtag",
                           dry_run=True)
    assert result.returncode == 0, result.stderr
    assert "-m hdl.board.program --board colorlight --top selftest --engine all" \
        in result.stdout
    assert "--flash" in result.stdout and "--cable dirtyJtag" in result.stdout


def test_make_program_without_a_build_is_one_line():
    """``make program`` itself, with no build of a board nobody built here: the one line of
    docs/bring-up.md (step 2), then make's own line for a failed recipe (its status 2)."""
    result = _make_program("BOARD=colorlight", "TOP=selftest", "FLASH=1", "CABLE=dirtyJtag")
    assert result.returncode == 2 and result.stdout == "", result
    ours, made = result.stderr.splitlines()
    assert ours.startswith("make program: no bitstream at ")
    assert ours.endswith("build/bitstream/colorlight-selftest/gradwire.bit: build it first "
                         "(make bitstream BOARD=colorlight)")
    assert made.startswith("make: *** [") and made.endswith("Error 1")
    page = " ".join((REPO / "docs" / "bring-up.md").read_text().split())
    assert "no build or the wrong board: one line saying which" in page
    assert "exit status 1" in page and "make exits 2" in page


def test_a_board_without_a_loader_name_is_refused():
    board = BOARDS["ecpix5"]
    import dataclasses
    nameless = dataclasses.replace(board, program={})
    with pytest.raises(ProgramError, match="no openFPGALoader board name"):
        program_command(nameless, "x.bit")
