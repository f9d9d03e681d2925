"""Seeded faults on the virtual board's wire: loss, duplication, delay, reordering.

Like SwitchML's drop simulator, it sits where the board meets the network and decides, per
datagram and per direction, whether the datagram is lost, how many copies arrive and when.
The virtual board (:mod:`host.board.virtual`) asks :meth:`WireFaults.schedule` for the
arrival times of every datagram it receives and every datagram its backend sends, and holds
the delayed copies until their time.

The network it models keeps three rules, which are what the protocols of
``docs/protocol/network.md`` section 5 need from a network (a real one keeps them by having
delays far below a round's time):

1. **Window order** (the aggregator protocol, ``aggregator-protocol.md`` section 3): every
   copy of a worker's packet for a slot arrives before that worker's packet of the next
   round on the slot (a copy arriving later would be folded into the next round). Per
   (source, job, worker, slot), copies of a packet with a new ``seq`` are held back behind
   the last copy already scheduled for the previous ``seq``.
2. **Control requests are barriers**: a ``CTRL`` datagram to the board is never delayed
   (its duplicate follows it at once), and everything the wire still holds, both ways, is
   delivered before it. A stale copy of a data packet therefore never crosses a
   reconfiguration (a commit clears the job's slots), and a stale copy of a write never
   lands after a later write.
3. Replies and results are lost, duplicated and reordered freely: the host side matches
   them by ``seq`` and discards what it no longer waits for.

Everything else (NIC requests, aggregator packets within rule 1, every reply) is lost with
probability ``loss``, else duplicated with probability ``dup``, and each copy is delayed by
up to ``max_delay`` seconds with probability ``reorder`` (so later datagrams overtake it).
"""
from __future__ import annotations

from contract.header import HEADER_BYTES, HEADER_FIELDS, PacketType

from ..switchml.faults import NetworkFaults

__all__ = ["WireFaults", "INBOUND", "OUTBOUND"]

INBOUND, OUTBOUND = "in", "out"
_FIELD = {f.name: f for f in HEADER_FIELDS}
_AGG_TYPES = (PacketType.AGG_ADD_I32, PacketType.AGG_OR32)


def _field(data: bytes, name: str) -> int:
    f = _FIELD[name]
    return int.from_bytes(data[f.offset:f.offset + f.size], "little")


class WireFaults(NetworkFaults):
    """Seeded loss, duplication and delay of datagrams on the board's wire (the fault model
    of :mod:`host.switchml.faults`, in seconds).

    Parameters
    ----------
    rate : float
        Default probability of each fault (``--fault-rate``): loss, duplication and delay.
    seed : int
        Seed of the injector's own random generator (``--fault-seed``).
    loss, dup, reorder : float, optional
        Override one probability (each in [0, 1); loss below 1).
    max_delay : float
        Largest delay of a delayed copy, in seconds.
    """

    def __init__(self, rate: float = 0.0, *, seed: int = 0, loss: float | None = None,
                 dup: float | None = None, reorder: float | None = None,
                 max_delay: float = 0.002):
        rates = {"loss": rate if loss is None else loss, "dup": rate if dup is None else dup,
                 "reorder": rate if reorder is None else reorder}
        for name, p in rates.items():
            if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
                raise ValueError(f"fault probability {name} must be in [0, 1), not {p!r}")
        if not 0.0 < max_delay <= 1.0:
            raise ValueError(f"max_delay must be in (0, 1] seconds, not {max_delay!r}")
        super().__init__(seed=seed, **rates, latency=0.0, max_delay=float(max_delay),
                         ticks=False)

    def stats(self) -> dict:
        return {"loss": self.loss, "dup": self.dup, "reorder": self.reorder,
                "seed": self.seed, "lost": self.lost, "duplicated": self.duplicated,
                "delayed": self.delayed, "held_back": self.held_back}

    def schedule(self, direction: str, src: tuple, payload: bytes, now: float, *,
                 barrier: bool = False, switch: bool = False) -> list[float]:
        """Arrival times of one datagram's copies (none if it is lost).

        ``direction`` is :data:`INBOUND` (to the board) or :data:`OUTBOUND`; ``src`` the
        sender's (ip, port); ``barrier`` marks a control request (rule 2: copies are not
        delayed); ``switch`` a datagram to the aggregator (rule 1 applies).
        """
        times = self.arrivals(now, delay=not barrier)
        if direction == INBOUND and switch and len(payload) >= HEADER_BYTES \
                and _field(payload, "type") in _AGG_TYPES:
            key = (*src, _field(payload, "job"), _field(payload, "worker"),
                   _field(payload, "slot"))
            times = self.hold_in_window_order(key, _field(payload, "seq"), times)
        return times
