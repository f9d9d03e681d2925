"""The compiled co-simulation harness: a Verilated top driven from C++, one request per
exchange (see ``harness.cpp``, ``build.py`` and ``transport.py``).

Importing this package is cheap (the bridge imports :mod:`sim.harness.patterns` inside
the cocotb process); :class:`HarnessTransport` and :func:`build_harness` load lazily.
"""
from __future__ import annotations

__all__ = ["HarnessTransport", "build_harness"]


def __getattr__(name):
    if name == "HarnessTransport":
        from .transport import HarnessTransport
        return HarnessTransport
    if name == "build_harness":
        from .build import build_harness
        return build_harness
    raise AttributeError(name)
