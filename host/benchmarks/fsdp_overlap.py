"""FSDP2's step with gradwire's reduce-scatters against the backward pass alone.

Two gloo processes on 127.0.0.1 train one MLP (:data:`LAYERS` layers of :data:`WIDTH`,
``fully_shard`` on every layer and on the model: one reduce-scatter per layer) from the
same weights on the same batches, in one run:

- ``backward alone``: the model without FSDP2 (forward, backward, optimizer step): the
  baseline of every ratio;
- ``fsdp fp32``: FSDP2's own fp32 reduce-scatter (gloo);
- ``fsdp inceptionn-golden`` / ``fsdp lhc-golden``: :class:`host.fsdp.InceptionnReduceScatter`
  (k = 10) and :class:`host.fsdp.LhcReduceScatter` on the golden backend;
- ``fsdp inceptionn-udp``: the INCEPTIONN reduce-scatter through a virtual board's NIC
  whose wire delays every datagram by up to :data:`WIRE_DELAY` seconds.

Reported per mode: the median step time (slowest rank), its ratio to backward alone, the
exposed communication (step minus backward alone), the reduce-scatters' calls per step,
the part of them in the codec (``path_seconds``) and bytes per step against FSDP2's fp32
reduce-scatter. torch 2.13's FSDP2 calls a custom reduce-scatter with ``async_op=False``
and reads its output at once, so every call ends inside the backward pass: the figures say
what the exchange costs there (see ``docs/training.md``).

``python -m host.benchmarks.fsdp_overlap`` runs it alone; ``make bench`` runs it through
``host.bench`` (section ``fsdp_overlap``).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from host.benchmarks.ddp_overlap import timed_steps

__all__ = ["run", "MODES"]

WORLD = 2
LAYERS = 8
WIDTH = 32
BATCH = 32768
WIRE_DELAY = 0.002
MTU = 9000
STEPS = 12
QUICK_STEPS = 4
WARMUP = 2
MODES = ("backward alone", "fsdp fp32", "fsdp inceptionn-golden", "fsdp lhc-golden",
         "fsdp inceptionn-udp")


def _model():
    import torch

    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers)


def _factory(mode, board):
    from host import fsdp

    if mode == "fsdp inceptionn-golden":
        return lambda: fsdp.InceptionnReduceScatter(k=10)
    if mode == "fsdp lhc-golden":
        return lambda: fsdp.LhcReduceScatter()
    if mode == "fsdp inceptionn-udp":
        return lambda: fsdp.InceptionnReduceScatter(k=10, backend="udp",
                                                    board=f"{board[0]}:{board[1]}", mtu=MTU)
    return None


def _steps(rank, world, mesh, mode, steps, batch, board):
    import torch
    from torch.distributed.fsdp import fully_shard

    from host import fsdp

    net = _model()
    objects = []
    if mode != "backward alone":
        for layer in net:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(net, mesh=mesh)
        factory = _factory(mode, board)
        if factory is not None:
            objects = fsdp.set_reduce_scatter(net, factory)
    seconds = timed_steps(net, rank, steps, batch)
    stats = None
    if objects:
        calls = [c for o in objects for c in o.calls]
        timed = calls[len(calls) * WARMUP // (WARMUP + steps):]
        stats = {"calls_per_step": len(calls) / (WARMUP + steps),
                 "call_ms_per_step": 1e3 * sum(c.seconds for c in timed) / steps,
                 "codec_ms_per_step": 1e3 * sum(c.path_seconds for c in timed) / steps,
                 "bytes_per_step": sum(o.bytes_sent for o in objects) / (WARMUP + steps),
                 "fp32_reduce_scatter_bytes_per_step":
                     sum(o.dense_bytes for o in objects) / (WARMUP + steps)}
        for o in objects:
            o.close()
    return seconds, stats


def _rank_main(rank, world, steps, batch, board):
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (world,))
    out = {mode: {"seconds": [], "stats": None} for mode in MODES}
    for _ in range(2):                      # twice through every mode, alternating
        for mode in MODES:
            seconds, stats = _steps(rank, world, mesh, mode, steps, batch, board)
            out[mode]["seconds"] += seconds
            out[mode]["stats"] = stats
    return out


def run(quick: bool = False, *, steps: int | None = None, wire_delay: float = WIRE_DELAY,
        batch: int = BATCH) -> dict:
    from host.board import VirtualBoard
    from host.board.wire import WireFaults
    from host.ddp import run_local_group

    steps = (QUICK_STEPS if quick else STEPS) if steps is None else steps
    faults = WireFaults(0.0, reorder=0.999, max_delay=wire_delay, seed=49)
    started = time.perf_counter()
    with VirtualBoard("golden", port_base=None, faults=faults) as board:
        per_rank = run_local_group(_rank_main, WORLD, steps, batch, board.address,
                                   timeout=1800)
    wall = time.perf_counter() - started
    rows = {}
    for mode in MODES:
        seconds = np.max([r[mode]["seconds"] for r in per_rank], axis=0)
        rows[mode] = {"step_ms": 1e3 * float(np.median(seconds)),
                      "stats": per_rank[0][mode]["stats"]}
    base = rows["backward alone"]["step_ms"]
    for row in rows.values():
        row["vs_backward_alone"] = row["step_ms"] / base
        row["exposed_ms"] = row["step_ms"] - base
    print(f"FSDP2 reduce-scatter: {WORLD} ranks, MLP {LAYERS} x {WIDTH} (fully_shard per "
          f"layer), batch {batch}; median of {2 * steps} steps (slowest rank); udp: a "
          f"virtual board with up to {wire_delay * 1e3:g} ms of wire delay per datagram")
    print(f"  {'mode':<24}{'step ms':>9}{'x backward':>11}{'exposed ms':>11}{'calls ms':>10}"
          f"{'codec ms':>10}{'B/step':>9}{'vs fp32 RS':>11}")
    for mode, row in rows.items():
        s = row["stats"]
        extra = ""
        if s:
            ratio = s["fp32_reduce_scatter_bytes_per_step"] / s["bytes_per_step"] \
                if s["bytes_per_step"] else float("inf")
            extra = (f"{s['call_ms_per_step']:>10.1f}{s['codec_ms_per_step']:>10.1f}"
                     f"{s['bytes_per_step']:>9.0f}{ratio:>10.2f}x")
        print(f"  {mode:<24}{row['step_ms']:>9.1f}{row['vs_backward_alone']:>11.2f}"
              f"{row['exposed_ms']:>11.1f}{extra}")
    print("  (calls/codec: ms per step in the reduce-scatter calls and in their codec, rank 0; "
          "vs fp32 RS: FSDP2's fp32 reduce-scatter bytes / bytes sent)")
    print(f"  wall time {wall:.0f} s")
    return {"world_size": WORLD, "layers": LAYERS, "width": WIDTH, "batch": batch,
            "wire_delay_s": wire_delay, "steps": 2 * steps, "modes": rows,
            "wall_seconds": wall}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m host.benchmarks.fsdp_overlap",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    results = run(steps=args.steps, batch=args.batch)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2, default=float)
    return 0


if __name__ == "__main__":
    sys.exit(main())
