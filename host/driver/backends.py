"""Where the driver finds the engines of each backend: the seam between host and simulator.

The golden models are the driver's own (``host.driver.models``). Every other backend is
named here by ``"module:function"`` and imported only when it is opened, so that the host
package never imports the simulation package (``sim`` imports ``host``, not the other way
round; ``tests/test_architecture.py`` checks it). A backend function takes the top's
parameters as keywords (plus ``waves``) and returns a :class:`~host.driver.transport.Transport`.
"""
from __future__ import annotations

import importlib

__all__ = ["BACKENDS", "open_backend"]

#: backend name -> top name -> "module:function"
BACKENDS = {
    # the compiled C++ harness: the fast default
    "verilator": {
        "nic_top": "sim.harness.transport:open_top",
        "switch_top": "sim.harness.transport:open_top",
    },
    # the cocotb bridge: same cycles, for cocotb's waveform debugging
    "cocotb": {
        "nic_top": "sim.cocotb_transport:open_top",
        "switch_top": "sim.cocotb_transport:open_top",
    },
    # a board over UDP sockets (a virtual board on 127.0.0.1 unless one is given): the
    # board package builds on the driver, so the driver names it here and never imports it
    "udp": {
        "nic_top": "host.board.udp_backend:open_top",
        "switch_top": "host.board.udp_backend:open_top",
    },
}


def open_backend(backend, top, **options):
    """Open ``top`` on ``backend`` (a name of :data:`BACKENDS`)."""
    choices = ["golden", *BACKENDS]
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, choices))}, "
                         f"not {backend!r}")
    if top not in BACKENDS[backend]:
        raise ValueError(f"backend {backend!r} has no {top}")
    module, function = BACKENDS[backend][top].split(":")
    return getattr(importlib.import_module(module), function)(top, **options)
