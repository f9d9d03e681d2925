"""The ring through NICs in the wire (``docs/protocol/network.md`` sections 5 and 6):
INCEPTIONN's ring all-reduce by hosts that each sit behind a two-port wire board, the
boards' network ports joined by a learning switch, on a simulated clock.

- :mod:`host.wire_ring.frames`: Ethernet/IPv4/UDP frames as a host builds and reads them;
- :mod:`host.wire_ring.switch`: :class:`LearningSwitch`, the network between the boards;
- :mod:`host.wire_ring.reliable`: messages of gradient datagrams over a lossy network
  without I/O (``seq``/``offset`` identity, ack datagrams, resends on a timeout);
- :mod:`host.wire_ring.host`: :class:`RingHost`, one host's side of the ring;
- :mod:`host.wire_ring.network`: :func:`ring_over_wire`, hosts, boards
  (:class:`~host.board.wire_golden.GoldenWire`) and switch on one event loop, with seeded
  faults and the bytes every link carries.
"""
from .host import RingHost
from .network import LinkSpec, RingStalled, WireRingStats, golden_ring, ring_over_wire
from .switch import LearningSwitch

__all__ = ["RingHost", "LearningSwitch", "LinkSpec", "RingStalled", "WireRingStats",
           "golden_ring", "ring_over_wire"]
