"""DDP training through the gateware: what the hardware path costs, and that it changes no bit.

4 gloo processes on 127.0.0.1 train the accuracy experiment's models (the digits MLP and the
NCF recommender, :mod:`host.ddp.accuracy`: the same seeds, batches and optimizers) for the same
steps once per gradient path:

- ``fp32``: DDP's own all-reduce over gloo (the baseline of every time);
- ``inceptionn-golden`` / ``-verilator`` / ``-udp``: ``InceptionnHook(k=10)`` computing through
  the golden model, every rank's Verilated NIC (compiled harness), a board's NIC;
- ``lhc-golden`` / ``-udp``: ``LhcHook()`` through gloo collectives, a board's switch.

The board is a virtual one (golden backend) in a process of its own. After every step every
rank hashes its parameters (SHA-256 of their bytes); a hardware path must give the golden
path's hash at every step, and the run fails otherwise. Reported per path, as means over the
steps and ranks: the whole step (forward, backward with the all-reduce, optimizer), the
hook's calls, the part of them in the hardware path (golden paths: the NumPy codec, or the
gloo collectives that stand for the switch), packets and bytes into the hardware per rank,
resends, and the hardware's start-up at the first bucket (left out of the per-step times).

``python -m host.benchmarks.ddp_hardware`` is the 50-step run of both models that
``docs/training.md`` quotes (a few minutes); ``make bench`` runs it through ``host.bench``,
shorter: both models for :data:`BENCH_STEPS` steps (about a minute and a half), ``--quick``
the digits model for :data:`QUICK_STEPS` steps.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time

import numpy as np

__all__ = ["run", "PATHS"]

K = 10
WORLD = 4
#: steps of ``make bench`` (``run(quick=False)``) and of ``make bench --quick``
BENCH_STEPS = 10
QUICK_STEPS = 3
#: name -> (family, backend); the golden path of a family first
PATHS = {
    "fp32": (None, None),
    "inceptionn-golden": ("inceptionn", "golden"),
    "inceptionn-verilator": ("inceptionn", "verilator"),
    "inceptionn-udp": ("inceptionn", "udp"),
    "lhc-golden": ("lhc", "golden"),
    "lhc-udp": ("lhc", "udp"),
}


def _hook(path, board, key):
    from host import ddp

    family, backend = PATHS[path]
    if family is None:
        return None
    options = {} if backend == "golden" else {"backend": backend}
    if backend == "udp":
        options["board"] = board
    if family == "inceptionn":
        return ddp.InceptionnHook(k=K, **options)
    if backend == "udp":
        options["key"] = key
    return ddp.LhcHook(**options)


def _train(task, steps, path, board, key):
    import torch
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(task.settings.seed)
    net = task.model()
    model = DistributedDataParallel(net)
    hook = _hook(path, board, key)
    if hook is not None:
        model.register_comm_hook(state=None, hook=hook)
    optimizer = task.optimizer(model.parameters())
    batches = task.batches()
    digests, step_seconds = [], 0.0
    started = time.perf_counter()
    for _ in range(steps):
        inputs, target = next(batches)
        t = time.perf_counter()
        optimizer.zero_grad()
        task.loss(model(*inputs), target).backward()
        optimizer.step()
        step_seconds += time.perf_counter() - t
        words = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
        digests.append(hashlib.sha256(words.numpy().tobytes()).hexdigest())
    out = {"path": path, "task": task.name, "steps": steps, "digests": digests,
           "params": sum(p.numel() for p in net.parameters()),
           "wall_seconds": time.perf_counter() - started}
    startup = 0.0
    if hook is not None:
        out["backend"] = hook.calls[-1].backend
        out["hook_seconds"] = sum(c.seconds for c in hook.calls)
        out["path_seconds"] = sum(c.path_seconds for c in hook.calls)
        out["bytes_sent"] = hook.bytes_sent
        totals = hook.hardware_totals
        if totals is not None:
            out["hardware"] = totals
            startup = totals["startup_seconds"]
            out["hook_seconds"] -= startup
            hook.close()
    else:
        out["backend"] = "gloo"
    out["step_seconds"] = step_seconds - startup
    return out


def _rank_main(rank, world, tasks, steps, paths, settings, datasets, board, key):
    from host.ddp.accuracy import _Task

    results = []
    for name in tasks:
        task = _Task(name, settings, datasets[name], rank)
        for path in paths:
            results.append(_train(task, steps, path, board, key))
    return results


def _summarise(per_rank, steps):
    """Per (task, path): means over ranks and steps, the slowest rank's wall time, and the
    check against the golden path of the family."""
    runs = {}
    for index, first in enumerate(per_rank[0]):
        ranks = [r[index] for r in per_rank]
        if len({tuple(r["digests"]) for r in ranks}) != 1:
            raise AssertionError(f"{first['task']} {first['path']}: the ranks' parameters "
                                 f"differ")
        row = {"task": first["task"], "path": first["path"], "backend": first["backend"],
               "params": first["params"], "steps": steps, "digests": first["digests"],
               "wall_seconds": max(r["wall_seconds"] for r in ranks)}
        for key in ("step_seconds", "hook_seconds", "path_seconds", "bytes_sent"):
            if key in first:
                row[f"{key.removesuffix('_seconds')}_ms" if key != "bytes_sent" else
                    "bytes_sent_per_step_rank"] = \
                    (1e3 if key != "bytes_sent" else 1) * np.mean([r[key] for r in ranks]) / steps
        if "hardware" in first:
            hw = [r["hardware"] for r in ranks]
            row["packets_in_per_step_rank"] = np.mean([h["packets_in"] for h in hw]) / steps
            row["packets_out_per_step_rank"] = np.mean([h["packets_out"] for h in hw]) / steps
            row["bytes_in_per_step_rank"] = np.mean([h["bytes_in"] for h in hw]) / steps
            row["resends"] = int(sum(h["resends"] for h in hw))
            if "cycles" in hw[0]:
                # what the same exchanges take on the gateware at its clock
                row["cycles_per_step_rank"] = np.mean([h["cycles"] for h in hw]) / steps
                row["gateware_ms_at_125mhz"] = row["cycles_per_step_rank"] / 125e3
            row["startup_seconds"] = max(h["startup_seconds"] for h in hw)
        runs[first["task"], first["path"]] = row
    for (task, path), row in runs.items():
        family, backend = PATHS[path]
        base = runs.get((task, "fp32"))
        if base is not None:
            row["step_vs_fp32"] = row["step_ms"] / base["step_ms"]
        if family is not None and backend != "golden":
            golden = runs.get((task, f"{family}-golden"))
            if golden is not None:
                row["identical_to_golden"] = row["digests"] == golden["digests"]
                row["path_vs_golden"] = row["path_ms"] / golden["path_ms"]
                row["step_vs_golden"] = row["step_ms"] / golden["step_ms"]
                if not row["identical_to_golden"]:
                    step = next(i for i, (a, b) in enumerate(zip(row["digests"],
                                                                 golden["digests"])) if a != b)
                    raise AssertionError(f"{task} {path}: the parameters differ from the "
                                         f"golden path's after step {step + 1}")
    return list(runs.values())


def run(quick: bool = False, *, steps: int | None = None, tasks=None, paths=None) -> dict:
    from host.ddp import accuracy
    from host.board.process import BoardProcess
    from host.ddp import run_local_group

    tasks = tuple(tasks or (("digits",) if quick else accuracy.TASKS))
    if steps is None:
        steps = QUICK_STEPS if quick else BENCH_STEPS
    if steps < 1:
        raise ValueError(f"steps must be at least 1, not {steps}")
    paths = tuple(paths or PATHS)
    unknown = set(paths) - set(PATHS)
    if unknown:
        raise ValueError(f"unknown paths {sorted(unknown)}; choose from {list(PATHS)}")
    # every path runs with the baselines it is checked and timed against: fp32 and the
    # golden path of its family (a hardware path alone would go unchecked)
    wanted = {"fp32"} | set(paths) | {f"{PATHS[p][0]}-golden" for p in paths
                                      if PATHS[p][0] is not None}
    paths = tuple(p for p in PATHS if p in wanted)
    settings = accuracy.Settings(world_size=WORLD, tasks=tasks)
    datasets = accuracy.prepare_datasets(settings)
    started = time.perf_counter()
    with BoardProcess() as board:
        per_rank = run_local_group(_rank_main, WORLD, tasks, steps, paths, settings, datasets,
                                   board.address, board.key, timeout=7200)
    wall = time.perf_counter() - started
    rows = _summarise(per_rank, steps)
    print(f"DDP through the gateware: {WORLD} ranks, {steps} steps, k = {K}; per step, mean "
          f"of ranks; ratios against fp32 and against the same hook's golden path")
    print(f"  {'task':<7}{'path':<21}{'step ms':>9}{'x fp32':>7}{'hook ms':>9}{'hw ms':>9}"
          f"{'x gold':>7}{'pkts in':>9}{'kB in':>8}{'resend':>7}{'start s':>8}{'same':>6}")
    for r in rows:
        print(f"  {r['task']:<7}{r['path']:<21}{r['step_ms']:>9.1f}"
              f"{r.get('step_vs_fp32', float('nan')):>7.2f}"
              f"{r.get('hook_ms', float('nan')):>9.1f}{r.get('path_ms', float('nan')):>9.1f}"
              f"{r.get('path_vs_golden', float('nan')):>7.2f}"
              f"{r.get('packets_in_per_step_rank', 0):>9.1f}"
              f"{r.get('bytes_in_per_step_rank', 0) / 1e3:>8.1f}{r.get('resends', 0):>7}"
              f"{r.get('startup_seconds', 0):>8.2f}"
              f"{'yes' if r.get('identical_to_golden', True) else 'NO':>6}", flush=True)
    for r in rows:
        if "cycles_per_step_rank" in r:
            print(f"  {r['task']} {r['path']}: {r['cycles_per_step_rank']:,.0f} simulated clock "
                  f"cycles per step and rank (idle tails of the exchanges included), "
                  f"{r['gateware_ms_at_125mhz']:.3f} ms at 125 MHz against "
                  f"{r['path_ms']:.1f} ms of simulation")
    print(f"  wall time {wall:.0f} s (with process start-up and the board's)")
    for r in rows:
        r.pop("digests")
    return {"world_size": WORLD, "k": K, "steps": steps, "tasks": list(tasks),
            "wall_seconds": wall, "runs": rows}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m host.benchmarks.ddp_hardware",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--tasks", nargs="+", choices=("digits", "ncf"))
    parser.add_argument("--paths", nargs="+", choices=list(PATHS))
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    results = run(steps=args.steps, tasks=args.tasks, paths=args.paths)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2, default=float)
    return 0


if __name__ == "__main__":
    sys.exit(main())
