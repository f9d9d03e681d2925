"""Benchmark sections of ``make bench`` that run the gateware (see ``host/bench.py``)."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

__all__ = ["cocotb_measurement"]


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
