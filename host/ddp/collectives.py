"""The collectives under the DDP hooks: the two hardware paths' arithmetic as exchanges over a
process group, bit for bit the gateware's.

:func:`inceptionn_ring_allreduce` and :func:`lhc_allreduce` sum every rank's float32 vector
over a :class:`torch.distributed.ProcessGroup` and return the sum with the call's
:class:`~host.ddp.call_stats.CallStats`; :class:`~host.ddp.hooks.InceptionnHook` and
:class:`~host.ddp.hooks.LhcHook` run them on DDP's buckets, and FSDP2's reduce-scatter
(:mod:`host.fsdp.reduce_scatter`) builds on the same pieces (the preflight, the ring's
messages, the golden codec). They exchange CPU tensors over gloo, for any vector length
(also lengths smaller than the world size or not a multiple of it), and compute through the
NumPy golden models (:mod:`host.golden.inceptionn`, :mod:`host.golden.lhc`), or through the
hardware backends of :mod:`host.ddp.hardware` standing in for them.

:func:`inceptionn_ring_allreduce`
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

:func:`lhc_allreduce`
    Lossless homomorphic compression (the in-network path), with the path chosen per call
    (``path="auto"``, the hook's default): after the index phase a vector whose sketch would
    send more bytes than a dense int32 all-reduce goes dense instead (same result bits). On
    the sketch path the workers' exponents are MAX-reduced, the index bitmaps OR-reduced,
    the int32 count sketches SUM-reduced (exact modulo 2^32: summed as int64, then wrapped),
    every worker peels the summed sketch with the golden decoder, and one more SUM
    all-reduce carries the exact quantised values of the elements that peeling left. The
    result is the dequantised exact sum, bit for bit :func:`host.golden.lhc.allreduce` of
    the ranks' tensors.

Both return the float32 *sum*, bit-identical on every rank (the hooks divide it by the world
size afterwards).

Every rank must call with the same number of values (and the same parameters: ``k``, or
``load``, ``r_min`` and ``path``), and the sketch path needs finite values. Before any
data moves, one small all-gather of these numbers and of each rank's "input accepted" flag
(3 or 5 int64 words per rank) lets every rank raise the *same*
``ValueError``, naming the ranks and what differs or which rank's input was refused (its own
message), instead of one rank failing and its peers hanging, dying inside gloo or
returning sums of different lengths.

Bytes on the wire (each call's :class:`~host.ddp.call_stats.CallStats`): ``bytes_sent``
(payload bytes this rank sent) and ``dense_ring_bytes`` (what a plain fp32 ring all-reduce of
the same vector sends from this rank: ``4 * 2 * (N-1)/N * numel``, exactly, chunk by chunk,
:func:`dense_ring_bytes`). Message framing is not counted in ``bytes_sent`` but reported as
``control_bytes``: the 8-byte length word that precedes every compressed INCEPTIONN chunk
(in hardware the packet header's ``count``), plus the preflight all-gather: ``8 * words *
(N - 1)`` bytes per rank and call (every other rank receives this rank's words once): 3
words for the ring (72 bytes with 4 ranks), 5 for the sketch (120 bytes).
"""
import numbers
import struct
import time

import numpy as np
import torch
import torch.distributed as dist

from .call_stats import CallStats
from .hardware import RING_FAILED
from ..golden import inceptionn as _inc
from ..golden import lhc as _lhc
from ..golden.ring import ring_chunk_bounds

__all__ = ["ring_chunk_bounds", "dense_ring_bytes", "inceptionn_ring_allreduce",
           "lhc_allreduce"]

#: Tag of the point-to-point messages of the INCEPTIONN ring (any fixed value works: every
#: message is matched in order between one pair of ranks, and each step is waited for).
_RING_TAG = 0x1CE
#: How the preflight names the path parameter (its word is the index in ``lhc.PATHS``).
_PATH_PARAMETER = "path (0 sketch, 1 dense, 2 auto)"


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
