"""Train a small model with PyTorch DDP through gradwire's gradient-compression hooks.

Run it with torchrun, one process per rank::

    torchrun --nproc_per_node=2 examples/ddp_train.py --codec inceptionn --k 10 --error-feedback
    torchrun --nproc_per_node=4 examples/ddp_train.py --codec lhc
    # through a board (or a virtual one: gradwire board serve):
    torchrun --nproc_per_node=2 examples/ddp_train.py --codec inceptionn --backend udp \\
        --board 127.0.0.1:9000
    torchrun --nproc_per_node=2 examples/ddp_train.py --codec lhc --backend udp \\
        --board 127.0.0.1:9000 --key 0x1234

On GPUs (``--device cuda``, the default when CUDA is there) the job's default group is NCCL
(``init_process_group("nccl")``) and the hooks carry their own traffic on a gloo group they
create; on CPUs it is gloo. Every rank trains the same MLP on its own synthetic batches (a
fixed random teacher network to regress), and rank 0 prints the loss and, at the end, the
bytes the hook sent against a plain fp32 ring all-reduce of the same buckets, summed over
the ranks.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

# Run from a checkout without installing it: the repository root is one folder up.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from host import ddp  # noqa: E402
from host.ddp.launch import bytes_compared, start_example  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--codec", choices=("inceptionn", "lhc", "none"), default="inceptionn",
                        help="the hook: INCEPTIONN's compressed ring, the lossless sketch "
                             "(LHC), or none (DDP's own all-reduce, for comparison)")
    parser.add_argument("--k", type=int, default=10,
                        help="inceptionn: error bound exponent 1..15 (default 10)")
    parser.add_argument("--error-feedback", action="store_true",
                        help="inceptionn: keep what the codec drops for the next step")
    parser.add_argument("--backend", choices=("golden", "verilator", "udp"), default="golden",
                        help="who computes: the golden models, each rank's Verilated NIC "
                             "(inceptionn), or a board over UDP (--board)")
    parser.add_argument("--board", default=None,
                        help="udp: the board HOST[:PORT_BASE] (default: GRADWIRE_BOARD)")
    parser.add_argument("--key", default=None,
                        help="udp: the board's control key (lhc needs it; default: "
                             "GRADWIRE_KEY)")
    parser.add_argument("--steps", type=int, default=50, help="training steps (default 50)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256, help="hidden width of the MLP")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="float32",
                        help="the model's (and so the gradient buckets') dtype")
    parser.add_argument("--sync", action="store_true",
                        help="run the hook's exchange inside the call (asynchronous=False)")
    parser.add_argument("--uneven", action="store_true",
                        help="rank r runs r fewer steps than rank 0 (at least 1), under "
                             "DDP's join(): the hook serves the ranks that ran out")
    parser.add_argument("--rendezvous-timeout", type=float, default=60.0,
                        help="seconds to reach the rendezvous (MASTER_ADDR:MASTER_PORT) "
                             "before failing (default 60)")
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


def make_hook(args):
    """The hook the arguments ask for (None: DDP's own all-reduce)."""
    if args.codec == "none":
        return None
    options = {"backend": args.backend, "asynchronous": not args.sync}
    if args.backend == "udp":
        options["board"] = args.board
        if args.key is not None:
            options["key"] = args.key
    if args.codec == "inceptionn":
        return ddp.InceptionnHook(k=args.k, error_feedback=args.error_feedback, **options)
    return ddp.LhcHook(**options)


def main(argv=None) -> int:
    args = parse_args(argv)
    device = start_example("ddp_train.py", args.device, args.rendezvous_timeout)
    if isinstance(device, int):
        return device
    rank, world = dist.get_rank(), dist.get_world_size()
    dtype = DTYPES[args.dtype]

    torch.manual_seed(args.seed)                           # the same model on every rank
    teacher = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(),
                                  torch.nn.Linear(64, 4))
    model = torch.nn.Sequential(torch.nn.Linear(32, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, 4)).to(device=device, dtype=dtype)
    ddp_model = DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None)
    hook = make_hook(args)
    if hook is not None:
        ddp_model.register_comm_hook(state=None, hook=hook)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=args.lr, momentum=0.9)

    data = torch.Generator().manual_seed(args.seed * 1000 + rank + 1)  # each rank its own
    # --uneven: rank r runs r fewer steps; join() lets the others finish theirs.
    steps = max(1, args.steps - rank) if args.uneven else args.steps
    started = time.perf_counter()
    with ddp_model.join(enable=args.uneven):
        for step in range(steps):
            x = torch.randn(args.batch_size, 32, generator=data)
            with torch.no_grad():
                y = teacher(x)
            x, y = x.to(device=device, dtype=dtype), y.to(device=device, dtype=dtype)
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp_model(x), y)
            loss.backward()
            optimizer.step()
            if rank == 0 and (step % 10 == 0 or step == steps - 1):
                print(f"step {step:4d}  loss {loss.item():.5f}", flush=True)
    seconds = time.perf_counter() - started

    # Bytes on the wire, summed over the ranks (a tensor on the model's device: the
    # default group may be NCCL).
    sent, dense = (hook.bytes_sent, hook.dense_ring_bytes) if hook is not None else (0, 0)
    totals = torch.tensor([sent, dense], dtype=torch.float64, device=device)
    dist.all_reduce(totals)
    if rank == 0:
        print(f"{world} ranks, {args.steps} steps in {seconds:.2f} s, {args.codec}"
              f"{'' if hook is None else f' ({hook!r})'} on {device.type}, {args.dtype}")
        if hook is not None:
            sent, dense = (int(v) for v in totals.tolist())
            print(f"bytes sent by the hook: {sent} (all ranks); a dense fp32 ring "
                  f"all-reduce: {dense}; saved: {dense - sent} ({bytes_compared(sent, dense)})")
    if hook is not None:
        hook.close()
    # No rank tears the group down while a peer may still use it. DDP's reducer sits in
    # reference cycles and holds the group: freed only at interpreter exit, gloo's threads
    # can be destroyed there while joinable, and the rank aborts (SIGABRT) after its work.
    dist.barrier()
    del ddp_model, optimizer
    gc.collect()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
