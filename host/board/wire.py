"""The seeded faults on a board's link moved to :mod:`host.board.link_faults` (``wire``
means the NIC in the wire elsewhere); this module keeps the old import path working."""
from .link_faults import INBOUND, OUTBOUND, WireFaults

__all__ = ["WireFaults", "INBOUND", "OUTBOUND"]
