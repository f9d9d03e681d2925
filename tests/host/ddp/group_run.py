"""The one process group the collectives, hooks and accuracy tests of this folder check.

Starting processes that import torch costs seconds on a 2-core machine, so one run of a
3-process gloo group on 127.0.0.1 (:func:`run`, the session fixture ``group_run`` of
``conftest.py``) does all their distributed work: ring and sketch all-reduces of many shapes
(:mod:`host.ddp.collectives`), DDP buckets recorded through the hooks, error feedback through
real DDP models and short 2-rank training runs on a subgroup (:mod:`host.ddp.hooks`), and a
tiny run of the accuracy experiment (:mod:`host.ddp.accuracy`); it returns what every rank
saw. The reference models the tests check it against are here too.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from host import ddp
from host.ddp import accuracy
from host.golden import inceptionn as inc
from host.golden import lhc

__all__ = ["WORLD", "K_VALUES", "TRAIN_STEPS", "ACCURACY_SETTINGS", "EF_K", "EF_STEPS",
           "EF_REBUILD_ITERATIONS", "run", "bits", "simulate_ring", "same_on_every_rank",
           "tiny_constant_gradient", "lhc_path_cases"]

WORLD = 3
K_VALUES = (1, 6, 10, 15)
TRAIN_STEPS = 12
#: A tiny version of the accuracy experiment, run inside the same process group.
ACCURACY_SETTINGS = accuracy.Settings(
    world_size=WORLD, digits_steps=3, ncf_steps=3, eval_every=2, ncf_users=150, ncf_items=120,
    ncf_eval_users=50)
#: Error feedback runs: k, and steps of the constant-gradient run.
EF_K = 6
EF_STEPS = 40
#: Iterations of the bucket-rebuild run (DDP rebuilds its buckets after the first).
EF_REBUILD_ITERATIONS = 4

# ---------------------------------------------------------------------------------------
# inputs (made in the parent, identical for every run)

def _mixed_magnitudes(rng, n):
    """Values over every INCEPTIONN class for every k: magnitudes 2^-20 .. 2^3, both signs,
    some exact zeros."""
    values = rng.choice([-1.0, 1.0], n) * 2.0 ** rng.uniform(-20, 3, n)
    values[rng.random(n) < 0.1] = 0.0
    return values.astype(np.float32)


def _nasty(rng, n_ranks):
    """NaN with payloads, ±Inf, denormals, ±0, and class boundaries with ±1-ulp neighbours
    for every k, one vector per rank (rank r gets a rotated copy so sums mix classes)."""
    words = [0x7FC00001, 0xFFC12345, 0x7F800001, 0x7F800000, 0xFF800000, 0x00000001,
             0x807FFFFF, 0x00000000, 0x80000000]
    for e in range(112, 131):                      # 2^-15 .. 2^3, the class boundaries
        for m in (0, 1, 0x7FFFFF):
            words += [(e << 23) | m, 0x80000000 | (e << 23) | m]
            words += [((e << 23) | m) - 1]
    base = np.array(words, dtype=np.uint32).view(np.float32)
    with np.errstate(invalid="ignore"):
        return [np.roll(base, 7 * r) * np.float32(1 + r % 2) for r in range(n_ranks)]


def _ring_cases():
    rng = np.random.default_rng(8)
    cases = {}
    for n in (1, 2, 3, 4, 8, 1000, 3001):
        cases[f"mixed{n}"] = [_mixed_magnitudes(rng, n) for _ in range(WORLD)]
    cases["zeros"] = [np.zeros(10, np.float32) for _ in range(WORLD)]
    cases["nasty"] = _nasty(rng, WORLD)
    for k in K_VALUES:
        # Every rank just below the bound: every hop truncates the partial sum to 0.
        cases[f"below{k}"] = [np.full(5, 0.99 * 2.0 ** -k, np.float32) for _ in range(WORLD)]
    cases.update(_rounding_cases(rng))
    return cases


def _rounding_cases(rng):
    """Inputs where the float32 rounding of the partial sums matters (issue 16, item 10)."""
    cases = {}
    # docs/accuracy.md's example: values in 1..2001 are raw at every k (nothing is quantised), and
    # partial sums up to 6003 round to 2^-11.
    cases["uniform2001"] = [rng.uniform(1, 2001, 2001).astype(np.float32) for _ in range(WORLD)]
    # Chunk c starts at rank c: 2^25 there, then 2 twice (half an ulp, a tie to even each
    # time). The ring returns 2^25 for 2^25 + 4, an error of exactly 2^-24 (|p_1| + |p_2|).
    n = 3 * WORLD
    tight = [np.full(n, 2.0, np.float32) for _ in range(WORLD)]
    for c, (a, b) in enumerate(ddp.ring_chunk_bounds(n, WORLD)):
        tight[c][a:b] = 2.0 ** 25
    cases["tight"] = tight
    # Every magnitude 2^-20 .. 2^26, both signs, boundaries and their neighbours: rounding,
    # cancellation into finer classes and truncation at once.
    spread = []
    for _ in range(WORLD):
        x = rng.choice([-1.0, 1.0], 3000) * 2.0 ** rng.uniform(-20, 26, 3000)
        edges = 2.0 ** rng.integers(-16, 26, 600)
        x[:600] = edges * rng.choice([1 - 2.0 ** -24, 1.0, 1 + 2.0 ** -23], 600)
        spread.append(x.astype(np.float32))
    cases["spread"] = spread
    return cases


def _lhc_cases():
    """name -> (per-rank vectors, load)."""
    rng = np.random.default_rng(9)
    cases = {}
    for n in (1, 2, 5, 1000, 3001):
        cases[f"dense{n}"] = ([rng.standard_normal(n).astype(np.float32) * 0.01
                               for _ in range(WORLD)], 0.7)
    sparse = []
    for _ in range(WORLD):
        x = np.zeros(20000, np.float32)
        hot = rng.choice(20000, 600, replace=False)
        x[hot] = rng.standard_normal(600).astype(np.float32) * 2.0 ** rng.integers(-30, 4, 600)
        sparse.append(x)
    cases["sparse20000"] = (sparse, 0.7)
    # A load far above 1 leaves too few rows: peeling stalls and the fallback round runs.
    cases["fallback"] = ([rng.standard_normal(4096).astype(np.float32) for _ in range(WORLD)],
                         6.0)
    cases["zeros"] = ([np.zeros(7, np.float32) for _ in range(WORLD)], 0.7)
    specials = np.array([0.0, -0.0, 1e-45, -1e-45, 1.1754942e-38, 1.0e38, -2.5, 1e-30],
                        dtype=np.float32)
    cases["specials"] = ([np.roll(specials, r) for r in range(WORLD)], 0.7)
    return cases


# ---------------------------------------------------------------------------------------
# what every rank runs

class _RecordingHook:
    """Wraps a hook and keeps (bucket index, input bucket, output) of every call."""

    def __init__(self, hook):
        self.hook = hook
        self.records = []
        self.__name__ = self.__qualname__ = "recording_hook"

    def __call__(self, state, bucket):
        before = bucket.buffer().detach().clone().numpy()
        future = self.hook(state, bucket)
        self.records.append((bucket.index(), before, future.wait().detach().clone().numpy()))
        return future


class _TinyNet(torch.nn.Module):
    """Parameters of very different sizes (DDP buckets of 280 values down to 1, some with fewer
    values than ranks)."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(7, 40)
        self.fc2 = torch.nn.Linear(40, 3)
        self.gain = torch.nn.Parameter(torch.ones(1))
        self.pair = torch.nn.Parameter(torch.tensor([0.5, -0.25]))

    def forward(self, x):
        h = torch.tanh(self.fc1(x)) * self.gain
        return self.fc2(h) + self.pair.sum()


def _ddp_buckets(rank, hook):
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = DistributedDataParallel(_TinyNet(), bucket_cap_mb=1e-6)  # one parameter per bucket
    recorder = _RecordingHook(hook)
    model.register_comm_hook(state=None, hook=recorder)
    generator = torch.Generator().manual_seed(100 + rank)
    # DDP puts everything in one bucket in the first iteration and rebuilds its buckets
    # (here: several small ones) for the second.
    for _ in range(2):
        model.zero_grad()
        x = torch.randn(16, 7, generator=generator)
        # A large factor on some ranks puts gradients in every class (also >= 1: raw words).
        loss = model(x).pow(2).mean() * (1 + 20 * rank)
        loss.backward()
    grads = [p.grad.detach().clone().numpy() for p in model.parameters()]
    return {"records": recorder.records, "grads": grads}


def _toy_data(rank):
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(256, 10, generator=generator)
    y = (x[:, :3].sum(dim=1) > 0).long()
    return x[rank::2], y[rank::2]


def _train(rank, hook, group):
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(1)
    net = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    model = DistributedDataParallel(net, process_group=group)
    if hook is not None:
        model.register_comm_hook(state=group, hook=hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    x, y = _toy_data(rank)
    losses = []
    for _ in range(TRAIN_STEPS):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    params = [p.detach().clone().numpy() for p in net.parameters()]
    stats = None if hook is None else (hook.bytes_sent, hook.dense_ring_bytes, len(hook.calls))
    return {"losses": losses, "params": params, "stats": stats}


def tiny_constant_gradient(rank, n=64):
    """A constant gradient below 2^-EF_K: ``m * 2^-(EF_K + 6)`` with m in 0..63 (rank and
    element dependent), both signs. Few bits, so every float32 addition of it is exact."""
    m = (np.arange(n) * 7 + rank * 13) % 64
    sign = np.where(np.arange(n) % 3 == 1, -1.0, 1.0)
    return (sign * m * 2.0 ** -(EF_K + 6)).astype(np.float32)


class _ConstantGradient(torch.nn.Module):
    """``loss = sum(w * c)``: the gradient of ``w`` is ``c``, the same every step."""

    def __init__(self, n):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(n))

    def forward(self, c):
        return (self.w * c).sum()


def _feedback_constant(rank):
    from torch.nn.parallel import DistributedDataParallel

    c = torch.from_numpy(tiny_constant_gradient(rank))
    model = DistributedDataParallel(_ConstantGradient(c.numel()))
    hook = ddp.InceptionnHook(k=EF_K, error_feedback=True)
    model.register_comm_hook(state=None, hook=hook)
    averaged = []
    for _ in range(EF_STEPS):
        model.zero_grad(set_to_none=True)
        model(c).backward()
        averaged.append(model.module.w.grad.detach().clone().numpy())
    return {"averaged": averaged, "residual": hook.residual(model.module.w),
            "bytes_sent": hook.bytes_sent,
            "offgrid": sum(call.details["offgrid_values"] for call in hook.calls),
            "rounded": sum(call.details["rounded_adds"] for call in hook.calls)}


class _BucketRecorder:
    """Wraps a hook; records every call's iteration, bucket index, parameter names, input
    and output, and checks that the bucket is its parameters' gradients back to back."""

    def __init__(self, hook, names):
        self.hook, self.names = hook, names
        self.iteration = 0
        self.records = []
        self.__name__ = self.__qualname__ = "bucket_recorder"

    def __call__(self, state, bucket):
        before = bucket.buffer().detach().clone().numpy()
        layout = np.concatenate([g.detach().reshape(-1).numpy() for g in bucket.gradients()])
        assert np.array_equal(layout.view(np.uint32), before.view(np.uint32))
        future = self.hook(state, bucket)
        self.records.append({"iteration": self.iteration, "index": bucket.index(),
                             "params": [self.names[id(p)] for p in bucket.parameters()],
                             "before": before,
                             "after": future.wait().detach().clone().numpy()})
        return future


def _feedback_rebuild(rank):
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    net = _TinyNet()
    names = {id(p): name for name, p in net.named_parameters()}
    model = DistributedDataParallel(net, bucket_cap_mb=1e-6)     # rebuilt after iteration 0
    hook = ddp.InceptionnHook(k=EF_K, error_feedback=True)
    recorder = _BucketRecorder(hook, names)
    model.register_comm_hook(state=None, hook=recorder)
    generator = torch.Generator().manual_seed(300 + rank)
    for iteration in range(EF_REBUILD_ITERATIONS):
        recorder.iteration = iteration
        model.zero_grad(set_to_none=True)
        x = torch.randn(16, 7, generator=generator)
        # Small gradients (most below 2^-6) so that the residuals carry a lot.
        (model(x).pow(2).mean() * 0.05 * (1 + rank)).backward()
    return {"records": recorder.records,
            "residuals": {name: hook.residual(p) for name, p in net.named_parameters()},
            "shapes": {name: tuple(p.shape) for name, p in net.named_parameters()},
            "grads": {name: p.grad.detach().clone().numpy() for name, p in net.named_parameters()}}


class _MixedNet(torch.nn.Module):
    """An embedding table (a batch touches a few rows: a sparse gradient) and a linear layer
    (a dense gradient), each its own bucket once DDP rebuilds them."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(4096, 16)
        self.fc = torch.nn.Linear(16, 2048)

    def forward(self, rows):
        return self.fc(self.table(rows)).pow(2).mean()


def _ddp_mixed_paths(rank):
    """LhcHook() (path "auto" by default) on a model with a sparse and a dense parameter:
    every call's input, output and chosen path."""
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = DistributedDataParallel(_MixedNet(), bucket_cap_mb=1e-6)
    hook = ddp.LhcHook()
    recorder = _RecordingHook(hook)
    model.register_comm_hook(state=None, hook=recorder)
    generator = torch.Generator().manual_seed(200 + rank)
    for _ in range(2):                       # the second iteration runs on rebuilt buckets
        model.zero_grad()
        model(torch.randint(0, 4096, (6,), generator=generator)).backward()
    return {"records": recorder.records, "paths": [c.details["path"] for c in hook.calls],
            "repr": repr(hook)}


def lhc_path_cases():
    """name -> per-rank vectors, for every path of lhc_allreduce."""
    rng = np.random.default_rng(12)
    dense = [rng.standard_normal(20000).astype(np.float32) * 0.01 for _ in range(WORLD)]
    sparse = []
    for _ in range(WORLD):
        x = np.zeros(50000, np.float32)
        hot = rng.choice(50000, 300, replace=False)
        x[hot] = rng.standard_normal(300).astype(np.float32)
        sparse.append(x)
    return {"dense": dense, "sparse": sparse, "zeros": [np.zeros(9, np.float32)] * WORLD,
            "empty": [np.zeros(0, np.float32)] * WORLD}


def _rank_main(rank, world, ring_cases, lhc_cases, accuracy_data):
    out = {"ring": {}, "lhc": {}, "ddp": {}, "train": {}, "lhc_paths": {}}
    for name, vectors in lhc_path_cases().items():
        for path in lhc.PATHS:
            out["lhc_paths"][name, path] = ddp.lhc_allreduce(vectors[rank], path=path)
    out["ddp"]["lhc_mixed"] = _ddp_mixed_paths(rank)
    out["accuracy"] = accuracy.train_in_group(rank, world, ACCURACY_SETTINGS, accuracy_data)
    for name, vectors in ring_cases.items():
        for k in K_VALUES:
            out["ring"][name, k] = ddp.inceptionn_ring_allreduce(vectors[rank], k)
    for name, (vectors, load) in lhc_cases.items():
        out["lhc"][name] = ddp.lhc_allreduce(vectors[rank], load=load)
    out["ddp"]["inceptionn"] = _ddp_buckets(rank, ddp.InceptionnHook(k=6))
    out["ddp"]["lhc"] = _ddp_buckets(rank, ddp.LhcHook())
    out["feedback"] = {"constant": _feedback_constant(rank), "rebuild": _feedback_rebuild(rank)}
    # Two-rank training runs on a subgroup (also checks that the hooks honour `state`).
    pair = dist.new_group([0, 1])
    if rank < 2:
        for name, hook in (("plain", None), ("inceptionn", ddp.InceptionnHook(k=10)),
                           ("lhc", ddp.LhcHook())):
            out["train"][name] = _train(rank, hook, pair)
    return out


def run():
    """Run the group once: ``{"ring_cases", "lhc_cases", "ranks"}`` (the inputs, and what
    every rank returned, in rank order)."""
    ring_cases, lhc_cases = _ring_cases(), _lhc_cases()
    accuracy_data = accuracy.prepare_datasets(ACCURACY_SETTINGS)
    results = ddp.run_local_group(_rank_main, WORLD, ring_cases, lhc_cases, accuracy_data,
                                  timeout=240)
    return {"ring_cases": ring_cases, "lhc_cases": lhc_cases, "ranks": results}


# ---------------------------------------------------------------------------------------
# reference models

def bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def simulate_ring(vectors, k):
    """Single-process model of the compressed ring: chunk c starts at rank c, every hop
    quantises the partial sum and the next rank adds its own chunk; the owner's final
    quantised chunk is what everyone gets. Returns (sum, total payload bytes of all ranks)."""
    n = len(vectors)
    size = vectors[0].size
    total = np.empty(size, np.float32)
    payload = 0
    for c in range(n):
        a, b = c * size // n, (c + 1) * size // n
        if a == b:
            continue
        partial = vectors[c][a:b].copy()
        for hop in range(1, n):
            payload += len(inc.encode(partial, k))
            partial = inc.quantize(partial, k) + vectors[(c + hop) % n][a:b]
        final = inc.quantize(partial, k) if n > 1 else partial
        payload += (n - 1) * len(inc.encode(final, k))
        total[a:b] = final
    return total, payload


def same_on_every_rank(arrays):
    first = bits(arrays[0])
    for other in arrays[1:]:
        np.testing.assert_array_equal(bits(other), first)
