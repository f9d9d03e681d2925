"""``gradwire accuracy``: train with the compressed DDP hooks and compare with fp32.

Runs :func:`host.accuracy.run_experiment` (a gloo process group on 127.0.0.1; see that
module for the tasks and gradient paths), prints the results table and writes
``accuracy.json``, ``accuracy.png`` and ``accuracy.md`` into ``--out``. Needs the ``ddp``
extra (PyTorch, scikit-learn, matplotlib); torch is imported only when the command runs.
"""
from __future__ import annotations

import argparse
import importlib.util

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
    from ..accuracy import CODECS, TASKS

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


def run(args) -> int:
    missing = [name for name in ("torch", "sklearn", "matplotlib")
               if importlib.util.find_spec(name) is None]
    if missing:
        raise CliError(f"missing {', '.join(missing)}: install the 'ddp' extra "
                       f"(pip install -e '.[ddp]', or make setup)")
    from ..accuracy import Settings, results_table, run_experiment, write_outputs

    overrides = {"world_size": args.world_size, "seed": args.seed,
                 "tasks": tuple(args.tasks), "codecs": tuple(args.codecs)}
    if args.steps is not None:
        overrides.update(digits_steps=args.steps, ncf_steps=args.steps)
    settings = Settings.quick(**overrides) if args.quick else Settings(**overrides)
    if settings.world_size > 32:
        raise CliError("the sketch path supports at most 32 workers")
    print(f"training {', '.join(settings.tasks)} with {', '.join(settings.codecs)} "
          f"on {settings.world_size} gloo processes", flush=True)
    results = run_experiment(settings)
    paths = write_outputs(results, args.out)
    print()
    print(results_table(results))
    print(f"\nwall time {results['wall_seconds']:.0f} s; wrote "
          + ", ".join(str(p) for p in paths.values()))
    return 0
