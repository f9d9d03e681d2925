"""The whole system, end to end: what ``make sim`` and ``gradwire sim`` run.

N workers train two NumPy models (``sim.workloads``; 1.3M parameters in total by
default, 11.5M with ``size="large"``) on data they generate. After every training step
their gradients are all-reduced over three network paths:

1. **INCEPTIONN ring** (dense MLP): reduce-scatter then all-gather, every hop through the
   NIC transmit (compressor) and receive (decompressor) gateware.
2. **In-network LHC** (sparse NCF-like recommender): index phase (OR), then per tensor
   either the sketch phase (ADD) and the fallback round, decoded on the hosts, or a dense
   int32 round, whichever sends fewer bytes (``lhc_path="auto"``, the default; see
   ``host.golden.lhc.choose_path``), through the switch aggregator gateware. Each of the
   model's tensors is its own job, all of them on the switch at once.

3. **The ring through NICs in the wire** (the same dense MLP, ``wire_steps`` steps): every
   worker is a host behind its own two-port wire board (``host.board.wire_golden``, the
   golden model), the boards' network ports joined by a learning switch; the hosts send
   the ring's chunks as plain gradient datagrams and recover losses themselves
   (``host.wire_ring``), with seeded loss, duplication and reordering on the network links
   (``wire_fault_rate``). Its result is checked bit for bit against the golden ring
   (``host.golden.ring``), and it reports the bytes on the host links (raw) and on the
   network links (compressed). It runs the golden models whatever ``backend`` says.

2 to 32 workers (``workers``): the ring has N hops per phase and its result is checked
against the exact per-element bound (``host.golden.ring.ring_sum_error_bound``: N 2^-k plus the
float32 rounding of the partial sums); the switch's worker bitmaps are 32 bits wide.

With ``backend="udp"`` every packet crosses real UDP sockets on 127.0.0.1 to a virtual
board (``host.board``, golden backend) through ``host.driver.udp.UdpTransport``, optionally
with faults on the board's wire (``backend_options={"fault_rate": ...}``); the report then
counts the resends. With ``backend="verilator"`` (the compiled harness, ``sim/harness``) or
``"cocotb"`` (the cocotb bridge, same cycles) every packet that leaves a gateware block is
compared byte for
byte with the reference model's packet as the system runs (``LockstepTransport``), and the
counters read back over the control port must match too; any difference stops the run.
The report (JSON and a readable table) has bytes on the wire against dense fp32,
compression ratios, the INCEPTIONN error against its bound, the LHC exactness, peeling
statistics, clock cycles and beats per clock of each engine, and the throughput those
cycles give at the clock of the latest ``make bitstream`` (or the 125 MHz target, said which).
"""
from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path

import numpy as np

from contract.header import BEAT_BYTES

__all__ = ["run", "format_report", "clock_mhz", "PATHS", "TREE_BOARDS", "parse_tree"]

REPO = Path(__file__).resolve().parents[1]


def clock_mhz(board="ecpix5"):
    """``(MHz, source)``: the engine clock of the latest ``make bitstream`` of the board (the
    clock it was built for, which it meets), else the board's default engine clock."""
    summary = REPO / "build" / "bitstream" / board / "summary.json"
    try:
        data = json.loads(summary.read_text())
        if data["timing_met"]:
            return float(data["engine_clock_mhz"]["pll_output"]), \
                f"engine clock of the latest `make bitstream` ({summary.relative_to(REPO)})"
    except (OSError, KeyError, ValueError, TypeError):
        pass
    from hdl.board.boards import load_boards
    return load_boards()[board].engine_clock_mhz("network"), \
        "the board's default engine clock (no `make bitstream` that met timing found)"


def _engine_report(stats, mhz):
    """Beats per clock and throughput of one engine stream from transport stats."""
    d = stats.as_dict()
    if stats.busy_cycles:
        for side in ("in", "out"):
            beats = getattr(stats, f"{side}_beats")
            d[f"throughput_{side}_gbps"] = beats * BEAT_BYTES * 8 / stats.busy_cycles * mhz / 1e3
    return d


def _network(transport):
    """What a network transport's traffic cost (datagrams, resends, ...), else None."""
    stats = getattr(getattr(transport, "device", transport), "network_stats", None)
    return stats() if stats else None


def _with_transport_facts(report, transport):
    """``report`` with what the transport knows of itself: its comparison with the golden
    model (a checking transport), its build (compiled harness), its network traffic."""
    if hasattr(transport, "compared"):
        report["compared_with_golden"] = dict(transport.compared)
    for name, facts in (("build", _build_info(transport)), ("network", _network(transport))):
        if facts:
            report[name] = facts
    return report


def _bits_equal(a, b):
    return np.array_equal(np.asarray(a, np.float32).view(np.uint32),
                          np.asarray(b, np.float32).view(np.uint32))


#: model sizes: the default scenario (1.31M parameters over both paths), a large one
#: (11.5M) and a small one for the test suite
SIZES = {
    "default": {"mlp": dict(inputs=512, hidden=1000),
                "ncf": dict(users=8192, items=4096, dim=64, batch=128)},
    "large": {"mlp": dict(inputs=2048, hidden=2500),
              "ncf": dict(users=65536, items=32768, dim=64, batch=512)},
    "small": {"mlp": dict(inputs=16, hidden=32), "ncf": dict(users=128, items=64, dim=8)},
}


def _build_info(transport):
    """How the gateware model behind ``transport`` was built (compiled harness only)."""
    build = getattr(getattr(transport, "device", transport), "build", None)
    return build.as_dict() if build is not None else None


def run_inceptionn(*, workers, k, steps, seed, backend, waves, progress, size="default",
                   backend_options=None):
    from host.driver.nic import NicInterface, open_nic
    from host.golden.ring import ring_allreduce, ring_error_bound, ring_sum_error_bound
    from sim.workloads import DenseMLP

    model = DenseMLP(seed=seed, **SIZES[size]["mlp"])
    transport = open_nic(backend, check=True, waves=waves, **(backend_options or {}))
    try:
        nic = NicInterface(transport)
        totals = {"wire_bytes": 0, "raw_bytes": 0, "packets": 0, "class_counts": [0] * 4}
        steps_out = []
        loss_before = np.mean([model.loss(w, 10_000) for w in range(workers)])
        for step in range(steps):
            grads = [model.gradient(w, step) for w in range(workers)]
            hops = 2 * (workers - 1)
            results, stats = ring_allreduce(
                grads, nic, k, progress=progress and (
                    lambda done, step=step: progress("inceptionn", step * hops + done // workers,
                                                     steps * hops)))
            identical = all(_bits_equal(r, results[0]) for r in results)
            exact = np.sum(np.array(grads, dtype=np.float64), axis=0)
            error = np.abs(results[0].astype(np.float64) - exact)
            # The exact bound per element: N 2^-k plus the float32 rounding of the sums.
            bound = ring_sum_error_bound(grads, k)
            steps_out.append({"step": step, "max_error": float(error.max()),
                              "bound": ring_error_bound(workers, k),
                              "max_error_over_bound": float(np.max(error / bound)),
                              "within_bound": bool(np.all(error < bound)),
                              "identical": identical})
            for key in ("wire_bytes", "raw_bytes", "packets"):
                totals[key] += getattr(stats, key)
            totals["class_counts"] = [a + b for a, b in zip(totals["class_counts"],
                                                            stats.class_counts)]
            model.apply(results[0] / np.float32(workers), lr=0.5)
        loss_after = np.mean([model.loss(w, 10_000) for w in range(workers)])
        counters = nic.counters()
        report = {
            "model": f"DenseMLP ({model.params.size} parameters)",
            "workers": workers, "k": k, "steps": steps, "per_step": steps_out,
            "bit_identical_on_all_workers": all(s["identical"] for s in steps_out),
            "within_error_bound": all(s["within_bound"] for s in steps_out),
            "max_error": max(s["max_error"] for s in steps_out),
            "error_bound": ring_error_bound(workers, k),
            "max_error_over_bound": max(s["max_error_over_bound"] for s in steps_out),
            "wire_bytes": totals["wire_bytes"], "dense_fp32_bytes": totals["raw_bytes"],
            "compression_ratio": totals["raw_bytes"] / max(totals["wire_bytes"], 1),
            "packets": totals["packets"],
            "class_histogram": dict(zip(("00", "01", "10", "11"), totals["class_counts"])),
            "loss_before": float(loss_before), "loss_after": float(loss_after),
            "counters": counters,
        }
        return _with_transport_facts(report, transport), transport.stats
    finally:
        transport.close()


#: Largest extra delay (reordering) of a frame on the wire path's network links, seconds:
#: below the hosts' first resend timeout (1 ms), as on a real network.
WIRE_MAX_DELAY = 2e-4

#: Jobs the switch of ``open_switch`` serves at once (its ``jobs`` parameter).
SWITCH_JOBS = 4
#: Per-tensor statistics summed over tensors into each step's entry.
_SUMMED = ("union_nnz", "peeled", "unpeeled", "packets_sent", "resends", "results_unicast")


def _allreduce_tensors(switch, grads, layout, path):
    """All-reduce every tensor of ``layout`` as its own job, up to SWITCH_JOBS at once;
    returns the flat result and ``{name: stats}``."""
    result = np.empty_like(grads[0])
    per_tensor = {}
    names = list(layout)
    for first in range(0, len(names), SWITCH_JOBS):
        group = names[first:first + SWITCH_JOBS]
        runs = switch.allreduce_jobs([[g[slice(*layout[name])] for g in grads]
                                      for name in group], path=path)
        for name, (part, stats) in zip(group, runs):
            result[slice(*layout[name])] = part
            per_tensor[name] = stats
    return result, per_tensor


def _train_lhc(switch, model, workers, steps, lhc_path, progress) -> dict:
    """The NCF model's training through ``switch`` (one board's or several boards'
    interface), every step's all-reduce checked bit for bit against the golden one: the
    report's model, steps, totals and losses."""
    from host.golden import lhc

    layout = model.layout()
    steps_out = []
    totals = {}
    loss_before = np.mean([model.loss(w, 10_000) for w in range(workers)])
    for step in range(steps):
        grads = [model.gradient(w, step) for w in range(workers)]
        result, per_tensor = _allreduce_tensors(switch, grads, layout, lhc_path)
        want = np.concatenate([lhc.allreduce([g[slice(*layout[name])] for g in grads],
                                             path=lhc_path)[0] for name in layout])
        tensors = {name: {k: v for k, v in stats.items() if np.isscalar(v) or v is None}
                   for name, stats in per_tensor.items()}
        steps_out.append({"step": step, "exact": _bits_equal(result, want),
                          "density": float(np.mean(np.any(np.array(grads) != 0, axis=0))),
                          "tensors": tensors,
                          **{k: sum(t[k] or 0 for t in tensors.values()) for k in _SUMMED}})
        for stats in per_tensor.values():
            for key, value in stats.items():
                if key.endswith("bytes") and np.isscalar(value):
                    totals[key] = totals.get(key, 0) + int(value)
        model.apply(result / np.float32(workers), lr=5.0)
        if progress:
            progress("lhc", step + 1, steps)
    loss_after = np.mean([model.loss(w, 10_000) for w in range(workers)])
    return {
        "model": f"NcfModel ({model.params.size} parameters)",
        "workers": workers, "steps": steps, "path": lhc_path,
        "tensors": {name: b - a for name, (a, b) in layout.items()},
        "per_step": steps_out,
        "exact": all(s["exact"] for s in steps_out),
        "totals": totals,
        "loss_before": float(loss_before), "loss_after": float(loss_after),
    }


def run_lhc(*, workers, steps, seed, backend, waves, progress, size="default",
            backend_options=None, lhc_path="auto", boards=1):
    from host.driver.switch import SwitchInterface, open_switch
    from sim.workloads import NcfModel

    if boards > 1:
        return _run_lhc_boards(workers=workers, steps=steps, seed=seed, backend=backend,
                               waves=waves, progress=progress, size=size,
                               backend_options=backend_options, lhc_path=lhc_path,
                               boards=boards)
    model = NcfModel(seed=seed, **SIZES[size]["ncf"])
    transport = open_switch(backend, check=True, waves=waves, **(backend_options or {}))
    try:
        switch = SwitchInterface(transport)
        report = _train_lhc(switch, model, workers, steps, lhc_path, progress)
        report["counters"] = switch.counters()
        return _with_transport_facts(report, transport), transport.stats
    finally:
        transport.close()


def _run_lhc_boards(*, workers, steps, seed, backend, waves, progress, size, backend_options,
                    lhc_path, boards):
    """:func:`run_lhc` with every job striped over ``boards`` switches
    (``docs/protocol/network.md`` section 3): one gateware instance per board (a harness
    process each with the compiled harness, a virtual board each over UDP), chunk ``c`` of
    every phase on board ``c mod boards``; the report says what each board carried."""
    from host.driver.settings import ENV_BOARD
    from host.driver.striped import StripedSwitchInterface
    from host.driver.switch import SwitchInterface, open_switch
    from sim.workloads import NcfModel

    if backend == "udp" and ((backend_options or {}).get("board") or os.environ.get(ENV_BOARD)):
        raise ValueError(f"boards={boards} starts {boards} virtual boards; a board given by "
                         f"address ({ENV_BOARD}) is one board: unset it")
    model = NcfModel(seed=seed, **SIZES[size]["ncf"])
    transports = []
    try:
        for _ in range(boards):
            transports.append(open_switch(backend, check=True, waves=waves,
                                          **(backend_options or {})))
        switch = StripedSwitchInterface([SwitchInterface(t) for t in transports])
        report = _train_lhc(switch, model, workers, steps, lhc_path, progress)
        counters = switch.board_counters()
        all_bytes = sum(sent["bytes"] for sent in switch.sent) or 1
        per_board = []
        for b, (transport, sent, board_counters) in enumerate(zip(transports, switch.sent,
                                                                  counters)):
            entry = {"board": b, "packets_in": sent["packets"], "resends": sent["resends"],
                     "bytes_in": sent["bytes"], "share": sent["bytes"] / all_bytes,
                     "counters": board_counters}
            per_board.append(_with_transport_facts(entry, transport))
        report.update(boards=boards, counters=switch.counters(), per_board=per_board)
        compared = [entry.get("compared_with_golden") for entry in per_board]
        if all(compared):
            report["compared_with_golden"] = {key: sum(c[key] for c in compared)
                                              for key in compared[0]}
        build = _build_info(transports[0])
        if build:
            report["build"] = build
        stats = {}
        for b, transport in enumerate(transports):
            for name, s in transport.stats.items():
                stats[f"{b}_{name}"] = s
        return report, stats
    finally:
        for transport in transports:
            transport.close()


def run_wire(*, workers, k, steps, seed, progress, size="default", fault_rate=0.0,
             fault_seed=0):
    """The ring through NICs in the wire (``host.wire_ring``) on the dense MLP's gradients,
    each step's result compared bit for bit with the golden ring's."""
    from host.board.link_faults import WireFaults
    from host.wire_ring.network import bits_equal, golden_ring, ring_over_wire
    from sim.workloads import DenseMLP

    model = DenseMLP(seed=seed, **SIZES[size]["mlp"])
    steps_out = []
    totals = {}
    faults = WireFaults(fault_rate, seed=fault_seed, max_delay=WIRE_MAX_DELAY) \
        if fault_rate else None
    for step in range(steps):
        grads = [model.gradient(w, step) for w in range(workers)]
        results, stats = ring_over_wire(grads, k, faults=faults)
        golden = golden_ring(grads, k)
        exact = all(bits_equal(r, g) for r, g in zip(results, golden))
        d = stats.as_dict()
        steps_out.append({"step": step, "bit_exact": exact, "host_bytes": d["host_bytes"],
                          "network_bytes": d["network_bytes"],
                          "simulated_seconds": d["simulated_seconds"]})
        for side in ("host_link", "network_link"):
            for what in ("bytes", "frames"):
                for kind, n in d[side][what].items():
                    key = f"{side}_{what}_{kind}"
                    totals[key] = totals.get(key, 0) + n
        for name, n in stats.hosts.items():
            totals[name] = totals.get(name, 0) + n
        for port in (0, 1):
            for name in ("compressed", "incompressible", "decompressed", "passed"):
                key = f"board_port{port}_{name}"
                totals[key] = totals.get(key, 0) + stats.boards[port][name]
        model.apply(golden[0] / np.float32(workers), lr=0.5)
        if progress:
            progress("wire", step + 1, steps)
    host_bytes = sum(v for key, v in totals.items() if key.startswith("host_link_bytes_"))
    network_bytes = sum(v for key, v in totals.items() if key.startswith("network_link_bytes_"))
    return {
        "model": f"DenseMLP ({model.params.size} parameters)", "workers": workers, "k": k,
        "steps": steps, "per_step": steps_out,
        "bit_exact": all(s["bit_exact"] for s in steps_out),
        "host_link_bytes": host_bytes, "network_link_bytes": network_bytes,
        "ratio": host_bytes / max(network_bytes, 1),
        "gradient_ratio": totals["host_link_bytes_gradient"]
        / max(totals["network_link_bytes_gradient"], 1),
        "totals": totals, "faults": faults.stats() if faults else None,
    }


#: The paths ``run`` knows, in the order it runs them.
PATHS = ("inceptionn", "lhc", "wire")

def _verilator_tree_board(address, **params):
    from sim.harness.board import tree_board
    return tree_board(address, **params)


#: The boards a tree runs on (``run(tree=...)``): backend name -> factory
#: ``(host.switchml.tree.BoardAddress, *, peers, **params) -> BoardBackend`` (None: the
#: golden board, ``host.switchml.tree_network.TreeNetwork.golden``'s default); ``peers``
#: are the tree's boards' addresses. ``verilator``: every board the Verilated network top,
#: its own gateware instance in a compiled harness of its own.
TREE_BOARDS = {"golden": None, "verilator": _verilator_tree_board}
#: Boards' switch parameters on the tree path: slots per board, lanes, jobs at once.
TREE_SWITCH = dict(slots=64, lanes=64, jobs=SWITCH_JOBS)


def parse_tree(tree) -> tuple[int, int]:
    """``"LxW"`` (or ``(L, W)``) as ``(leaves, workers per leaf)``, each 1..32."""
    if isinstance(tree, str):
        leaves, sep, workers = tree.lower().partition("x")
        try:
            if not sep:
                raise ValueError
            tree = (int(leaves), int(workers))
        except ValueError:
            raise ValueError(f"give a tree as LxW (leaves x workers per leaf, e.g. 4x8), not "
                             f"{tree!r}") from None
    leaves, workers = tree
    for name, value in (("leaves", leaves), ("workers per leaf", workers)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 32:
            raise ValueError(f"a tree's {name} must be an integer in 1..32, not {value!r}")
    if leaves * workers < 2:
        raise ValueError("a tree of one worker aggregates nothing: give at least 2 workers")
    return leaves, workers


def run_tree(*, tree, steps, seed, backend, progress, size="default", lhc_path="auto",
             fault_rate=0.01, fault_seed=0) -> dict:
    """The NCF model's training with its gradients all-reduced through a tree of
    aggregators (``aggregator-protocol.md`` section 4): ``L`` leaf boards of ``W`` workers
    each and a root board, on the in-process network of ``host.switchml.tree_network``
    (the boards' backend from :data:`TREE_BOARDS`), seeded loss, duplication and reordering
    on both levels (``fault_rate`` each), every tensor its own tree job, up to
    ``SWITCH_JOBS`` at once. Each step is checked bit for bit against the flat golden
    all-reduce over all ``L x W`` workers; the report counts datagrams and resends per
    level and sums the boards' counters."""
    from host.golden import lhc
    from host.switchml.tree import Tree
    from host.switchml.tree_network import LEVELS, TreeNetwork, TreeSwitch, tree_faults
    from sim.workloads import NcfModel

    leaves, per_leaf = parse_tree(tree)
    if backend not in TREE_BOARDS:
        raise ValueError(f"the tree runs on {', '.join(TREE_BOARDS)} boards for now, not "
                         f"{backend!r} (--backend golden)")
    workers = leaves * per_leaf
    shape = Tree("10.0.0.1", [f"10.0.1.{leaf + 1}" for leaf in range(leaves)], per_leaf)
    factory = TREE_BOARDS[backend]
    if factory is not None:
        factory = functools.partial(factory, peers=[board.host for board in shape.boards])
    network = TreeNetwork.golden(shape, board_factory=factory, **TREE_SWITCH)
    faults = tree_faults(fault_rate, seed=fault_seed) if fault_rate else None
    switch = TreeSwitch(network, shape.root, shape.leaves, per_leaf, faults=faults)
    model = NcfModel(seed=seed, **SIZES[size]["ncf"])
    started = time.perf_counter()
    report = _train_lhc(switch, model, workers, steps, lhc_path, progress and (
        lambda path, done, total: progress("tree", done, total)))
    levels = {name: {} for name in LEVELS}
    for call in switch.calls:
        for stats in call:
            for name in LEVELS:
                for key, value in stats.levels[name].as_dict().items():
                    levels[name][key] = levels[name].get(key, 0) + value
    counters = {"root": network.counters(shape.root)["switch"], "leaves": {}}
    for board in shape.leaves:
        for key, value in network.counters(board)["switch"].items():
            counters["leaves"][key] = counters["leaves"].get(key, 0) + value
    report.update(backend=backend, leaves=leaves, workers_per_leaf=per_leaf,
                  levels=levels, board_counters=counters,
                  ticks=sum(s.ticks for call in switch.calls for s in call),
                  faults={"rate": fault_rate, "seed": fault_seed},
                  seconds=round(time.perf_counter() - started, 1),
                  scale_workers=workers,
                  scale_steps_down=lhc.scale_steps_down(workers))
    return report


def run(*, workers=4, k=10, steps=3, seed=0, backend="verilator", paths=PATHS,
        out_dir="build/e2e", waves=None, progress=None, board="ecpix5", size="default",
        backend_options=None, lhc_path="auto", wire_steps=1, wire_fault_rate=0.01,
        wire_fault_seed=0, boards=1, tree=None, tree_fault_rate=0.01, tree_fault_seed=0):
    """Run the end-to-end simulation; write ``report.json`` and ``report.txt``; return the
    report dict. ``report["ok"]`` is True when every path is bit-exact. ``backend_options``
    go to the backend (``"udp"``: ``host.board.udp_backend.open_top``); ``lhc_path`` ("auto",
    "sketch" or "dense") is how each of the LHC model's tensors travels; ``wire_steps``,
    ``wire_fault_rate`` and ``wire_fault_seed`` are the wire path's training steps and the
    probability (each of loss, duplication, reordering) and seed of its network faults.
    ``boards`` > 1 stripes every LHC job over that many switches, one gateware instance
    (or virtual board) per board (``docs/protocol/network.md`` section 3). ``tree``
    (``"LxW"`` or ``(L, W)``) runs the tree of aggregators alone instead of the paths
    (:func:`run_tree`: ``L`` leaves of ``W`` workers and a root, the boards ``backend``'s
    of :data:`TREE_BOARDS`, ``tree_fault_rate`` and ``tree_fault_seed`` its network's
    faults); ``workers`` and ``boards`` are then the tree's."""
    if tree is not None:
        leaves, per_leaf = parse_tree(tree)
        if boards != 1:
            raise ValueError("a tree's boards are its leaves and root: give --tree or "
                             "--boards, not both")
        workers, paths = leaves * per_leaf, ("tree",)
        if not 0.0 <= tree_fault_rate < 1.0:
            raise ValueError(f"the tree's fault rate must be in [0, 1), not "
                             f"{tree_fault_rate!r}")
    elif not isinstance(workers, int) or not 2 <= workers <= 32:
        raise ValueError(f"workers must be an integer in 2..32, not {workers!r}")
    if size not in SIZES:
        raise ValueError(f"size must be one of {', '.join(SIZES)}, not {size!r}")
    from host.golden.lhc import PATHS as LHC_PATHS
    if lhc_path not in LHC_PATHS:
        raise ValueError(f"lhc_path must be one of {', '.join(LHC_PATHS)}, not {lhc_path!r}")
    for name, value in (("steps", steps), ("wire_steps", wire_steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, not {value!r}")
    if isinstance(boards, bool) or not isinstance(boards, int) or not 1 <= boards <= 8:
        raise ValueError(f"boards must be an integer in 1..8, not {boards!r}")
    unknown = set(paths) - set(PATHS) - ({"tree"} if tree is not None else set())
    if unknown or not paths:
        raise ValueError(f"paths must be some of {', '.join(PATHS)}, not {paths!r}")
    mhz, clock_source = clock_mhz(board)
    report = {"backend": backend, "workers": workers, "seed": seed,
              "clock_mhz": mhz, "clock_source": clock_source, "engines": {}}
    if backend_options:
        report["backend_options"] = dict(backend_options)
    if boards > 1:
        report["boards"] = boards
    started = time.perf_counter()
    if "inceptionn" in paths:
        report["inceptionn"], stats = run_inceptionn(workers=workers, k=k, steps=steps,
                                                     seed=seed, backend=backend, waves=waves,
                                                     progress=progress, size=size,
                                                     backend_options=backend_options)
        for name, s in stats.items():
            report["engines"][f"nic_{name}"] = _engine_report(s, mhz)
    if "lhc" in paths:
        report["lhc"], stats = run_lhc(workers=workers, steps=steps, seed=seed,
                                       backend=backend, waves=waves, progress=progress,
                                       size=size, backend_options=backend_options,
                                       lhc_path=lhc_path, boards=boards)
        for name, s in stats.items():
            # several boards: "switch0_agg", "switch1_agg", ...
            report["engines"][f"switch{name}" if boards > 1 else f"switch_{name}"] = \
                _engine_report(s, mhz)
    if "tree" in paths:
        report["tree"] = run_tree(tree=tree, steps=steps, seed=seed, backend=backend,
                                  progress=progress, size=size, lhc_path=lhc_path,
                                  fault_rate=tree_fault_rate, fault_seed=tree_fault_seed)
    if "wire" in paths:
        report["wire"] = run_wire(workers=workers, k=k, steps=wire_steps, seed=seed,
                                  progress=progress, size=size, fault_rate=wire_fault_rate,
                                  fault_seed=wire_fault_seed)
    report["seconds"] = round(time.perf_counter() - started, 1)
    report["ok"] = all([
        report.get("inceptionn", {}).get("bit_identical_on_all_workers", True),
        report.get("inceptionn", {}).get("within_error_bound", True),
        report.get("lhc", {}).get("exact", True),
        report.get("wire", {}).get("bit_exact", True),
        report.get("tree", {}).get("exact", True),
    ])
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2, default=float) + "\n")
    text = format_report(report)
    (out / "report.txt").write_text(text + "\n")
    report["files"] = [str(out / "report.json"), str(out / "report.txt")]
    return report


def _format_tree(t):
    """The tree path's lines of the report."""
    lines = ["", f"Tree of aggregators: {t['leaves']} leaves x {t['workers_per_leaf']} workers "
                 f"= {t['workers']} workers and a root ({t['backend']} boards), {t['model']}, "
                 f"{t['steps']} steps, path {t['path']} per tensor, {t['seconds']} s",
             f"  exact (bit for bit vs the flat golden all-reduce over all {t['workers']} "
             f"workers): {'yes' if t['exact'] else 'NO'}",
             f"  LHC scale for {t['scale_workers']} workers"
             + (f" ({t['scale_steps_down']} float32 ulp(s) below the rounded formula)"
                if t["scale_steps_down"] else ""),
             f"  network faults: {t['faults']['rate']:g} each (seed {t['faults']['seed']}), "
             f"{t['ticks']:,} ticks in all",
             f"  {'level':<10} {'up':>9} {'first':>9} {'resends':>9} {'down':>9} "
             f"{'unicast':>8} {'lost':>7} {'dup':>7} {'delayed':>7}"]
    for name, level in t["levels"].items():
        lines.append(f"  {name:<10} {level['datagrams_up']:>9,} {level['first_up']:>9,} "
                     f"{level['resends_up']:>9,} {level['datagrams_down']:>9,} "
                     f"{level['unicast_down']:>8,} {level['lost']:>7,} "
                     f"{level['duplicated']:>7,} {level['delayed']:>7,}")
    root, leaves = t["board_counters"]["root"], t["board_counters"]["leaves"]
    lines += [f"  root: accepted {root['accepted']:,}, results {root['results_multicast']:,} "
              f"multicast + {root['results_unicast']:,} unicast, retransmits dropped "
              f"{root['retransmit_dropped']:,}",
              f"  leaves: accepted {leaves['accepted']:,}, sent up {leaves['upstream_sent']:,} "
              f"(+{leaves['upstream_resent']:,} again), results from the root "
              f"{leaves['results_upstream']:,}, duplicates {leaves['drop_result_duplicate']:,}, "
              f"unexpected {leaves['drop_result_unexpected']:,}",
              f"  loss {t['loss_before']:.4f} -> {t['loss_after']:.4f}"]
    return lines


def format_report(r):
    lines = [f"gradwire end-to-end simulation: backend {r['backend']}, {r['workers']} workers, "
             f"seed {r['seed']}, {r.get('seconds', '?')} s"]
    if "inceptionn" in r:
        i = r["inceptionn"]
        lines += ["", f"INCEPTIONN ring all-reduce, {i['model']}, k={i['k']}, {i['steps']} steps",
                  f"  wire bytes          {i['wire_bytes']:>12,}  (dense fp32 {i['dense_fp32_bytes']:,})",
                  f"  compression ratio   {i['compression_ratio']:>12.2f}x",
                  "  value classes       " + "  ".join(f"{t}:{c}" for t, c in i["class_histogram"].items()),
                  f"  max error           {i['max_error']:>12.3e}  (N*2^-k = {i['error_bound']:.3e}; "
                  f"error / exact bound {i['max_error_over_bound']:.3f}, ring_sum_error_bound) "
                  f"{'OK' if i['within_error_bound'] else 'EXCEEDED'}",
                  f"  identical on all workers: {'yes' if i['bit_identical_on_all_workers'] else 'NO'}",
                  f"  loss {i['loss_before']:.4f} -> {i['loss_after']:.4f}"]
        if "compared_with_golden" in i:
            c = i["compared_with_golden"]
            lines.append(f"  gateware vs golden: {c['packets']} packets, {c['bytes']:,} bytes, "
                         f"{c['registers']} counters compared, all identical")
    if "lhc" in r:
        h = r["lhc"]
        last = h["per_step"][-1]
        lines += ["", f"In-network LHC all-reduce, {h['model']}, {h['steps']} steps, "
                      f"{h['workers']} workers, path {h.get('path', 'sketch')} per tensor, "
                      f"one job per tensor at once",
                  f"  exact (bit for bit vs golden allreduce): {'yes' if h['exact'] else 'NO'}"]
        for key, value in h["totals"].items():
            lines.append(f"  {key:<30} {value:>12,}")
        if "tensors" in last:
            lines.append(f"  {'tensor (last step)':<18} {'values':>9} {'union':>7} {'path':>7} "
                         f"{'rows':>6} {'unpeeled':>8} {'bytes':>10} {'vs dense':>8}")
            for name, t in last["tensors"].items():
                union = f"{t['union_nnz'] / t['elements']:.1%}" if t.get("union_nnz") is not None \
                    else "-"
                lines.append(f"  {name:<18} {t['elements']:>9,} {union:>7} {t['path']:>7} "
                             f"{t['rows'] if t['rows'] is not None else '-':>6} "
                             f"{t['unpeeled']:>8} {t['total_bytes']:>10,} "
                             f"{t['total_bytes'] / max(t['dense_bytes'], 1):>8.2f}")
        lines.append(f"  loss {h['loss_before']:.4f} -> {h['loss_after']:.4f}")
        if h.get("boards", 1) > 1:
            lines.append(f"  {h['boards']} boards, one switch each, every job on all of them "
                         f"(chunk c on board c mod {h['boards']}):")
            for b in h["per_board"]:
                lines.append(f"    board {b['board']}: {b['bytes_in']:>12,} bytes in "
                             f"({b['share']:.1%}), {b['packets_in']:,} packets, "
                             f"{b['resends']:,} resends; its switch accepted "
                             f"{b['counters']['accepted']:,}")
        if "compared_with_golden" in h:
            c = h["compared_with_golden"]
            lines.append(f"  gateware vs reference model: {c['packets']} packets, {c['bytes']:,} "
                         f"bytes, {c['registers']} counters compared, all identical")
    if "tree" in r:
        lines += _format_tree(r["tree"])
    if "wire" in r:
        w = r["wire"]
        t = w["totals"]
        lines += ["", f"INCEPTIONN ring through NICs in the wire, {w['model']}, k={w['k']}, "
                      f"{w['steps']} step{'s' if w['steps'] != 1 else ''}, {w['workers']} hosts "
                      f"(golden wire boards, learning switch)",
                  f"  bytes on host links     {w['host_link_bytes']:>12,}  (gradient "
                  f"{t['host_link_bytes_gradient']:,}, acks {t['host_link_bytes_ack']:,})",
                  f"  bytes on network links  {w['network_link_bytes']:>12,}  (gradient "
                  f"{t['network_link_bytes_gradient']:,}, acks {t['network_link_bytes_ack']:,})",
                  f"  host / network          {w['ratio']:>12.2f}x  (gradient datagrams alone "
                  f"{w['gradient_ratio']:.2f}x)",
                  f"  gradient datagrams {t['tx_datagrams']:,}, retransmissions "
                  f"{t['tx_resends']:,} (after {t['tx_timeouts']:,} timeouts); the boards "
                  f"compressed {t['board_port0_compressed']:,} and passed "
                  f"{t['board_port0_incompressible']:,} raw (resends included)",
                  f"  duplicates discarded {t['rx_duplicates']:,}, acks {t['rx_acks']:,}"]
        if w["faults"]:
            f = w["faults"]
            lines.append(f"  network faults (seed {f['seed']}, {f['loss']:g} each): "
                         f"{f['lost']} lost, {f['duplicated']} duplicated, {f['delayed']} "
                         f"delayed")
        lines.append(f"  bit-exact vs the golden ring on all hosts: "
                     f"{'yes' if w['bit_exact'] else 'NO'}")
    networks = {path: r[path]["network"] for path in ("inceptionn", "lhc")
                if "network" in r.get(path, {})}
    if networks:
        lines += ["", "Network (UDP transport to the board; a resend is a datagram sent again "
                      "after a timeout)",
                  f"  {'path':<10} {'service':<8} {'requests':>9} {'datagrams':>9} "
                  f"{'resends':>8} {'discarded':>9} {'rebuilt':>7} {'RTT ms':>7}"]
        for path, net in networks.items():
            for service, s in net.items():
                if service == "wire_faults":
                    continue
                rtt = f"{s['srtt_ms']:.2f}" if s.get("srtt_ms") is not None else "-"
                lines.append(f"  {path:<10} {service:<8} {s['requests']:>9} {s['datagrams']:>9} "
                             f"{s['resends']:>8} {s['discarded']:>9} {s['rebuilt']:>7} "
                             f"{rtt:>7}")
            if "wire_faults" in net:
                f = net["wire_faults"]
                lines.append(f"  {path:<10} wire faults (seed {f['seed']}): {f['lost']} lost, "
                             f"{f['duplicated']} duplicated, {f['delayed']} delayed, "
                             f"{f['held_back']} held back (window order)")
    if r["engines"]:
        lines += ["", f"Engines (clock {r['clock_mhz']:.1f} MHz: {r['clock_source']})",
                  f"  {'engine':<12} {'in beats':>9} {'out beats':>9} {'cycles':>9} "
                  f"{'in/clk':>7} {'out/clk':>7} {'latency':>7} {'Gb/s in':>8} {'Gb/s out':>8}"]
        for name, e in r["engines"].items():
            if not e.get("busy_cycles"):
                lines.append(f"  {name:<12} (no clock: reference model)")
                continue
            lines.append(f"  {name:<12} {e['in_beats']:>9} {e['out_beats']:>9} "
                         f"{e['busy_cycles']:>9} {e['in_beats_per_cycle']:>7.3f} "
                         f"{e['out_beats_per_cycle']:>7.3f} "
                         f"{e.get('first_beat_latency_cycles', '-'):>7} "
                         f"{e.get('throughput_in_gbps', 0):>8.2f} "
                         f"{e.get('throughput_out_gbps', 0):>8.2f}")
    if r["engines"]:
        lines.append("  (cycles run from each exchange's first input beat to its last output beat, so "
                     "short exchanges\n   include pipeline fill; the RX path stores and forwards "
                     "whole packets)")
    cycles = sum(e.get("cycles", 0) for e in r["engines"].values())
    if cycles:
        lines.append(f"  simulated {cycles:,} clock cycles in all ({cycles / max(r.get('seconds') or 0, 0.1):,.0f} "
                     f"per second of the run, golden-model checks included)")
    builds = [r[path]["build"] for path in ("inceptionn", "lhc") if "build" in r.get(path, {})]
    if builds:
        lines += ["", "Verilator builds of the compiled harness (cached by content in build/sim/)"]
        for b in builds:
            lines.append(f"  {b['top']:<12} {b['build_seconds']:>7.1f} s"
                         f"{'  (reused)' if b['cached'] else ''}")
    lines += ["", "RESULT: " + ("every path bit-exact against the golden model" if r["ok"]
                                else "MISMATCH (see above)")]
    return "\n".join(lines)
