"""Train a small model sharded with FSDP2 through gradwire's reduce-scatters (host.fsdp).

Run it with torchrun, one process per rank::

    torchrun --nproc_per_node=2 examples/fsdp_train.py --codec inceptionn --k 10
    torchrun --nproc_per_node=2 examples/fsdp_train.py --codec inceptionn --error-feedback
    torchrun --nproc_per_node=4 examples/fsdp_train.py --codec lhc --dtype bfloat16
    torchrun --nproc_per_node=2 examples/fsdp_train.py --codec none      # FSDP2's own fp32
    # through a board (or a virtual one: gradwire board serve):
    torchrun --nproc_per_node=2 examples/fsdp_train.py --codec inceptionn --backend udp \\
        --board 127.0.0.1:9000

Every layer and the model are ``fully_shard`` ed; each FSDP2 module gets its own
``InceptionnReduceScatter`` or ``LhcReduceScatter`` (``host.fsdp.set_reduce_scatter``).
On GPUs (``--device cuda``, the default when CUDA is there) the job's group is NCCL and the
reduce-scatters carry their traffic on gloo groups of their own; on CPUs it is gloo. The
same script runs both, unchanged. ``--dtype bfloat16|float16`` trains with
``MixedPrecisionPolicy(param_dtype=..., reduce_dtype=...)``. Rank 0 prints the loss and, at
the end, the bytes the reduce-scatters sent against FSDP2's own fp32 reduce-scatter of
the same gradients, summed over the ranks.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

# Run from a checkout without installing it: the repository root is one folder up.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from host import fsdp  # noqa: E402
from host.ddp.launch import bytes_compared, start_example  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--codec", choices=("inceptionn", "lhc", "none"), default="inceptionn",
                        help="the reduce-scatter: INCEPTIONN's compressed ring, the lossless "
                             "sketch (LHC), or none (FSDP2's own fp32 reduce-scatter)")
    parser.add_argument("--k", type=int, default=10,
                        help="inceptionn: error bound exponent 1..15 (default 10)")
    parser.add_argument("--error-feedback", action="store_true",
                        help="inceptionn: keep what the codec drops for the next step")
    parser.add_argument("--backend", choices=("golden", "verilator", "udp"), default="golden")
    parser.add_argument("--board", default=None, help="udp: the board HOST[:PORT_BASE]")
    parser.add_argument("--key", default=None, help="udp: the board's control key (lhc)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=255,
                        help="hidden width (odd by default: FSDP2 pads the shards)")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="float32",
                        help="parameter and reduce dtype (MixedPrecisionPolicy)")
    parser.add_argument("--rendezvous-timeout", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if args.codec != "inceptionn" and (args.error_feedback or args.k != 10):
        parser.error("--k and --error-feedback are for --codec inceptionn")
    if args.backend != "golden" and args.codec == "none":
        parser.error("--backend is for a codec (--codec inceptionn or lhc)")
    if args.backend == "verilator" and args.codec == "lhc":
        parser.error("--codec lhc runs on --backend golden or udp (the board's switch)")
    return args


def make_reduce_scatter(args):
    """A factory of the reduce-scatter the arguments ask for (None: FSDP2's own)."""
    if args.codec == "none":
        return None
    options = {"backend": args.backend}
    if args.backend == "udp":
        options["board"] = args.board
        if args.key is not None:
            options["key"] = args.key
    if args.codec == "inceptionn":
        return lambda: fsdp.InceptionnReduceScatter(k=args.k,
                                                    error_feedback=args.error_feedback,
                                                    **options)
    return lambda: fsdp.LhcReduceScatter(**options)


def main(argv=None) -> int:
    args = parse_args(argv)
    device = start_example("fsdp_train.py", args.device, args.rendezvous_timeout)
    if isinstance(device, int):
        return device
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh(device.type, (world,))
    dtype = DTYPES[args.dtype]
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype) \
        if dtype != torch.float32 else MixedPrecisionPolicy()

    torch.manual_seed(args.seed)                           # the same model on every rank
    teacher = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(),
                                  torch.nn.Linear(64, 4))
    model = torch.nn.Sequential(torch.nn.Linear(32, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, 4)).to(device)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    factory = make_reduce_scatter(args)
    objects = fsdp.set_reduce_scatter(model, factory) if factory is not None else []
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    data = torch.Generator().manual_seed(args.seed * 1000 + rank + 1)  # each rank its own
    started = time.perf_counter()
    for step in range(args.steps):
        x = torch.randn(args.batch_size, 32, generator=data)
        with torch.no_grad():
            y = teacher(x)
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
        loss.backward()
        optimizer.step()
        if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {loss.item():.5f}", flush=True)
    seconds = time.perf_counter() - started

    sent = sum(o.bytes_sent for o in objects)
    dense = sum(o.dense_bytes for o in objects)
    totals = torch.tensor([sent, dense], dtype=torch.float64, device=device)
    dist.all_reduce(totals)
    if rank == 0:
        what = "FSDP2's own fp32 reduce-scatter" if not objects else repr(objects[0])
        print(f"{world} ranks, {args.steps} steps in {seconds:.2f} s, {what} on "
              f"{device.type}, {args.dtype}")
        if objects:
            sent, dense = (int(v) for v in totals.tolist())
            print(f"bytes sent by the reduce-scatters: {sent} (all ranks); FSDP2's fp32 "
                  f"reduce-scatter: {dense}; saved: {dense - sent} ({bytes_compared(sent, dense)})")
    for o in objects:
        o.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
