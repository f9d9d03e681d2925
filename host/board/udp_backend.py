"""The driver's ``"udp"`` backend: a transport to a board, starting a virtual one if no
board is given.

``host.driver.backends`` names :func:`open_top` by its module path, so that the driver
never imports the board package: a board is built on the driver (its transport), not the
other way round.
"""
from __future__ import annotations

import os

from contract.network import MTU_DEFAULT
from host.driver.rtt import retries_for_loss
from host.driver.settings import ENV_BOARD, board_settings
from host.driver.udp import UdpTransport

from .backend import open_board_backend
from .virtual import VirtualBoard
from .link_faults import WireFaults

__all__ = ["open_top"]

_TOP_REGIONS = {"nic_top": "nic", "switch_top": "switch"}
_TOP_PARAMS = {"nic_top": ("max_count",), "switch_top": ("slots", "lanes", "max_workers", "jobs")}


def open_top(top, *, waves=None, board=None, key=None, mtu=None, port_base=None,
             fault_rate=0.0, fault_seed=0, board_backend="golden", **params):
    """A :class:`~host.driver.udp.UdpTransport` for ``top``'s region:
    ``host.driver.backends``'s ``"udp"``.

    With ``board`` (``HOST[:PORT_BASE]``) or :data:`ENV_BOARD` set, it talks to that board
    (key from ``key`` or :data:`ENV_KEY`); otherwise it starts a virtual board with the
    ``board_backend`` of :data:`~host.board.backend.BOARD_BACKENDS` (``"golden"``, or
    ``"verilator"``: the Verilated network top, with the simulation key unless ``key`` is
    given) and ``params`` on free ports of 127.0.0.1, with ``fault_rate`` / ``fault_seed``
    on its wire, and stops it on ``close()``.
    """
    if top not in _TOP_REGIONS:
        raise ValueError(f"the udp backend serves {', '.join(_TOP_REGIONS)}, not {top!r}")
    if waves:
        raise ValueError("a board over UDP records no waveforms (use backend 'verilator')")
    unknown = set(params) - set(_TOP_PARAMS[top])
    if unknown:
        raise ValueError(f"{top} has no parameter(s) {sorted(unknown)}")
    if board is not None or os.environ.get(ENV_BOARD):
        if fault_rate:
            raise ValueError("faults are injected on a virtual board's wire; a board given "
                             "by address has its own network")
        settings = board_settings(board, port_base=port_base, key=key, mtu=mtu)
        return UdpTransport(settings["host"], port_base=settings["port_base"],
                            key=settings["key"], mtu=settings["mtu"], region=_TOP_REGIONS[top])
    faults = WireFaults(fault_rate, seed=fault_seed) if fault_rate else None
    if board_backend == "golden":
        virtual = VirtualBoard("golden", port_base=port_base, key=key, faults=faults, **params)
    else:
        # built here so that its own default key (a simulation build's) is the board's
        backend = open_board_backend(board_backend, key=key, port_base=port_base, **params)
        virtual = VirtualBoard(backend, port_base=port_base, faults=faults)
    virtual.start()
    try:
        options = dict(getattr(virtual.backend, "transport_options", {}))
        return UdpTransport(virtual.host, port_base=virtual.port_base, key=virtual.key,
                            mtu=mtu or MTU_DEFAULT, region=_TOP_REGIONS[top], owns=virtual,
                            retries=retries_for_loss(faults.loss if faults else 0.0), **options)
    except BaseException:
        virtual.stop()
        raise
