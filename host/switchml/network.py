"""Host side of the in-network path: SwitchML workers on a simulated network.

Each worker's vector of 32-bit words (an index bitmap for ``AGG_OR32``, an int32 sketch or
fallback vector for ``AGG_ADD_I32``) goes through the switch as the aggregator protocol
says (``docs/protocol/aggregator-protocol.md`` section 3), one
:class:`~host.switchml.window.SwitchWorkerWindow` per worker and phase: chunks of P lanes
over the job's slot pool, one outstanding packet per slot, resends on timeouts, results
matched by ``seq``. A worker's chunk numbers count on over its phases, so versions keep
alternating.

The network is a simulated clock (an event loop in integer ticks) with an optional
:class:`TickFaults` (the fault model of :mod:`host.switchml.faults`) that loses,
duplicates and delays (reorders) packets both ways. Its one rule, which SwitchML's scheme needs (``docs/protocol/aggregator-protocol.md``
section 3: a worker reuses a slot with the other version only after it has the result of
that slot's previous round, one round back, not two): **every copy of a worker's packet for
a slot reaches the switch before that worker's next-round packet for the same slot does.** A
stale copy that arrived later would find the worker's seen bit already moved to the other
version and be folded in as a new contribution, corrupting the slot
(``tests/host/golden/test_aggregator.py`` shows it). Copies of the *same* packet, other workers'
packets and all results may be reordered freely.

The engine talks to the switch through a **transport**: any callable
``send(packets: list[Packet]) -> list[Packet]`` that feeds packets to the aggregator in
order and returns what it emits (e.g. :func:`host.golden.aggregator.model_transport`, or a
hardware driver's ``lambda ps: transport.exchange("agg", ps)``). Configuring the job on the
switch is the caller's business.

Several jobs can run at once over one transport (:func:`run_jobs`,
:func:`allreduce_jobs_over_transport`): every worker of every job is an endpoint of the same
simulated clock, their packets meet in the same exchanges, and results are routed by the
header's ``job``. The jobs must have distinct job numbers and disjoint slot ranges (what
the switch's control interface enforces).

One job may also span several boards (``docs/protocol/network.md`` section 3): give
:func:`run_jobs` (or :func:`allreduce_jobs_over_transport`) one transport per board. Every
phase's vector is then striped by chunk (:mod:`host.switchml.stripe`: chunk ``c`` to board
``c mod B`` as that board's chunk ``c div B``), each worker keeps one window and one chunk
count per board, and the boards' results are put back together by chunk before the
protocol sees them: bit for bit one board's.

Entry points: :func:`run_allreduce_packets` (LHC all-reduce through an
:class:`~host.golden.aggregator.AggregatorModel`), :func:`allreduce_over_transport` (the same over
any transport; ``path`` = "sketch", "dense" or "auto" as in
:func:`host.golden.lhc.allreduce`), :func:`allreduce_jobs_over_transport` (several at
once), :func:`aggregate_phase` (one OR/ADD vector per worker), and the lower-level
:func:`run_protocols` / :func:`run_jobs`. Packetisation (``make_packets``,
``collect_results``) is :mod:`host.switchml.window`'s.
"""
from __future__ import annotations

import dataclasses
import heapq
import itertools
from typing import Callable, Generator, Sequence

import numpy as np

from ..golden import lhc
from ..golden.aggregator import AggregatorModel, model_transport
from . import stripe
from .faults import NetworkFaults
from .window import ProtocolError, SwitchWorkerWindow, as_words, check_layout
from contract.header import PacketType
from contract.packet import Packet

__all__ = [
    "Phase", "TickFaults",
    "PacketStats", "JobSpec", "run_protocols", "run_jobs", "aggregate_phase", "lhc_protocol",
    "allreduce_over_transport", "allreduce_jobs_over_transport", "run_allreduce_packets",
    "DEFAULT_TIMEOUT",
]

#: what carries a batch of packets to the switch and returns what it emits (the module
#: docstring's "transport"; the driver's Transport class is another thing)
PacketExchange = Callable[[list], list]

#: Ticks a worker waits for a result before resending.
DEFAULT_TIMEOUT = 24


# ---------------------------------------------------------------------------------------
# the simulated network

class TickFaults(NetworkFaults):
    """Loses, duplicates and delays packets on the simulated network, reproducibly (the
    fault model of :mod:`host.switchml.faults`, in ticks).

    Parameters
    ----------
    seed : int
        Seed of the model's own random generator.
    loss : float
        Probability that a transmission (worker to switch, or one copy of a result to one
        worker) is lost.
    dup : float
        Probability that a transmission that was not lost is delivered twice (the copy has
        its own random delay).
    reorder : float
        Probability that a delivery gets an extra delay of 1..``max_delay`` ticks, so that
        later packets overtake it.
    max_delay : int
        Largest extra delay in ticks.
    latency : int
        Base one-way latency in ticks (>= 1).
    keep_window_order : bool
        Enforce the windowing bound below (default). False lets stale copies arrive after
        the worker's next round on the slot: only to show that the bound is needed.

    Notes
    -----
    Worker-to-switch deliveries keep the windowing bound (module docstring): per (job,
    worker, slot), a packet with a new ``seq`` is never delivered before the last delivery
    already scheduled for the previous ``seq`` (it is held back if needed).
    """

    def __init__(self, seed: int = 0, *, loss: float = 0.0, dup: float = 0.0,
                 reorder: float = 0.0, max_delay: int = 8, latency: int = 1,
                 keep_window_order: bool = True):
        for name, p in (("loss", loss), ("dup", dup), ("reorder", reorder)):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], got {p!r}")
        if loss >= 1.0:
            raise ValueError("loss = 1 would never deliver anything")
        if int(max_delay) != max_delay or max_delay < 1:
            raise ValueError(f"max_delay must be a positive integer, got {max_delay!r}")
        if int(latency) != latency or latency < 1:
            raise ValueError(f"latency must be a positive integer, got {latency!r}")
        super().__init__(seed=seed, loss=loss, dup=dup, reorder=reorder, latency=int(latency),
                         max_delay=int(max_delay), ticks=True,
                         keep_window_order=keep_window_order)

    def to_switch(self, packet: Packet, now: int, board: int = 0) -> list[int]:
        """Arrival ticks at the switch (of board ``board``, for a job over several) of one
        transmission of ``packet`` (maybe none)."""
        h = packet.header
        key = (h.job, h.worker, h.slot) + ((board,) if board else ())
        return self.hold_in_window_order(key, h.seq, self.arrivals(now))

    def to_worker(self, packet: Packet, worker: int, now: int) -> list[int]:
        """Arrival ticks at ``worker`` of one copy of a result (maybe none)."""
        return self.arrivals(now)


class _NoFaults(TickFaults):
    def __init__(self):
        super().__init__()


# ---------------------------------------------------------------------------------------
# windowed workers

@dataclasses.dataclass(frozen=True)
class Phase:
    """What a worker protocol yields: send ``words`` with ``op``; it receives back
    ``(aggregated uint32 vector, aggregated exponent or None)``."""
    name: str
    op: PacketType
    words: np.ndarray
    exponent: int = 0


@dataclasses.dataclass
class PacketStats:
    """Totals of one packet-level run (all workers)."""
    workers: int = 0
    lanes: int = 0
    slot_count: int = 0
    chunks: dict = dataclasses.field(default_factory=dict)       # phase -> chunks
    packets_sent: int = 0          # first transmissions
    resends: int = 0               # timeout retransmissions
    results_accepted: int = 0
    results_ignored: int = 0       # duplicates, stale, already answered
    results_multicast: int = 0
    results_unicast: int = 0
    lost: int = 0
    duplicated: int = 0
    delayed: int = 0
    held_back: int = 0
    ticks: int = 0
    next_chunk: int = 0            # first chunk number free for the next message
    wire_bytes_per_worker: dict = dataclasses.field(default_factory=dict)   # phase -> bytes

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class _SimulatedWorker:
    """One worker on the simulated network: drives its protocol generator, one
    :class:`~host.switchml.window.SwitchWorkerWindow` per phase."""

    def __init__(self, worker, protocol, *, job, slot_base, slot_count, lanes, first_chunk,
                 stats, boards=1):
        self.worker, self.protocol = worker, protocol
        self.job, self.slot_base, self.slot_count, self.lanes = job, slot_base, slot_count, lanes
        self.boards = boards
        if boards == 1:
            self.next_chunk = first_chunk
        else:
            # one chunk count per board; on one board ``window`` is the only window
            self.next_chunks = list(first_chunk)
            self.windows: list = [None] * boards
            self._parts = None
        self.stats = stats
        self.window: SwitchWorkerWindow | None = None
        self.finished = False
        self.result = None
        self.phase = None
        self.phase_log = []        # (name, first_chunk, chunks) for cross-worker checks

    @property
    def outstanding(self) -> dict:
        if self.boards > 1:
            return {(b, g): chunk for b, window in enumerate(self.windows)
                    if window is not None for g, chunk in window.outstanding.items()}
        return self.window.outstanding if self.window is not None else {}

    @property
    def board_next_chunk(self) -> list:
        return [self.next_chunk] if self.boards == 1 else list(self.next_chunks)

    def start(self):
        return self._advance(None, first=True)

    def _advance(self, value, first=False):
        """Feed the finished phase to the protocol until it asks for a non-empty phase."""
        while True:
            try:
                phase = next(self.protocol) if first else self.protocol.send(value)
            except StopIteration as stop:
                self.finished, self.result = True, stop.value
                self.phase = self.window = None
                return []
            first = False
            if not isinstance(phase, Phase):
                raise TypeError(f"a worker protocol must yield Phase objects, got {phase!r}")
            words = as_words(phase.words)
            if self.boards > 1:
                if words.size == 0:
                    self.phase_log.append((phase.name, tuple(self.next_chunks), 0))
                    value = (words.copy(), None)
                    continue
                return self._start_striped(phase, words)
            if words.size == 0:
                self.phase_log.append((phase.name, self.next_chunk, 0))
                value = (words.copy(), None)
                continue
            window = SwitchWorkerWindow(words, op=phase.op, job=self.job, worker=self.worker,
                                        slot_base=self.slot_base, slot_count=self.slot_count,
                                        lanes=self.lanes, first_chunk=self.next_chunk,
                                        exponent=phase.exponent)
            self.phase_log.append((phase.name, self.next_chunk, window.chunks))
            if self.worker == 0:
                self.stats.chunks[phase.name] = \
                    self.stats.chunks.get(phase.name, 0) + window.chunks
            self.next_chunk = window.end_chunk
            self.phase, self.window = phase, window
            return window.start()

    def _start_striped(self, phase, words):
        """The phase's vector striped over the boards: one window per board with chunks
        (``(board, packet)`` pairs to send)."""
        parts = stripe.split(words, self.lanes, self.boards)
        self._parts = (words.size, [None] * self.boards)
        out, chunks = [], 0
        for b, part in enumerate(parts):
            if not part.size:
                self.windows[b] = None
                self._parts[1][b] = (part.copy(), None)
                continue
            window = SwitchWorkerWindow(part, op=phase.op, job=self.job, worker=self.worker,
                                        slot_base=self.slot_base, slot_count=self.slot_count,
                                        lanes=self.lanes, first_chunk=self.next_chunks[b],
                                        exponent=phase.exponent)
            self.next_chunks[b] = window.end_chunk
            self.windows[b] = window
            chunks += window.chunks
            out += [(b, packet) for packet in window.start()]
        self.phase_log.append((phase.name, tuple(self.next_chunks), chunks))
        if self.worker == 0:
            self.stats.chunks[phase.name] = self.stats.chunks.get(phase.name, 0) + chunks
        self.phase, self.window = phase, None
        return out

    def resend(self, g, attempt, board=0):
        if self.boards > 1:
            window = self.windows[board]
            return window.resend(g, attempt) if window is not None else None
        return self.window.resend(g, attempt) if self.window is not None else None

    def on_result(self, packet, board=0):
        """Returns (accepted, packets to send next); on several boards the packets are
        ``(board, packet)`` pairs."""
        if self.boards > 1:
            return self._on_striped_result(packet, board)
        if self.window is None:
            return False, []
        accepted, out = self.window.on_result(packet)
        if accepted and self.window.done:
            out = out + self._advance(self.window.result())
        return accepted, out

    def _on_striped_result(self, packet, board):
        window = self.windows[board]
        if window is None:
            return False, []
        accepted, out = window.on_result(packet)
        out = [(board, p) for p in out]
        if accepted and window.done:
            size, results = self._parts
            results[board] = window.result()
            self.windows[board] = None
            if all(w is None for w in self.windows):
                vector = stripe.join([v for v, _ in results], size, self.lanes)
                exponents = [e for _, e in results if e is not None]
                self._parts = None
                out = out + self._advance((vector.astype(np.uint32, copy=False),
                                           max(exponents) if exponents else None))
        return accepted, out


_TO_SWITCH, _TO_WORKER, _TIMEOUT = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """One job of a concurrent run (:func:`run_jobs`): a protocol generator per worker, the
    job number and its slot pool (absolute slots ``[slot_base, slot_base + slot_count)``),
    and the chunk number its message starts at."""
    protocols: Sequence
    job: int = 0
    slot_base: int = 0
    slot_count: int = 1
    first_chunk: int = 0


def run_protocols(protocols: Sequence[Generator], transport: PacketExchange, *, job: int = 0,
                  slot_base: int = 0, slot_count: int, lanes: int,
                  fault: TickFaults | None = None, timeout: int = DEFAULT_TIMEOUT,
                  first_chunk: int = 0, max_ticks: int = 10_000_000):
    """Run one protocol generator per worker over ``transport`` on a simulated clock.

    A protocol yields :class:`Phase` objects and receives ``(vector, exponent)`` back for
    each; its return value is the worker's result. A worker starts its next phase as soon
    as its own previous phase is complete, independently of the others. Empty phases send
    nothing and give back ``(empty vector, None)``. Every worker must produce phases of the
    same sizes (ProtocolError otherwise).

    Returns
    -------
    results : list
        Each worker's protocol return value.
    stats : PacketStats
    """
    ((results, stats),) = run_jobs(
        [JobSpec(list(protocols), job=job, slot_base=slot_base, slot_count=slot_count,
                 first_chunk=first_chunk)],
        transport, lanes=lanes, fault=fault, timeout=timeout, max_ticks=max_ticks)
    return results, stats


def _check_jobs(jobs, lanes):
    if not jobs:
        raise ValueError("no job to run")
    seen = {}
    for spec in jobs:
        n = len(spec.protocols)
        if not 1 <= n <= 32:
            raise ValueError(f"job {spec.job}: 1..32 workers, got {n}")
        check_layout(PacketType.AGG_ADD_I32, spec.job, 0, spec.slot_base, spec.slot_count,
                      lanes)
        if spec.job in seen:
            raise ValueError(f"job {spec.job} appears twice in one run")
        for other in seen.values():
            if spec.slot_base < other.slot_base + other.slot_count \
                    and other.slot_base < spec.slot_base + spec.slot_count:
                raise ValueError(f"jobs {other.job} and {spec.job} share slots: their ranges "
                                 f"must be disjoint")
        seen[spec.job] = spec


def _first_chunks(first_chunk, boards):
    """A job's first chunk number on each of ``boards`` boards (one number for all, or one
    per board)."""
    if np.isscalar(first_chunk):
        return [int(first_chunk)] * boards
    firsts = [int(c) for c in first_chunk]
    if len(firsts) != boards:
        raise ValueError(f"{len(firsts)} first chunks for {boards} boards")
    return firsts


def run_jobs(jobs: Sequence[JobSpec], transport, *, lanes: int,
             fault: TickFaults | None = None, timeout: int = DEFAULT_TIMEOUT,
             max_ticks: int = 10_000_000):
    """Run several jobs' worker protocols at once over one ``transport`` and one clock.

    Every worker of every job is an endpoint of the same event loop, so the jobs' packets
    share the exchanges (the switch sees them interleaved); results go to the job named in
    their header. Per job as :func:`run_protocols`.

    ``transport`` may also be a sequence of transports, one per board of jobs that span
    several boards (module docstring): every phase is striped over them by chunk, and a
    job's ``first_chunk`` is one number for every board or one per board.

    Returns
    -------
    list of ``(results, PacketStats)``, one per job, in the order of ``jobs``; a job's
    ``stats.ticks`` is the tick its last worker finished. On several boards the stats'
    ``next_chunk`` is a list (per board), and they also have ``board_packets_sent`` and
    ``board_resends`` (lists per board; not dataclass fields).
    """
    jobs = list(jobs)
    _check_jobs(jobs, lanes)
    if int(timeout) != timeout or timeout < 1:
        raise ValueError(f"timeout must be a positive number of ticks, got {timeout!r}")
    exchanges = [transport] if callable(transport) else list(transport)
    boards = len(exchanges)
    if not boards:
        raise ValueError("no transport: a job spans at least one board")
    fault = fault if fault is not None else _NoFaults()
    by_job = {spec.job: j for j, spec in enumerate(jobs)}
    stats = [PacketStats(workers=len(spec.protocols), lanes=lanes, slot_count=spec.slot_count)
             for spec in jobs]
    if boards > 1:
        for s in stats:
            s.board_packets_sent, s.board_resends = [0] * boards, [0] * boards
    endpoints = [[_SimulatedWorker(w, iter(proto), job=spec.job, slot_base=spec.slot_base,
                            slot_count=spec.slot_count, lanes=lanes,
                            first_chunk=spec.first_chunk if boards == 1
                            else _first_chunks(spec.first_chunk, boards),
                            stats=stats[j], boards=boards)
                  for w, proto in enumerate(spec.protocols)] for j, spec in enumerate(jobs)]
    finished = [None] * len(jobs)
    packet_bytes = 32 + 4 * lanes
    events = []
    order = itertools.count()

    def transmit(j, w, packet, now, attempt, board=0):
        arrivals = fault.to_switch(packet, now, board) if boards > 1 \
            else fault.to_switch(packet, now)
        for t in arrivals:
            heapq.heappush(events, (t, next(order), _TO_SWITCH, (board, packet)))
        heapq.heappush(events, (now + timeout, next(order), _TIMEOUT,
                                (j, w, packet.header.seq, attempt, board)))
        if w == 0:
            name = endpoints[j][w].phase.name
            per_worker = stats[j].wire_bytes_per_worker
            per_worker[name] = per_worker.get(name, 0) + packet_bytes

    def send_new(j, w, packets, now):
        # one board: packets; several: (board, packet) pairs
        for item in packets:
            board, packet = item if boards > 1 else (0, item)
            stats[j].packets_sent += 1
            if boards > 1:
                stats[j].board_packets_sent[board] += 1
            transmit(j, w, packet, now, 0, board)

    def note_finished(now):
        for j, job_endpoints in enumerate(endpoints):
            if finished[j] is None and all(e.finished for e in job_endpoints):
                finished[j] = now

    for j, job_endpoints in enumerate(endpoints):
        for w, endpoint in enumerate(job_endpoints):
            send_new(j, w, endpoint.start(), 0)
    note_finished(0)
    now = 0
    while not all(e.finished for job_endpoints in endpoints for e in job_endpoints):
        if not events:
            raise ProtocolError("deadlock: nothing in flight but workers unfinished")
        now = events[0][0]
        if now > max_ticks:
            waiting = {(e.job, e.worker): sorted(e.outstanding)[:5]
                       for job_endpoints in endpoints for e in job_endpoints if e.outstanding}
            raise ProtocolError(f"no completion after {max_ticks} ticks; outstanding chunks "
                                f"(first few per job and worker): {waiting}")
        batch, deliveries, timeouts = [], [], []
        while events and events[0][0] == now:
            _, _, kind, item = heapq.heappop(events)
            (batch if kind == _TO_SWITCH else deliveries if kind == _TO_WORKER
             else timeouts).append(item)
        outputs = []
        for board, exchange in enumerate(exchanges):
            packets = [packet for b, packet in batch if b == board]
            if packets:
                outputs += [(board, out) for out in exchange(packets)]
        if outputs:
            for board, out in outputs:
                h = out.header
                j = by_job.get(h.job)
                if j is None:
                    raise ProtocolError(f"result for a job that is not running: {out}")
                n = len(endpoints[j])
                if h.worker == 0xFF:
                    stats[j].results_multicast += 1
                    targets = range(n)
                elif h.worker < n:
                    stats[j].results_unicast += 1
                    targets = (h.worker,)
                else:
                    raise ProtocolError(f"result for unknown worker: {out}")
                for w in targets:
                    for t in fault.to_worker(out, w, now):
                        heapq.heappush(events, (t, next(order), _TO_WORKER,
                                                (j, w, board, out)))
        for j, w, board, packet in deliveries:
            accepted, following = endpoints[j][w].on_result(packet, board) if boards > 1 \
                else endpoints[j][w].on_result(packet)
            if accepted:
                stats[j].results_accepted += 1
            else:
                stats[j].results_ignored += 1
            send_new(j, w, following, now)
        for j, w, seq, attempt, board in timeouts:
            packet = endpoints[j][w].resend(seq, attempt, board) if boards > 1 \
                else endpoints[j][w].resend(seq, attempt)
            if packet is not None:
                stats[j].resends += 1
                if boards > 1:
                    stats[j].board_resends[board] += 1
                transmit(j, w, packet, now, attempt + 1, board)
        note_finished(now)
    out = []
    for j, job_endpoints in enumerate(endpoints):
        logs = {tuple(e.phase_log) for e in job_endpoints}
        if len(logs) != 1:
            raise ProtocolError(f"job {jobs[j].job}: workers disagree on phase sizes: "
                                f"{sorted(logs)}")
        s = stats[j]
        s.ticks = finished[j] if finished[j] is not None else now
        s.next_chunk = job_endpoints[0].next_chunk if boards == 1 \
            else job_endpoints[0].board_next_chunk
        # The fault injector is shared: its totals are the whole run's.
        s.lost, s.duplicated = fault.lost, fault.duplicated
        s.delayed, s.held_back = fault.delayed, fault.held_back
        out.append(([e.result for e in job_endpoints], s))
    return out


def aggregate_phase(vectors: Sequence, transport: PacketExchange, *, op, exponents=None,
                    **options):
    """Aggregate one vector per worker (OR or wrap-around ADD) through ``transport``.

    ``options`` go to :func:`run_protocols` (job, slot_base, slot_count, lanes, fault,
    timeout, first_chunk). Returns ``(vector uint32, exponent or None, PacketStats)``;
    raises ProtocolError if workers ended with different vectors.
    """
    vectors = [as_words(v) for v in vectors]
    exponents = [0] * len(vectors) if exponents is None else list(exponents)

    def protocol(words, exponent):
        result = yield Phase("phase", op, words, exponent)
        return result

    results, stats = run_protocols([protocol(v, e) for v, e in zip(vectors, exponents)],
                                   transport, **options)
    for vector, exponent in results[1:]:
        if not np.array_equal(vector, results[0][0]) or exponent != results[0][1]:
            raise ProtocolError("workers received different aggregates")
    return results[0][0], results[0][1], stats


# ---------------------------------------------------------------------------------------
# the LHC all-reduce over packets

def lhc_protocol(worker: lhc.LhcWorker):
    """One worker's LHC all-reduce as a protocol generator.

    Phases by the worker's ``path``: "sketch": index, sketch, fallback; "dense": exponent
    (one word) and dense; "auto": index, then dense or sketch and fallback as the plan
    chose (:func:`host.golden.lhc.choose_path`). Returns ``(result, LhcStats)`` like
    :meth:`host.golden.lhc.LhcWorker.finish`.
    """
    first = "exponent" if worker.path == "dense" else "index"
    merged, e_max = yield Phase(first, PacketType.AGG_OR32, worker.phase_a_words,
                                worker.exponent)
    if e_max is None:            # empty tensor: no index chunks, so nothing was aggregated
        e_max = lhc.EXPONENT_ZERO
    if worker.plan_phase(merged, e_max) == "dense":
        dense = worker.dense_phase(merged, e_max, worker.plan)
        dense_sum, _ = yield Phase("dense", PacketType.AGG_ADD_I32, dense.view(np.uint32))
        return worker.finish(dense_sum.view(np.int32))
    sketch = worker.sketch_phase(merged, e_max, worker.plan)
    sketch_sum, _ = yield Phase("sketch", PacketType.AGG_ADD_I32, sketch.view(np.uint32))
    fallback = worker.fallback_phase(sketch_sum.view(np.int32))
    fallback_sum, _ = yield Phase("fallback", PacketType.AGG_ADD_I32, fallback.view(np.uint32))
    return worker.finish(fallback_sum.view(np.int32))


def _lhc_workers(tensors, *, load, r_min, path):
    tensors = list(tensors)
    lhc._check_workers(len(tensors))
    shapes = {np.shape(t) for t in tensors}
    if len(shapes) != 1:
        raise ValueError(f"all workers' tensors must have the same shape, got {sorted(shapes)}")
    return [lhc.LhcWorker(t, len(tensors), load=load, r_min=r_min, path=path,
                          name=f"worker {w}'s tensor") for w, t in enumerate(tensors)]


def _agreed_result(results, packet_stats, what="worker"):
    result, lhc_stats = results[0]
    for w, (other, other_stats) in enumerate(results[1:], 1):
        if not np.array_equal(other.view(np.uint32), result.view(np.uint32)) \
                or other_stats != lhc_stats:
            raise ProtocolError(f"{what} {w} decoded a different result than {what} 0")
    return result, {"lhc": lhc_stats, "packets": packet_stats}


def allreduce_over_transport(tensors, transport: PacketExchange, *, slot_count: int, lanes: int,
                             job: int = 0, slot_base: int = 0,
                             load: float = lhc.DEFAULT_LOAD, r_min: int = 1,
                             path: str = "sketch", fault: TickFaults | None = None,
                             timeout: int = DEFAULT_TIMEOUT, first_chunk: int = 0,
                             max_ticks: int = 10_000_000):
    """LHC all-reduce of ``tensors`` (one per worker) through a switch behind ``transport``.

    The job must already be configured on the switch with ``len(tensors)`` workers and the
    slot range ``[slot_base, slot_base + slot_count)``, with slot state fresh or continuing
    from a previous message whose ``next_chunk`` is passed as ``first_chunk``. ``path``:
    "sketch" (default), "dense" or "auto" (:func:`host.golden.lhc.allreduce`).

    Returns
    -------
    result : numpy.ndarray of float32
        Bit for bit what :func:`host.golden.lhc.allreduce` gives (with the same ``path``,
        and in fact on every path).
    stats : dict
        ``{"lhc": LhcStats, "packets": PacketStats}``.
    """
    workers = _lhc_workers(tensors, load=load, r_min=r_min, path=path)
    results, packet_stats = run_protocols(
        [lhc_protocol(w) for w in workers], transport, job=job, slot_base=slot_base,
        slot_count=slot_count, lanes=lanes, fault=fault, timeout=timeout,
        first_chunk=first_chunk, max_ticks=max_ticks)
    return _agreed_result(results, packet_stats)


def allreduce_jobs_over_transport(requests: Sequence[dict], transport: PacketExchange, *,
                                  lanes: int, fault: TickFaults | None = None,
                                  timeout: int = DEFAULT_TIMEOUT,
                                  max_ticks: int = 10_000_000):
    """Several LHC all-reduces at once, each its own job, through one switch.

    Each request is a dict with ``tensors`` (one per worker of that job), ``job``,
    ``slot_base``, ``slot_count`` and optionally ``first_chunk``, ``load``, ``r_min`` and
    ``path`` (defaults as :func:`allreduce_over_transport`). Every job must be configured on
    the switch already (its workers, its slot range; ranges disjoint).

    Returns
    -------
    list of ``(result, {"lhc": LhcStats, "packets": PacketStats})``, in request order.
    """
    specs, known = [], {"tensors", "job", "slot_base", "slot_count", "first_chunk", "load",
                        "r_min", "path"}
    for request in requests:
        unknown = set(request) - known
        if unknown:
            raise ValueError(f"unknown request fields {sorted(unknown)}")
        workers = _lhc_workers(request["tensors"], load=request.get("load", lhc.DEFAULT_LOAD),
                               r_min=request.get("r_min", 1),
                               path=request.get("path", "sketch"))
        specs.append(JobSpec([lhc_protocol(w) for w in workers], job=request["job"],
                             slot_base=request["slot_base"], slot_count=request["slot_count"],
                             first_chunk=request.get("first_chunk", 0)))
    runs = run_jobs(specs, transport, lanes=lanes, fault=fault, timeout=timeout,
                    max_ticks=max_ticks)
    return [_agreed_result(results, packet_stats, what=f"job {spec.job}: worker")
            for spec, (results, packet_stats) in zip(specs, runs)]


def run_allreduce_packets(tensors, model: AggregatorModel, *, job: int = 0,
                          slot_base: int = 0, slot_count: int | None = None,
                          configure: bool = True, **options):
    """LHC all-reduce packet by packet through an :class:`AggregatorModel`.

    With ``configure`` (default) the job is (re)configured first, which resets its slots,
    so the message starts at chunk 0. ``slot_count`` defaults to the rest of the pool from
    ``slot_base``. Other options as :func:`allreduce_over_transport` (``fault``, ``load``,
    ``r_min``, ``timeout``, ...).
    """
    if slot_count is None:
        slot_count = model.slots - slot_base
    if configure:
        model.configure_job(job, len(tensors), slot_base, slot_count)
    return allreduce_over_transport(tensors, model_transport(model), job=job,
                                    slot_base=slot_base, slot_count=slot_count,
                                    lanes=model.lanes, **options)
