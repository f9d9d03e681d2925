"""A board made slow on purpose: a slow transmit path in front of any board backend.

:class:`SlowBoard` wraps a backend (the golden board, say) as the gateware's front end
wraps its engines: every reply the backend sends is stored whole in its service's output
buffer (``EgressBuffer``, sized as the board's, :func:`host.driver.pacing.board_buffers`)
and leaves through one transmit path shared by every service, each datagram after a seeded
random time (``delay``: seconds, drawn uniformly per datagram). A reply that does not fit
its buffer (beats or stored packets) is dropped whole and counted as ``drop_reply_full``,
and not as ``<service>_out``, as the gateware counts it. A switch result sent to several
workers is one stored packet sent once per worker (the gateware's fan-out replays it),
freed after its last copy leaves.

The backend's replies are held, so :class:`~host.board.virtual.VirtualBoard` asks for them
again (``poll``) by :attr:`SlowBoard.next_due`, the time the next one leaves. Use it as
``VirtualBoard(SlowBoard(GoldenBoard(key), delay=(0.005, 0.02), seed=1), port_base=None)``
or :func:`slow_virtual_board`.
"""
from __future__ import annotations

import collections
import heapq
import itertools
import random
import secrets
import time

from contract.network import SERVICE_OFFSETS, Service

from .backend import BoardBackend, Datagram

__all__ = ["SlowBoard", "slow_virtual_board"]

_BY_OFFSET = {offset: service for service, offset in SERVICE_OFFSETS.items()}


class SlowBoard(BoardBackend):
    """``backend`` behind output buffers of the board's sizes and a slow transmit path.

    Parameters
    ----------
    backend : BoardBackend
    delay : (float, float)
        Seconds each datagram takes on the transmit path, drawn uniformly in this range.
    seed : int
        Seeds the draws.
    board : str or None
        Whose output buffers (``constraints/network.toml``; default every board's).
    buffers : dict or None
        ``Service -> ServiceBuffer`` instead of the board's (a test's).
    clock : callable
        Seconds, monotonic (``time.monotonic``).
    """

    def __init__(self, backend: BoardBackend, *, delay=(0.005, 0.02), seed: int = 0,
                 board: str | None = None, buffers=None, clock=time.monotonic):
        from host.driver.pacing import board_buffers

        low, high = (float(d) for d in delay)
        if not 0 <= low <= high:
            raise ValueError(f"delay must be a range 0 <= low <= high, not {delay!r}")
        self.inner = backend
        self.delay = (low, high)
        self.seed = seed
        self.buffers = dict(board_buffers(board) if buffers is None else buffers)
        self.clock = clock
        self._rng = random.Random(seed)
        self._order = itertools.count()
        self._out = []                                    # (leaves, order, Datagram)
        #: per service: (freed at, beats) of every stored packet, oldest first
        self._stored = {s: collections.deque() for s in Service}
        self._tx_free = float("-inf")                     # when the transmit path is free
        self.stats = {"stored": 0, "dropped": 0, "sent": 0, "peak_beats": {},
                      "peak_packets": {}}

    # -- what the socket side sees -------------------------------------------------------

    @property
    def ip(self):
        return self.inner.ip

    @property
    def port_base(self):
        return self.inner.port_base

    @property
    def key(self):
        return getattr(self.inner, "key", None)

    @property
    def transport_options(self):
        return getattr(self.inner, "transport_options", {})

    @property
    def counters(self):
        return self.inner.counters

    def __getattr__(self, name):          # read, write, faults, ...: the wrapped backend's
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def describe(self) -> str:
        return (f"{self.inner.describe()}; slow transmit path {self.delay[0] * 1e3:g}-"
                f"{self.delay[1] * 1e3:g} ms per datagram (seed {self.seed})")

    def close(self) -> None:
        self.inner.close()

    # -- datagrams -----------------------------------------------------------------------

    def deliver(self, datagrams) -> list[Datagram]:
        now = self.clock()
        self._store(self.inner.deliver(datagrams), now)
        return self._leaving(now)

    def poll(self) -> list[Datagram]:
        now = self.clock()
        self._store(self.inner.poll(), now)
        return self._leaving(now)

    @property
    def next_due(self) -> float | None:
        """When the next held datagram leaves (``clock`` time), or None."""
        return self._out[0][0] if self._out else None

    def _store(self, datagrams, now) -> None:
        from host.driver.pacing import reply_beats

        i = 0
        while i < len(datagrams):
            first = datagrams[i]
            copies = 1             # a switch result to several workers: one stored packet
            while (i + copies < len(datagrams)
                   and datagrams[i + copies].src_port == first.src_port
                   and datagrams[i + copies].payload == first.payload
                   and _service(self.inner, first) is Service.SWITCH):
                copies += 1
            group, i = datagrams[i:i + copies], i + copies
            service = _service(self.inner, first)
            if service is None:
                for d in group:
                    self._push(now, d)
                continue
            stored, buffer = self._stored[service], self.buffers[service]
            while stored and stored[0][0] <= now:
                stored.popleft()
            beats = reply_beats(len(first.payload))
            used = sum(b for _, b in stored)
            if len(stored) >= buffer.packets or used + beats > buffer.beats:
                self._drop(service, len(group))
                continue
            leaves = now
            for d in group:
                leaves = max(leaves, self._tx_free) + self._rng.uniform(*self.delay)
                self._tx_free = leaves
                self._push(leaves, d)
            stored.append((leaves, beats))
            self.stats["stored"] += 1
            peaks_b, peaks_p = self.stats["peak_beats"], self.stats["peak_packets"]
            peaks_b[service.value] = max(peaks_b.get(service.value, 0), used + beats)
            peaks_p[service.value] = max(peaks_p.get(service.value, 0), len(stored))

    def _drop(self, service: Service, copies: int) -> None:
        self.stats["dropped"] += 1
        counters = getattr(self.inner, "counters", None)
        if counters is not None:
            mask = 0xFFFF_FFFF
            counters["drop_reply_full"] = (counters["drop_reply_full"] + 1) & mask
            name = f"{service.value}_out"         # counted when sent, in the gateware
            if name in counters:
                counters[name] = (counters[name] - copies) & mask

    def _push(self, leaves, datagram) -> None:
        heapq.heappush(self._out, (leaves, next(self._order), datagram))

    def _leaving(self, now) -> list[Datagram]:
        out = []
        while self._out and self._out[0][0] <= now:
            out.append(heapq.heappop(self._out)[2])
        self.stats["sent"] += len(out)
        return out


def _service(backend, datagram) -> Service | None:
    return _BY_OFFSET.get(datagram.src_port - backend.port_base)


def slow_virtual_board(*, delay=(0.005, 0.02), seed: int = 0, key: int | None = None,
                       board: str | None = None, buffers=None, **golden):
    """A :class:`~host.board.virtual.VirtualBoard` (not started, free ports) serving the
    golden board behind a :class:`SlowBoard`; ``golden``: the golden board's parameters."""
    from .golden import GoldenBoard
    from .virtual import VirtualBoard

    key = secrets.randbits(64) if key is None else key
    slow = SlowBoard(GoldenBoard(key, **golden), delay=delay, seed=seed, board=board,
                     buffers=buffers)
    return VirtualBoard(slow, port_base=None)
