"""``make bench``: every benchmark of the project, each reported against a baseline
measured in the same run. Results go to the screen and to ``build/bench/results.json``.

Each module named in :data:`SECTIONS` has ``run(quick: bool) -> dict``: it prints its own
table and returns JSON-serialisable results. The host software's sections are in
``host/benchmarks/``; those that run the gateware are in ``sim/benchmarks/`` and are
imported by name only when they run (``host`` never imports ``sim``).
"""
from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import time
from pathlib import Path

#: section name -> module with its ``run(quick)``
SECTIONS = {
    "inceptionn": "host.benchmarks.inceptionn",
    "lhc": "host.benchmarks.lhc",
    "udp": "host.benchmarks.udp",
    "switch": "sim.benchmarks.switch",
    "nic": "sim.benchmarks.nic",
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m host.bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    parser.add_argument("--only", action="append", choices=list(SECTIONS), help="run only these sections")
    parser.add_argument("--out", default="build/bench/results.json", help="JSON results file")
    args = parser.parse_args(argv)
    results = {"machine": {"python": platform.python_version(), "platform": platform.platform()},
               "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    for name in args.only or SECTIONS:
        print(f"\n=== {name} ===", flush=True)
        results[name] = importlib.import_module(SECTIONS[name]).run(quick=args.quick)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=float) + "\n")
    print(f"\nresults written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
