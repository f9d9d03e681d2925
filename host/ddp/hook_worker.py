"""What makes the DDP hooks of :mod:`host.ddp` run as training runs them: asynchronously, on
any process group and device, with mixed precision.

:class:`host.ddp.InceptionnHook` and :class:`host.ddp.LhcHook` use these pieces; nothing here
computes a sum.

Asynchronous exchange (:class:`HookWorker`)
    DDP calls a hook once per gradient bucket, on the autograd thread, as soon as the bucket
    is ready, and waits for the returned future only at the end of the backward pass
    (``Reducer::finalize_backward``). The hook copies the bucket to the host
    (:func:`bucket_to_host`), hands the exchange to its worker thread and returns the
    future at once; the worker runs the exchanges one after another in call order. Every
    rank's autograd calls the hook for the same buckets in the same order, so the ranks'
    collectives and ring messages pair up exactly as with the synchronous hook: the
    arithmetic, and therefore every result bit, is the same.

    A failed exchange completes its future with the error (raised on every rank alike by
    the exchange functions' agreement steps, see :mod:`host.ddp`), and every later bucket of
    the same backward pass fails at once with it, without touching the network
    (:class:`FailedIteration`): DDP raises from ``backward()`` on the first failed future
    while the worker may still hold later buckets, and those must not run collectives
    beside the caller's next ones. Every rank fails the same bucket, so every rank skips the
    same ones; the pass ends with DDP's last bucket (``GradBucket.is_last()``).

    A hook's worker is started at its first asynchronous call; :meth:`HookWorker.stop` (from
    the hook's ``close()``), the garbage collection of the hook and interpreter exit stop
    it after the exchanges already handed to it.

Process group (:func:`cpu_group`)
    The hooks' collectives never share a communicator with DDP's: each hook creates a gloo
    group of its own with the ranks of the group DDP gives it (``state``: ``None`` for the
    default group, or a ProcessGroup), once, collectively, at its first bucket (every rank
    reaches it together), with that group's timeout. DDP's own collectives from the
    autograd thread (``find_unused_parameters=True``, ``static_graph=True``, join) and the
    worker's exchanges then cannot interleave differently on different ranks. The private
    group is gloo, so it also carries the hooks' CPU tensors and bitwise-OR reduction when
    DDP's group is NCCL's. A group smaller than the job (``new_group`` is collective over
    the whole job) is used as it is when it has a CPU backend, and must then be the hook's
    own: ``dist.new_group(ranks, backend="gloo")``; without one it is refused.

Devices and precision (:func:`bucket_to_host`, :func:`result_to_device`)
    A bucket of float32, float16 or bfloat16 is widened to float32 (exactly: every float16
    and bfloat16 value is a float32 value) for the codec or the sketch, and the averaged
    float32 result is narrowed back to the bucket's dtype (round to nearest even) on the
    host, so every rank narrows the same bits. A CUDA bucket is copied to pinned host memory
    on the stream that was current when DDP called the hook, the worker waits for that copy
    only (a CUDA event), and the result goes back on the same stream into a future built
    with the bucket's device, which makes DDP's stream wait for it.
"""
from __future__ import annotations

import dataclasses
import queue
import threading
import weakref

import numpy as np
import torch
import torch.distributed as dist

__all__ = ["ACCEPTED_DTYPES", "HookWorker", "FailedIteration", "HostBucket", "cpu_group",
           "check_bucket", "bucket_to_host", "result_to_device", "new_future", "complete",
           "raise_carried_error"]

#: Bucket dtypes the hooks take (float16 and bfloat16 widen to float32 exactly).
ACCEPTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# -- the bucket's way to the host and back ---------------------------------------------------

def check_bucket(who: str, buffer: torch.Tensor) -> None:
    """Refuse a bucket the hooks cannot reduce, with a ``TypeError`` that says why.

    DDP gives every rank buckets of the same dtypes (its replicas are one model), so every
    rank raises the same error at the same bucket, before any message moves.
    """
    if buffer.is_sparse:
        raise TypeError(f"{who} needs dense gradient buckets (use nn.Embedding(sparse=False))")
    if buffer.dtype not in ACCEPTED_DTYPES:
        raise TypeError(f"{who} handles float32, float16 and bfloat16 gradient buckets, not "
                        f"{buffer.dtype}: its codecs compute in float32, and a wider or an "
                        f"integer gradient cannot go through them without changing its "
                        f"values (reduce such parameters without the hook, or cast them)")
    if buffer.device.type not in ("cpu", "cuda"):
        raise TypeError(f"{who} handles CPU and CUDA gradient buckets, not "
                        f"{buffer.device.type!r} ones")


@dataclasses.dataclass
class HostBucket:
    """A bucket's values on the host, widened to float32, and how to give the result back.

    Attributes
    ----------
    values : torch.Tensor
        float32, flat, this hook's own copy (DDP may reuse the bucket once the future is
        done; the exchange must not see it change before).
    ready : torch.cuda.Event or None
        Recorded after the device-to-host copy (CUDA buckets): wait for it before reading
        ``values``.
    dtype, shape, device :
        The bucket's.
    stream : torch.cuda.Stream or None
        The stream DDP's autograd ran on when it called the hook (CUDA buckets): the result
        is copied back on it and the future's event recorded on it.
    """

    values: torch.Tensor
    ready: object
    dtype: torch.dtype
    shape: torch.Size
    device: torch.device
    stream: object

    def wait(self) -> np.ndarray:
        """The float32 values as a NumPy array, once the copy to the host has completed."""
        if self.ready is not None:
            self.ready.synchronize()
        return self.values.numpy()


def bucket_to_host(buffer: torch.Tensor) -> HostBucket:
    """Start copying ``buffer`` to the host as float32; returns at once for a CUDA bucket.

    The widening (float16/bfloat16 to float32) is exact; on CUDA it runs on the current
    stream before the copy, so the copy moves float32 words into pinned memory and the
    autograd thread does not wait for it.
    """
    flat = buffer.detach().reshape(-1)
    if flat.device.type != "cuda":
        return HostBucket(flat.to(torch.float32, copy=True), None, buffer.dtype, buffer.shape,
                          buffer.device, None)
    stream = torch.cuda.current_stream(flat.device)
    wide = flat.to(torch.float32)            # on ``stream``; freed only after the copy
    host = torch.empty(flat.shape, dtype=torch.float32, pin_memory=True)
    host.copy_(wide, non_blocking=True)
    ready = torch.cuda.Event()
    ready.record(stream)
    return HostBucket(host, ready, buffer.dtype, buffer.shape, buffer.device, stream)


def new_future(device: torch.device) -> torch.futures.Future:
    """The future a hook returns: with the bucket's device for a CUDA bucket (the futures
    documentation requires it for the consumer's stream synchronisation)."""
    if device.type == "cuda":
        return torch.futures.Future(devices=[device])
    return torch.futures.Future()


def result_to_device(averaged: torch.Tensor, bucket: HostBucket) -> torch.Tensor:
    """The averaged float32 ``averaged`` (host, flat) narrowed to the bucket's dtype and
    shape, on the bucket's device: for CUDA copied on the hook call's stream (call
    :func:`complete` to set the future on the same stream)."""
    narrowed = averaged.to(bucket.dtype).view(bucket.shape)   # round to nearest even
    if bucket.device.type != "cuda":
        return narrowed
    with torch.cuda.stream(bucket.stream):
        # From pinned memory the copy is asynchronous; the caching host allocator keeps the
        # pinned block until the stream has used it.
        return narrowed.pin_memory().to(bucket.device, non_blocking=True)


def complete(future: torch.futures.Future, result: torch.Tensor, bucket: HostBucket) -> None:
    """Set ``future``'s result; for CUDA with the hook call's stream current, so that the
    future's event follows the copy :func:`result_to_device` queued on it."""
    if bucket.device.type != "cuda":
        future.set_result(result)
        return
    with torch.cuda.stream(bucket.stream):
        future.set_result(result)


def raise_carried_error(future: torch.futures.Future):
    """``then`` callback of a hook's future: the worker's result, or its error raised.

    The worker completes its future with the exception object as the value, and the future
    the hook returns is this callback's: raising here gives DDP's C++ reducer a future that
    completed with an error (``Future.set_exception`` only stores the exception as the
    value, which the reducer would try to read as a tensor). DDP raises it from
    ``backward()`` as a ``RuntimeError`` whose message holds the original exception's type
    and message; ``wait()`` outside DDP raises the same.
    """
    value = future.value()
    if isinstance(value, BaseException):
        raise value
    return value


# -- the worker --------------------------------------------------------------------------------

class FailedIteration:
    """The failure that ends a backward pass on one hook: the buckets DDP hands the hook
    after a failed one, up to the pass's last bucket, fail with the same error, without
    running their exchange (see the module docstring)."""

    def __init__(self):
        self.error: BaseException | None = None

    def fail(self, error: BaseException, last: bool) -> None:
        """A bucket failed with ``error``; ``last``: it was the pass's last bucket."""
        self.error = None if last else error

    def pending(self, last: bool) -> BaseException | None:
        """The error a bucket must fail with without running, or None to run it; a pass's
        last bucket ends the failed pass."""
        error = self.error
        if error is not None and last:
            self.error = None
        return error


def _serve(jobs: queue.SimpleQueue) -> None:
    """The worker thread: run each job (which completes its own future) until ``None``."""
    while True:
        job = jobs.get()
        if job is None:
            return
        job()
        # Drop the job before waiting for the next: it holds the hook, which must stay
        # collectable while its worker is idle.
        del job


def _stop(jobs: queue.SimpleQueue, thread: threading.Thread) -> None:
    jobs.put(None)
    if thread is not threading.current_thread():
        thread.join()


class HookWorker:
    """One thread that runs a hook's exchanges one after another, in the order of
    :meth:`submit`.

    Parameters
    ----------
    name : str
        The thread's name (shown by debuggers and ``py-spy``).

    Notes
    -----
    The thread is a daemon and holds no reference to the hook (only the queued jobs do), so
    an unused hook can be collected; collection, :meth:`stop` and interpreter exit (through
    :func:`weakref.finalize`) end the thread after the jobs already submitted.
    """

    def __init__(self, name: str):
        self._jobs = queue.SimpleQueue()
        self._thread = threading.Thread(target=_serve, args=(self._jobs,), name=name,
                                        daemon=True)
        self._thread.start()
        self._finalizer = weakref.finalize(self, _stop, self._jobs, self._thread)

    @property
    def alive(self) -> bool:
        return self._finalizer.alive and self._thread.is_alive()

    def submit(self, job) -> None:
        """Queue ``job`` (a callable that never raises: it completes its own future)."""
        if not self._finalizer.alive:
            raise RuntimeError("the hook's worker was stopped")
        self._jobs.put(job)

    def stop(self) -> None:
        """Let the submitted jobs finish, then end the thread (waits for it)."""
        self._finalizer()


# -- the process group that carries the hooks' CPU traffic -------------------------------------

def _carries_cpu(group) -> bool:
    return torch.device("cpu") in group._device_types


def _timeout(group):
    """The group's collective timeout (None: let the new group take the default)."""
    for device in group._device_types:
        try:
            return group._get_backend(device).options._timeout
        except (AttributeError, RuntimeError):
            continue
    return None


def cpu_group(who: str, state, groups: dict | None = None):
    """The process group for a hook's traffic, from DDP's ``state``: a private gloo group.

    The hooks' collectives never share a communicator with DDP's own. DDP runs collectives
    of its own on its group from the autograd thread (the unused-parameter map with
    ``find_unused_parameters=True``, the graph checks of ``static_graph=True``, join's
    shadow all-reduces) while the hook's worker thread runs its exchanges; on one group the
    ranks would interleave the two threads' collectives differently, and gloo pairs them
    by order (a hang, or "collective mismatch"). So every hook (each ``groups`` dict, one
    per hook) gets a gloo group of its own with the same ranks as the group it was given,
    created at its first call (collectively: every rank calls the hook for its first
    bucket, in the same order), with the group's timeout, and kept.

    Parameters
    ----------
    who : str
        The hook's name, for error messages.
    state : None or torch.distributed.ProcessGroup
        What ``register_comm_hook(state=...)`` was given: ``None`` for the default group.
    groups : dict, optional
        The caller's own cache (given group -> private group). ``None``: one per call
        (only for one-off calls).

    Returns
    -------
    ProcessGroup
        The private gloo group of ``state``'s ranks; or ``state`` itself when it is smaller
        than the job and has a CPU backend (``new_group`` is collective over the whole job,
        and only this group's ranks call the hook: such a group must be the hook's own,
        not DDP's).

    Raises
    ------
    TypeError
        ``state`` is neither None nor a ProcessGroup.
    ValueError
        ``state`` has no CPU backend and not every rank of the job is in it: give a gloo
        group created for the hook.
    RuntimeError
        The default group is not initialised.
    """
    if state is not None and not isinstance(state, dist.ProcessGroup):
        raise TypeError(f"{who}: state must be None or a ProcessGroup, not "
                        f"{type(state).__name__}")
    if not dist.is_initialized():
        raise RuntimeError(f"{who}: torch.distributed is not initialised "
                           f"(init_process_group first)")
    group = dist.group.WORLD if state is None else state
    if groups is None:
        groups = {}
    private = groups.get(group)
    if private is not None and private in dist.distributed_c10d._world.pg_map:
        return private
    ranks = dist.get_process_group_ranks(group)
    if len(ranks) != dist.get_world_size():
        if _carries_cpu(group):
            return state
        # new_group is collective over the whole job, and only this group's ranks call
        # the hook. (Its use_local_synchronization=True variant hung in the gloo
        # rendezvous with torch 2.13 once other subgroups existed.)
        raise ValueError(
            f"{who}: the process group given as state (ranks {ranks}) has no CPU backend "
            f"and is smaller than the job, so the hook cannot create its gloo group "
            f"there; create one with every rank beside it, "
            f"dist.new_group({ranks}, backend='gloo'), and give that as state")
    private = dist.new_group(ranks=ranks, backend="gloo", timeout=_timeout(group))
    groups[group] = private
    return private
