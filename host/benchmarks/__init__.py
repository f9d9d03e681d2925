"""Benchmark sections of ``make bench`` (see ``host/bench.py``) and what they share."""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

__all__ = ["best_time", "cocotb_measurement"]


def best_time(function, repeats):
    """``(seconds, result)``: the fastest of ``repeats`` calls of ``function``."""
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = function()
        best = min(best, time.perf_counter() - start)
    return best, result


def cocotb_measurement(top, verilog, test_module, testcase, params, *, report_param):
    """Run one cocotb measurement test on Verilator and return the JSON it writes.

    The test receives ``params`` plus ``{report_param: path}`` and must write its results
    as JSON to that path; a failing or missing test raises ``RuntimeError``.
    """
    from cocotb_tools.check_results import get_results

    from sim.runner import run_cocotb

    with tempfile.TemporaryDirectory(prefix=f"{top}-bench-") as tmp:
        report = Path(tmp) / "report.json"
        results = run_cocotb(top, verilog, test_module, testcase=testcase,
                             params={**params, report_param: str(report)},
                             test_dir=Path(tmp) / "run")
        tests, failed = get_results(Path(results))
        if failed or not tests:
            raise RuntimeError(f"the {top} measurement bench failed (log: {tmp}/run/sim.log)")
        return json.loads(report.read_text())
