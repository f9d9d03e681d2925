"""INCEPTIONN's gradient-centric all-reduce: a ring of workers, every hop through the NIC.

No parameter server: each worker's tensor is cut into N chunks; a reduce-scatter (N-1 steps,
each worker sends one partial-sum chunk to its right neighbour, which adds it) leaves
every worker owning one fully reduced chunk, and an all-gather (N-1 steps) passes the
reduced chunks around. Every hop goes through the sender's NIC transmit path (compress)
and the receiver's NIC receive path (decompress).

Exactness argument, and why every worker ends with the same bits: a hop turns a chunk x
into ``quantize(x)``. In the all-gather the owner keeps ``quantize(x)`` of its reduced chunk
(what it sends), and forwarding ``quantize(x)`` again changes nothing (the codec is
idempotent), so all workers hold identical bits. Each element passes N-1 quantisations in
the reduce-scatter and one in the all-gather, each off by less than 2^-k: the result
differs from the exact sum by less than ``N * 2^-k`` (plus float32 rounding of the adds).

All N workers' NICs are the same gateware and keep no state between packets but their
counters, so one NIC instance serves every hop here (the counters then total the ring).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .golden import inceptionn
from contract.header import HEADER_BYTES

__all__ = ["ring_allreduce", "RingStats", "ring_error_bound"]


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
    """The guaranteed bound on ``|ring result - exact sum|`` before float32 add rounding."""
    return workers * 2.0 ** -k


def _chunks(n, workers):
    edges = np.linspace(0, n, workers + 1).astype(np.int64)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]


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
    chunks = _chunks(n, workers)
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
