"""``make bench``: every benchmark of the project, each reported against a baseline
measured in the same run. Results go to the screen and to ``build/bench/results.json``.

Each module listed in :data:`SECTIONS` (under ``host/benchmarks/``) has
``run(quick: bool) -> dict``: it prints its own table and returns JSON-serialisable results.
"""
from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import time
from pathlib import Path

SECTIONS = [
    "inceptionn",
    "lhc",
    "switch",
    "nic",
    "sim_speed",
]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m host.bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    parser.add_argument("--only", action="append", choices=SECTIONS, help="run only these sections")
    parser.add_argument("--out", default="build/bench/results.json", help="JSON results file")
    args = parser.parse_args(argv)
    results = {"machine": {"python": platform.python_version(), "platform": platform.platform()},
               "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    for name in args.only or SECTIONS:
        print(f"\n=== {name} ===", flush=True)
        results[name] = importlib.import_module(f"host.benchmarks.{name}").run(quick=args.quick)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=float) + "\n")
    print(f"\nresults written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
