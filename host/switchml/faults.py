"""One seeded fault model for the host's simulated networks: loss, duplication, delay
(reordering), and the window order SwitchML needs.

Two networks use it: the simulated network of :mod:`host.switchml.network` (integer ticks,
:class:`~host.switchml.network.TickFaults`) and the virtual board's wire
(seconds, :class:`~host.board.link_faults.WireFaults`). Per transmission, drawn from the model's
own seeded generator:

- it is lost with probability ``loss``;
- else it arrives twice with probability ``dup``;
- each copy arrives after the base ``latency``, plus, with probability ``reorder``, an
  extra delay (so later transmissions overtake it).

**Window order** (``docs/protocol/aggregator-protocol.md`` section 3): every copy of a
worker's packet for a slot arrives before that worker's packet of the next round on the
slot; a stale copy arriving later would be folded into the next round as a new
contribution. :meth:`NetworkFaults.hold_in_window_order` holds a next-round packet back
behind the last copy already scheduled for the previous one. Results and replies need no
such rule: the host matches them by ``seq``.
"""
from __future__ import annotations

import random

__all__ = ["NetworkFaults"]


class NetworkFaults:
    """Seeded loss, duplication and delay of transmissions, with the window order.

    Parameters
    ----------
    seed : int
        Seed of the model's own random generator.
    loss, dup, reorder : float
        Probabilities of a loss, of a second copy, of an extra delay per copy.
    latency : int or float
        Base one-way delay of every copy.
    max_delay : int or float
        Largest extra delay.
    ticks : bool
        Integer time: extra delays are ``1..max_delay`` ticks and a held-back packet
        arrives one tick after the copy it waits for (a tick is delivered as one batch).
        Otherwise continuous time: extra delays are uniform in ``[0, max_delay]`` and a
        held-back packet arrives at the same time as that copy, after it.
    keep_window_order : bool
        Hold next-round packets back (default). False lets stale copies arrive after the
        worker's next round on the slot: only to show that the rule is needed.

    Attributes
    ----------
    lost, duplicated, delayed, held_back : int
        What the model did so far.
    """

    def __init__(self, *, seed: int = 0, loss: float = 0.0, dup: float = 0.0,
                 reorder: float = 0.0, latency=0, max_delay, ticks: bool,
                 keep_window_order: bool = True):
        self.loss, self.dup, self.reorder = loss, dup, reorder
        self.latency, self.max_delay = latency, max_delay
        self.ticks = bool(ticks)
        self.keep_window_order = bool(keep_window_order)
        self.seed = seed
        self._rng = random.Random(seed)
        self._rounds = {}   # window key -> (seq, floor, horizon)
        self.lost = self.duplicated = self.delayed = self.held_back = 0

    @property
    def active(self) -> bool:
        return bool(self.loss or self.dup or self.reorder)

    def arrivals(self, now, *, delay: bool = True) -> list:
        """Arrival times of one transmission's copies (none if it is lost); ``delay=False``
        keeps every copy on the base latency (a barrier that nothing may overtake)."""
        if self.loss and self._rng.random() < self.loss:
            self.lost += 1
            return []
        copies = 2 if self.dup and self._rng.random() < self.dup else 1
        self.duplicated += copies - 1
        times = []
        for _ in range(copies):
            extra = 0
            if delay and self.reorder and self._rng.random() < self.reorder:
                extra = self._rng.randint(1, self.max_delay) if self.ticks \
                    else self._rng.uniform(0.0, self.max_delay)
                self.delayed += 1
            times.append(now + self.latency + extra)
        return times

    def hold_in_window_order(self, key, seq: int, times: list) -> list:
        """``times`` (the copies of a worker's packet ``seq`` on the slot ``key`` names),
        held back behind every copy already scheduled for the worker's previous packet on
        that slot."""
        gap = 1 if self.ticks else 0
        last_seq, floor, horizon = self._rounds.get(key, (None, float("-inf"), float("-inf")))
        if seq != last_seq:              # the worker's next round on this slot
            last_seq, floor = seq, horizon
        held = []
        for t in times:
            if t < floor + gap and self.keep_window_order:
                self.held_back += 1
                t = floor + gap
            held.append(t)
        self._rounds[key] = (last_seq, floor, max([horizon, *held]))
        return held
