"""DDP communication hooks (host/ddp.py) on a real gloo process group on 127.0.0.1.

Starting processes that import torch costs seconds on a 2-core machine, so one module-scoped
run of a 3-process group does all the distributed work (ring and sketch all-reduces of many
shapes, DDP buckets recorded through the hooks, short 2-rank training runs on a subgroup)
and returns what every rank saw; the tests below check it against the golden models:

* the INCEPTIONN ring against an independent single-process NumPy model of the same ring
  (bit for bit), against the exact sum (error bound) and across ranks (identical bits);
* the LHC hook against ``host.golden.lhc.allreduce`` and against a plain sum of the
  quantised values (bit for bit);
* the DDP buckets: the hook's output is the sum above divided by the world size, bit for bit.
"""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed (it comes with the 'ddp' extra: "
                    "pip install -e '.[ddp]')")

import torch.distributed as dist  # noqa: E402

from host import accuracy, ddp  # noqa: E402
from host.golden import inceptionn as inc  # noqa: E402
from host.golden import lhc  # noqa: E402

WORLD = 3
K_VALUES = (1, 6, 10, 15)
TRAIN_STEPS = 12
#: A tiny version of the accuracy experiment, run inside the same process group.
ACCURACY_SETTINGS = accuracy.Settings(
    world_size=WORLD, digits_steps=3, ncf_steps=3, eval_every=2, ncf_users=150, ncf_items=120,
    ncf_eval_users=50)


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
        self.records.append((bucket.index(), before, future.value().detach().clone().numpy()))
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


def _rank_main(rank, world, ring_cases, lhc_cases, accuracy_data):
    out = {"ring": {}, "lhc": {}, "ddp": {}, "train": {}}
    out["accuracy"] = accuracy.train_in_group(rank, world, ACCURACY_SETTINGS, accuracy_data)
    for name, vectors in ring_cases.items():
        for k in K_VALUES:
            out["ring"][name, k] = ddp.inceptionn_ring_allreduce(vectors[rank], k)
    for name, (vectors, load) in lhc_cases.items():
        out["lhc"][name] = ddp.lhc_allreduce(vectors[rank], load=load)
    out["ddp"]["inceptionn"] = _ddp_buckets(rank, ddp.InceptionnHook(k=6))
    out["ddp"]["lhc"] = _ddp_buckets(rank, ddp.LhcHook())
    # Two-rank training runs on a subgroup (also checks that the hooks honour `state`).
    pair = dist.new_group([0, 1])
    if rank < 2:
        for name, hook in (("plain", None), ("inceptionn", ddp.InceptionnHook(k=10)),
                           ("lhc", ddp.LhcHook())):
            out["train"][name] = _train(rank, hook, pair)
    return out


@pytest.fixture(scope="module")
def group_run():
    ring_cases, lhc_cases = _ring_cases(), _lhc_cases()
    accuracy_data = accuracy.prepare_datasets(ACCURACY_SETTINGS)
    results = ddp.run_local_group(_rank_main, WORLD, ring_cases, lhc_cases, accuracy_data,
                                  timeout=240)
    return {"ring_cases": ring_cases, "lhc_cases": lhc_cases, "ranks": results}


# ---------------------------------------------------------------------------------------
# reference models

def _bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def _simulate_ring(vectors, k):
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


def _same_on_every_rank(arrays):
    first = _bits(arrays[0])
    for other in arrays[1:]:
        np.testing.assert_array_equal(_bits(other), first)


# ---------------------------------------------------------------------------------------
# INCEPTIONN ring

@pytest.mark.parametrize("k", K_VALUES)
def test_ring_bit_identical_on_all_ranks_and_equal_to_ring_model(group_run, k):
    for name, vectors in group_run["ring_cases"].items():
        totals = [rank["ring"][name, k][0] for rank in group_run["ranks"]]
        _same_on_every_rank(totals)
        expected, payload = _simulate_ring(vectors, k)
        np.testing.assert_array_equal(_bits(totals[0]), _bits(expected), err_msg=name)
        sent = sum(rank["ring"][name, k][1].bytes_sent for rank in group_run["ranks"])
        assert sent == payload, name


@pytest.mark.parametrize("k", K_VALUES)
def test_ring_sum_error_bound(group_run, k):
    """Each chunk is quantised N-1 times in the reduce-scatter and once by its owner, each
    time by less than 2^-k; the float32 additions add at most N half-ulps of the largest
    partial sum."""
    for name, vectors in group_run["ring_cases"].items():
        stacked = np.stack(vectors).astype(np.float64)
        finite = np.isfinite(stacked).all(axis=0)
        exact = stacked.sum(axis=0)
        total = group_run["ranks"][0]["ring"][name, k][0].astype(np.float64)
        slack = WORLD * np.abs(stacked).sum(axis=0) * 2.0 ** -24
        with np.errstate(invalid="ignore"):
            error = np.abs(total - exact)[finite]
        assert np.all(error < WORLD * 2.0 ** -k + slack[finite]), name
        # And the ring really is lossy where it should be: |x| < 2^-k everywhere -> 0.
        if name == "mixed1000" and k == 6:
            assert np.any(error > 0)


@pytest.mark.parametrize("k", K_VALUES)
def test_ring_error_can_exceed_n_minus_1_quanta(group_run, k):
    """The bound above is the right one: values just below 2^-k on every rank are dropped
    at every hop, and the ring returns 0 where the exact sum is about N * 2^-k."""
    vectors = group_run["ring_cases"][f"below{k}"]
    total = group_run["ranks"][0]["ring"][f"below{k}", k][0]
    assert np.all(total == 0)
    exact = np.stack(vectors).astype(np.float64).sum(axis=0)
    assert np.all(exact > (WORLD - 1) * 2.0 ** -k) and np.all(exact < WORLD * 2.0 ** -k)


def test_ring_nonfinite_values_travel_raw(group_run):
    vectors = group_run["ring_cases"]["nasty"]
    stacked = np.stack(vectors)
    for k in K_VALUES:
        total = group_run["ranks"][0]["ring"]["nasty", k][0]
        assert np.array_equal(np.isnan(total), np.isnan(stacked.sum(axis=0)))
        inf = np.isinf(stacked.sum(axis=0))
        np.testing.assert_array_equal(total[inf], stacked.sum(axis=0)[inf])


def test_ring_byte_accounting(group_run):
    size = 3001
    for k in K_VALUES:
        stats = [rank["ring"][f"mixed{size}", k][1] for rank in group_run["ranks"]]
        # A plain fp32 ring sends 2 (N-1) chunks of 4-byte values from every rank.
        assert sum(s.dense_ring_bytes for s in stats) == 2 * (WORLD - 1) * 4 * size
        assert all(s.details["messages"] == 2 * (WORLD - 1) for s in stats)
        assert all(s.control_bytes == 8 * s.details["messages"] for s in stats)
    small = [rank["ring"]["mixed2", 10][1] for rank in group_run["ranks"]]
    # 2 values over 3 ranks: one chunk is empty and is never sent.
    assert sum(s.details["messages"] for s in small) == 2 * 2 * (WORLD - 1)


def test_ring_rejects_bad_arguments():
    with pytest.raises(ValueError):
        ddp.InceptionnHook(k=0)
    with pytest.raises(ValueError):
        ddp.InceptionnHook(k=16)
    with pytest.raises(TypeError):
        ddp.InceptionnHook(k=10.0)
    with pytest.raises(ValueError):
        ddp.LhcHook(load=0)
    with pytest.raises(ValueError):
        ddp.LhcHook(r_min=0)


# ---------------------------------------------------------------------------------------
# LHC

def test_lhc_equals_golden_allreduce_bit_for_bit(group_run):
    for name, (vectors, load) in group_run["lhc_cases"].items():
        totals = [rank["lhc"][name][0] for rank in group_run["ranks"]]
        _same_on_every_rank(totals)
        expected, golden_stats = lhc.allreduce(vectors, load=load)
        np.testing.assert_array_equal(_bits(totals[0]), _bits(expected), err_msg=name)
        for rank in group_run["ranks"]:
            stats = rank["lhc"][name][1]
            assert stats.details == {**golden_stats.as_dict(), "world_size": WORLD}, name
            assert stats.bytes_sent == golden_stats.total_bytes


def test_lhc_equals_plain_sum_of_quantised_values(group_run):
    """The sketch path is lossless: the same bits as an uncompressed all-reduce of q."""
    for name, (vectors, _) in group_run["lhc_cases"].items():
        f = np.float32(group_run["ranks"][0]["lhc"][name][1].details["scale"])
        q_sum = sum(lhc.quantize(v, f).astype(np.int64) for v in vectors)
        assert np.abs(q_sum).max(initial=0) <= lhc.INT32_MAX
        expected = q_sum.astype(np.float32) / f
        np.testing.assert_array_equal(_bits(group_run["ranks"][0]["lhc"][name][0]),
                                      _bits(expected), err_msg=name)


def test_lhc_fallback_round_was_exercised(group_run):
    details = group_run["ranks"][0]["lhc"]["fallback"][1].details
    assert details["unpeeled"] > 0
    assert details["fallback_bytes"] == 4 * details["unpeeled"]
    sparse = group_run["ranks"][0]["lhc"]["sparse20000"][1]
    # Sparse gradients are what the sketch is for: far fewer bytes than a dense ring.
    assert sparse.bytes_sent * 2 < sparse.dense_ring_bytes


# ---------------------------------------------------------------------------------------
# through DDP

@pytest.mark.parametrize("codec", ["inceptionn", "lhc"])
def test_ddp_buckets_are_sum_then_divide_and_identical(group_run, codec):
    per_rank = [rank["ddp"][codec] for rank in group_run["ranks"]]
    records = [r["records"] for r in per_rank]
    assert len(records[0]) >= 3, "the tiny bucket cap should give several buckets"
    sizes = [rec[1].size for rec in records[0]]
    assert min(sizes) < WORLD, sizes
    for calls in zip(*records):
        assert len({c[0] for c in calls}) == 1          # same bucket on every rank
        inputs = [c[1] for c in calls]
        _same_on_every_rank([c[2] for c in calls])
        if codec == "lhc":
            total, _ = lhc.allreduce(inputs)
        else:
            total, _ = _simulate_ring(inputs, 6)
        expected = total / np.float32(WORLD)
        np.testing.assert_array_equal(_bits(calls[0][2]), _bits(expected))
    for grads in zip(*[r["grads"] for r in per_rank]):
        _same_on_every_rank(grads)


@pytest.mark.parametrize("codec", ["inceptionn", "lhc"])
def test_two_rank_training(group_run, codec):
    ranks = group_run["ranks"][:2]
    runs = [r["train"][codec] for r in ranks]
    plain = ranks[0]["train"]["plain"]
    for a, b in zip(runs[0]["params"], runs[1]["params"]):
        np.testing.assert_array_equal(_bits(a), _bits(b))
    losses = runs[0]["losses"]
    assert np.isfinite(losses).all()
    assert losses[-1] < 0.8 * losses[0]
    bytes_sent, dense, calls = runs[0]["stats"]
    assert calls >= TRAIN_STEPS and bytes_sent > 0 and dense > 0
    # Lossless up to the int32 quantisation: the LHC run stays next to the fp32 run.
    if codec == "lhc":
        for a, b in zip(runs[0]["params"], plain["params"]):
            np.testing.assert_allclose(a, b, atol=1e-5)


# ---------------------------------------------------------------------------------------
# the accuracy experiment (a tiny run of it)

def test_accuracy_pipeline(group_run, tmp_path):
    runs = group_run["ranks"][0]["accuracy"]
    assert [(r["task"], r["codec"]) for r in runs] == \
        [(t, c) for t in accuracy.TASKS for c in accuracy.CODECS]
    for run in runs:
        assert run["replicas_identical"], (run["task"], run["codec"])
        assert len(run["train_loss"]) == 3 and np.isfinite(run["train_loss"]).all()
        assert [e[0] for e in run["evals"]] == [2, 3]
        assert 0.0 <= run["final_metric"] <= 1.0
        if run["codec"].startswith("inceptionn"):
            assert 0 < run["bytes_per_step"] < run["dense_ring_bytes_per_step"]
        if run["codec"] == "lhc":
            assert run["lhc_mean_rows"] >= 1
    # Same seeds and batches: the paths differ only by their gradient arithmetic, so the
    # first step's loss (before any update) is the same for every path of a task.
    for task in accuracy.TASKS:
        first = {r["train_loss"][0] for r in runs if r["task"] == task}
        assert len(first) == 1, task
    results = {"settings": dataclasses.asdict(ACCURACY_SETTINGS), "runs": runs,
               "wall_seconds": 0.0}
    paths = accuracy.write_outputs(results, tmp_path)
    assert json.loads(paths["json"].read_text())["runs"][0]["codec"] == "fp32"
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = paths["md"].read_text()
    assert sum(line.startswith("| ") for line in table.splitlines()) == 1 + len(runs)


def test_ncf_data_is_consistent():
    data = accuracy.make_ncf_data(60, 130, 12, seed=5)
    assert data["train_users"].shape == (60 * 11,)
    assert data["test_items"].shape == (60, 100)
    for user in range(60):
        train = set(data["train_items"][data["train_users"] == user].tolist())
        positive, negatives = data["test_items"][user, 0], data["test_items"][user, 1:]
        assert len(train) == 11 and positive not in train
        assert len(set(negatives.tolist())) == 99
        assert not (set(negatives.tolist()) & (train | {positive}))
    again = accuracy.make_ncf_data(60, 130, 12, seed=5)
    assert all(np.array_equal(data[key], again[key]) for key in ("train_items", "test_items"))
    with pytest.raises(ValueError):
        accuracy.make_ncf_data(10, 100, 5, seed=0)
