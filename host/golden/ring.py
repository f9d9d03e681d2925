"""INCEPTIONN's gradient-centric all-reduce: a ring of workers, every hop through the NIC.

No parameter server: each worker's tensor is cut into N chunks; a reduce-scatter (N-1 steps,
each worker sends one partial-sum chunk to its right neighbour, which adds it) leaves
every worker owning one fully reduced chunk, and an all-gather (N-1 steps) passes the
reduced chunks around. Every hop goes through the sender's NIC transmit path (compress)
and the receiver's NIC receive path (decompress).

The exact algorithm (the same bits as :class:`host.ddp.InceptionnHook`'s ring;
``docs/accuracy.md`` states it too). ``N >= 2`` workers hold
float32 vectors ``x_0 .. x_{N-1}`` of ``n`` values; ``q`` is
:func:`host.golden.inceptionn.quantize` (``decode(encode(.))``) and ``fl`` a float32
addition, rounded to nearest even.

* Chunk ``c`` is ``[c * n // N, (c + 1) * n // N)`` (:func:`ring_chunk_bounds`).
* Worker ``w`` sends to worker ``w + 1`` and receives from ``w - 1`` (mod N).
* Reduce-scatter step ``s = 0 .. N-2``: worker ``w`` sends its chunk ``w - s`` compressed;
  the receiver replaces its own values ``y`` of that chunk by ``fl(decoded + y)``. Chunk
  ``c`` so starts at worker ``c`` and is summed in the order ``c, c+1, .., c+N-1``:
  ``p_0 = x_c``, ``p_j = fl(q(p_{j-1}) + x_{c+j})``.
* Worker ``w`` then owns chunk ``w + 1`` (it holds ``p_{N-1}``) and replaces it by
  ``R = q(p_{N-1})``, what the all-gather carries.
* All-gather step ``s = 0 .. N-2``: worker ``w`` sends its chunk ``w + 1 - s`` compressed;
  the receiver stores the decoded values. The codec is idempotent (``q(R) == R``), so every
  worker ends with ``R`` for every chunk: identical bits.

Error bound (:func:`ring_sum_error_bound`). Write ``q(y) = y - d`` with ``|d| < 2^-k``
(truncation toward zero under the spec's bound) and ``fl(a + b) = a + b + r`` with
``|r| <= 2^-24 |fl(a + b)|`` (round to nearest; additions in the denormal range are
exact). Then ``R - sum_j x_{c+j} = -(d_0 + .. + d_{N-1}) + (r_1 + .. + r_{N-1})``, so for
finite inputs whose partial sums do not overflow::

    |R - sum_j x_{c+j}| < N 2^-k + 2^-24 (|p_1| + .. + |p_{N-1}|)

and, since ``|q(y)| <= |y|`` gives ``|p_j| <= (1 + 2^-24)^j (|x_c| + .. + |x_{c+j}|)``,
a priori::

    |R - sum_j x_{c+j}| < N 2^-k + 2^-24 sum_{j=1}^{N-1} (1 + 2^-24)^j sum_{i=0}^{j} |x_{c+i}|
                        <= N 2^-k + (N - 1) (1 + 2^-24)^(N-1) 2^-24 sum_w |x_w|.

Both terms are needed. ``N 2^-k``: with values just below ``2^-k`` on every worker each
quantisation drops everything and the error is close to ``N 2^-k`` (``(N - 1) 2^-k`` is not
a bound). The rounding term: three workers with values in 1 .. 2001 at k = 15 (nothing is
quantised, every value is raw) miss the exact sum by up to 3.7e-4, four times
``3 * 2^-15 = 9.2e-5``; and ``2^25, 2, 2`` (in ring order, each 2 half an ulp, rounded to
even) give ``2^25`` for the exact ``2^25 + 4``: an error of exactly ``2^-24 (|p_1| + |p_2|)``.

All N workers' NICs are the same gateware and keep no state between packets but their
counters, so one NIC instance serves every hop here (the counters then total the ring).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import inceptionn
from contract.header import HEADER_BYTES

__all__ = ["ring_allreduce", "RingStats", "ring_error_bound", "ring_chunk_bounds",
           "ring_sum_error_bound", "chunk_sum_error_bound"]


@dataclass
class RingStats:
    workers: int
    values: int
    k: int
    #: bytes that crossed the wire (headers included), all hops
    wire_bytes: int = 0
    #: what the same hops would carry as uncompressed RAW_F32 packets
    raw_bytes: int = 0
    packets: int = 0
    hops: int = 0
    #: the wire packets' value classes (tags 00, 01, 10, 11)
    class_counts: list = field(default_factory=lambda: [0, 0, 0, 0])

    @property
    def compression_ratio(self):
        return self.raw_bytes / self.wire_bytes if self.wire_bytes else float("nan")

    def as_dict(self):
        d = dict(self.__dict__)
        d["compression_ratio"] = self.compression_ratio
        return d


def ring_error_bound(workers, k):
    """``N * 2^-k``, the quantisation part of the bound on ``|ring result - exact sum|``.

    It leaves out the float32 rounding of the partial sums: :func:`ring_sum_error_bound`
    gives the whole bound, element by element.
    """
    return workers * 2.0 ** -k


def ring_chunk_bounds(numel: int, world_size: int) -> list:
    """``[(start, stop), ...]`` of the ``world_size`` ring chunks of ``numel`` values.

    Chunk ``c`` is ``[c * numel // world_size, (c + 1) * numel // world_size)``: sizes differ
    by at most one, and some are empty when ``numel < world_size``.
    """
    return [(c * numel // world_size, (c + 1) * numel // world_size) for c in range(world_size)]


def ring_sum_error_bound(tensors, k) -> np.ndarray:
    """Per-element a priori bound on ``|ring result - exact sum|``, rounding included.

    ``N 2^-k + 2^-24 sum_{j=1}^{N-1} (1 + 2^-24)^j sum_{i=0}^{j} |x_{c+i}|`` for every
    element of chunk ``c`` (see the module docstring for the derivation): the ring's result
    is strictly below it for finite inputs whose partial sums do not overflow. One worker
    needs no network and returns its values unchanged: the bound is 0.

    Parameters
    ----------
    tensors : list of array_like
        Every worker's float32 values, in worker order (all the same size).
    k : int
        Error bound exponent, 1..15.

    Returns
    -------
    numpy.ndarray of float64, flattened. It is computed in float64 (relative rounding
    below 1e-15, far inside the bound's own slack of ``2^-k`` per quantisation).
    """
    return chunk_sum_error_bound(tensors, k, first=0, quantisations=len(tensors))


def chunk_sum_error_bound(tensors, k, *, first: int, quantisations: int) -> np.ndarray:
    """The bound of a ring whose chunk ``c`` is summed in the workers' order ``c + first,
    .., c + first + N - 1`` with ``quantisations`` INCEPTIONN quantisations of ``2^-k``
    on the way: ``quantisations 2^-k + 2^-24 sum_{j=1}^{N-1} (1 + 2^-24)^j sum_{i=0}^{j}
    |x_{c+first+i}|`` (:func:`ring_sum_error_bound`: ``first`` 0, ``N`` quantisations; the
    reduce-scatter phase alone, ``host.fsdp``: ``first`` 1, ``N - 1``). 0 for one worker."""
    k = inceptionn.check_k(k)
    stacked = np.stack([np.asarray(t, dtype=np.float32).reshape(-1) for t in tensors])
    workers, n = stacked.shape
    bound = np.zeros(n, dtype=np.float64)
    if workers == 1:
        return bound
    magnitude = np.abs(stacked.astype(np.float64))
    u = 2.0 ** -24
    for c, (a, b) in enumerate(ring_chunk_bounds(n, workers)):
        prefix = np.zeros(b - a, dtype=np.float64)
        rounding = np.zeros(b - a, dtype=np.float64)
        for j in range(workers):
            prefix += magnitude[(c + first + j) % workers, a:b]
            if j:
                rounding += (1.0 + u) ** j * prefix
        bound[a:b] = quantisations * 2.0 ** -k + u * rounding
    return bound


def ring_allreduce(tensors, nic, k=10, *, progress=None):
    """Sum equal-length float32 tensors over a ring of NICs.

    Parameters
    ----------
    tensors : list of np.ndarray
        One float32 tensor per worker (2 or more workers), all the same shape.
    nic : host.driver.nic.NicInterface
        The NIC every hop goes through.
    k : int
        Error-bound exponent, 1..15.
    progress : callable, optional
        Called with the number of hops done after every step.

    Returns
    -------
    results : list of np.ndarray
        Each worker's all-reduced tensor (bit-identical across workers).
    stats : RingStats
    """
    workers = len(tensors)
    if workers < 2:
        raise ValueError(f"a ring needs at least 2 workers, got {workers}")
    k = inceptionn.check_k(k)
    shape = np.shape(tensors[0])
    for w, t in enumerate(tensors):
        if np.asarray(t).dtype != np.float32 or np.shape(t) != shape:
            raise ValueError(f"worker {w}: expected a float32 tensor of shape {shape}, got "
                             f"{np.asarray(t).dtype} {np.shape(t)}")
    acc = [np.array(t, dtype=np.float32).ravel() for t in tensors]
    n = acc[0].size
    chunks = ring_chunk_bounds(n, workers)
    stats = RingStats(workers=workers, values=n, k=k)

    def hop_step(step, chunk_of_sender, combine):
        """All workers send one chunk to their right neighbour at once, through the NIC."""
        sent = {}
        for w in range(workers):
            a, b = chunks[chunk_of_sender(w)]
            sent[w] = (a, b)
        wire = []
        for w, (a, b) in sent.items():
            wire += nic.transmit(acc[w][a:b], k, worker=w, seq=step, offset=a)
        stats.packets += len(wire)
        stats.wire_bytes += sum(HEADER_BYTES + len(p.payload) for p in wire)
        stats.raw_bytes += sum(HEADER_BYTES + 4 * p.header.count for p in wire)
        for w, (a, b) in sent.items():
            tags = inceptionn.classify(acc[w][a:b], k)
            stats.class_counts = [c + int(np.count_nonzero(tags == t))
                                  for t, c in enumerate(stats.class_counts)]
        by_sender = {w: [] for w in range(workers)}
        for p in wire:
            by_sender[p.header.worker].append(p)
        for w, (a, b) in sent.items():
            received = nic.receive(by_sender[w], b - a, offset=a)
            combine((w + 1) % workers, a, b, received)
        stats.hops += workers
        if progress:
            progress(stats.hops)

    def add(dst, a, b, values):
        acc[dst][a:b] += values

    def store(dst, a, b, values):
        acc[dst][a:b] = values

    # Reduce-scatter: after step s, worker w holds the sum of s+2 workers' chunk (w - s - 1).
    for step in range(workers - 1):
        hop_step(step, lambda w, s=step: (w - s) % workers, add)
    # Worker w now owns chunk (w + 1) % N. It keeps what the wire carries of it.
    for w in range(workers):
        a, b = chunks[(w + 1) % workers]
        acc[w][a:b] = inceptionn.quantize(acc[w][a:b], k)
    # All-gather.
    for step in range(workers - 1):
        hop_step(workers - 1 + step, lambda w, s=step: (w + 1 - s) % workers, store)
    return [a.reshape(shape) for a in acc], stats
