"""``gradwire sim``: the end-to-end system simulation (see ``sim/e2e.py``)."""
from __future__ import annotations

import importlib
import os
import sys

from ..cli import CliError
from ..driver.transport import TransportError
from ..wire_ring import RingStalled
from ..wire_ring.reliable import DeliveryError

#: The simulation package runs the scenario; it is imported by name when the command runs
#: (``sim`` imports ``host``, never the other way round).
E2E_MODULE = "sim.e2e"
#: The paths of the simulation (``sim.e2e.PATHS``; the CLI names them without importing it).
PATHS = ("inceptionn", "lhc", "wire")


def add_arguments(p):
    p.add_argument("--workers", type=int, help="number of workers (2..32, default 4)")
    p.add_argument("-k", type=int, default=10, help="INCEPTIONN error bound 2^-k (1..15, default 10)")
    p.add_argument("--steps", type=int, default=3, help="training steps per path (default 3)")
    p.add_argument("--seed", type=int, default=0, help="seed of data and weights (default 0)")
    p.add_argument("--backend", choices=("golden", "verilator", "cocotb", "udp"),
                   default="verilator",
                   help="engines: the golden models; the Verilated gateware checked packet by "
                        "packet against them, through the compiled harness (verilator, the "
                        "default) or the cocotb bridge (cocotb: slow, same cycles, for "
                        "debugging); or a virtual board over UDP sockets on 127.0.0.1 (udp, "
                        "golden backend), checked the same way")
    p.add_argument("--fault-rate", type=float, default=0.0,
                   help="udp: probability of loss, duplication and delay of each datagram on "
                        "the virtual board's wire (default 0)")
    p.add_argument("--fault-seed", type=int, default=0, help="udp: seed of the wire faults")
    p.add_argument("--board-backend", choices=("golden", "verilator"), default="golden",
                   help="udp: what the virtual board runs: the golden board (default) or the "
                        "Verilated network top (LiteEth, front end and engines behind a C++ "
                        "RGMII PHY; slow)")
    p.add_argument("--mtu", type=int, default=None,
                   help="udp: IP MTU of the path to the board (default 1500; 9000: jumbo)")
    p.add_argument("--path", dest="paths", action="append", choices=PATHS,
                   help="run only this path (repeatable; default all three: the INCEPTIONN "
                        "ring through the NIC engines, the in-network LHC, the ring through "
                        "NICs in the wire)")
    p.add_argument("--wire-steps", type=int, default=1,
                   help="wire path: training steps (default 1)")
    p.add_argument("--wire-fault-rate", type=float, default=0.01,
                   help="wire path: probability of loss, duplication and reordering of each "
                        "frame on a network link (default 0.01; 0: none)")
    p.add_argument("--wire-fault-seed", type=int, default=0,
                   help="wire path: seed of the network faults (default 0)")
    p.add_argument("--boards", type=int, default=1,
                   help="in-network LHC path: stripe every job over this many boards (1..8, "
                        "default 1), one switch gateware instance each (verilator, cocotb: "
                        "a harness process per board; udp: a virtual board per board), "
                        "chunk c of every phase on board c mod N (docs/protocol/network.md "
                        "section 3); the report says what each board carried")
    p.add_argument("--tree", metavar="LxW",
                   help="run a tree of aggregators instead of the paths: L leaf boards of W "
                        "workers each (1..32 each, up to 32x32 = 1024 workers) and a root "
                        "board (docs/protocol/aggregator-protocol.md section 4), the NCF "
                        "model's gradients through it, each step bit-exact against the flat "
                        "golden all-reduce over every worker; --backend golden (golden "
                        "boards; the gateware's come later); the report counts datagrams and "
                        "resends per level")
    p.add_argument("--tree-fault-rate", type=float, default=0.01,
                   help="tree: probability of loss, duplication and reordering of each "
                        "datagram on both levels (default 0.01; 0: none)")
    p.add_argument("--tree-fault-seed", type=int, default=0,
                   help="tree: seed of the network faults (default 0)")
    p.add_argument("--lhc-path", choices=("auto", "sketch", "dense"), default="auto",
                   help="how each tensor of the in-network path travels: the cheaper of the "
                        "sketch and a dense int32 all-reduce, chosen after the index phase "
                        "(auto, the default), or always one of them")
    p.add_argument("--size", choices=("default", "large", "small"),
                   help="model sizes: default 1.3M parameters over both paths, large 11.5M, "
                        "small a quick smoke run (the default with --tree: every worker of "
                        "the tree is a packet-level host)")
    p.add_argument("--out", default="build/e2e", help="report folder (default build/e2e)")
    p.add_argument("--waves", action="store_true",
                   help="record waveforms of the gateware (also WAVES=1)")
    p.add_argument("--board", default="ecpix5",
                   help="board whose `make bitstream` clock the throughput uses")


def run(args):
    from tqdm import tqdm

    e2e = importlib.import_module(E2E_MODULE)
    waves = args.waves or os.environ.get("WAVES", "0") not in ("", "0")
    bars = {}

    def progress(path, done, total):
        bar = bars.get(path)
        if bar is None:
            bar = bars[path] = tqdm(total=total, desc=f"{path:<10}", unit="step",
                                    file=sys.stderr, leave=True)
        bar.n = done
        bar.refresh()

    backend_options = {}
    if args.backend == "udp":
        backend_options = {"fault_rate": args.fault_rate, "fault_seed": args.fault_seed}
        if args.board_backend != "golden":
            backend_options["board_backend"] = args.board_backend
        if args.mtu is not None:
            backend_options["mtu"] = args.mtu
    elif args.fault_rate or args.mtu is not None or args.board_backend != "golden":
        raise CliError("--fault-rate, --mtu and --board-backend apply to --backend udp")
    tree = {}
    if args.tree is not None:
        given = [option for option, value in (("--workers", args.workers),
                                              ("--path", args.paths),
                                              ("--boards", args.boards != 1 or None))
                 if value]
        if given:
            raise CliError(f"--tree runs the tree alone, its workers its leaves': drop "
                           f"{', '.join(given)}")
        tree = {"tree": args.tree, "tree_fault_rate": args.tree_fault_rate,
                "tree_fault_seed": args.tree_fault_seed}
    size = args.size or ("small" if args.tree is not None else "default")
    try:
        report = e2e.run(workers=args.workers or 4, k=args.k, steps=args.steps, seed=args.seed,
                         backend=args.backend, paths=tuple(args.paths or PATHS),
                         out_dir=args.out, waves=waves, progress=progress, board=args.board,
                         size=size, backend_options=backend_options,
                         lhc_path=args.lhc_path, wire_steps=args.wire_steps,
                         wire_fault_rate=args.wire_fault_rate,
                         wire_fault_seed=args.wire_fault_seed,
                         **({"boards": args.boards} if args.boards != 1 else {}), **tree)
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    except (TransportError, DeliveryError, RingStalled) as exc:
        # a board that went away, a mismatch; the wire path's ring that could not finish
        raise CliError(f"{type(exc).__name__}: {exc}") from exc
    finally:
        for bar in bars.values():
            bar.close()
    print(e2e.format_report(report))
    print(f"\nreport written to {', '.join(report['files'])}")
    return 0 if report["ok"] else 1
