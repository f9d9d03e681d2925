"""``gradwire accuracy``: train with the compressed DDP hooks and compare with fp32.

Runs :func:`host.ddp.accuracy.run_experiment` (a gloo process group on 127.0.0.1; see that
module for the tasks and gradient paths), prints the results table and writes
``accuracy.json``, ``accuracy.png`` and ``accuracy.md`` into ``--out``. Needs the ``ddp``
extra (PyTorch, scikit-learn, matplotlib); torch is imported only when the command runs.

``--backend verilator`` computes the INCEPTIONN rows through every rank's Verilated NIC,
``--backend udp`` the INCEPTIONN rows through a board's NIC and the LHC row through its
switch (``--board``/``--key``, or a virtual board started for the run); the report says which
backend computed each row and how many packets went through the hardware. ``--board`` given
more than once (a ``--key`` for all, or one per board), or ``--boards N`` (N virtual boards,
each a ``gradwire board serve`` process on its own port base), stripes the LHC row's switch
job over the boards (``LhcHook(boards=[...])``); the INCEPTIONN rows use the first board.
"""
from __future__ import annotations

import argparse
import importlib.util
import re

from ..cli import CliError

__all__ = ["add_arguments", "run"]


def _positive(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_arguments(parser):
    from ..ddp.accuracy import BACKENDS, CODECS, TASKS

    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 20 steps, small tables (a minute or two)")
    parser.add_argument("--out", default="build/accuracy",
                        help="output folder (default: build/accuracy)")
    parser.add_argument("--world-size", type=_positive, default=4,
                        help="number of processes (default 4)")
    parser.add_argument("--steps", type=_positive,
                        help="training steps of every task (default 300, 20 with --quick)")
    parser.add_argument("--seed", type=int, default=2024, help="seed of data, models, batches")
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS),
                        help="tasks to train (default: all)")
    parser.add_argument("--codecs", nargs="+", choices=list(CODECS), default=list(CODECS),
                        help="gradient paths (default: all)")
    parser.add_argument("--backend", choices=BACKENDS, default="golden",
                        help="who computes the compressed rows: golden (NumPy models, default), "
                             "verilator (every rank's Verilated NIC; LHC stays golden), udp (a "
                             "board's NIC and switch)")
    parser.add_argument("--board", metavar="HOST[:PORT_BASE]", action="append",
                        help="udp: the board (default: GRADWIRE_BOARD, else a virtual board "
                             "started for the run); more than once: the LHC row's job over "
                             "several boards (the INCEPTIONN rows use the first)")
    parser.add_argument("--key", metavar="HEX", action="append",
                        help="udp: the board's control key (default: GRADWIRE_KEY); one for "
                             "every board, or one per --board")
    parser.add_argument("--boards", type=_positive, default=None, metavar="N",
                        help="udp without --board: start N virtual boards (one process each, "
                             "distinct port bases) and stripe the LHC row's job over them")


def run(args) -> int:
    missing = [name for name in ("torch", "sklearn", "matplotlib")
               if importlib.util.find_spec(name) is None]
    if missing:
        raise CliError(f"missing {', '.join(missing)}: install the 'ddp' extra "
                       f"(pip install -e '.[ddp]', or make setup)")
    from ..ddp.accuracy import Settings, results_table, run_experiment, write_outputs
    from ..ddp.launch import raise_on_sigterm

    # SIGTERM unwinds (stopping the ranks and a virtual board) instead of killing this
    # process alone.
    raise_on_sigterm()

    import os

    from ..driver.settings import ENV_BOARD, ENV_KEY, parse_key

    boards = list(args.board or ())
    keys = list(args.key or ())
    if not boards and args.backend == "udp" and os.environ.get(ENV_BOARD):
        boards = [os.environ[ENV_BOARD]]
    if not keys and boards and os.environ.get(ENV_KEY):
        keys = [os.environ[ENV_KEY]]
    if args.backend != "udp" and (args.board or args.key or args.boards):
        raise CliError("--board, --boards and --key are for --backend udp" if args.boards
                       else "--board and --key are for --backend udp")
    if args.boards is not None and boards:
        raise CliError("--boards N starts N virtual boards: give it without --board")
    if len(keys) > 1 and len(keys) != len(boards):
        raise CliError(f"{len(keys)} keys for {len(boards)} boards: give one --key for every "
                       f"board, or one per --board")
    if boards and not keys and any(c == "lhc" for c in args.codecs):
        raise CliError("the LHC row configures a job on the board's switch: give its control "
                       f"key (--key or {ENV_KEY})")
    try:
        parsed = [parse_key(text) for text in keys]
    except ValueError as exc:
        raise CliError(str(exc)) from None
    board = boards[0] if len(boards) == 1 else (boards or None)
    key = parsed[0] if len(parsed) == 1 else (parsed or None)
    overrides = {"world_size": args.world_size, "seed": args.seed,
                 "tasks": tuple(args.tasks), "codecs": tuple(args.codecs),
                 "backend": args.backend}
    if args.steps is not None:
        overrides.update(digits_steps=args.steps, ncf_steps=args.steps)
    settings = Settings.quick(**overrides) if args.quick else Settings(**overrides)
    if settings.world_size > 32:
        raise CliError("the sketch path supports at most 32 workers")
    if isinstance(board, list):
        udp_where = f"the boards at {', '.join(board)} (the LHC job over all {len(board)})"
    elif board:
        udp_where = f"the board at {board}"
    elif args.boards and args.boards > 1:
        udp_where = f"{args.boards} virtual boards (the LHC job over all of them)"
    else:
        udp_where = "a virtual board"
    where = {"golden": "the golden models", "verilator": "every rank's Verilated NIC",
             "udp": udp_where}[args.backend]
    print(f"training {', '.join(settings.tasks)} with {', '.join(settings.codecs)} "
          f"on {settings.world_size} gloo processes, compressed rows through {where}",
          flush=True)
    from torch.multiprocessing import ProcessRaisedException

    from ..ddp.launch import RendezvousError
    try:
        results = run_experiment(settings, board=board, key=key,
                                 **({"boards": args.boards} if args.boards else {}))
    except ProcessRaisedException as exc:
        raise CliError(f"the training run stopped: {_reason(str(exc))}") from None
    except RendezvousError as exc:
        raise CliError(str(exc)) from None
    paths = write_outputs(results, args.out)
    print()
    print(results_table(results))
    print(f"\nwall time {results['wall_seconds']:.0f} s; wrote "
          + ", ".join(str(p) for p in paths.values()))
    return 0


def _reason(traceback_text):
    """The last ``SomeError: message`` line of a rank's traceback (the error that stopped
    it; the frames printed after it are a worker thread's), else the text's last line."""
    lines = [line.strip() for line in traceback_text.splitlines() if line.strip()]
    for line in reversed(lines):
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)(: |$)", line):
            return line
    return lines[-1] if lines else "a rank failed"
