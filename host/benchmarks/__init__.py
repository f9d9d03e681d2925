"""Benchmark sections of ``make bench`` for the host software (see ``host/bench.py``; the
gateware sections are in ``sim/benchmarks/``) and what they share."""
from __future__ import annotations

import time

__all__ = ["best_time"]


def best_time(function, repeats):
    """``(seconds, result)``: the fastest of ``repeats`` calls of ``function``."""
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = function()
        best = min(best, time.perf_counter() - start)
    return best, result
