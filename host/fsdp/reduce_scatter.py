"""INCEPTIONN and LHC as FSDP2's custom reduce-scatter (``FSDPModule.set_custom_reduce_scatter``).

FSDP2 reduces each layer group's gradients with one reduce-scatter: it copies the
unsharded gradients into one flat ``input`` of ``N * S`` values (``N`` ranks, ``S`` the
shard; every parameter padded along dim 0 to a multiple of ``N`` with zeros, rank ``r``'s
part of every parameter in the contiguous chunk ``[r S, (r + 1) S)``), and every rank wants
chunk ``r`` of the sum in its ``output`` of ``S`` values. The objects here are
``torch.distributed.fsdp`` ``ReduceScatter`` s: ``allocate`` and
``__call__(output, input, group, op, async_op)``.

:class:`InceptionnReduceScatter`
    The reduce-scatter phase of INCEPTIONN's ring (:func:`inceptionn_reduce_scatter`), with
    the chunks of FSDP2's layout. Rank ``r`` sends at step ``s = 0 .. N-2`` its partial sum
    of chunk ``r - s - 1`` compressed to rank ``r + 1`` and adds the decoded chunk
    ``r - s - 2`` from rank ``r - 1`` to its own values in float32; chunk ``c`` so starts at
    rank ``c + 1`` and ends, summed in the order ``c + 1, c + 2, .., c + N`` (mod N), at its
    owner ``c``: ``p_0 = x_{c+1}``, ``p_j = fl(q(p_{j-1}) + x_{c+1+j})``, result ``p_{N-1}``.
    That is the ring of :class:`host.ddp.InceptionnHook` (the same codec, backends and
    messages) without the all-gather, and without the owner's last quantisation (nobody else
    needs the shard's bits), so its error is within the ring's bound of ``docs/accuracy.md``,
    computed here for this order by :func:`reduce_scatter_error_bound`: ``N 2^-k`` plus the
    float32 rounding of the partial sums. Each hop goes through the golden model, this rank's
    Verilated NIC or a board's NIC over UDP (``backend``); the result bits are the same.
    ``error_feedback=True`` quantises this rank's whole input with its residual added
    (:func:`host.golden.inceptionn.quantize_with_feedback`) and keeps the residual, one per
    input layout (its size): give every FSDP2 module an object of its own
    (:func:`set_reduce_scatter` does).

:class:`LhcReduceScatter`
    The LHC sum of the whole input (:func:`host.ddp.collectives.lhc_allreduce`: sketch or dense
    int32, chosen per call as :class:`host.ddp.LhcHook` chooses per bucket; the switch
    sends every worker the sum), of which every rank keeps its chunk: bit for bit
    :func:`host.golden.lhc.allreduce`'s chunk, the exact sum of the quantised values.

Arithmetic for every op and factor
    The float32 sum ``s`` of the chunk is computed first (identical bits on every rank where
    it matters: LHC's whole sum, the owner's INCEPTIONN shard), then ``op``: ``SUM`` keeps
    ``s``; ``AVG`` divides by the group's size in float32 (one correctly rounded division);
    ``PREMUL_SUM(f)`` (what FSDP2 passes for ``set_gradient_divide_factor(F)`` with ``F``
    other than the group's size, ``f = 1/F``) gives ``s * f`` rounded once to float32 (the
    product formed in float64), where torch's own reduce-scatter multiplies every input by
    ``f`` before the sum: the same value up to float32 rounding. Any other op is refused.
    FSDP2's own pre- and post-division (float16 ``reduce_dtype``: ``SUM`` between them) are
    FSDP2's, outside the call. A float16 or bfloat16 input (``MixedPrecisionPolicy(
    reduce_dtype=...)``) is widened to float32 exactly, reduced as above, and the result
    narrowed once to the input's dtype (round to nearest even).

Asynchronous
    Every call hands its exchange to the object's worker thread (in call order:
    :class:`host.ddp.hook_worker.HookWorker`) and returns a ``torch.distributed.Work``
    (``async_op=True``) that completes when ``output`` holds the result, as the DDP hooks'
    futures do; ``wait()`` raises the call's error. With ``async_op=False`` the call waits
    for it before returning. torch 2.13's FSDP2 calls its reduce-scatter with
    ``async_op=False`` and reads ``output`` at once on the host (division, casts, gradient
    accumulation), and ignores the returned Work; so under FSDP2 each call ends before the
    backward pass goes on, and the asynchrony serves callers that wait later.

Process group
    The same rule as the DDP hooks (:func:`host.ddp.hook_worker.cpu_group`): the calls'
    collectives never run on FSDP2's communicator. Every object creates, at its first call
    (collectively: FSDP2 reduces the same layer groups in the same order on every rank), a
    gloo group of its own with the ranks of the group FSDP2 passes, and keeps it: on GPUs
    with NCCL the traffic goes over that gloo group, CUDA gradients copied to pinned host
    memory on FSDP2's reduce-scatter stream and the result copied back on it.

Bytes: every call appends a :class:`host.ddp.call_stats.CallStats` to ``calls`` and adds to
``bytes_sent`` (this rank's payload) and ``dense_bytes`` (what FSDP2's own fp32
reduce-scatter, a ring, sends from this rank: ``4 (N - 1) S``,
:func:`dense_reduce_scatter_bytes`).
"""
from __future__ import annotations

import collections
import numbers
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter

from ..ddp import collectives as _collectives
from ..ddp import hooks as _hooks
from ..ddp.call_stats import CallStats
from ..ddp.hook_worker import (ACCEPTED_DTYPES, HookWorker, bucket_to_host, complete,
                               cpu_group, new_future, raise_carried_error)
from ..golden import inceptionn as _inc
from ..golden import lhc as _lhc
from ..golden.ring import chunk_sum_error_bound

__all__ = ["InceptionnReduceScatter", "LhcReduceScatter", "set_reduce_scatter",
           "inceptionn_reduce_scatter", "lhc_reduce_scatter", "reduce_scatter_error_bound",
           "dense_reduce_scatter_bytes"]


def dense_reduce_scatter_bytes(numel: int, world_size: int) -> int:
    """Bytes one rank sends in a plain fp32 ring reduce-scatter of ``numel`` values
    (``numel`` a multiple of ``world_size``): ``4 (N - 1) numel / N``."""
    return 4 * (world_size - 1) * (numel // world_size)


def _rs_schedule(rank: int, world: int):
    """``(step, send_chunk, recv_chunk)``: rank ``r`` ends owning chunk ``r``."""
    for s in range(world - 1):
        yield s, (rank - s - 1) % world, (rank - s - 2) % world


def reduce_scatter_error_bound(tensors, k) -> np.ndarray:
    """Per-element bound on ``|reduce-scatter result - exact sum|`` for every element of
    the ``N`` ranks' inputs ``tensors`` (flat, ``N S`` values each): chunk ``c`` is summed
    in the order ``c + 1, .., c + N``; the bound is ``(N - 1) 2^-k`` (one quantisation per
    hop; the ring all-reduce's ``N 2^-k`` has one more, the owner's) plus
    ``2^-24 sum_{j=1}^{N-1} (1 + 2^-24)^j sum_{i=0}^{j} |x_{c+1+i}|``, in float64 (the
    derivation of :mod:`host.golden.ring`). A result element ``y`` of chunk ``c`` satisfies
    ``|y - sum_w x_w| < bound``."""
    return chunk_sum_error_bound(tensors, k, first=1, quantisations=len(tensors) - 1)


def inceptionn_reduce_scatter(values, k: int = _inc.K_DEFAULT, group=None, *, codec=None):
    """The INCEPTIONN ring's reduce-scatter of this rank's ``values`` (float32, ``N S``):
    returns (this rank's chunk of the sum, ``S`` float32 values; :class:`CallStats`).

    Every rank calls with the same length (a multiple of ``N``) and ``k``; a preflight
    all-gather raises the same ``ValueError`` on every rank if not. ``codec``: a
    :class:`host.ddp.hardware.NicRingCodec` (every hop through this rank's NIC), default the
    golden model. See the module docstring for the order of the additions and the bound.
    """
    started = time.perf_counter()
    k = _collectives._check_k(k)
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    values = np.asarray(values)
    if values.dtype != np.float32:
        raise TypeError(f"values must be float32, not {values.dtype}")
    acc = values.astype(np.float32, copy=True).reshape(-1)
    group, rank, world, to_global = _collectives._group_info(group)
    problem = None
    if acc.size % world:
        problem = f"{acc.size} values do not split into {world} equal shards"
    preflight = _collectives._preflight(group, world, to_global,
                                        "INCEPTIONN ring reduce-scatter", acc.size, [("k", k)],
                                        problem)
    shard = acc.size // world
    if world == 1:
        stats = CallStats(bucket_index=-1, numel=acc.size, bytes_sent=0, dense_ring_bytes=0,
                          details={"k": k, "world_size": 1},
                          seconds=time.perf_counter() - started)
        return acc, stats
    codec = _collectives._GOLDEN_RING if codec is None else codec
    codec.start(group, rank, world, to_global)
    before = codec.counts.as_dict() if codec.hardware else None
    right, left = to_global((rank + 1) % world), to_global((rank - 1) % world)
    sent = messages = framing = added = rounded = 0
    path_seconds = 0.0
    for _, send_chunk, recv_chunk in _rs_schedule(rank, world):
        sa, ra = send_chunk * shard, recv_chunk * shard
        t = time.perf_counter()
        payload = codec.encode(acc[sa:sa + shard], k) if shard else None
        path_seconds += time.perf_counter() - t
        data = _collectives._ring_exchange(payload, shard > 0, right, left, group)
        if payload is not None:
            sent += codec.payload_bytes(payload)
            framing += codec.framing_bytes(payload)
            messages += 1
        if data is not None:
            t = time.perf_counter()
            decoded = codec.decode(data, shard, k)
            path_seconds += time.perf_counter() - t
            total = decoded + acc[ra:ra + shard]
            added += shard
            rounded += _collectives._count_rounded_sums(decoded, acc[ra:ra + shard], total)
            acc[ra:ra + shard] = total
    status = codec.finish(group, world, to_global)
    dense = dense_reduce_scatter_bytes(acc.size, world)
    hardware = {}
    if before is not None:
        after = codec.counts.as_dict()
        hardware = {name: after[name] - before[name] for name in after}
    details = {"k": k, "world_size": world, "messages": messages, "shard": shard,
               "ratio": (dense / sent) if sent else None, "added_values": added,
               "rounded_adds": rounded}
    stats = CallStats(bucket_index=-1, numel=acc.size, bytes_sent=sent, dense_ring_bytes=dense,
                      control_bytes=8 * messages + framing + preflight + status,
                      details=details,
                      backend=codec.describe() if codec.hardware else "golden",
                      seconds=time.perf_counter() - started, path_seconds=path_seconds,
                      hardware=hardware)
    return acc[rank * shard:(rank + 1) * shard].copy(), stats


def lhc_reduce_scatter(values, group=None, *, load: float = _lhc.DEFAULT_LOAD,
                       r_min: int = 1, path: str = "auto", switch=None):
    """The LHC sum of every rank's ``values`` (float32, ``N S``, finite), of which this
    rank keeps chunk ``rank``: (``S`` float32 values, :class:`CallStats`). Bit for bit
    :func:`host.golden.lhc.allreduce`'s chunk. ``switch``: a
    :class:`host.ddp.hardware.UdpSwitch` (a board's switch), default gloo collectives."""
    group_, rank, world, _ = _collectives._group_info(group)
    size = int(np.asarray(values).size) if not isinstance(values, torch.Tensor) \
        else values.numel()
    if size % world:
        raise ValueError(f"LHC reduce-scatter: {size} values do not split into {world} "
                         f"equal shards")
    total, stats = _collectives.lhc_allreduce(values, group, load=load, r_min=r_min,
                                              path=path, switch=switch)
    shard = size // world
    stats.dense_ring_bytes = dense_reduce_scatter_bytes(size, world)
    stats.details["shard"] = shard
    return total[rank * shard:(rank + 1) * shard].copy(), stats


# ---------------------------------------------------------------------------------------
# the ReduceScatter objects

def _op_kind(op):
    """``("sum", None)``, ``("avg", None)`` or ``("premul", factor)`` of a reduce op."""
    if op == dist.ReduceOp.SUM:
        return "sum", None
    if op == dist.ReduceOp.AVG:
        return "avg", None
    if op == dist.ReduceOp.PREMUL_SUM:
        factor = getattr(op, "factor", None)
        if isinstance(factor, torch.Tensor):
            factor = float(factor.item())
        if factor is None:
            raise ValueError("PREMUL_SUM without a readable factor")
        return "premul", float(factor)
    raise ValueError(f"the reduce-scatter takes SUM, AVG and PREMUL_SUM, not {op!r}")


def _apply_op(total: np.ndarray, kind: str, factor, world: int) -> np.ndarray:
    if kind == "sum":
        return total
    if kind == "avg":
        return total / np.float32(world)                      # one float32 division
    return (total.astype(np.float64) * factor).astype(np.float32)   # rounded once


class ReduceScatterWork(dist.Work):
    """The ``Work`` of an asynchronous call: ``wait()`` returns once ``output`` holds the
    result (for CUDA: once FSDP2's stream will see it) and raises the call's error, on every
    rank alike; ``get_future()`` is a future of ``[output]`` that carries the error."""

    def __init__(self, future: torch.futures.Future):
        super().__init__()
        self._future = future

    def wait(self, timeout=None) -> bool:
        value = self._future.wait()
        if isinstance(value, BaseException):
            raise value
        return True

    def is_completed(self) -> bool:
        return self._future.done()

    def is_success(self) -> bool:
        return self._future.done() and not isinstance(self._future.value(), BaseException)

    def get_future(self) -> torch.futures.Future:
        return self._future.then(raise_carried_error)


class _ReduceScatterBase(ReduceScatter):
    """Common part: checks, the host copy, the worker, the op, the output, statistics."""

    _who = "ReduceScatter"

    def __init__(self, history: int):
        if isinstance(history, bool) or not isinstance(history, numbers.Integral) \
                or history < 0:
            raise ValueError(f"history must be a non-negative integer, not {history!r}")
        self.calls = collections.deque(maxlen=int(history))
        self.bytes_sent = 0
        self.dense_bytes = 0
        self.control_bytes = 0
        self._worker = None
        self._groups = {}                       # FSDP2's group -> the private gloo group

    # the inner DDP hook object: backend checks and the hardware path
    _hook = None

    @property
    def backend(self) -> str:
        return self._hook.backend

    @property
    def hardware_totals(self):
        return self._hook.hardware_totals

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def reset_stats(self):
        self.calls.clear()
        self.bytes_sent = self.dense_bytes = self.control_bytes = 0

    def close(self):
        """Stop the worker once its calls are done; close the hardware path."""
        if self._worker is not None:
            self._worker.stop()
            self._worker = None
        self._hook.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _reduce(self, values: np.ndarray, group):
        raise NotImplementedError

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup = None, op=dist.ReduceOp.SUM,
                 async_op: bool = False):
        who = self._who
        for name, tensor in (("input", input_tensor), ("output", output_tensor)):
            if tensor.dtype not in ACCEPTED_DTYPES:
                raise TypeError(f"{who}: {name} must be float32, float16 or bfloat16, not "
                                f"{tensor.dtype}")
            if tensor.device.type not in ("cpu", "cuda"):
                raise TypeError(f"{who}: CPU and CUDA tensors only, not {tensor.device.type}")
        kind, factor = _op_kind(op)
        private = cpu_group(who, group, self._groups)
        world = dist.get_world_size(private if private is not None else dist.group.WORLD)
        if input_tensor.numel() != world * output_tensor.numel():
            raise ValueError(f"{who}: input of {input_tensor.numel()} values for an output "
                             f"of {output_tensor.numel()} on {world} ranks (input must be "
                             f"world size x output)")
        host = bucket_to_host(input_tensor)
        future = new_future(output_tensor.device)
        if self._worker is None or not self._worker.alive:
            self._worker = HookWorker(f"{who}-worker")
        self._worker.submit(lambda: self._run(future, host, private, kind, factor, world,
                                              output_tensor))
        work = ReduceScatterWork(future)
        if async_op:
            return work
        work.wait()
        return None

    def _run(self, future, host, group, kind, factor, world, output):
        try:
            shard, stats = self._reduce(host.wait(), group)
            result = torch.from_numpy(_apply_op(shard, kind, factor, world))
            narrowed = result.to(output.dtype)                  # round to nearest even
            if output.device.type == "cuda":
                with torch.cuda.stream(host.stream):
                    output.view(-1).copy_(narrowed.pin_memory(), non_blocking=True)
            else:
                output.view(-1).copy_(narrowed)
            stats.details["op"] = kind if factor is None else f"{kind}({factor!r})"
            stats.details["dtype"] = str(output.dtype).replace("torch.", "")
            self.calls.append(stats)
            self.bytes_sent += stats.bytes_sent
            self.dense_bytes += stats.dense_ring_bytes
            self.control_bytes += stats.control_bytes
            complete(future, [output], host)
        except BaseException as exc:                            # noqa: BLE001 (the Work)
            future.set_result(exc)


class InceptionnReduceScatter(_ReduceScatterBase):
    """FSDP2 reduce-scatter through INCEPTIONN's ring (error bound ``2^-k`` per hop).

    Parameters
    ----------
    k : int
        Error bound exponent, 1..15 (default 10).
    error_feedback : bool
        Keep what the codec drops of this rank's input and add it to the next call's
        (one residual per input size: one object per FSDP2 module).
    backend : {"golden", "verilator", "udp"}
        Who compresses and decompresses every hop (as :class:`host.ddp.InceptionnHook`).
    board, key, mtu :
        ``"udp"``: the board(s), optional key and MTU (as the hook).
    history : int
        How many :class:`CallStats` ``calls`` keeps.

    See the module docstring.
    """

    _who = "InceptionnReduceScatter"

    def __init__(self, k: int = _inc.K_DEFAULT, error_feedback: bool = False,
                 backend: str = "golden", *, board=None, key=None, mtu=None,
                 history: int = _hooks.DEFAULT_HISTORY):
        super().__init__(history)
        self._hook = _hooks.InceptionnHook(k, error_feedback=error_feedback, backend=backend,
                                           board=board, key=key, mtu=mtu,
                                           asynchronous=False)
        self.k = self._hook.k
        self.error_feedback = error_feedback
        self._residuals = {}                    # input size -> float32 residual

    def __repr__(self):
        text = f"InceptionnReduceScatter(k={self.k}"
        if self.error_feedback:
            text += ", error_feedback=True"
        if self.backend != "golden":
            text += f", backend={self.backend!r}"
        return text + ")"

    def residual(self, numel: int) -> np.ndarray:
        """This rank's residual for inputs of ``numel`` values (zeros before)."""
        stored = self._residuals.get(int(numel))
        return np.zeros(int(numel), dtype=np.float32) if stored is None else stored.copy()

    def reset_residuals(self):
        self._residuals.clear()

    def _reduce(self, values, group):
        values = values.reshape(-1)
        if not self.error_feedback:
            shard, stats = inceptionn_reduce_scatter(values, self.k, group,
                                                     codec=self._hook._hardware)
            stats.details["error_feedback"] = False
            return shard, stats
        residual = self._residuals.get(values.size)
        if residual is None:
            residual = np.zeros(values.size, dtype=np.float32)
        sent, residual = _inc.quantize_with_feedback(values, residual, self.k)
        shard, stats = inceptionn_reduce_scatter(sent, self.k, group,
                                                 codec=self._hook._hardware)
        self._residuals[values.size] = residual           # only a completed call moves it
        stats.details["error_feedback"] = True
        return shard, stats


class LhcReduceScatter(_ReduceScatterBase):
    """FSDP2 reduce-scatter through the LHC sum (exact sum of the quantised values).

    Parameters
    ----------
    load, r_min, path :
        As :class:`host.ddp.LhcHook` (``path="auto"``: sketch or dense int32, per call).
    backend : {"golden", "udp"}
        gloo collectives standing for the switch, or a board's switch.
    board, key, job, slot_base, slot_count, timeout :
        ``"udp"``: as the hook.
    history : int
        How many :class:`CallStats` ``calls`` keeps.

    Gradients must be finite (every rank raises the same ``ValueError`` otherwise).
    """

    _who = "LhcReduceScatter"

    def __init__(self, load: float = _lhc.DEFAULT_LOAD, r_min: int = 1, path: str = "auto",
                 backend: str = "golden", *, board=None, key=None, job: int = 0,
                 slot_base: int = 0, slot_count=None, timeout=None,
                 history: int = _hooks.DEFAULT_HISTORY):
        super().__init__(history)
        self._hook = _hooks.LhcHook(load=load, r_min=r_min, path=path, backend=backend,
                                    board=board, key=key, job=job, slot_base=slot_base,
                                    slot_count=slot_count, timeout=timeout,
                                    asynchronous=False)
        self.load, self.r_min, self.path = self._hook.load, self._hook.r_min, path

    def __repr__(self):
        text = f"LhcReduceScatter(load={self.load}, r_min={self.r_min}, path={self.path!r}"
        if self.backend != "golden":
            text += f", backend={self.backend!r}"
        return text + ")"

    def _reduce(self, values, group):
        return lhc_reduce_scatter(values.reshape(-1), group, load=self.load, r_min=self.r_min,
                                  path=self.path, switch=self._hook._hardware)


def set_reduce_scatter(model, factory) -> list:
    """``factory()`` (a fresh reduce-scatter object) on every FSDP2 module of ``model``
    (``model`` itself and its submodules that ``fully_shard`` wrapped); returns the
    objects, in module order."""
    from torch.distributed.fsdp import FSDPModule

    objects = []
    for module in model.modules():
        if isinstance(module, FSDPModule):
            comm = factory()
            module.set_custom_reduce_scatter(comm)
            objects.append(comm)
    return objects
