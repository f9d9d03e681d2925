"""PyTorch DDP communication hooks that reproduce the two hardware paths' arithmetic.

Both hooks are callable objects for :meth:`torch.nn.parallel.DistributedDataParallel.
register_comm_hook`::

    ddp_model.register_comm_hook(state=None, hook=InceptionnHook(k=10))
    ddp_model.register_comm_hook(state=None, hook=LhcHook())

``state`` is ``None`` (the default process group) or a :class:`torch.distributed.ProcessGroup`.
They exchange CPU tensors over gloo, for any bucket size (also buckets smaller
than the world size or not a multiple of it), and compute through the NumPy golden models
(:mod:`host.golden.inceptionn`, :mod:`host.golden.lhc`), so their arithmetic is, bit for
bit, the arithmetic of the gateware.

:class:`InceptionnHook`
    Gradient-centric ring all-reduce (INCEPTIONN's NIC path) over point-to-point messages:
    a reduce-scatter of ``N - 1`` steps, in which every hop carries the sender's partial
    sum compressed by :func:`host.golden.inceptionn.encode` and the receiver adds the
    decoded chunk to its own in float32; then an all-gather of ``N - 1`` steps in which every
    forwarded chunk is compressed and decoded again. The owner of a finished chunk replaces
    it by its quantised value (``quantize`` = decode(encode(.))) before forwarding it, and
    the codec is idempotent, so every rank ends with the same bits. Chunk bounds, direction
    of travel, order of the additions and the exact error bound (quantisation ``N * 2^-k``
    plus the float32 rounding of the partial sums) are in :mod:`host.golden.ring`'s docstring
    and ``docs/accuracy.md``; :func:`host.golden.ring.ring_sum_error_bound` computes the bound.

    With ``error_feedback=True`` each rank first quantises its own bucket with the residual
    of its earlier steps added (:func:`host.golden.inceptionn.quantize_with_feedback`) and
    keeps what the codec dropped for the next step; see :class:`InceptionnHook`.

:class:`LhcHook`
    Lossless homomorphic compression (the in-network path), by default with the path chosen
    per bucket (``path="auto"``): after the index phase a bucket whose sketch would send
    more bytes than a dense int32 all-reduce goes dense instead (same result bits). On the
    sketch path the workers' exponents
    are MAX-reduced, the index bitmaps OR-reduced, the int32 count sketches SUM-reduced
    (exact modulo 2^32: summed as int64, then wrapped), every worker peels the summed
    sketch with the golden decoder, and one more SUM all-reduce carries the exact quantised
    values of the elements that peeling left. The result is the dequantised exact sum,
    bit for bit :func:`host.golden.lhc.allreduce` of the ranks' tensors.

Both hooks are asynchronous by default (the future comes back at once, a worker thread of
the hook's own runs the exchange while the backward pass goes on; ``asynchronous=False``
runs it inside the call), take float32, float16 and bfloat16 buckets on CPU and CUDA devices,
and carry their traffic on a gloo group of their own, never on DDP's communicator: see
:mod:`host.ddp.hook_worker`.

Both return the *average* DDP expects, computed in one fixed order on every rank: first the
float32 sum (bit-identical on all ranks), then one float32 division by the world size
(IEEE division, correctly rounded, hence the same bits on every rank).

Every rank must call with the same number of values (and the same parameters: ``k``, or
``load``, ``r_min`` and ``path``), and the sketch path needs finite gradients. Before any
data moves, one small all-gather of these numbers and of each rank's "input accepted" flag
(3 or 5 int64 words per rank) lets every rank raise the *same*
``ValueError``, naming the ranks and what differs or which rank's input was refused (its own
message), instead of one rank failing and its peers hanging, dying inside gloo or
returning sums of different lengths.

Bytes on the wire: every call appends a :class:`CallStats` to ``hook.calls`` (the newest
``history`` calls are kept, default :data:`DEFAULT_HISTORY`) and adds to
``hook.bytes_sent`` (payload bytes this rank sent) and ``hook.dense_ring_bytes`` (what a plain
fp32 ring all-reduce of the same bucket sends from this rank: ``4 * 2 * (N-1)/N * numel``,
exactly, chunk by chunk). Message framing is not counted in ``bytes_sent`` but reported as
``control_bytes``: the 8-byte length word that precedes every compressed INCEPTIONN chunk
(in hardware the packet header's ``count``), plus the preflight all-gather: ``8 * words *
(N - 1)`` bytes per rank and call (every other rank receives this rank's words once): 3
words for the ring (72 bytes with 4 ranks), 5 for the sketch (120 bytes).
"""
# No ``from __future__ import annotations`` here: DDP's register_comm_hook inspects the
# hook's annotations and accepts only the real objects, not strings.
import collections
import dataclasses
import numbers
import struct
import time
import weakref

import numpy as np
import torch
import torch.distributed as dist

from .hook_worker import (FailedIteration, HookWorker, bucket_to_host, check_bucket, complete,
                        cpu_group, new_future, raise_carried_error, result_to_device)
from .hardware import (INCEPTIONN_BACKENDS, LHC_BACKENDS, RING_FAILED, HookBackendError,
                           NicRingCodec, UdpSwitch, check_backend, check_board,
                           check_boards)
from ..golden import inceptionn as _inc
from ..golden import lhc as _lhc
from ..golden.ring import ring_chunk_bounds
# the local process-group launcher lives in host.ddp.launch; re-exported for its users
from .launch import free_loopback_port, run_local_group  # noqa: F401

__all__ = [
    "CallStats", "InceptionnHook", "LhcHook", "DEFAULT_HISTORY", "HookBackendError",
    "ring_chunk_bounds", "dense_ring_bytes", "inceptionn_ring_allreduce", "lhc_allreduce",
    "free_loopback_port", "run_local_group",
]

#: How many per-call statistics a hook keeps by default.
DEFAULT_HISTORY = 100_000
#: Tag of the point-to-point messages of the INCEPTIONN ring (any fixed value works: every
#: message is matched in order between one pair of ranks, and each step is waited for).
_RING_TAG = 0x1CE


@dataclasses.dataclass
class CallStats:
    """What one hook call (one bucket of one step) sent from this rank.

    Attributes
    ----------
    bucket_index : int
        DDP's bucket index (``-1`` when called outside DDP).
    numel : int
        Values in the bucket.
    bytes_sent : int
        Payload bytes this rank sent (compressed streams, index, sketch, fallback...).
    dense_ring_bytes : int
        Bytes this rank would send in a plain fp32 ring all-reduce of the same bucket.
    control_bytes : int
        Framing this rank sent on top of ``bytes_sent`` (length words; with a NIC the wire
        packets' headers; with a hardware backend the call's status word).
    details : dict
        Codec-specific numbers (see each hook).
    backend : str
        What computed the call: ``"golden"``, or the hardware backend and its address.
    seconds : float
        Wall time of the whole call on this rank.
    path_seconds : float
        The part of it in the path a backend replaces: the codec (golden model or NIC
        exchanges) of the ring, the three aggregation phases (gloo collectives or the
        switch's rounds) of the sketch. For the NIC, the ring's messages between ranks
        (gloo) are outside it; for the switch, the wait for the slowest rank is inside.
    hardware : dict
        What this call sent through the hardware (empty with the golden models): the NIC's
        packets and bytes per path, or the switch worker's packets, resends and bytes.
    """

    bucket_index: int
    numel: int
    bytes_sent: int
    dense_ring_bytes: int
    control_bytes: int = 0
    details: dict = dataclasses.field(default_factory=dict)
    backend: str = "golden"
    seconds: float = 0.0
    path_seconds: float = 0.0
    hardware: dict = dataclasses.field(default_factory=dict)


def _ring_schedule(rank: int, world_size: int):
    """The ring's ``(phase, step, send_chunk, recv_chunk)`` for ``rank``, in order.

    Reduce-scatter step ``s``: send chunk ``rank - s``, receive chunk ``rank - s - 1`` (mod N);
    afterwards rank ``r`` owns the full sum of chunk ``r + 1``. All-gather step ``s``: send
    chunk ``rank + 1 - s``, receive chunk ``rank - s``.
    """
    n = world_size
    for s in range(n - 1):
        yield "reduce_scatter", s, (rank - s) % n, (rank - s - 1) % n
    for s in range(n - 1):
        yield "all_gather", s, (rank + 1 - s) % n, (rank - s) % n


def dense_ring_bytes(numel: int, world_size: int, rank: int) -> int:
    """Bytes ``rank`` sends in a plain fp32 ring all-reduce of ``numel`` values
    (same chunking and schedule as the INCEPTIONN ring, 4 bytes per value)."""
    bounds = ring_chunk_bounds(numel, world_size)
    return sum(4 * (bounds[send][1] - bounds[send][0])
               for _, _, send, _ in _ring_schedule(rank, world_size))


def _group_info(group):
    """``(group, rank in group, world size, local rank -> global rank)``."""
    if group is None:
        group = dist.group.WORLD
    rank = dist.get_rank(group)
    world = dist.get_world_size(group)
    if group is dist.group.WORLD:
        return group, rank, world, (lambda r: r)
    return group, rank, world, (lambda r: dist.get_global_rank(group, r))


def _wait_all(works):
    for work in works:
        work.wait()


def _preflight(group, world, to_global, who, numel, parameters, problem=None):
    """Agree on the call before any data moves; raise the same error on every rank if not.

    Every rank contributes ``numel``, its ``parameters`` (``(name, value)`` pairs, the same
    names on every rank; ints, or floats compared bit for bit) and whether ``problem`` (this
    rank's reason to refuse its input, or ``None``) is set, in one all-gather of int64
    words. When any rank refused its input, a second all-gather (of the reasons, as Python
    objects) runs on every rank, so that all of them can name it.

    Returns the preflight bytes this rank sent. Raises ``ValueError`` on every rank alike.
    """
    if world == 1:
        if problem is not None:
            raise ValueError(f"{who}: {problem}")
        return 0
    words = [int(numel)] + [_as_word(value) for _, value in parameters] \
        + [int(problem is not None)]
    mine = torch.tensor(words, dtype=torch.int64)
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine, group=group)
    table = [g.tolist() for g in gathered]
    messages = []
    if len({row[0] for row in table}) > 1:
        sizes = ", ".join(f"rank {to_global(r)}: {row[0]}" for r, row in enumerate(table))
        messages.append(f"the ranks' buckets differ in length ({sizes} values); every "
                        f"rank must reduce the same number of values (same model, same "
                        f"bucket layout)")
    for position, (name, value) in enumerate(parameters, start=1):
        ranks_of = {}
        for r, row in enumerate(table):
            ranks_of.setdefault(row[position], []).append(str(to_global(r)))
        if len(ranks_of) > 1:
            shown = "; ".join(f"{name}={_from_word(word, value)!r} on rank(s) {', '.join(ranks)}"
                              for word, ranks in ranks_of.items())
            messages.append(f"{name} differs between ranks ({shown})")
    refused = [r for r, row in enumerate(table) if row[-1]]
    if refused:
        reasons = [None] * world
        dist.all_gather_object(reasons, problem, group=group)
        messages += [f"rank {to_global(r)} refused its input: {reasons[r]}" for r in refused]
    if messages:
        raise ValueError(f"{who}: " + "; ".join(messages)
                         + " (every rank of the group raises this error)")
    return 8 * len(words) * (world - 1)


def _as_word(value) -> int:
    """A preflight parameter as an int64 word (a float by its float64 bits)."""
    if isinstance(value, float):
        return struct.unpack("<q", struct.pack("<d", value))[0]
    return int(value)


def _from_word(word: int, like):
    """The parameter a gathered word stands for (the inverse of :func:`_as_word`)."""
    if isinstance(like, float):
        return struct.unpack("<d", struct.pack("<q", word))[0]
    return word


def _ring_exchange(payload, expect_payload, right, left, group):
    """Send ``payload`` (bytes or ``None``) to ``right`` while receiving from ``left``.

    Compressed chunks have a data-dependent size, so each message is a length word followed
    by the bytes. Sends and receives are posted together (``isend``/``irecv``) so that the
    ring cannot deadlock. Returns the received bytes (or ``None``). A payload of
    :data:`~host.ddp.hardware.RING_FAILED` (the sender's NIC failed) is sent as the length
    word -1 without bytes, and received as ``RING_FAILED``.
    """
    works = []
    failed = payload is RING_FAILED
    if payload is not None:
        out_len = torch.tensor([-1 if failed else len(payload)], dtype=torch.int64)
        works.append(dist.isend(out_len, right, group=group, tag=_RING_TAG))
    if expect_payload:
        in_len = torch.zeros(1, dtype=torch.int64)
        works.append(dist.irecv(in_len, left, group=group, tag=_RING_TAG))
    _wait_all(works)
    works = []
    if payload is not None and not failed and len(payload):
        out = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        works.append(dist.isend(out, right, group=group, tag=_RING_TAG))
    received = None
    if expect_payload:
        if int(in_len.item()) < 0:
            _wait_all(works)
            return RING_FAILED
        received = torch.empty(int(in_len.item()), dtype=torch.uint8)
        if received.numel():
            works.append(dist.irecv(received, left, group=group, tag=_RING_TAG))
    _wait_all(works)
    return None if received is None else received.numpy().tobytes()


def _check_k(k) -> int:
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise TypeError(f"k must be an integer in {_inc.K_MIN}..{_inc.K_MAX}, not {k!r}")
    return _inc.check_k(int(k))


def _count_changed(before, after) -> int:
    """How many values ``after`` differs from ``before`` in (NaN counts as unchanged)."""
    return int(np.count_nonzero((before != after) & (before == before)))


def _count_rounded_sums(a, b, total) -> int:
    """How many of the float32 additions ``total = a + b`` rounded (Knuth's TwoSum: the
    rounding error ``(a - (total - b')) + (b - b')`` with ``b' = total - a`` is computed
    exactly in float32; non-finite sums are not counted)."""
    with np.errstate(invalid="ignore", over="ignore"):
        b_virtual = total - a
        error = (a - (total - b_virtual)) + (b - b_virtual)
        return int(np.count_nonzero((error != 0) & np.isfinite(total)))


class _GoldenRingCodec:
    """The ring's codec in software: the golden INCEPTIONN model (the default backend).
    :class:`host.ddp.hardware.NicRingCodec` is the same interface through a rank's NIC."""

    hardware = False
    failed = False

    def start(self, group, rank, world, to_global):
        pass

    def own(self, values, k):
        return _inc.quantize(values, k)

    def encode(self, values, k):
        return _inc.encode(values, k)

    def decode(self, message, n, k):
        return _inc.decode(message, n, k)

    def payload_bytes(self, message):
        return len(message)

    def framing_bytes(self, message):
        return 0

    def finish(self, group, world, to_global):
        return 0


_GOLDEN_RING = _GoldenRingCodec()


def inceptionn_ring_allreduce(values, k: int = _inc.K_DEFAULT, group=None, *, codec=None):
    """Sum ``values`` over the ranks of ``group`` with the compressed INCEPTIONN ring.

    Every rank calls it with its own float32 vector of the same length and the same ``k``
    (checked first, see the module docstring: a mismatch raises the same ``ValueError`` on
    every rank before any data moves).

    Parameters
    ----------
    values : array_like or torch.Tensor
        This rank's values (flattened, float32).
    k : int
        Error bound exponent, 1..15.
    group : ProcessGroup, optional
        Default: the world.
    codec : host.ddp.hardware.NicRingCodec, optional
        Every hop through this rank's NIC (a hook's ``backend``); default: the golden model.

    Returns
    -------
    total : numpy.ndarray
        float32 sum, identical bits on every rank (NaN/Inf travel raw and propagate).
        With one rank nothing crosses the network and the values come back unchanged.
    stats : CallStats
        ``details``: ``k``, ``world_size``, ``messages``, ``compressed_values`` (values this
        rank compressed), ``ratio`` (dense ring bytes / bytes sent), and what the ring's
        arithmetic did to the values this rank handled: ``quantised_values`` (values of the
        partial sums it sent in the reduce-scatter plus its owned chunk), ``offgrid_values``
        (how many of those the quantisation changed: not on their class's grid),
        ``added_values`` and ``rounded_adds`` (its reduce-scatter additions, and how many of
        them rounded in float32). ``backend``, ``seconds``, ``path_seconds`` (the time in
        the codec: the golden model, or the NIC) and ``hardware`` (the NIC's packets and
        bytes in this call) as :class:`CallStats` says.

    Raises
    ------
    ValueError
        On every rank: lengths or ``k`` that differ between ranks.
    HookBackendError
        On every rank: the NIC could not start, or failed on some rank during the call.
    """
    started = time.perf_counter()
    k = _check_k(k)
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    values = np.asarray(values)
    if values.dtype != np.float32:
        raise TypeError(f"values must be float32, not {values.dtype}")
    acc = values.astype(np.float32, copy=True).reshape(-1)
    group, rank, world, to_global = _group_info(group)
    preflight = _preflight(group, world, to_global, "INCEPTIONN ring all-reduce", acc.size,
                           [("k", k)])
    codec = _GOLDEN_RING if codec is None else codec
    codec.start(group, rank, world, to_global)
    before = codec.counts.as_dict() if codec.hardware else None
    bounds = ring_chunk_bounds(acc.size, world)
    right, left = to_global((rank + 1) % world), to_global((rank - 1) % world)
    sent = messages = compressed = framing = 0
    quantised = offgrid = added = rounded = 0
    path_seconds = 0.0
    for phase, step, send_chunk, recv_chunk in _ring_schedule(rank, world):
        if phase == "all_gather" and step == 0:
            # The owner of the finished chunk keeps exactly what the others will decode.
            a, b = bounds[(rank + 1) % world]
            t = time.perf_counter()
            owned = codec.own(acc[a:b], k)
            path_seconds += time.perf_counter() - t
            quantised += b - a
            offgrid += _count_changed(acc[a:b], owned)
            acc[a:b] = owned
        sa, sb = bounds[send_chunk]
        ra, rb = bounds[recv_chunk]
        t = time.perf_counter()
        payload = codec.encode(acc[sa:sb], k) if sb > sa else None
        path_seconds += time.perf_counter() - t
        if payload is not None and phase == "reduce_scatter":
            quantised += sb - sa
            offgrid += _count_changed(acc[sa:sb], _inc.quantize(acc[sa:sb], k))
        data = _ring_exchange(payload, rb > ra, right, left, group)
        if payload is not None:
            sent += codec.payload_bytes(payload)
            framing += codec.framing_bytes(payload)
            messages += 1
            compressed += sb - sa
        if data is not None:
            t = time.perf_counter()
            decoded = codec.decode(data, rb - ra, k)
            path_seconds += time.perf_counter() - t
            if phase == "reduce_scatter":
                total = decoded + acc[ra:rb]
                added += rb - ra
                rounded += _count_rounded_sums(decoded, acc[ra:rb], total)
                acc[ra:rb] = total
            else:
                acc[ra:rb] = decoded
    status = codec.finish(group, world, to_global)
    dense = dense_ring_bytes(acc.size, world, rank)
    details = {"k": k, "world_size": world, "messages": messages,
               "compressed_values": compressed, "ratio": (dense / sent) if sent else None,
               "quantised_values": quantised, "offgrid_values": offgrid,
               "added_values": added, "rounded_adds": rounded}
    hardware = {}
    if before is not None:
        after = codec.counts.as_dict()
        hardware = {name: after[name] - before[name] for name in after}
    stats = CallStats(bucket_index=-1, numel=acc.size, bytes_sent=sent, dense_ring_bytes=dense,
                      control_bytes=8 * messages + framing + preflight + status,
                      details=details,
                      backend=codec.describe() if codec.hardware else "golden",
                      seconds=time.perf_counter() - started, path_seconds=path_seconds,
                      hardware=hardware)
    return acc, stats


class _CommHook:
    """Common part of the hooks: bucket in, averaged bucket out, statistics."""

    def __init__(self, history: int, asynchronous: bool = True):
        # register_comm_hook reads a hook's __name__ and __qualname__ like a function's.
        self.__name__ = type(self).__name__
        self.__qualname__ = type(self).__qualname__
        if isinstance(history, bool) or not isinstance(history, numbers.Integral) \
                or history < 0:
            raise ValueError(f"history must be a non-negative integer, not {history!r}")
        if not isinstance(asynchronous, bool):
            raise TypeError(f"asynchronous must be True or False, not {asynchronous!r}")
        self.asynchronous = asynchronous
        self.calls = collections.deque(maxlen=int(history))
        self.bytes_sent = 0
        self.dense_ring_bytes = 0
        self.control_bytes = 0
        self._worker = None                   # started at the first asynchronous call
        self._groups = {}                     # the hook's private gloo groups (cpu_group)
        self._failed_pass = FailedIteration()

    #: the hardware path (None: the golden models)
    _hardware = None

    def reset_stats(self):
        """Forget the recorded calls and zero the byte counters."""
        self.calls.clear()
        self.bytes_sent = self.dense_ring_bytes = self.control_bytes = 0

    @property
    def backend(self) -> str:
        """``"golden"``, ``"verilator"`` or ``"udp"``."""
        return "golden" if self._hardware is None else self._hardware.backend

    @property
    def hardware_stats(self):
        """What went through this rank's hardware so far (packets, bytes, resends, cycles,
        seconds; see :mod:`host.ddp.hardware`), or None with the golden models."""
        return None if self._hardware is None else self._hardware.stats()

    @property
    def hardware_totals(self):
        """``packets_in``, ``packets_out``, ``bytes_in``, ``bytes_out``, ``resends``,
        ``seconds`` and ``startup_seconds`` of this rank's hardware path so far, alike for the
        NIC and the switch (None with the golden models)."""
        return None if self._hardware is None else self._hardware.totals()

    def close(self):
        """Stop the hook's worker thread once the buckets handed to it are done, and close
        this rank's hardware (a NIC harness process, sockets); a hook with a hardware
        backend takes no calls afterwards. Also done when the hook is garbage collected or
        the interpreter exits."""
        if self._worker is not None:
            self._worker.stop()
            self._worker = None
        if self._hardware is not None:
            self._hardware.close()
            if self._hardware.broken is None:
                self._hardware.broken = f"{type(self).__name__}: the hook was closed"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _allreduce_sum(self, values: np.ndarray, group):
        raise NotImplementedError

    def _allreduce_bucket(self, values: np.ndarray, group, parameters, index: int):
        """The sum over the group of this rank's bucket ``values`` (and its statistics);
        ``parameters`` are the bucket's (None when the hook does not need them)."""
        return self._allreduce_sum(values, group)

    #: whether :meth:`_allreduce_bucket` needs the bucket's parameters
    _needs_parameters = False

    def __call__(self, state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        who = type(self).__name__
        group = cpu_group(who, state, self._groups)
        buffer = bucket.buffer()
        check_bucket(who, buffer)
        # Everything the exchange needs is taken now: DDP owns the bucket object and its
        # buffer, and reuses them once the future is done.
        host = bucket_to_host(buffer)
        parameters = bucket.parameters() if self._needs_parameters else None
        index = bucket.index()
        # Outside DDP (a bucket without is_last) every call is a pass of its own.
        last = bucket.is_last() if hasattr(bucket, "is_last") else True
        future = new_future(buffer.device)
        if not self.asynchronous:
            result = self._exchange(host, group, parameters, index)
            complete(future, result, host)
            return future
        if self._worker is None or not self._worker.alive:
            self._worker = HookWorker(f"{who}-worker")
        self._worker.submit(lambda: self._run(future, host, group, parameters, index, last))
        return future.then(raise_carried_error)

    def _run(self, future, host, group, parameters, index, last):
        """One bucket on the worker thread: completes ``future`` with the result or the
        error (as its value, see :func:`host.ddp.hook_worker.raise_carried_error`), never
        raises."""
        try:
            error = self._failed_pass.pending(last)
            if error is not None:
                # The failed bucket's error object itself, not raised again: a raise would
                # add this frame to its traceback, which DDP prints into every rank's
                # message, while the other ranks may already have printed it without.
                future.set_result(error)
                return
            try:
                result = self._exchange(host, group, parameters, index)
            except BaseException as exc:      # noqa: BLE001 (the future carries it)
                self._failed_pass.fail(exc, last)
                raise
            complete(future, result, host)
        except BaseException as exc:          # noqa: BLE001 (the future carries it)
            future.set_result(exc)

    def _exchange(self, host, group, parameters, index) -> torch.Tensor:
        """The averaged bucket (the bucket's dtype, shape and device) and its statistics
        recorded: the same code for the synchronous and the asynchronous hook."""
        total, stats = self._allreduce_bucket(host.wait(), group, parameters, index)
        stats.bucket_index = index
        world = dist.get_world_size(group if group is not None else dist.group.WORLD)
        # Sum first (identical bits everywhere), then one float32 division by the world
        # size, then (float16/bfloat16 buckets) one rounding to the bucket's dtype.
        result = result_to_device(torch.from_numpy(total).div_(world), host)
        # Recorded before the future completes: once DDP's backward returns, every call of
        # it is counted.
        self.calls.append(stats)
        self.bytes_sent += stats.bytes_sent
        self.dense_ring_bytes += stats.dense_ring_bytes
        self.control_bytes += stats.control_bytes
        return result


class InceptionnHook(_CommHook):
    """DDP hook: compressed INCEPTIONN ring all-reduce with error bound ``2^-k``.

    Parameters
    ----------
    k : int
        Error bound exponent, 1..15 (default 10, the paper's operating point).
    error_feedback : bool
        Keep what the codec drops and add it to the next step's gradient (default off:
        every value below ``2^-k`` is lost at every hop).
    history : int
        How many :class:`CallStats` ``hook.calls`` keeps (the newest; the byte counters
        count every call).
    backend : str
        Who compresses and decompresses every hop: ``"golden"`` (the NumPy model, default),
        ``"verilator"`` (this rank's own Verilated NIC, a compiled harness opened at the
        first bucket) or ``"udp"`` (a board's NIC over UDP, ``board`` needed). Every rank
        of the group must use the same backend. See :mod:`host.ddp.hardware`.
    board : str or list of str
        ``"udp"``: the board ``HOST[:PORT_BASE]`` (default: ``GRADWIRE_BOARD``), or one per
        rank.
    key : int or str
        ``"udp"``: the board's control key (optional; with it the first bucket also checks
        the control service).
    mtu : int
        ``"udp"``: the path's MTU (packet sizes follow it; default 1500).
    asynchronous : bool
        ``True`` (default): the hook returns its future at once and its worker thread runs
        the exchange while the backward pass goes on (:mod:`host.ddp.hook_worker`); ``False``:
        the exchange runs inside the call, as the reference for the same bits.

    Notes
    -----
    Mixed precision: a float16 or bfloat16 bucket is widened to float32 (exactly), goes
    through the ring and the division by the world size as a float32 bucket would, and the
    average is narrowed back to the bucket's dtype, rounded to nearest even, on every rank
    alike (same bits everywhere). The narrowing adds one rounding to the ring's bound
    (:func:`host.golden.ring.ring_sum_error_bound`, divided by the world size for the average): at
    most half a unit in the last place of the result, ``2^-11 |avg|`` for float16 and
    ``2^-8 |avg|`` for bfloat16 in their normal ranges (``2^-25`` absolute in float16's
    subnormal range, which also flushes what falls below ``2^-25``), and an average beyond
    float16's largest value (65504) becomes an infinity. Error feedback keeps its residual
    in float32, of the widened gradient: the narrowing of the average is not fed back.

    Uneven inputs: under ``model.join()`` DDP calls the hook of a rank that ran out of
    batches with zero buckets, and that rank takes part in the exchange like the others
    (with error feedback it also sends what its residual carries). The average is always
    divided by the group's size.

    Error feedback: each rank quantises its own bucket ``g`` with its residual ``e`` added,
    in float32: ``x' = quantize(g + e)``, ``e = (g + e) - x'``
    (:func:`host.golden.inceptionn.quantize_with_feedback`; the subtraction is exact, so
    nothing is lost, only delayed: a value below ``2^-k`` accumulates until it crosses
    ``2^-k`` and is then sent). The ring then runs unchanged on ``x'``; the residual stays
    on the rank and costs no wire bytes.

    The residual is kept per parameter (keyed by the parameter object, checked by a weak
    reference and its size), not per bucket index: DDP rebuilds its buckets after the first
    iteration (other parameters in bucket 0, other sizes), and every parameter's residual
    follows it into its new bucket. A parameter whose size changed starts again from zero.
    :meth:`residual` reads it, :meth:`reset_residuals` drops it.

    What the ring does to ``x'``: every value of ``x'`` lies on its class's grid (multiples
    of ``2^-k`` for tag 01, of ``2^-15`` for tag 10, any float32 for tag 11, only 0 for tag
    00), where the codec is exact. A sum of two values on their grids is on the grid of the
    class it lands in unless that class is *coarser* than one operand's: sums of tag-01
    values are multiples of ``2^-k`` wherever they land (tag 01, tag 10, or raw and exact
    below 2), sums involving tag-10 values (multiples of ``2^-15``) stay exact while they
    stay at or above ``2^(7-k)``. Exactly two things lose anything in the reduce-scatter
    of ``x'`` (the all-gather never does):

    * float32 rounding of a partial sum, which happens only for ``|sum| >= 1`` (raw
      values, kept exactly by the codec once rounded): below 1 every operand is a
      multiple of ``2^-23`` and the sum is exact;
    * a partial sum that crosses into a coarser class: tag-10 values (or raw ones) that
      cancel to below ``2^(7-k)`` (tag 01, grid ``2^-k``) or below ``2^-k`` (tag 00). With
      ``k <= 7`` there is no tag 10 and only cancelling raw values can do it; at
      ``k = 15`` tags 01 and 10 share the grid ``2^-15``.

    Each call's :class:`CallStats` counts both (``details``: ``offgrid_values`` of
    ``quantised_values``, ``rounded_adds`` of ``added_values``). Measured over the accuracy
    experiment's 300 steps on 4 ranks (:mod:`host.ddp.accuracy`, ``ring_offgrid_fraction`` and
    ``ring_rounded_fraction``) with error feedback: no float32 addition rounded in any run
    (the gradients stay below 1), and a partial sum left its grid for 545 of 20.7 million
    hop values in digits at k = 10 (tag-10 sums cancelling below ``2^-3``), for none in
    digits at k = 6 and 8 nor in the recommender at k = 6, 8 and 10 (175 million each).
    Without feedback, for comparison, the quantisation changes 59-61 % (digits) and 8.6 %
    (recommender) of the hop values and 0.002-18 % of the additions round.
    What the ring drops is not fed back (it happens after the residual is taken); its
    size stays within the ring's bound (:mod:`host.golden.ring`).

    See :func:`inceptionn_ring_allreduce` and the module docstring.
    """

    def __init__(self, k: int = _inc.K_DEFAULT, *, error_feedback: bool = False,
                 history: int = DEFAULT_HISTORY, backend: str = "golden", board=None,
                 key=None, mtu=None, asynchronous: bool = True):
        super().__init__(history, asynchronous)
        self.k = _check_k(k)
        if not isinstance(error_feedback, bool):
            raise TypeError(f"error_feedback must be True or False, not {error_feedback!r}")
        self.error_feedback = error_feedback
        # id(parameter) -> (weak reference to it, float32 residual of its numel values)
        self._residuals = {}
        check_backend("InceptionnHook", backend, INCEPTIONN_BACKENDS)
        if backend != "udp" and (board is not None or key is not None or mtu is not None):
            raise ValueError(f"InceptionnHook: board, key and mtu are for backend 'udp', "
                             f"not {backend!r}")
        if backend != "golden":
            settings = check_board("InceptionnHook", board, key, mtu, per_rank=True,
                                   need_key=False) if backend == "udp" else None
            self._hardware = NicRingCodec("InceptionnHook", backend, settings)

    def __repr__(self):
        text = f"InceptionnHook(k={self.k}"
        if self.error_feedback:
            text += ", error_feedback=True"
        if self._hardware is not None:
            text += f", backend={self.backend!r}"
        return text + ")"

    def residual(self, parameter) -> np.ndarray:
        """This rank's error-feedback residual of ``parameter`` (float32, its shape; zeros
        before its first step or without error feedback)."""
        stored = self._stored_residual(parameter)
        if stored is None:
            return np.zeros(tuple(parameter.shape), dtype=np.float32)
        return stored.reshape(tuple(parameter.shape)).copy()

    def reset_residuals(self):
        """Forget every residual (the next step starts from zero)."""
        self._residuals.clear()

    def _forget(self, key, reference):
        """A parameter died: drop its residual (unless its id has a new owner by now)."""
        entry = self._residuals.get(key)
        if entry is not None and entry[0] is reference:
            del self._residuals[key]

    def _stored_residual(self, parameter):
        entry = self._residuals.get(id(parameter))
        if entry is None or entry[0]() is not parameter or entry[1].size != parameter.numel():
            return None
        return entry[1]

    def _allreduce_sum(self, values, group):
        return inceptionn_ring_allreduce(values, self.k, group, codec=self._hardware)

    @property
    def _needs_parameters(self):
        return self.error_feedback

    def _allreduce_bucket(self, values, group, parameters, index):
        if not self.error_feedback:
            total, stats = self._allreduce_sum(values, group)
            stats.details["error_feedback"] = False
            return total, stats
        sizes = [p.numel() for p in parameters]
        if sum(sizes) != values.size:
            raise RuntimeError(f"InceptionnHook: bucket {index} holds {values.size} "
                               f"values but its parameters {sum(sizes)}: cannot place the "
                               f"error-feedback residuals")
        residual = np.zeros(values.size, dtype=np.float32)
        offsets = np.cumsum([0] + sizes)
        for parameter, a, b in zip(parameters, offsets[:-1], offsets[1:]):
            stored = self._stored_residual(parameter)
            if stored is not None:
                residual[a:b] = stored
        sent, residual = _inc.quantize_with_feedback(values.reshape(-1), residual, self.k)
        total, stats = self._allreduce_sum(sent, group)
        # Only a completed call moves the residuals (a refused one leaves them as they were).
        for parameter, a, b in zip(parameters, offsets[:-1], offsets[1:]):
            key = id(parameter)
            reference = weakref.ref(parameter, lambda ref, key=key: self._forget(key, ref))
            self._residuals[key] = (reference, residual[a:b].copy())
        stats.details["error_feedback"] = True
        return total, stats


def _sum_int32_wrapped(values: np.ndarray, group) -> np.ndarray:
    """Wrap-around int32 SUM over the group (the switch's ``AGG_ADD_I32``): summed exactly
    as int64 (at most 32 workers cannot overflow it), then reduced modulo 2^32."""
    wide = torch.from_numpy(np.asarray(values, dtype=np.int64).copy())
    dist.all_reduce(wide, op=dist.ReduceOp.SUM, group=group)
    return _lhc.wrap_int32(wide.numpy())


class _GlooSwitch:
    """The switch's operations as gloo collectives (the default backend, with the golden
    models): phase A's OR and MAX, phases B and C's wrap-around SUM.
    :class:`host.ddp.hardware.UdpSwitch` is the same interface through a board's switch."""

    hardware = False

    def __init__(self, group):
        self.group = group

    def start(self, group, rank, world, to_global):
        pass

    def index(self, words, exponent, *, dense=False):
        if dense:
            # A forced dense all-reduce's phase A: MAX of (exponent, holds a non-zero); MAX
            # of 0/1 is their OR, one collective instead of two.
            head = torch.tensor([exponent, int(words[0])], dtype=torch.int32)
            dist.all_reduce(head, op=dist.ReduceOp.MAX, group=self.group)
            return np.array([head[1].item()], dtype=np.uint32), int(head[0].item())
        index = torch.from_numpy(words.view(np.int32).copy())
        dist.all_reduce(index, op=dist.ReduceOp.BOR, group=self.group)
        e_max = torch.tensor([exponent], dtype=torch.int32)
        dist.all_reduce(e_max, op=dist.ReduceOp.MAX, group=self.group)
        return index.numpy().view(np.uint32), int(e_max.item())

    def add(self, values, name):
        return _sum_int32_wrapped(values, self.group)

    def finish(self, group, world, to_global):
        return 0


def lhc_allreduce(values, group=None, *, load: float = _lhc.DEFAULT_LOAD, r_min: int = 1,
                  path: str = "sketch", switch=None):
    """Sum ``values`` over the ranks of ``group`` through the lossless homomorphic sketch.

    Every rank calls it with its own finite float32 vector of the same length and the same
    ``load``, ``r_min`` and ``path``; a preflight all-gather checks that first and raises
    the same ``ValueError`` on every rank if not, or if any rank's vector is refused
    (NaN/Inf, a magnitude of 2^127 or more). Then the phases run as collectives, each
    standing for one switch operation:

    A. ``all_reduce(BOR)`` of the index bitmap (as int32 words: OR does not care about the
       sign) and ``all_reduce(MAX)`` of the worker exponent;
    B. ``all_reduce(SUM)`` of the int32 count sketch, computed in int64 and wrapped;
    C. when peeling left elements (the same set on every rank), ``all_reduce(SUM)`` of their
       exact quantised values, wrapped the same way.

    ``path="auto"`` decides after A, identically on every rank
    (:func:`host.golden.lhc.choose_path`), whether B and C run or one ``all_reduce(SUM)``
    of all quantised values instead (a dense int32 all-reduce); ``path="dense"`` skips the
    index: A is one ``all_reduce(MAX)`` of (exponent, holds a non-zero), then the dense
    round. The result bits are the same on every path.

    Each rank runs :class:`host.golden.lhc.LhcWorker`, so the result is bit for bit
    :func:`host.golden.lhc.allreduce` of the ranks' vectors. With ``switch`` (a hook's
    :class:`host.ddp.hardware.UdpSwitch`) the three phases are ``AGG_*`` rounds through a
    board's switch instead, the exponent in phase A's packet headers.

    Returns
    -------
    total : numpy.ndarray
        float32 ``dequantize(sum_w quantize(x_w, f), f)``, identical on every rank.
    stats : CallStats
        ``bytes_sent`` = index + sketch + fallback bytes of one worker, or index + dense
        round on the dense path (the int32 wire format; the exponent travels in the packet
        header); ``details`` holds :class:`host.golden.lhc.LhcStats` as a dict (path, rows,
        union size, unpeeled, ..., ``dense_bytes`` = 4 bytes per value, what a dense
        in-network int32 all-reduce sends).
        ``path_seconds`` is the phases (gloo collectives, or the switch's rounds);
        ``hardware`` the switch worker's packets, resends and bytes in this call.

    Raises
    ------
    ValueError
        On every rank: NaN/Inf or ``|x| >= 2^127`` in any rank's ``values`` (gradients must
        be finite; the message names the rank), lengths or ``load``/``r_min`` that differ
        between ranks. Also bad ``load``/``r_min`` or more than 32 ranks.
    HookBackendError
        On every rank: the switch could not be reached or configured, or a round failed.
    """
    started = time.perf_counter()
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    values = np.asarray(values)
    if values.dtype != np.float32:
        raise TypeError(f"values must be float32, not {values.dtype}")
    group, rank, world, to_global = _group_info(group)
    # Arguments first (the caller's, raised here); then this rank's data, which every rank
    # must hear about.
    _lhc.LhcWorker(np.zeros(0, dtype=np.float32), world, load=load, r_min=r_min, path=path)
    worker, problem = None, None
    try:
        worker = _lhc.LhcWorker(values.reshape(-1), world, load=load, r_min=r_min,
                                name="its gradient", path=path)
    except ValueError as exc:
        problem = str(exc)
    preflight = _preflight(group, world, to_global, "LHC sketch all-reduce", values.size,
                           [("load", float(load)), ("r_min", int(r_min)),
                            (_PATH_PARAMETER, _lhc.PATHS.index(path))], problem)
    switch = _GlooSwitch(group) if switch is None else switch
    switch.start(group, rank, world, to_global)
    before = switch.worker.stats.as_dict() if switch.hardware else None
    path_started = time.perf_counter()
    summed = None
    try:
        # Phase A: index OR and exponent MAX (a forced dense all-reduce: no index, one word
        # that says whether any worker holds a non-zero value).
        merged, e_max = switch.index(worker.phase_a_words, worker.exponent,
                                     dense=path == "dense")
        if worker.plan_phase(merged, e_max) == "dense":
            # One dense int32 SUM of every quantised value (the same choice on every rank).
            summed = switch.add(worker.dense_phase(merged, e_max, worker.plan), "dense round")
        else:
            # Phase B: sketch SUM.
            sketch_sum = switch.add(worker.sketch_phase(merged, e_max, worker.plan), "sketch")
            # Phase C: exact fallback for what peeling could not recover (same set
            # everywhere).
            fallback = worker.fallback_phase(sketch_sum)
            summed = switch.add(fallback, "fallback") if fallback.size else fallback
    except Exception as exc:
        if not switch.hardware:
            raise
        switch.fail(exc)              # raised on every rank by finish()
    path_seconds = time.perf_counter() - path_started
    status = switch.finish(group, world, to_global)
    total, lhc_stats = worker.finish(summed)
    details = lhc_stats.as_dict()
    details["world_size"] = world
    hardware = {}
    if before is not None:
        after = switch.worker.stats.as_dict()
        hardware = {name: after[name] - before[name] for name in after}
    dense = dense_ring_bytes(values.size, world, rank)
    stats = CallStats(bucket_index=-1, numel=int(values.size), bytes_sent=lhc_stats.total_bytes,
                      dense_ring_bytes=dense, control_bytes=preflight + status, details=details,
                      backend=switch.describe() if switch.hardware else "golden",
                      seconds=time.perf_counter() - started, path_seconds=path_seconds,
                      hardware=hardware)
    return total.reshape(-1), stats


#: How the preflight names the path parameter (its word is the index in ``lhc.PATHS``).
_PATH_PARAMETER = "path (0 sketch, 1 dense, 2 auto)"


class LhcHook(_CommHook):
    """DDP hook: lossless homomorphic sketch all-reduce (exact sum of the quantised values).

    Parameters
    ----------
    path : {"auto", "sketch", "dense"}
        ``"auto"`` (default): every bucket goes as the sketch or as a dense int32
        all-reduce, whichever sends fewer bytes once the index phase has shown its union
        density (:func:`host.golden.lhc.choose_path`; the same choice on every rank; never
        more than the index phase, 1 bit per value, above a dense all-reduce). The
        result bits are the same either way. ``"sketch"`` / ``"dense"`` force one path.
        Each call's ``details["path"]`` says which one the bucket took.
    load : float
        Target non-zeros per sketch cell (default 0.7).
    r_min : int
        Minimum number of sketch rows (default 1).
    history : int
        How many :class:`CallStats` ``hook.calls`` keeps (the newest; the byte counters
        count every call).
    backend : str
        Who aggregates: ``"golden"`` (gloo collectives standing for the switch, default) or
        ``"udp"``: a board's switch (``AGG_*`` packets from every rank's own socket; one
        board serves the whole job, or several with ``boards``). Every rank of the group
        must use the same backend. See :mod:`host.ddp.hardware`.
    board : str
        ``"udp"``: the board ``HOST[:PORT_BASE]`` (default: ``GRADWIRE_BOARD``).
    boards : list of str
        ``"udp"``: instead of ``board``, the job over several boards (the same address
        forms, one per board, each board its own ports: ``gradwire board serve
        --port-base``), ``docs/protocol/network.md`` section 3: every board holds the job
        with the same workers and slots, chunk ``c`` of every round goes to board
        ``c mod B``, and each rank puts the boards' results back together (bit for bit one
        board's; each board's link carries ``1/B`` of the job).
    key : int or str, or a list of them
        ``"udp"``: the board's control key (default: ``GRADWIRE_KEY``): group rank 0 writes
        the job's worker table and configures the job with it at the first bucket. With
        ``boards``: one key for every board, or one per board.
    job, slot_base, slot_count : int
        ``"udp"``: the switch job and its slots (default: job 0, the whole pool). The job is
        the hook's from its first bucket (group rank 0 configures it) until :meth:`close`
        (group rank 0 releases it); hooks in use at the same time need jobs of their own on
        slots that do not overlap (the switch refuses overlapping jobs).
    timeout : float
        ``"udp"``: seconds a round may go without any result before the call fails
        (default 30).
    asynchronous : bool
        ``True`` (default): the hook returns its future at once and its worker thread runs
        the exchange while the backward pass goes on (:mod:`host.ddp.hook_worker`); ``False``:
        the exchange runs inside the call, as the reference for the same bits.
    group : str or (str, int)
        ``"udp"``: the job's result group, ``"ADDR:PORT"`` (an IPv4 multicast address,
        239.0.0.0/8 best) or None (default): the board sends each result once, to the
        group, instead of once per rank (``docs/protocol/network.md`` section 3), and every
        rank joins it on the interface that reaches the board. With ``boards``, board ``b``
        sends to the group's address at ``PORT + b``.

    Notes
    -----
    A float16 or bfloat16 bucket is widened to float32 (exactly) for the sketch, and the
    exact-sum result, divided by the world size in float32, is narrowed back to the
    bucket's dtype (round to nearest even; half a unit in the last place: ``2^-11`` of the
    value in float16, ``2^-8`` in bfloat16, an infinity above float16's 65504). An
    infinity in a float16 gradient is refused like any non-finite value.

    See :func:`lhc_allreduce` and the module docstring. Gradients must be finite.
    """

    def __init__(self, *, load: float = _lhc.DEFAULT_LOAD, r_min: int = 1,
                 history: int = DEFAULT_HISTORY, path: str = "auto", backend: str = "golden",
                 board=None, key=None, job: int = 0, slot_base: int = 0, slot_count=None,
                 timeout=None, asynchronous: bool = True, boards=None, group=None):
        super().__init__(history, asynchronous)
        # Reject a bad load / r_min / path now rather than in the middle of a backward pass.
        _lhc.LhcWorker(np.zeros(1, dtype=np.float32), 1, load=load, r_min=r_min, path=path)
        self.load = float(load)
        self.r_min = int(r_min)
        self.path = path
        check_backend("LhcHook", backend, LHC_BACKENDS)
        if backend == "golden":
            defaults = dict(board=None, boards=None, key=None, job=0, slot_base=0,
                            slot_count=None, timeout=None, group=None)
            given = [name for name, value in dict(board=board, boards=boards, key=key, job=job,
                                                  slot_base=slot_base, slot_count=slot_count,
                                                  timeout=timeout, group=group).items()
                     if value is not defaults[name] and value != defaults[name]]
            if given:
                raise ValueError(f"LhcHook: {', '.join(given)} are for backend 'udp', not "
                                 f"'golden'")
            return
        for name, value, low in (("job", job, 0), ("slot_base", slot_base, 0)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) \
                    or value < low:
                raise ValueError(f"LhcHook: {name} must be a non-negative integer, not "
                                 f"{value!r}")
        if slot_count is not None and (isinstance(slot_count, bool) or not isinstance(
                slot_count, numbers.Integral) or slot_count < 1):
            raise ValueError(f"LhcHook: slot_count must be a positive integer, not "
                             f"{slot_count!r}")
        if timeout is not None and not (isinstance(timeout, numbers.Real) and timeout > 0):
            raise ValueError(f"LhcHook: timeout must be a positive number of seconds, not "
                             f"{timeout!r}")
        if boards is not None:
            settings = check_boards("LhcHook", board, boards, key)
        else:
            settings, = check_board("LhcHook", board, key, None, per_rank=False,
                                    need_key=True)
        self._hardware = UdpSwitch("LhcHook", settings, job=int(job), slot_base=int(slot_base),
                                   slot_count=slot_count, timeout=timeout, group=group)

    def __repr__(self):
        text = f"LhcHook(load={self.load}, r_min={self.r_min}, path={self.path!r}"
        if self._hardware is not None:
            text += f", backend={self.backend!r}"
            if len(self._hardware.boards) > 1:
                text += f", boards={len(self._hardware.boards)}"
        return text + ")"

    def _allreduce_sum(self, values, group):
        return lhc_allreduce(values, group, load=self.load, r_min=self.r_min, path=self.path,
                             switch=self._hardware)
