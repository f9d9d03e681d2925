"""``make bench``: every benchmark of the project, each reported against a baseline
measured in the same run. Results go to the screen and to ``build/bench/results.json``.

Each module named in :data:`SECTIONS` has ``run(quick: bool) -> dict``: it prints its own
table and returns JSON-serialisable results. The host software's sections are in
``host/benchmarks/``; those that run the gateware are in ``sim/benchmarks/`` and are
imported by name only when they run (``host`` never imports ``sim``).
A section with sizes too long for every run takes ``run(quick, large=False)`` too and runs
them only with ``--large``; one that writes files (plots) takes ``out_dir`` and puts them
beside the JSON results. ``--only NAME`` (repeatable) runs some sections alone.
"""
from __future__ import annotations

import argparse
import importlib
import inspect
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
    "ctrl_auth": "sim.benchmarks.ctrl_auth",
    "job_auth": "sim.benchmarks.job_auth",
    "nic": "sim.benchmarks.nic",
    "codec_memory": "host.benchmarks.codec_memory",
    "sim_speed": "sim.benchmarks.sim_speed",
    "aggregation": "sim.benchmarks.aggregation",
    "inceptionn_comm": "sim.benchmarks.inceptionn_comm",
    "deployment": "sim.benchmarks.deployment",
    "ddp_hardware": "host.benchmarks.ddp_hardware",
    "ddp_overlap": "host.benchmarks.ddp_overlap",
    "fsdp_overlap": "host.benchmarks.fsdp_overlap",
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m host.bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    parser.add_argument("--only", action="append", choices=list(SECTIONS),
                        help="run only these sections")
    parser.add_argument("--large", action="store_true",
                        help="also the largest sizes of the sections that have them "
                             "(codec_memory: 2^27 values; minutes)")
    parser.add_argument("--out", default="build/bench/results.json", help="JSON results file")
    args = parser.parse_args(argv)
    results = {"machine": {"python": platform.python_version(), "platform": platform.platform()},
               "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    for name in args.only or SECTIONS:
        print(f"\n=== {name} ===", flush=True)
        run = importlib.import_module(SECTIONS[name]).run
        parameters = inspect.signature(run).parameters
        options = {"large": True} if args.large and "large" in parameters else {}
        if "out_dir" in parameters:         # sections that write files (plots) beside the JSON
            options["out_dir"] = Path(args.out).parent
        results[name] = run(quick=args.quick, **options)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=float) + "\n")
    print(f"\nresults written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
