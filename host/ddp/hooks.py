"""PyTorch DDP communication hooks that reproduce the two hardware paths' arithmetic.

Both hooks are callable objects for :meth:`torch.nn.parallel.DistributedDataParallel.
register_comm_hook`::

    ddp_model.register_comm_hook(state=None, hook=InceptionnHook(k=10))
    ddp_model.register_comm_hook(state=None, hook=LhcHook())

``state`` is ``None`` (the default process group) or a :class:`torch.distributed.ProcessGroup`.
Each bucket goes through one of the collectives of :mod:`host.ddp.collectives`, which
exchange CPU tensors over gloo, for any bucket size (also buckets smaller than the world
size or not a multiple of it), and compute through the NumPy golden models
(:mod:`host.golden.inceptionn`, :mod:`host.golden.lhc`), so their arithmetic is, bit for
bit, the arithmetic of the gateware.

:class:`InceptionnHook`
    Gradient-centric ring all-reduce (INCEPTIONN's NIC path),
    :func:`~host.ddp.collectives.inceptionn_ring_allreduce`: every hop carries the sender's
    partial sum compressed by :func:`host.golden.inceptionn.encode`, and every rank ends
    with the same bits (the ring, its error bound and ``docs/accuracy.md`` in
    :mod:`host.ddp.collectives`).

    With ``error_feedback=True`` each rank first quantises its own bucket with the residual
    of its earlier steps added (:func:`host.golden.inceptionn.quantize_with_feedback`) and
    keeps what the codec dropped for the next step; see :class:`InceptionnHook`.

:class:`LhcHook`
    Lossless homomorphic compression (the in-network path),
    :func:`~host.ddp.collectives.lhc_allreduce`, by default with the path chosen per bucket
    (``path="auto"``): after the index phase a bucket whose sketch would send more bytes
    than a dense int32 all-reduce goes dense instead (same result bits). The result is the
    dequantised exact sum, bit for bit :func:`host.golden.lhc.allreduce` of the ranks'
    tensors.

Both hooks are asynchronous by default (the future comes back at once, a worker thread of
the hook's own runs the exchange while the backward pass goes on; ``asynchronous=False``
runs it inside the call), take float32, float16 and bfloat16 buckets on CPU and CUDA devices,
and carry their traffic on a gloo group of their own, never on DDP's communicator: see
:mod:`host.ddp.hook_worker`.

Both return the *average* DDP expects, computed in one fixed order on every rank: first the
float32 sum (bit-identical on all ranks), then one float32 division by the world size
(IEEE division, correctly rounded, hence the same bits on every rank).

Every rank must call with the same number of values (and the same parameters: ``k``, or
``load``, ``r_min`` and ``path``), and the sketch path needs finite gradients: otherwise
every rank raises the same ``ValueError`` before any data moves (the preflight of
:mod:`host.ddp.collectives`).

Bytes on the wire: every call appends a :class:`~host.ddp.call_stats.CallStats` to
``hook.calls`` (the newest ``history`` calls are kept, default :data:`DEFAULT_HISTORY`) and
adds to ``hook.bytes_sent`` (payload bytes this rank sent), ``hook.dense_ring_bytes`` (what
a plain fp32 ring all-reduce of the same bucket sends from this rank) and
``hook.control_bytes`` (framing and the preflight); what each counts is in
:mod:`host.ddp.collectives`.
"""
# No ``from __future__ import annotations`` here: DDP's register_comm_hook inspects the
# hook's annotations and accepts only the real objects, not strings.
import collections
import numbers
import weakref

import numpy as np
import torch
import torch.distributed as dist

from .collectives import _check_k, inceptionn_ring_allreduce, lhc_allreduce
from .hook_worker import (FailedIteration, HookWorker, bucket_to_host, check_bucket, complete,
                          cpu_group, new_future, raise_carried_error, result_to_device)
from .hardware import (INCEPTIONN_BACKENDS, LHC_BACKENDS, NicRingCodec, UdpSwitch,
                       check_backend, check_board, check_boards, check_tree)
from ..golden import inceptionn as _inc
from ..golden import lhc as _lhc

__all__ = ["InceptionnHook", "LhcHook", "DEFAULT_HISTORY"]

#: How many per-call statistics a hook keeps by default.
DEFAULT_HISTORY = 100_000


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
        How many :class:`~host.ddp.call_stats.CallStats` ``hook.calls`` keeps (the newest;
        the byte counters count every call).
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

    Each call's :class:`~host.ddp.call_stats.CallStats` counts both (``details``:
    ``offgrid_values`` of ``quantised_values``, ``rounded_adds`` of ``added_values``). Measured
    over the accuracy experiment's 300 steps on 4 ranks (:mod:`host.ddp.accuracy`,
    ``ring_offgrid_fraction`` and ``ring_rounded_fraction``) with error feedback: no float32
    addition rounded in any run (the gradients stay below 1), and a partial sum left its grid
    for 545 of 20.7 million hop values in digits at k = 10 (tag-10 sums cancelling below
    ``2^-3``), for none in digits at k = 6 and 8 nor in the recommender at k = 6, 8 and 10 (175
    million each). Without feedback, for comparison, the quantisation changes 59-61 % (digits)
    and 8.6 % (recommender) of the hop values and 0.002-18 % of the additions round.
    What the ring drops is not fed back (it happens after the residual is taken); its
    size stays within the ring's bound (:mod:`host.golden.ring`).

    See :func:`host.ddp.collectives.inceptionn_ring_allreduce` and the module docstrings.
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
        How many :class:`~host.ddp.call_stats.CallStats` ``hook.calls`` keeps (the newest;
        the byte counters count every call).
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
        ``boards``: one key for every board, or one per board; with ``tree``: see there.
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
    tree : host.switchml.tree.Tree or dict
        ``"udp"``: instead of ``board``/``boards``, the job on a tree of aggregators
        (``docs/protocol/aggregator-protocol.md`` section 4): a
        :class:`~host.switchml.tree.Tree` (root board, leaf boards, workers per leaf, the
        root's and the leaves' jobs, slots, result groups per leaf), or a dict of its
        arguments, ``{"root": "HOST:PORT_BASE", "leaves": [...], "workers": 2}``. Group
        rank ``r`` is the tree's worker ``r`` (leaf 0's workers first) and talks to its
        leaf board alone; group rank 0 configures every board (root first) at the first
        bucket and releases the tree's jobs at :meth:`close`. The process group must have
        exactly :attr:`~host.switchml.tree.Tree.total_workers` ranks (up to 32 x 32 = 1024;
        also the LHC scale's worker count), otherwise the first bucket raises one
        :class:`~host.ddp.hardware.HookBackendError` naming both counts on every rank.
        ``key`` is one key for every board, a list with one per board (the root first, then
        the leaves: ``Tree.boards``) or a dict from ``"HOST:PORT_BASE"`` to key; ``job``,
        ``slot_base``, ``slot_count`` and ``group`` are the Tree's and must be left out.
        The result bits are one board's (the flat LHC all-reduce over every rank).

    Raises
    ------
    ValueError
        Arguments that do not fit together or out of range (checked here, before any
        bucket): ``board``/``boards``/``tree`` with backend ``"golden"``; ``tree`` with
        ``board``, ``boards``, ``group``, ``job``, ``slot_base`` or ``slot_count``; a bad
        tree or the wrong number of keys.
    TypeError
        ``tree`` that is neither a Tree nor a dict.

    Notes
    -----
    A float16 or bfloat16 bucket is widened to float32 (exactly) for the sketch, and the
    exact-sum result, divided by the world size in float32, is narrowed back to the
    bucket's dtype (round to nearest even; half a unit in the last place: ``2^-11`` of the
    value in float16, ``2^-8`` in bfloat16, an infinity above float16's 65504). An
    infinity in a float16 gradient is refused like any non-finite value.

    See :func:`host.ddp.collectives.lhc_allreduce` and the module docstrings. Gradients must
    be finite.
    """

    def __init__(self, *, load: float = _lhc.DEFAULT_LOAD, r_min: int = 1,
                 history: int = DEFAULT_HISTORY, path: str = "auto", backend: str = "golden",
                 board=None, key=None, job: int = 0, slot_base: int = 0, slot_count=None,
                 timeout=None, asynchronous: bool = True, boards=None, group=None,
                 tree=None):
        super().__init__(history, asynchronous)
        # Reject a bad load / r_min / path now rather than in the middle of a backward pass.
        _lhc.LhcWorker(np.zeros(1, dtype=np.float32), 1, load=load, r_min=r_min, path=path)
        self.load = float(load)
        self.r_min = int(r_min)
        self.path = path
        check_backend("LhcHook", backend, LHC_BACKENDS)
        if backend == "golden":
            defaults = dict(board=None, boards=None, key=None, job=0, slot_base=0,
                            slot_count=None, timeout=None, group=None, tree=None)
            given = [name for name, value in dict(board=board, boards=boards, key=key, job=job,
                                                  slot_base=slot_base, slot_count=slot_count,
                                                  timeout=timeout, group=group,
                                                  tree=tree).items()
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
        if tree is not None:
            if board is not None or boards is not None:
                raise ValueError(f"LhcHook: give tree= (a tree of aggregators) or "
                                 f"{'board=' if board is not None else 'boards='}, not both: "
                                 f"the tree names its boards itself (Tree's root and leaves)")
            given = [name for name, value, default in (
                ("job", job, 0), ("slot_base", slot_base, 0), ("slot_count", slot_count, None),
                ("group", group, None)) if value is not default and value != default]
            if given:
                raise ValueError(f"LhcHook: give tree= without "
                                 f"{', '.join(f'{name}=' for name in given)}: the tree names "
                                 f"its jobs, slots and result groups itself (Tree's root_job, "
                                 f"leaf_job, slot_base, slot_count, groups)")
            tree, keys = check_tree("LhcHook", tree, key)
            self._hardware = UdpSwitch("LhcHook", None, timeout=timeout, tree=tree, keys=keys)
            return
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
            if self._hardware.tree is not None:
                tree = self._hardware.tree
                text += f", tree={len(tree.leaves)} leaves/{tree.total_workers} workers"
            elif len(self._hardware.boards) > 1:
                text += f", boards={len(self._hardware.boards)}"
        return text + ")"

    def _allreduce_sum(self, values, group):
        return lhc_allreduce(values, group, load=self.load, r_min=self.r_min, path=self.path,
                             switch=self._hardware)
