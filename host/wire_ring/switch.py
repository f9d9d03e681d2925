"""A learning Ethernet switch: the network that joins the wire boards' network ports.

A transparent bridge as IEEE 802.1D describes its forwarding (no spanning tree, no VLANs):

- it **learns** the source MAC of every good frame: the station is behind the ingress port
  (a station that moves is re-learnt on its new port);
- a frame to a **known unicast** MAC goes out of that port only, and is *filtered*
  (dropped) when that port is the one it came in on;
- a frame to a **broadcast, multicast or unknown** MAC is *flooded*: sent out of every
  port but the ingress port;
- a frame with a bad FCS or shorter than a header is dropped (a store-and-forward
  switch checks the FCS before it forwards).

Bounded and deterministic: the table holds at most ``table_size`` stations (when it is
full the least recently seen one makes room) and an entry not refreshed for ``aging``
seconds of simulated time is forgotten. Frames go out unchanged, FCS included; the switch
has no clock of its own (``now`` is the caller's simulated time).
"""
from __future__ import annotations

import collections

from contract.frames import ETH_HEADER, FCS_BYTES, with_fcs

from .frames import dst_mac, src_mac

__all__ = ["LearningSwitch", "SWITCH_COUNTERS"]

#: What :attr:`LearningSwitch.counters` counts: every frame in is exactly one of
#: forwarded, flooded, filtered or dropped (bad FCS or runt).
SWITCH_COUNTERS = ("frames_in", "forwarded", "flooded", "filtered", "dropped", "frames_out",
                   "learned", "moved", "evicted", "aged")


def _is_group(mac: bytes) -> bool:
    """Broadcast and multicast addresses have the I/G bit (bit 0 of the first byte) set."""
    return bool(mac[0] & 1)


class LearningSwitch:
    """A learning switch with ``ports`` ports, frame by frame.

    Parameters
    ----------
    ports : int
        Number of ports, 2..1024.
    table_size : int
        Most stations the MAC table holds, at least 1.
    aging : float
        Seconds after which an entry not refreshed is forgotten (802.1D's default 300).

    Attributes
    ----------
    table : collections.OrderedDict
        ``{mac bytes: (port, last seen)}``, least recently seen first.
    counters : dict
        :data:`SWITCH_COUNTERS`.
    """

    def __init__(self, ports: int, *, table_size: int = 1024, aging: float = 300.0):
        if isinstance(ports, bool) or not isinstance(ports, int) or not 2 <= ports <= 1024:
            raise ValueError(f"a switch has 2..1024 ports, not {ports!r}")
        if isinstance(table_size, bool) or not isinstance(table_size, int) or table_size < 1:
            raise ValueError(f"table_size must be a positive integer, not {table_size!r}")
        if not aging > 0:
            raise ValueError(f"aging must be a positive number of seconds, not {aging!r}")
        self.ports, self.table_size, self.aging = ports, table_size, float(aging)
        self.table: collections.OrderedDict = collections.OrderedDict()
        self.counters = dict.fromkeys(SWITCH_COUNTERS, 0)

    def port_of(self, mac: bytes, now: float = 0.0) -> int | None:
        """The port ``mac`` was learnt on, or None (unknown, or aged out by ``now``)."""
        entry = self.table.get(bytes(mac))
        if entry is None or now - entry[1] >= self.aging:
            return None
        return entry[0]

    def receive(self, port: int, frame: bytes, now: float = 0.0) -> list[tuple[int, bytes]]:
        """One frame (FCS included) in on ``port`` at simulated time ``now``: the
        ``(port, frame)`` copies the switch sends."""
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < self.ports:
            raise ValueError(f"the switch has ports 0..{self.ports - 1}, not {port!r}")
        self.counters["frames_in"] += 1
        if len(frame) < ETH_HEADER + FCS_BYTES or with_fcs(frame[:-FCS_BYTES]) != frame:
            self.counters["dropped"] += 1
            return []
        self._age(now)
        source = src_mac(frame)
        if not _is_group(source):       # a group address is never a station's: not learnt
            self._learn(source, port, now)
        destination = dst_mac(frame)
        out_port = None if _is_group(destination) else self.port_of(destination, now)
        if out_port is None:
            self.counters["flooded"] += 1
            out = [(p, frame) for p in range(self.ports) if p != port]
        elif out_port == port:
            # the station is on the segment the frame came from: it has it already
            self.counters["filtered"] += 1
            out = []
        else:
            self.counters["forwarded"] += 1
            out = [(out_port, frame)]
        self.counters["frames_out"] += len(out)
        return out

    def _learn(self, mac: bytes, port: int, now: float) -> None:
        old = self.table.pop(mac, None)
        if old is None:
            self.counters["learned"] += 1
            if len(self.table) >= self.table_size:
                self.table.popitem(last=False)       # the least recently seen station
                self.counters["evicted"] += 1
        elif old[0] != port:
            self.counters["moved"] += 1
        self.table[mac] = (port, now)

    def _age(self, now: float) -> None:
        # the table is in order of last sighting: expired entries are at its front
        while self.table:
            mac, (_, seen) = next(iter(self.table.items()))
            if now - seen < self.aging:
                break
            del self.table[mac]
            self.counters["aged"] += 1
