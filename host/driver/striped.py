"""One worker of a job that spans several boards (``docs/protocol/network.md`` section 3, "Several
boards, one job").

Each board holds the job with the same workers and the same number of slots, and the
worker has one :class:`~host.driver.udp_worker.UdpSwitchWorker` per board (its own socket
there: its entry in that board's worker table). :class:`StripedSwitchWorker` cuts every
message into chunks of the boards' ``lanes`` words and sends chunk ``c`` to board
``c mod B`` as that board's chunk ``c div B`` (:mod:`host.switchml.stripe`); the boards
aggregate their parts at the same time (one thread per board, each on its own socket) and
the parts are put back together by chunk. The result is bit for bit what one board gives:
the vector, and the MAX of the exponent bytes over the boards that had chunks.

A board whose part of a message is empty (a vector of fewer than ``B`` chunks) sends
nothing for it, on every worker alike (every worker of the job splits the same length the
same way), so its chunk numbers stay in step on every worker.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import time

import numpy as np

from ..switchml import stripe
from .udp_worker import JobLayout, UdpSwitchWorker, WorkerStats

__all__ = ["StripedSwitchWorker", "check_layouts"]


def check_layouts(layouts) -> tuple[int, int]:
    """``(lanes, slot_count)`` the boards' job layouts share; ValueError naming the boards
    that disagree (a job spans boards only with the same lanes and number of slots, and
    the same job and workers)."""
    layouts = list(layouts)
    if not layouts:
        raise ValueError("no board: a job spans at least one board")
    first = layouts[0]
    for b, layout in enumerate(layouts[1:], 1):
        for field in ("lanes", "slot_count", "job", "workers"):
            if getattr(layout, field) != getattr(first, field):
                raise ValueError(
                    f"the boards of one job must agree on {field}: board 0 has "
                    f"{getattr(first, field)}, board {b} has {getattr(layout, field)} "
                    f"(every board holds the job with the same workers and the same number "
                    f"of slots, docs/protocol/network.md section 3; give slot_count= for "
                    f"boards whose switches differ)")
    return first.lanes, first.slot_count


class StripedSwitchWorker:
    """Worker ``worker`` of a job striped over the boards of ``workers`` (one
    :class:`UdpSwitchWorker` per board, in board order; the list is this object's now:
    :meth:`close` closes them).

    :meth:`set_layout` takes one :class:`JobLayout` per board (as each board's
    ``configure_job`` returned it); :meth:`aggregate` is :meth:`UdpSwitchWorker.aggregate`
    over all of them.
    """

    def __init__(self, workers):
        self.workers = list(workers)
        if not self.workers:
            raise ValueError("a striped worker needs at least one board's worker")
        jobs = {(w.job, w.worker) for w in self.workers}
        if len(jobs) != 1:
            raise ValueError(f"the per-board workers must be the same job and worker, not "
                             f"{sorted(jobs)}")
        (self.job, self.worker), = jobs
        self.layouts: list[JobLayout] | None = None
        self.lanes = None
        self._pool = None
        self._seconds = 0.0
        self._messages = 0
        self._closed = False

    @property
    def boards(self) -> int:
        return len(self.workers)

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """This worker's socket address on each board (its worker table entries)."""
        return [w.address for w in self.workers]

    @property
    def switch_addresses(self) -> list[tuple[str, int]]:
        return [w.switch_address for w in self.workers]

    def set_layout(self, layouts, first_chunk=0) -> None:
        """The job's layout on each board (same lanes, slot count, job and workers);
        ``first_chunk``: one chunk number for every board, or one per board."""
        layouts = list(layouts)
        if len(layouts) != self.boards:
            raise ValueError(f"{len(layouts)} layouts for {self.boards} boards")
        self.lanes, _ = check_layouts(layouts)
        firsts = [first_chunk] * self.boards if np.isscalar(first_chunk) else list(first_chunk)
        if len(firsts) != self.boards:
            raise ValueError(f"{len(firsts)} first chunks for {self.boards} boards")
        for worker, layout, first in zip(self.workers, layouts, firsts):
            worker.set_layout(layout, first)
        self.layouts = layouts

    @property
    def layout(self) -> JobLayout | None:
        """Board 0's layout (the others agree on lanes, slots, job and workers)."""
        return None if self.layouts is None else self.layouts[0]

    def aggregate(self, words, op, *, exponent: int = 0, name: str = "message"):
        """As :meth:`UdpSwitchWorker.aggregate`, the vector striped over the boards.

        Returns ``(vector, exponent)``: the aggregated uint32 vector (bit for bit one
        board's) and the MAX of the workers' ``exponent`` bytes (None when no board had a
        chunk, i.e. an empty vector)."""
        if self._closed:
            from .transport import TransportError
            raise TransportError("the switch worker is closed")
        if self.layouts is None:
            raise RuntimeError("set_layout() first: the worker does not know its job's slots")
        if self.boards == 1:
            return self.workers[0].aggregate(words, op, exponent=exponent, name=name)
        started = time.perf_counter()
        words = np.ascontiguousarray(words).reshape(-1)
        if words.dtype.itemsize != 4 or words.dtype.kind not in "iu":
            raise TypeError(f"expected 32-bit integer words, not {words.dtype}")
        parts = stripe.split(words, self.lanes, self.boards)
        busy = [b for b, part in enumerate(parts) if part.size]
        results: list = [(part.view(np.uint32)[:0].copy(), None) for part in parts]
        errors: list = [None] * self.boards
        self._messages += 1

        def one(b):
            try:
                results[b] = self.workers[b].aggregate(
                    parts[b], op, exponent=exponent,
                    name=f"{name} (board {b} of {self.boards})")
            except BaseException as exc:      # noqa: BLE001 (raised below, in order)
                errors[b] = exc

        try:
            if len(busy) > 1:
                if self._pool is None:
                    self._pool = concurrent.futures.ThreadPoolExecutor(
                        max_workers=self.boards - 1, thread_name_prefix="gradwire-board")
                futures = [self._pool.submit(one, b) for b in busy[1:]]
                one(busy[0])
                for future in futures:
                    future.result()
            elif busy:
                one(busy[0])
        finally:
            self._seconds += time.perf_counter() - started
        for error in errors:
            if error is not None:
                raise error
        vector = stripe.join([v for v, _ in results], words.size, self.lanes)
        exponents = [e for _, e in results if e is not None]
        return vector.astype(np.uint32, copy=False), (max(exponents) if exponents else None)

    # -- what it cost ---------------------------------------------------------------------

    @property
    def board_stats(self) -> list[WorkerStats]:
        """Each board's worker's own figures (packets, bytes, resends, seconds)."""
        return [w.stats for w in self.workers]

    @property
    def stats(self) -> WorkerStats:
        """The boards' figures summed; ``messages`` and ``seconds`` are the striped
        messages and their wall time (the boards run at the same time)."""
        if self.boards == 1:
            return self.workers[0].stats
        total = WorkerStats()
        for s in self.board_stats:
            for field in dataclasses.fields(WorkerStats):
                if field.name not in ("messages", "seconds"):
                    setattr(total, field.name,
                            getattr(total, field.name) + getattr(s, field.name))
        total.messages, total.seconds = self._messages, self._seconds
        return total

    @property
    def rto_ms(self) -> float:
        """The largest of the boards' current packet timeouts (ms)."""
        return max(w.rto_ms for w in self.workers)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        for w in self.workers:
            w.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class StripedSwitchInterface:
    """:class:`~host.driver.switch.SwitchInterface`'s all-reduces with every job striped
    over several boards' switches (one interface per board, in board order): what ``make
    sim --boards N`` runs, with one gateware instance (one harness process) per board.

    The boards must agree on lanes and slots (the job holds the same slots on each). Jobs
    are configured on every board; each board keeps its own chunk count per job.
    """

    def __init__(self, interfaces):
        self.boards = list(interfaces)
        if not self.boards:
            raise ValueError("no board: a job spans at least one board")
        first = self.boards[0]
        for b, other in enumerate(self.boards[1:], 1):
            for field in ("lanes", "slots"):
                if getattr(other, field) != getattr(first, field):
                    raise ValueError(f"the boards of one job must agree on {field}: board 0 "
                                     f"has {getattr(first, field)}, board {b} has "
                                     f"{getattr(other, field)}")
        self.lanes, self.slots = first.lanes, first.slots
        self.jobs = min(i.jobs for i in self.boards)
        self.max_workers = min(i.max_workers for i in self.boards)
        self._next_chunk = {}
        #: per board, what the all-reduces sent it (first transmissions, resends, bytes)
        self.sent = [dict(packets=0, resends=0, bytes=0) for _ in self.boards]

    def configure_job(self, job, workers, slot_base, slot_count, upstream=None):
        """Configure ``job`` alike on every board.

        ``upstream`` is None (no board's job has one) or one
        :class:`host.golden.aggregator.Upstream` (or None) per board, in board order: each
        board aggregates other chunks of the job, so each board's job is a leaf of a parent
        job of its own (one parent job shared by two boards would fold different chunks on
        the same slots).
        """
        upstreams = [None] * len(self.boards) if upstream is None else upstream
        if not isinstance(upstreams, (list, tuple)) or len(upstreams) != len(self.boards):
            raise ValueError(f"upstream must be None or one upstream (or None) per board "
                             f"({len(self.boards)}), each board's job a leaf of its own "
                             f"parent job; got {upstream!r}")
        for interface, board_upstream in zip(self.boards, upstreams):
            interface.configure_job(job, workers, slot_base, slot_count,
                                    upstream=board_upstream)
        self._next_chunk[job] = [0] * len(self.boards)

    def clear_job(self, job):
        for interface in self.boards:
            interface.clear_job(job)
        self._next_chunk.pop(job, None)

    def counters(self) -> dict:
        """Every board's switch counters summed (:meth:`board_counters`: each board's)."""
        total = {}
        for counters in self.board_counters():
            for name, value in counters.items():
                total[name] = total.get(name, 0) + value
        return total

    def board_counters(self) -> list[dict]:
        return [interface.counters() for interface in self.boards]

    def _exchanges(self):
        return [lambda packets, t=interface.transport: t.exchange("agg", packets, idle=32)
                for interface in self.boards]

    def _count(self, packet_stats):
        size = 32 + 4 * self.lanes
        for b, sent in enumerate(self.sent):
            sent["packets"] += packet_stats.board_packets_sent[b]
            sent["resends"] += packet_stats.board_resends[b]
            sent["bytes"] += size * (packet_stats.board_packets_sent[b]
                                     + packet_stats.board_resends[b])

    def allreduce(self, tensors, *, job=0, slot_base=0, slot_count=None, fault=None,
                  configure=True, **options):
        """As :meth:`SwitchInterface.allreduce`, striped over the boards."""
        (result, stats), = self.allreduce_jobs([tensors], jobs=[job],
                                               slot_counts=[slot_count or self.slots - slot_base],
                                               slot_base=slot_base, fault=fault,
                                               configure=configure, **options)
        return result, stats

    def allreduce_jobs(self, tensor_sets, *, jobs=None, slot_counts=None, path="sketch",
                       fault=None, configure=True, slot_base=0, **options):
        """As :meth:`SwitchInterface.allreduce_jobs`, every job striped over the boards.
        The stats also hold ``board_packets_sent`` and ``board_resends`` (per board)."""
        from ..switchml.network import allreduce_jobs_over_transport
        from .switch import _flat_stats, job_requests

        jobs, requests, options = job_requests(
            self, tensor_sets, jobs=jobs, slot_counts=slot_counts, path=path,
            configure=configure, slot_base=slot_base, options=options,
            what="the switches have")
        runs = allreduce_jobs_over_transport(requests, self._exchanges(), lanes=self.lanes,
                                             fault=fault, **options)
        out = []
        for job, (result, stats) in zip(jobs, runs):
            packet_stats = stats["packets"]
            self._next_chunk[job] = list(packet_stats.next_chunk)
            self._count(packet_stats)
            flat = _flat_stats(stats)
            flat["board_packets_sent"] = list(packet_stats.board_packets_sent)
            flat["board_resends"] = list(packet_stats.board_resends)
            out.append((result, flat))
        return out
