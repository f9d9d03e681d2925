"""What a board is to the sockets in front of it: datagrams in, datagrams out.

A **board backend** is everything behind the board's Ethernet port: the network front end
(``docs/protocol/network.md``: one UDP port per service, the control service, the worker
table) and the engines behind it. The virtual board (:mod:`host.board.virtual`) puts real
UDP sockets in front of a backend; the backend never sees a socket, only
:class:`Datagram` values, so the golden model (:class:`host.board.golden.GoldenBoard`) and
the Verilated network top (frames in and out of a compiled harness) plug into the same
socket side.

The interface (:class:`BoardBackend`):

- ``ip`` (str) and ``port_base`` (int): the board's own IPv4 address and first service
  port, as built (the gateware's are fixed when it is generated; the socket side translates
  its own ports ``socket_base + i`` to ``port_base + i`` and back);
- ``deliver(datagrams) -> list[Datagram]``: the datagrams that arrived from the wire, in
  arrival order, each addressed to the board (``dst_ip == ip``); returns every datagram the
  board sent in consequence, in the order it sent them (``src_ip == ip``, ``src_port`` one
  of its service ports, ``dst_ip``/``dst_port`` the requester or a worker table entry). A
  clocked backend runs its clock until its outputs are idle before it returns;
- ``poll() -> list[Datagram]``: datagrams sent since the last call without new input (a
  clocked backend's late outputs); the golden model has none;
- ``key`` (int or None): the control key it was built with, if the socket side may show it;
- ``transport_options`` (dict): defaults for the transports of a virtual board serving it
  (a simulated backend answers slowly, so they wait longer before resending);
- ``describe() -> str``: one line for the ``ready`` message;
- ``close()``.

Backends are named in :data:`BOARD_BACKENDS` (``"module:callable"``, imported when opened,
so that ``host`` never imports ``sim``): ``"golden"`` and ``"verilator"``, the Verilated
network top (``sim.harness.board.VerilatorBoard``).
"""
from __future__ import annotations

import abc
import importlib
from typing import NamedTuple, Sequence

__all__ = ["Datagram", "BoardBackend", "BOARD_BACKENDS", "open_board_backend"]


class Datagram(NamedTuple):
    """One UDP datagram on the board's wire (addresses as dotted IPv4 strings)."""
    src_ip: str
    src_port: int
    dst_ip: str
    dst_port: int
    payload: bytes


class BoardBackend(abc.ABC):
    """Base class of board backends (see the module docstring for the contract)."""

    ip: str
    port_base: int
    key: int | None = None
    transport_options: dict = {}

    @abc.abstractmethod
    def deliver(self, datagrams: Sequence[Datagram]) -> list[Datagram]:
        """Datagrams from the wire in, in arrival order; what the board sends, in order."""

    def poll(self) -> list[Datagram]:
        """Datagrams the board sent since the last call without new input."""
        return []

    def describe(self) -> str:
        return type(self).__name__

    def close(self) -> None:
        pass


#: backend name -> "module:callable"; the callable takes the keywords ``key``, ``port_base``
#: and the backend's own parameters and returns a :class:`BoardBackend`.
BOARD_BACKENDS = {
    "golden": "host.board.golden:GoldenBoard",
    # the Verilated network top behind a C++ RGMII PHY (the compiled harness)
    "verilator": "sim.harness.board:VerilatorBoard",
}


def open_board_backend(name: str, **params) -> BoardBackend:
    """Build the backend ``name`` of :data:`BOARD_BACKENDS` with ``params``."""
    if name not in BOARD_BACKENDS:
        raise ValueError(f"board backend must be one of {', '.join(map(repr, BOARD_BACKENDS))}, "
                         f"not {name!r}")
    module, function = BOARD_BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), function)(**params)
