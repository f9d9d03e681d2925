"""Accuracy with compressed gradients: data-parallel training through the DDP hooks.

``make accuracy`` / ``gradwire accuracy`` train two models with a 4-process gloo group on
127.0.0.1, once per gradient path, with the same seeds, batches and steps:

* ``digits``: an MLP classifier (64-128-64-10) on scikit-learn's bundled 8x8 handwritten
  digits (1797 images, no download), SGD with momentum; metric: test accuracy.
* ``ncf``: an NCF-like recommender (NeuMF: GMF and MLP towers on user/item embedding
  tables) on synthetic implicit feedback drawn from a seeded latent-factor model, Adam;
  metric: leave-one-out hit rate HR@10 against 99 sampled negatives. Only the rows of the
  users and items in a batch get a gradient, so the bucket is mostly zeros: the sparse
  case the sketch is made for. (The tables use dense gradients, ``sparse=False``: DDP
  communication hooks get dense buckets.)

Gradient paths: ``fp32`` (DDP's own all-reduce, uncompressed), ``inceptionn-k6/8/10``
(:class:`host.ddp.InceptionnHook`), the same with error feedback ``inceptionn-k6/8/10-ef``
(``InceptionnHook(k, error_feedback=True)``) and ``lhc`` (:class:`host.ddp.LhcHook`).
The INCEPTIONN rows also report how often the ring's hops changed a value
(``ring_offgrid_fraction``: values of the partial sums a rank sent, and of its owned chunk,
that were not on their class's grid) and how often a float32 addition of the partial sums
rounded (``ring_rounded_fraction``), summed over ranks and steps.

The ``fsdp-*`` rows train the same models sharded with FSDP2 (``fully_shard`` on every
layer and on the model), whose gradient traffic is one reduce-scatter per layer: ``fsdp-fp32``
is FSDP2's own fp32 reduce-scatter, ``fsdp-inceptionn-k10(-ef)`` and ``fsdp-lhc`` the
custom reduce-scatters of :mod:`host.fsdp`; their "dense" bytes are FSDP2's fp32 ring
reduce-scatter of the same (padded) gradients, ``4 (N - 1) / N`` bytes per value. After the
run the replicas' full parameters are compared (all-gathered, MIN == MAX over the ranks)
and against the DDP row of the same path (``max_param_diff_vs_ddp``, when both ran).

Bytes per step are per rank, payload only, as counted by the hooks; the fp32 row is what a
plain ring all-reduce of the same gradients sends (``host.ddp.dense_ring_bytes``). Results
go to ``<out>/accuracy.json``, ``<out>/accuracy.png`` (learning curves) and
``<out>/accuracy.md`` (the table of ``docs/accuracy.md``).

``Settings.backend`` chooses who computes the compressed rows (:data:`BACKENDS`):
``"golden"`` (the NumPy models), ``"verilator"`` (the INCEPTIONN rows through every rank's
own Verilated NIC; the LHC row stays golden: the hooks have no simulated switch of their
own) or ``"udp"`` (the INCEPTIONN rows through a board's NIC, the LHC row through its
switch; a virtual board in a process of its own unless :func:`run_experiment` is given
one). Every row records which backend computed it, the packets and bytes that went through
the hardware, resends, and the time per step: the whole training step (evaluation left
out), the hook's calls and the part of them in the hardware path.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import time
from pathlib import Path

import numpy as np

__all__ = ["CODECS", "TASKS", "BACKENDS", "PINNED_ENVIRONMENT", "Settings", "make_ncf_data",
           "load_digits_split", "prepare_datasets", "first_step_gradients", "train_in_group",
           "run_experiment", "results_table", "plot_curves", "write_outputs"]

#: Gradient paths, in table order: name -> None (plain DDP), ("inceptionn", k,
#: error_feedback) or ("lhc",).
CODECS = {
    "fp32": None,
    "inceptionn-k6": ("inceptionn", 6, False),
    "inceptionn-k6-ef": ("inceptionn", 6, True),
    "inceptionn-k8": ("inceptionn", 8, False),
    "inceptionn-k8-ef": ("inceptionn", 8, True),
    "inceptionn-k10": ("inceptionn", 10, False),
    "inceptionn-k10-ef": ("inceptionn", 10, True),
    "lhc": ("lhc",),
    # FSDP2 (fully_shard per layer): its own fp32 reduce-scatter, and the two paths as its
    # custom reduce-scatter (host.fsdp)
    "fsdp-fp32": ("fsdp", None),
    "fsdp-inceptionn-k10": ("fsdp", ("inceptionn", 10, False)),
    "fsdp-inceptionn-k10-ef": ("fsdp", ("inceptionn", 10, True)),
    "fsdp-lhc": ("fsdp", ("lhc",)),
}
TASKS = ("digits", "ncf")
#: who computes the compressed rows (see the module docstring)
BACKENDS = ("golden", "verilator", "udp")
#: The training processes' SIMD code paths, pinned. By default MKL's sgemm and ATen's
#: vectorised kernels take the widest instructions the CPU has (AVX2, AVX-512, ...), and their
#: float32 results differ in the last bits from one instruction set to another; the runs that
#: carry such bits forward (error feedback's residuals, the ring's rounded additions, fp32
#: itself over 300 steps) then print other figures on another machine. With these every
#: x86-64 machine takes the same code paths (MKL's conditional numerical reproducibility mode
#: COMPATIBLE, ATen's baseline kernels). One machine gives the same bits run after run either
#: way (one intra-op thread, seeded data, models and batches). A variable already set in the
#: environment is left as it is; the results record what the processes ran with.
PINNED_ENVIRONMENT = {"MKL_CBWR": "COMPATIBLE", "ATEN_CPU_CAPABILITY": "default"}


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything that defines a run (stored in the JSON)."""
    world_size: int = 4
    seed: int = 2024
    tasks: tuple = TASKS
    codecs: tuple = tuple(CODECS)
    digits_steps: int = 300
    digits_batch: int = 32          # per rank
    digits_lr: float = 0.05
    ncf_steps: int = 300
    ncf_batch: int = 64             # positives per rank, each with ncf_negatives negatives
    ncf_negatives: int = 4
    ncf_lr: float = 0.003
    ncf_users: int = 3000
    ncf_items: int = 1500
    ncf_interactions: int = 20      # per user, one of them held out for the test
    ncf_eval_users: int = 1000
    eval_every: int = 25
    backend: str = "golden"

    @classmethod
    def quick(cls, **overrides):
        """A smoke run: few steps, small tables."""
        values = dict(digits_steps=20, ncf_steps=20, ncf_users=400, ncf_items=300,
                      ncf_eval_users=200, eval_every=10)
        values.update(overrides)
        return cls(**values)


# ---------------------------------------------------------------------------------------
# data (made in the parent process, handed to every rank)

def load_digits_split(seed: int):
    """scikit-learn's bundled digits, scaled to [0, 1], split 80/20 (stratified, seeded)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=seed, stratify=y)
    return {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test}


def make_ncf_data(users: int, items: int, interactions: int, seed: int, *, dim: int = 8,
                  test_negatives: int = 99):
    """Synthetic implicit feedback from a seeded latent-factor model.

    Every user u and item i get latent vectors ``U_u``, ``V_i`` (dimension ``dim``) and every
    item a popularity ``b_i``; user u interacts with the ``interactions`` items of largest
    ``U_u . V_i * 2 / sqrt(dim) + b_i + Gumbel noise`` (sampling without replacement from
    the softmax of the affinities). One interaction per user is held out as the test
    positive, with ``test_negatives`` items the user never touched.

    Returns
    -------
    dict of numpy arrays: ``train_users``, ``train_items`` (positive pairs),
    ``test_users`` (users), ``test_items`` (users x (1 + test_negatives), column 0 the
    held-out positive), plus ``users``, ``items``.
    """
    if interactions < 2 or interactions + test_negatives > items:
        raise ValueError(f"need 2 <= interactions and interactions + {test_negatives} <= items, "
                         f"got interactions={interactions}, items={items}")
    rng = np.random.default_rng(seed)
    user_factors = rng.standard_normal((users, dim))
    item_factors = rng.standard_normal((items, dim))
    popularity = rng.standard_normal(items)
    affinity = user_factors @ item_factors.T * (2.0 / math.sqrt(dim)) + popularity
    noisy = affinity + rng.gumbel(size=affinity.shape)
    chosen = np.argpartition(-noisy, interactions - 1, axis=1)[:, :interactions]
    chosen = rng.permuted(chosen, axis=1)
    held_out = chosen[:, 0]
    train_items = chosen[:, 1:].reshape(-1)
    train_users = np.repeat(np.arange(users), interactions - 1)
    # Test negatives: items the user never interacted with.
    touched = np.zeros((users, items), dtype=bool)
    np.put_along_axis(touched, chosen, True, axis=1)
    priority = np.where(touched, np.inf, rng.random((users, items)))
    negatives = np.argpartition(priority, test_negatives - 1, axis=1)[:, :test_negatives]
    return {
        "users": users, "items": items,
        "train_users": train_users.astype(np.int64), "train_items": train_items.astype(np.int64),
        "test_users": np.arange(users, dtype=np.int64),
        "test_items": np.concatenate([held_out[:, None], negatives], axis=1).astype(np.int64),
    }


# ---------------------------------------------------------------------------------------
# models and training (run inside each rank)

def _digits_model():
    import torch

    return torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 10))


def _ncf_model(users, items, dim=16):
    import torch

    class NeuMF(torch.nn.Module):
        """He et al., "Neural Collaborative Filtering" (WWW 2017): a generalised matrix
        factorisation tower and an MLP tower on separate embeddings, joined by one layer."""

        def __init__(self):
            super().__init__()
            self.user_gmf = torch.nn.Embedding(users, dim)
            self.item_gmf = torch.nn.Embedding(items, dim)
            self.user_mlp = torch.nn.Embedding(users, dim)
            self.item_mlp = torch.nn.Embedding(items, dim)
            for table in (self.user_gmf, self.item_gmf, self.user_mlp, self.item_mlp):
                torch.nn.init.normal_(table.weight, std=0.1)
            self.mlp = torch.nn.Sequential(
                torch.nn.Linear(2 * dim, 32), torch.nn.ReLU(),
                torch.nn.Linear(32, 16), torch.nn.ReLU())
            self.out = torch.nn.Linear(dim + 16, 1)

        def forward(self, user, item):
            gmf = self.user_gmf(user) * self.item_gmf(item)
            mlp = self.mlp(torch.cat([self.user_mlp(user), self.item_mlp(item)], dim=1))
            return self.out(torch.cat([gmf, mlp], dim=1)).squeeze(1)

    return NeuMF()


def _make_hook(codec, hardware=None):
    """The hook of a gradient path; ``hardware``: ``{"backend", "board", "key"}`` (None:
    golden)."""
    from . import hooks as ddp

    spec = CODECS[codec]
    if spec is None:
        return None
    backend = (hardware or {}).get("backend", "golden")
    if spec[0] == "inceptionn":
        if backend == "golden":
            return ddp.InceptionnHook(k=spec[1], error_feedback=spec[2])
        board = {"board": hardware["board"]} if backend == "udp" else {}
        return ddp.InceptionnHook(k=spec[1], error_feedback=spec[2], backend=backend, **board)
    if backend == "udp" and hardware.get("boards"):
        return ddp.LhcHook(backend="udp", boards=hardware["boards"], key=hardware["keys"])
    if backend == "udp":
        return ddp.LhcHook(backend="udp", board=hardware["board"], key=hardware["key"])
    return ddp.LhcHook()


class _Task:
    """One training problem: model, batches (per rank, seeded), loss, evaluation."""

    def __init__(self, name, settings, data, rank):
        self.name, self.settings, self.data, self.rank = name, settings, data, rank

    def model(self):
        if self.name == "digits":
            return _digits_model()
        return _ncf_model(self.data["users"], self.data["items"])

    def optimizer(self, params):
        import torch

        if self.name == "digits":
            return torch.optim.SGD(params, lr=self.settings.digits_lr, momentum=0.9)
        return torch.optim.Adam(params, lr=self.settings.ncf_lr)

    @property
    def steps(self):
        return self.settings.digits_steps if self.name == "digits" else self.settings.ncf_steps

    def batches(self):
        """The rank's batches: a generator seeded by (seed, task, rank), so every gradient
        path sees the same data in the same order."""
        import torch

        rng = np.random.default_rng([self.settings.seed, TASKS.index(self.name), self.rank])
        s, d = self.settings, self.data
        while True:
            if self.name == "digits":
                pick = rng.integers(0, len(d["y_train"]), s.digits_batch)
                yield (torch.from_numpy(d["x_train"][pick]),), torch.from_numpy(d["y_train"][pick])
            else:
                pick = rng.integers(0, len(d["train_users"]), s.ncf_batch)
                users = np.repeat(d["train_users"][pick], 1 + s.ncf_negatives)
                items = rng.integers(0, d["items"], (s.ncf_batch, 1 + s.ncf_negatives))
                items[:, 0] = d["train_items"][pick]
                labels = np.zeros((s.ncf_batch, 1 + s.ncf_negatives), np.float32)
                labels[:, 0] = 1.0
                yield ((torch.from_numpy(users), torch.from_numpy(items.reshape(-1))),
                       torch.from_numpy(labels.reshape(-1)))

    def loss(self, output, target):
        import torch.nn.functional as F

        if self.name == "digits":
            return F.cross_entropy(output, target)
        return F.binary_cross_entropy_with_logits(output, target)

    def evaluate(self, model):
        """(metric, test loss): digits accuracy / cross-entropy; NCF HR@10 / BCE over the
        held-out positive and its negatives."""
        import torch
        import torch.nn.functional as F

        d = self.data
        with torch.no_grad():
            if self.name == "digits":
                logits = model(torch.from_numpy(d["x_test"]))
                target = torch.from_numpy(d["y_test"])
                return (float((logits.argmax(1) == target).float().mean()),
                        float(F.cross_entropy(logits, target)))
            users = d["test_users"][:self.settings.ncf_eval_users]
            items = d["test_items"][:self.settings.ncf_eval_users]
            scores = model(torch.from_numpy(np.repeat(users, items.shape[1])),
                           torch.from_numpy(items.reshape(-1))).reshape(items.shape)
            # Rank of the positive (column 0) among 100; ties counted against it.
            rank = (scores[:, 1:] >= scores[:, :1]).sum(dim=1)
            labels = torch.zeros_like(scores)
            labels[:, 0] = 1
            return (float((rank < 10).float().mean()),
                    float(F.binary_cross_entropy_with_logits(scores, labels)))


def _train_one(task, codec, world, hardware=None):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from .collectives import dense_ring_bytes

    if CODECS[codec] is not None and CODECS[codec][0] == "fsdp":
        return _train_fsdp(task, codec, world, hardware)
    torch.manual_seed(task.settings.seed)
    net = task.model()
    numel = sum(p.numel() for p in net.parameters())
    model = DistributedDataParallel(net)
    hook = _make_hook(codec, hardware)
    if hook is not None:
        model.register_comm_hook(state=None, hook=hook)
    optimizer = task.optimizer(model.parameters())
    batches = task.batches()
    curve, evals = [], []
    lhc_rows, lhc_unpeeled, lhc_union = [], [], []
    started = time.perf_counter()
    step_seconds = 0.0
    for step in range(1, task.steps + 1):
        inputs, target = next(batches)
        step_started = time.perf_counter()
        optimizer.zero_grad()
        loss = task.loss(model(*inputs), target)
        loss.backward()
        optimizer.step()
        step_seconds += time.perf_counter() - step_started
        mean_loss = loss.detach().reshape(1) / world
        dist.all_reduce(mean_loss)                      # bookkeeping only, not counted
        curve.append(float(mean_loss))
        if step % task.settings.eval_every == 0 or step == task.steps:
            metric, test_loss = task.evaluate(net)
            evals.append((step, metric, test_loss))
    seconds = time.perf_counter() - started
    # Are the replicas still the same bits? (A compressed path that disagreed across ranks
    # would let them drift apart.) Elementwise MIN == MAX of the raw words over the ranks.
    words = torch.cat([p.detach().reshape(-1) for p in net.parameters()]).view(torch.int32)
    low, high = words.clone(), words.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    result = {
        "task": task.name, "codec": codec, "steps": task.steps, "params": numel,
        "train_loss": curve, "evals": evals,
        "final_metric": evals[-1][1], "final_test_loss": evals[-1][2],
        "replicas_identical": bool(torch.equal(low, high)),
        "train_seconds": seconds,
        "step_seconds": step_seconds / task.steps,
        "backend": "gloo" if hook is None else hook.backend,
    }
    if hook is None:
        per_step = dense_ring_bytes(numel, world, dist.get_rank())
        result.update(bytes_per_step=per_step, dense_ring_bytes_per_step=per_step)
    else:
        # (hook.calls holds every call: the experiment's hooks keep the default history)
        totals = hook.hardware_totals
        # The hardware's start-up (opening a NIC, configuring a switch job: once, at the first
        # bucket) is reported on its own, not spread over the steps.
        startup = totals["startup_seconds"] if totals is not None else 0.0
        result["step_seconds"] = (step_seconds - startup) / task.steps
        result["hook_seconds_per_step"] = \
            (sum(c.seconds for c in hook.calls) - startup) / task.steps
        result["path_seconds_per_step"] = sum(c.path_seconds for c in hook.calls) / task.steps
        result["backend"] = hook.calls[-1].backend if hook.calls else hook.backend
        if totals is not None:
            result["hardware"] = totals
            hook.close()
        result.update(bytes_per_step=hook.bytes_sent / task.steps,
                      dense_ring_bytes_per_step=hook.dense_ring_bytes / task.steps,
                      control_bytes_per_step=hook.control_bytes / task.steps)
        if CODECS[codec][0] == "inceptionn":
            # Sums over every call of this rank (the experiment's hooks keep all calls).
            for key in ("quantised_values", "offgrid_values", "added_values", "rounded_adds"):
                result[f"ring_{key}"] = int(sum(call.details[key] for call in hook.calls))
        if codec == "lhc":
            for call in hook.calls:
                lhc_rows.append(call.details["rows"])
                lhc_unpeeled.append(call.details["unpeeled"])
                lhc_union.append(call.details["union_nnz"] / call.numel)
            result.update(lhc_mean_rows=float(np.mean(lhc_rows)),
                          lhc_unpeeled_total=int(np.sum(lhc_unpeeled)),
                          lhc_mean_union_density=float(np.mean(lhc_union)))
    _FINAL_PARAMS[task.name, codec] = torch.cat(
        [p.detach().reshape(-1) for p in net.parameters()]).clone()
    return result


#: (task, codec) -> this rank's final flat parameters (FSDP rows compare with DDP rows)
_FINAL_PARAMS = {}
_MESH = []


def _make_reduce_scatter(spec, hardware):
    """The host.fsdp object of an FSDP row's path (None: FSDP2's own)."""
    from .. import fsdp

    if spec is None:
        return None
    backend = (hardware or {}).get("backend", "golden")
    if spec[0] == "inceptionn":
        if backend == "golden":
            return fsdp.InceptionnReduceScatter(k=spec[1], error_feedback=spec[2])
        board = {"board": hardware["board"]} if backend == "udp" else {}
        return fsdp.InceptionnReduceScatter(k=spec[1], error_feedback=spec[2],
                                            backend=backend, **board)
    if backend == "udp":
        return fsdp.LhcReduceScatter(backend="udp", board=hardware["board"],
                                     key=hardware["key"])
    return fsdp.LhcReduceScatter()


def _train_fsdp(task, codec, world, hardware=None):
    """One FSDP2 row: the task's model with ``fully_shard`` on every module that holds
    parameters directly and on the model, the path's reduce-scatter on each."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from .. import fsdp

    if not _MESH:
        _MESH.append(init_device_mesh("cpu", (world,)))
    mesh = _MESH[0]
    torch.manual_seed(task.settings.seed)
    net = task.model()
    numel = sum(p.numel() for p in net.parameters())
    for module in list(net.modules())[1:]:
        if any(True for _ in module.parameters(recurse=False)):
            fully_shard(module, mesh=mesh)
    fully_shard(net, mesh=mesh)
    spec = CODECS[codec][1]
    objects = fsdp.set_reduce_scatter(net, lambda: _make_reduce_scatter(spec, hardware)) \
        if spec is not None else []
    # FSDP2's own fp32 reduce-scatter sends 4 (N - 1) / N bytes per (padded) value
    padded = 0
    for module in net.modules():
        for group in getattr(getattr(module, "_get_fsdp_state", lambda: None)(), 
                             "_fsdp_param_groups", []) or []:
            padded += sum(p.padded_sharded_param_size.numel() for p in group.fsdp_params)
    dense_per_step = fsdp.dense_reduce_scatter_bytes(padded * world, world)
    optimizer = task.optimizer(net.parameters())
    batches = task.batches()
    curve, evals = [], []
    started = time.perf_counter()
    step_seconds = 0.0
    for step in range(1, task.steps + 1):
        inputs, target = next(batches)
        step_started = time.perf_counter()
        optimizer.zero_grad()
        loss = task.loss(net(*inputs), target)
        loss.backward()
        optimizer.step()
        step_seconds += time.perf_counter() - step_started
        mean_loss = loss.detach().reshape(1) / world
        dist.all_reduce(mean_loss)
        curve.append(float(mean_loss))
        if step % task.settings.eval_every == 0 or step == task.steps:
            metric, test_loss = task.evaluate(net)
            evals.append((step, metric, test_loss))
    seconds = time.perf_counter() - started
    full = torch.cat([p.full_tensor().detach().reshape(-1) for p in net.parameters()])
    words = full.view(torch.int32)
    low, high = words.clone(), words.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    result = {
        "task": task.name, "codec": codec, "steps": task.steps, "params": numel,
        "train_loss": curve, "evals": evals,
        "final_metric": evals[-1][1], "final_test_loss": evals[-1][2],
        "replicas_identical": bool(torch.equal(low, high)),
        "train_seconds": seconds, "step_seconds": step_seconds / task.steps,
        "backend": "gloo" if not objects else objects[0].backend,
        "dense_ring_bytes_per_step": dense_per_step,
    }
    ddp_codec = codec[len("fsdp-"):]
    if (task.name, ddp_codec) in _FINAL_PARAMS:
        result["max_param_diff_vs_ddp"] = float(
            (full - _FINAL_PARAMS[task.name, ddp_codec]).abs().max())
    if not objects:
        result["bytes_per_step"] = dense_per_step
    else:
        calls = [c for obj in objects for c in obj.calls]
        result.update(
            bytes_per_step=sum(obj.bytes_sent for obj in objects) / task.steps,
            dense_ring_bytes_per_step=sum(obj.dense_bytes for obj in objects) / task.steps,
            control_bytes_per_step=sum(obj.control_bytes for obj in objects) / task.steps,
            hook_seconds_per_step=sum(c.seconds for c in calls) / task.steps,
            path_seconds_per_step=sum(c.path_seconds for c in calls) / task.steps,
            backend=calls[-1].backend if calls else objects[0].backend)
        if spec[0] == "lhc":
            result.update(lhc_mean_rows=float(np.mean([c.details["rows"] for c in calls])),
                          lhc_unpeeled_total=int(sum(c.details["unpeeled"] for c in calls)))
        for obj in objects:
            obj.close()
    return result


#: per-rank figures averaged over the ranks (bytes and times differ per rank)
_MEAN_OF_RANKS = ("bytes_per_step", "dense_ring_bytes_per_step", "step_seconds",
                  "hook_seconds_per_step", "path_seconds_per_step")


def train_in_group(rank: int, world: int, settings: Settings, datasets: dict,
                   hardware: dict | None = None) -> list:
    """Train every task of ``settings`` with every gradient path, inside an initialised
    default process group (this rank's part; every rank must call it). Returns the list of
    run results (identical on every rank). ``hardware``: ``{"backend", "board", "key"}`` of
    ``settings.backend`` (the board of ``"udp"``; see :func:`run_experiment`)."""
    import torch
    import torch.distributed as dist

    if hardware is None and settings.backend != "golden":
        hardware = {"backend": settings.backend}
    results = []
    for name in settings.tasks:
        task = _Task(name, settings, datasets[name], rank)
        for codec in settings.codecs:
            result = _train_one(task, codec, world, hardware)
            # Bytes differ per rank (chunk sizes, compressibility): report the mean of ranks.
            for key in _MEAN_OF_RANKS:
                if key not in result:
                    continue
                total = torch.tensor([float(result[key])], dtype=torch.float64)
                dist.all_reduce(total)
                result[key] = float(total.item()) / world
            if "hardware" in result:
                # Packets, bytes and resends: all ranks together; seconds: the slowest rank.
                mine = result.pop("hardware")
                keys = sorted(mine)
                summed = torch.tensor([float(mine[k]) for k in keys], dtype=torch.float64)
                slowest = summed.clone()
                dist.all_reduce(summed)
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                result["hardware"] = {
                    k: (float(slowest[i]) if "seconds" in k
                        else int(slowest[i]) if k == "boards" else int(summed[i]))
                    for i, k in enumerate(keys)}
                result["hardware_packets_per_step_rank"] = \
                    result["hardware"]["packets_in"] / task.steps / world
            if "ring_quantised_values" in result:
                keys = ("ring_quantised_values", "ring_offgrid_values", "ring_added_values",
                        "ring_rounded_adds")
                counts = torch.tensor([result[key] for key in keys], dtype=torch.int64)
                dist.all_reduce(counts)             # all ranks' hops
                result.update(zip(keys, counts.tolist()))
                result["ring_offgrid_fraction"] = \
                    result["ring_offgrid_values"] / max(result["ring_quantised_values"], 1)
                result["ring_rounded_fraction"] = \
                    result["ring_rounded_adds"] / max(result["ring_added_values"], 1)
            if rank == 0:
                ring = ""
                if "ring_offgrid_fraction" in result:
                    ring = (f"  off-grid {result['ring_offgrid_fraction']:.2e}"
                            f"  rounded {result['ring_rounded_fraction']:.2e}")
                hw = ""
                if "hardware" in result:
                    hw = (f"  {result['hardware_packets_per_step_rank']:.0f} packets/step/rank "
                          f"through {result['backend']}")
                print(f"  {name:6s} {codec:18s} metric {result['final_metric']:.4f}  "
                      f"test loss {result['final_test_loss']:.4f}  "
                      f"{result['bytes_per_step']:10.0f} B/step/rank{ring}{hw}  "
                      f"({result['train_seconds']:.1f} s)", flush=True)
            results.append(result)
    return results


def prepare_datasets(settings: Settings) -> dict:
    """The data of every task in ``settings`` (made once, in the parent process)."""
    datasets = {}
    if "digits" in settings.tasks:
        datasets["digits"] = load_digits_split(settings.seed)
    if "ncf" in settings.tasks:
        datasets["ncf"] = make_ncf_data(settings.ncf_users, settings.ncf_items,
                                        settings.ncf_interactions, settings.seed)
    return datasets


def first_step_gradients(settings: Settings, datasets: dict, task: str) -> list:
    """Every rank's flat float32 gradient of ``task``'s first training step, without a
    process group: the model as every rank builds it (seeded), each rank's own first batch,
    the parameters in ``model.parameters()`` order (DDP's bucket contents before any
    averaging). For codec measurements on this experiment's real gradients."""
    import torch

    out = []
    for rank in range(settings.world_size):
        item = _Task(task, settings, datasets[task], rank)
        torch.manual_seed(settings.seed)
        net = item.model()
        inputs, target = next(item.batches())
        item.loss(net(*inputs), target).backward()
        out.append(np.concatenate([p.grad.detach().reshape(-1).numpy()
                                   for p in net.parameters()]).astype(np.float32))
    return out


def run_experiment(settings: Settings, *, board=None, key=None, boards: int = 1) -> dict:
    """Train every task with every gradient path; return the JSON-able results.

    With ``settings.backend == "udp"``, ``board`` (``HOST[:PORT_BASE]``) and ``key`` name the
    board; without them a virtual board (golden backend) is started in a process of its own
    for the run (:class:`host.board.process.BoardProcess`). Several boards (``board`` a list,
    ``key`` one for all or a list; or ``boards=N`` virtual ones, a process each on its own
    port base): the LHC row's switch job spans all of them (``LhcHook(boards=[...])``), the
    INCEPTIONN rows use the first.
    """
    from .launch import check_rendezvous_address, run_local_group

    # Fail at once, in one line, where the ranks could not meet (before a virtual board).
    check_rendezvous_address()
    unknown = set(settings.codecs) - set(CODECS) or set(settings.tasks) - set(TASKS)
    if unknown:
        raise ValueError(f"unknown codec or task: {sorted(unknown)}")
    if settings.backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, not "
                         f"{settings.backend!r}")
    if settings.backend != "udp" and (board is not None or key is not None or boards != 1):
        raise ValueError("board, boards and key are for the udp backend")
    if isinstance(boards, bool) or not isinstance(boards, int) or boards < 1 \
            or (boards > 1 and board is not None):
        raise ValueError(f"boards is a number of virtual boards to start (without board=), "
                         f"not {boards!r}")
    datasets = prepare_datasets(settings)
    hardware = None if settings.backend == "golden" else {"backend": settings.backend}
    started = time.perf_counter()
    virtual = None
    started_boards = []
    if settings.backend == "udp" and board is None:
        from ..board.process import BoardProcess
        try:
            for _ in range(boards):
                started_boards.append(BoardProcess().start())
        except BaseException:
            for process in started_boards:
                process.stop()
            raise
        virtual = started_boards[0]
        if boards == 1:
            board, key = virtual.address, virtual.key
        else:
            board, key = [p.address for p in started_boards], [p.key for p in started_boards]
    try:
        if settings.backend == "udp" and isinstance(board, (list, tuple)) and len(board) > 1:
            hardware.update(board=board[0], key=key[0] if isinstance(key, (list, tuple)) else key,
                            boards=list(board),
                            keys=list(key) if isinstance(key, (list, tuple)) else key)
        elif settings.backend == "udp":
            if isinstance(board, (list, tuple)):
                board = board[0]
            if isinstance(key, (list, tuple)):
                key = key[0]
            hardware.update(board=board, key=key)
        with _pinned_environment() as environment:
            per_rank = run_local_group(train_in_group, settings.world_size, settings, datasets,
                                       hardware, timeout=3600)
    finally:
        for process in started_boards:
            process.stop()
    runs = per_rank[0]
    results = {"settings": dataclasses.asdict(settings), "environment": environment,
               "runs": runs, "wall_seconds": time.perf_counter() - started}
    if settings.backend == "udp":
        results["board"] = {"address": board, "virtual": virtual is not None}
        if virtual is not None:
            results["board"]["datagrams_in_out"] = virtual.datagrams()
        if len(hardware.get("boards") or ()) > 1:
            results["board"]["boards"] = hardware["boards"]
            if started_boards:
                results["board"]["datagrams_in_out_per_board"] = [
                    p.datagrams() for p in started_boards]
    return results


@contextlib.contextmanager
def _pinned_environment():
    """:data:`PINNED_ENVIRONMENT` in ``os.environ`` while the training processes start (they
    inherit it), restored afterwards; yields the values they run with."""
    added = [name for name in PINNED_ENVIRONMENT if name not in os.environ]
    for name in added:
        os.environ[name] = PINNED_ENVIRONMENT[name]
    try:
        yield {name: os.environ[name] for name in PINNED_ENVIRONMENT}
    finally:
        for name in added:
            os.environ.pop(name, None)


# ---------------------------------------------------------------------------------------
# reporting

_METRIC = {"digits": "test accuracy", "ncf": "HR@10"}


def _ms(seconds):
    return "-" if seconds is None else f"{seconds * 1e3:,.1f}"


def hardware_table(results: dict) -> str:
    """Where every row was computed and what it cost per step (Markdown)."""
    lines = [
        "| task | gradients | computed by | packets through the hardware /step/rank | resends "
        "| step ms | hook ms/step | hardware path ms/step | start-up s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in results["runs"]:
        hardware = run.get("hardware")
        packets = f"{run['hardware_packets_per_step_rank']:,.1f}" if hardware else "-"
        resends = f"{hardware['resends']:,}" if hardware else "-"
        startup = f"{hardware['startup_seconds']:.2f}" if hardware else "-"
        lines.append(
            f"| {run['task']} | {run['codec']} | {run.get('backend', 'golden')} | {packets} "
            f"| {resends} | {_ms(run.get('step_seconds'))} "
            f"| {_ms(run.get('hook_seconds_per_step'))} "
            f"| {_ms(run.get('path_seconds_per_step'))} | {startup} |")
    lines.append("")
    lines.append("Packets into the gateware (NIC transmit and receive paths, or the switch, "
                 "resends included) per step and rank; times per step, mean of ranks: the "
                 "whole training step (evaluation left out), the hook's calls, and the part "
                 "of them in the hardware path (golden rows: the same part computed by the "
                 "NumPy models or gloo collectives); the hardware's start-up at the first "
                 "bucket (the slowest rank) is left out of them and shown on its own.")
    return "\n".join(lines)


def results_table(results: dict) -> str:
    """The Markdown table of ``docs/accuracy.md``."""
    s = results["settings"]
    lines = [
        "| task | gradients | final metric | final test loss | bytes/step/rank | vs fp32 ring "
        "| replicas identical |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in results["runs"]:
        ratio = run["dense_ring_bytes_per_step"] / run["bytes_per_step"] \
            if run["bytes_per_step"] else float("inf")
        lines.append(
            f"| {run['task']} ({run['params']} params, {run['steps']} steps) | {run['codec']} "
            f"| {_METRIC[run['task']]} {run['final_metric']:.4f} "
            f"| {run['final_test_loss']:.4f} | {run['bytes_per_step']:,.0f} "
            f"| {ratio:.2f}x | {'yes' if run['replicas_identical'] else 'NO'} |")
    lines.append("")
    lines.append(f"{s['world_size']} gloo processes, seed {s['seed']}; bytes are payload bytes "
                 f"per rank per step (mean over ranks and steps); \"vs fp32 ring\" = bytes "
                 f"of a plain fp32 ring all-reduce of the same buckets / bytes sent; for "
                 f"the fsdp rows, of FSDP2's own fp32 ring reduce-scatter of the same "
                 f"(padded) gradients / bytes sent.")
    ring_runs = [run for run in results["runs"] if "ring_offgrid_fraction" in run]
    if ring_runs:
        lines += [
            "",
            "| task | gradients | hop values the codec changed | float32 adds that rounded |",
            "|---|---|---|---|",
        ]
        for run in ring_runs:
            lines.append(
                f"| {run['task']} | {run['codec']} "
                f"| {run['ring_offgrid_values']:,} of {run['ring_quantised_values']:,} "
                f"({run['ring_offgrid_fraction']:.2e}) "
                f"| {run['ring_rounded_adds']:,} of {run['ring_added_values']:,} "
                f"({run['ring_rounded_fraction']:.2e}) |")
        lines.append("")
        lines.append("INCEPTIONN ring, all ranks and steps: values of the reduce-scatter's "
                     "partial sums (and of the owners' chunks) that the quantisation changed, "
                     "i.e. not on their class's grid; float32 additions of partial sums that "
                     "rounded.")
    lines += ["", hardware_table(results)]
    return "\n".join(lines)


def plot_curves(results: dict, path) -> None:
    """Learning curves: training loss (smoothed) and the test metric, per task."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = [t for t in TASKS if any(r["task"] == t for r in results["runs"])]
    fig, axes = plt.subplots(2, len(tasks), figsize=(6 * len(tasks), 7.5), squeeze=False)
    for column, task in enumerate(tasks):
        loss_ax, metric_ax = axes[0][column], axes[1][column]
        for run in (r for r in results["runs"] if r["task"] == task):
            loss = np.asarray(run["train_loss"])
            window = max(1, min(10, loss.size // 10))
            smooth = np.convolve(loss, np.ones(window) / window, mode="valid")
            # LHC is lossless up to int32 quantisation: it lies on top of fp32, so dash it.
            # Error feedback: the colour of the same k without it, dash-dotted.
            base = run["codec"].removesuffix("-ef")
            style = {"color": f"C{list(CODECS).index(base) if base in CODECS else 0}"}
            if run["codec"] == "lhc":
                style["linestyle"] = "--"
            elif run["codec"].endswith("-ef"):
                style["linestyle"] = "-."
            loss_ax.plot(np.arange(window, loss.size + 1), smooth, label=run["codec"], **style)
            steps, metric, _ = zip(*run["evals"])
            metric_ax.plot(steps, metric, marker="o", markersize=3, label=run["codec"], **style)
        loss_ax.set_title(f"{task}: training loss (mean of ranks, smoothed)")
        loss_ax.set_xlabel("step")
        loss_ax.set_yscale("log")
        metric_ax.set_title(f"{task}: {_METRIC[task]}")
        metric_ax.set_xlabel("step")
        for ax in (loss_ax, metric_ax):
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(results: dict, out_dir) -> dict:
    """Write accuracy.json, accuracy.png and accuracy.md into ``out_dir``; return paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "accuracy.json", "png": out / "accuracy.png",
             "md": out / "accuracy.md"}
    paths["json"].write_text(json.dumps(results, indent=2) + "\n")
    plot_curves(results, paths["png"])
    paths["md"].write_text(results_table(results) + "\n")
    return paths
