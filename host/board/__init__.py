"""A board on the network: the backend interface, the golden board, the virtual board.

- :mod:`host.board.backend`: :class:`Datagram`, :class:`BoardBackend` (what sits behind a
  board's Ethernet port, datagrams in and out) and the named backends;
- :mod:`host.board.golden`: :class:`GoldenBoard`, the network front end of
  ``docs/protocol/network.md`` with the golden engines behind it (the reference the
  gateware's network top is compared against);
- :mod:`host.board.wire_golden`: :class:`GoldenWire`, the two-port board with the NIC in
  the wire (``network.md`` section 6), frame by frame;
- :mod:`host.board.virtual`: :class:`VirtualBoard`, a backend behind real UDP sockets on
  127.0.0.1 (``gradwire board serve``);
- :mod:`host.board.link_faults`: :class:`WireFaults`, a seeded fault injector on its link
  (``host.board.wire`` keeps the old path);
- :mod:`host.board.udp_backend`: the driver's ``"udp"`` backend (a transport to a given
  board, or to a virtual board it starts).

The host talks to any of them, and to a real board, through
:class:`host.driver.udp.UdpTransport`.
"""
from .backend import BOARD_BACKENDS, BoardBackend, Datagram, open_board_backend
from .golden import GoldenBoard
from .virtual import VirtualBoard, free_port_base
from .link_faults import WireFaults
from .wire_golden import GoldenWire

__all__ = ["BOARD_BACKENDS", "BoardBackend", "Datagram", "open_board_backend", "GoldenBoard",
           "GoldenWire", "VirtualBoard", "WireFaults", "free_port_base"]
