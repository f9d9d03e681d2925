# amaranth: UnusedElaboratable=no
"""Aggregation throughput of the switch: dense int32, the LHC sketch, the per-tensor choice.

The real ``switch_top`` (the ``make sim`` engine: 64 slots of P = 64 lanes, 32 workers, 4
jobs) runs under the compiled harness. For every worker count n and union density d, n
workers' tensors of :data:`VALUES` values are all-reduced phase by phase through it:

- **dense** (SwitchML's quantised int32 sum, ``path="dense"``): the exponent round (one
  packet per worker) and the dense round (N / P packets per worker);
- **sketch** (``path="sketch"``): the index round (N / 32 / P packets), the sketch round
  (r B / P) and the fallback round (u / P, rounded up);
- **auto** (``path="auto"``): the index round, then the dense round or sketch + fallback,
  as :func:`host.golden.lhc.choose_path` decides; composed from the same measured rounds.

Every round goes through the gateware as the workers would send it (chunk after chunk,
each chunk from all n workers, slots reused with alternating versions), back to back, and
its result is checked: the OR / wrap-around sum of the workers' words, and at the end the
decoded tensor bit for bit against the golden model. Its time is the clock cycles from the
round's first input beat to its last result beat (``ExchangeStats.busy_cycles``, summed
over the round's exchanges), at the clock of the latest ``make bitstream`` or the board's
default engine clock (said which). Host work between rounds (encoding, peeling) is not in it.

Throughput is **uncompressed Gb/s**: the tensor's 32 N bits over the aggregation time (what
the LHC paper calls aggregation throughput). The link-limited figures are a **model**
(``sim/benchmarks/links.py``) on these counted numbers: per round, the longer of the
engine's measured time and the wire time of the round's packets per worker (header, payload
and Ethernet/IP/UDP framing) over a 1, 10 or 100 GbE link per worker; and the fp32 ring
all-reduce of the same tensor over the same link, the baseline without in-network help.

The workers' data: at union density d, every worker is non-zero on the same random set of
d N elements (values N(0, 1e-2)): the sketch's size depends only on that union. Where the
paper's benchmark tensor (2^27 values) is too big to simulate, its row is **scaled**: the
rounds' packet counts are exact (from the golden model's plan and peeling schedule at
2^27 values), their cycles come from a line fitted to the 8-worker rounds simulated here
(cycles = a + b packets per worker), and the bench checks that every measured 8-worker
round lies on that line (largest relative deviation reported). A second 8-worker row with
each worker 5 % dense at independent positions (a union of 1 - 0.95^8 = 33.7 %) is
simulated in full at :data:`VALUES` values.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from contract.header import HEADER_FIELDS, MAGIC, VERSION, PacketType
from sim.switch_traffic import EngineParams

from . import links

__all__ = ["run", "phase_frames", "phase_words", "DENSITIES", "WORKERS", "VALUES", "PAPER"]

DENSITIES = (0.01, 0.05, 0.1, 0.3, 0.5, 0.7, 0.9)
WORKERS = (4, 8, 16, 32)
VALUES = 1 << 20
#: The LHC paper's public benchmark: 2^27 values at 95 % sparsity, 8 workers, 6.33x.
PAPER = {"values": 1 << 27, "density": 0.05, "workers": 8, "speedup": 6.33}
QUICK = {"values": 1 << 13, "densities": (0.05, 0.7), "workers": (4, 8), "paper_values": 1 << 16}
#: The engine of ``make sim`` (``host.driver.switch.open_switch``'s defaults).
ENGINE = EngineParams(slots=64, lanes=64, max_workers=32, jobs=4)
SEED = 20240227
#: Packets per harness exchange (a few MB per request).
EXCHANGE_PACKETS = 8192
OR, ADD = PacketType.AGG_OR32, PacketType.AGG_ADD_I32
#: The fit's largest allowed relative deviation of a measured 8-worker round.
LINEARITY_TOLERANCE = 0.01


# ---------------------------------------------------------------------------------------
# packets, vectorised (the same bytes as host.switchml.window.make_packets)

def _frame_dtype(lanes):
    fields = [(f.name, ("<i1" if f.signed else "<u1") if f.size == 1 else
               "<u2" if f.size == 2 else "<u4" if f.size == 4 else "<u8")
              for f in HEADER_FIELDS]
    return np.dtype(fields + [("payload", "<u4", (lanes,))])


def phase_frames(words, *, op, job, slot_base, slot_count, lanes, first_chunk,
                 exponents=None) -> np.ndarray:
    """Every worker's packets of one round, as a ``(chunks, workers)`` record array whose
    records are the packets' bytes (header, then P lanes): chunk g of worker w is what
    ``make_packets(words[w], first_chunk=first_chunk, ...)[g - first_chunk]`` sends."""
    words = np.asarray(words, dtype=np.uint32)
    workers, count = words.shape
    chunks = -(-count // lanes)
    out = np.zeros((chunks, workers), dtype=_frame_dtype(lanes))
    padded = np.zeros((workers, chunks * lanes), dtype=np.uint32)
    padded[:, :count] = words
    out["payload"] = padded.reshape(workers, chunks, lanes).transpose(1, 0, 2)
    g = first_chunk + np.arange(chunks)
    out["magic"], out["version"], out["type"] = MAGIC, VERSION, int(op)
    out["job"], out["count"] = job, lanes
    out["worker"] = np.arange(workers)[None, :]
    out["exponent"] = 0 if exponents is None else np.asarray(exponents)[None, :]
    out["slot"] = (slot_base + g % slot_count)[:, None]
    out["slot_version"] = ((g // slot_count) % 2)[:, None]
    out["seq"] = g[:, None]
    out["offset"] = (np.arange(chunks) * lanes)[:, None]
    return out


class _Frame:
    """A packet given by its bytes (what a transport's ``exchange`` needs of a packet)."""
    __slots__ = ("data",)

    def __init__(self, data):
        self.data = data

    def to_bytes(self):
        return self.data


class _Switch:
    """The switch job the rounds run on; counts cycles and checks results per round."""

    def __init__(self, transport, workers):
        from host.driver.switch import SwitchInterface
        self.transport = transport
        self.workers = workers
        SwitchInterface(transport).configure_job(0, workers, 0, ENGINE.slots)
        self.next_chunk = 0

    def round(self, words, op, exponents=None):
        """One round of ``words`` (workers x count uint32) through the gateware: returns
        ``(aggregated vector, exponent, {"chunks", "cycles", "in_beats"})``."""
        words = np.asarray(words, dtype=np.uint32)
        count = words.shape[1]
        if count == 0:
            return words[0].copy(), None, {"chunks": 0, "cycles": 0, "in_beats": 0}
        frames = phase_frames(words, op=op, job=0, slot_base=0, slot_count=ENGINE.slots,
                              lanes=ENGINE.lanes, first_chunk=self.next_chunk,
                              exponents=exponents)
        chunks = frames.shape[0]
        flat = frames.reshape(-1)
        stats = self.transport.stats
        before = stats["agg"].busy_cycles if "agg" in stats else 0
        beats_before = stats["agg"].in_beats if "agg" in stats else 0
        vector = np.zeros(chunks * ENGINE.lanes, dtype=np.uint32)
        seen = np.zeros(chunks, dtype=bool)
        exponent = None
        for start in range(0, flat.size, EXCHANGE_PACKETS):
            batch = [_Frame(r.tobytes()) for r in flat[start:start + EXCHANGE_PACKETS]]
            for result in self.transport.exchange("agg", batch, idle=32):
                h = result.header
                index = h.seq - self.next_chunk
                if h.worker != 0xFF or not 0 <= index < chunks or seen[index]:
                    raise AssertionError(f"unexpected result {result}")
                seen[index] = True
                vector[index * ENGINE.lanes:(index + 1) * ENGINE.lanes] = \
                    np.frombuffer(result.payload, dtype="<u4")
                exponent = h.exponent if exponent is None else max(exponent, h.exponent)
        if not seen.all():
            raise AssertionError(f"{int((~seen).sum())} chunks got no result")
        self.next_chunk += chunks
        cycles = stats["agg"].busy_cycles - before
        return vector[:count], exponent, {"chunks": chunks, "cycles": cycles,
                                          "in_beats": stats["agg"].in_beats - beats_before}


# ---------------------------------------------------------------------------------------
# one case: n workers, one union density, every round

def _union_tensors(rng, values, density, workers, independent=False):
    """``workers`` float32 tensors; union density ``density`` (every worker non-zero on the
    same union), or with ``independent`` each worker ``density`` dense on its own."""
    tensors = []
    union = np.flatnonzero(rng.random(values) < density)
    for _ in range(workers):
        x = np.zeros(values, np.float32)
        where = np.flatnonzero(rng.random(values) < density) if independent else union
        v = rng.normal(0.0, 1e-2, where.size).astype(np.float32)
        v[v == 0] = 1e-3
        x[where] = v
        tensors.append(x)
    return tensors


def _measure_case(switch, tensors, *, dense=True):
    """Every round of the three paths for one set of tensors; the decoded results are
    checked bit for bit against the golden model."""
    from host.golden import lhc

    n, size = len(tensors), tensors[0].size
    workers = [lhc.LhcWorker(t, n) for t in tensors]
    rounds = {}
    union, e_max, rounds["index"] = switch.round(
        [w.index_words for w in workers], OR, [w.exponent for w in workers])
    if not np.array_equal(union, lhc.aggregate_index([w.index_words for w in workers])) \
            or e_max != lhc.aggregate_exponent([w.exponent for w in workers]):
        raise AssertionError("the switch's OR of the index (or MAX of the exponents) differs "
                             "from the golden model")
    plan = lhc.make_plan(union, e_max, n, size)
    auto = lhc.make_plan(union, e_max, n, size, path="auto")
    sketches = [w.sketch_phase(union, e_max, plan) for w in workers]
    sketch_sum, _, rounds["sketch"] = switch.round([s.view(np.uint32) for s in sketches], ADD)
    sketch_sum = sketch_sum.view(np.int32)
    if not np.array_equal(sketch_sum, lhc.aggregate_sketch(sketches)):
        raise AssertionError("the switch's sum of the sketches differs from the golden model")
    peeling = lhc.peel(sketch_sum, plan.elements, plan.rows, plan.blocks)
    fallback = [w.fallback_phase(sketch_sum, peeling) for w in workers]
    fallback_sum, _, rounds["fallback"] = switch.round([f.view(np.uint32) for f in fallback],
                                                       ADD)
    result, stats = workers[0].finish(fallback_sum.view(np.int32))
    exact = np.sum([w.q.astype(np.int64) for w in workers], axis=0)
    expect = lhc.dequantize(exact.astype(np.int32), plan.scale)
    if not np.array_equal(result.view(np.uint32), expect.view(np.uint32)):
        raise AssertionError("the sketch path through the gateware is not exact")
    if dense:
        flags = [w.index_words.any() for w in workers]
        merged, exponent, rounds["exponent"] = switch.round(
            np.array(flags, dtype=np.uint32)[:, None], OR, [w.exponent for w in workers])
        if merged[0] != any(flags) or exponent != e_max:
            raise AssertionError("the switch's exponent round differs from the golden model")
        dense_sum, _, rounds["dense"] = switch.round([w.q.view(np.uint32) for w in workers],
                                                     ADD)
        dense_result = lhc.dequantize(dense_sum.view(np.int32), plan.scale)
        if not np.array_equal(dense_result.view(np.uint32), expect.view(np.uint32)):
            raise AssertionError("the dense path through the gateware is not exact")
    return {"rows": stats.rows, "union_nnz": stats.union_nnz, "unpeeled": stats.unpeeled,
            "chosen": auto.path, "predicted_unpeeled": auto.predicted_unpeeled,
            "sketch_payload_bytes": stats.total_bytes, "rounds": rounds}


# ---------------------------------------------------------------------------------------
# from rounds to throughput

_PATH_ROUNDS = {"dense": ("exponent", "dense"), "sketch": ("index", "sketch", "fallback")}


def _path_rounds(path, chosen):
    if path == "auto":
        return ("index", "dense") if chosen == "dense" else _PATH_ROUNDS["sketch"]
    return _PATH_ROUNDS[path]


def _seconds(rounds, names, mhz, gbps=None):
    """Aggregation time of ``names``: engine cycles, or per round the longer of the engine
    and the link (modelled)."""
    total = 0.0
    for name in names:
        r = rounds[name]
        engine = r["cycles"] / (mhz * 1e6)
        if gbps is not None:
            wire = links.wire_bytes(r["chunks"], 4 * ENGINE.lanes * r["chunks"])
            engine = max(engine, links.link_seconds(wire, gbps))
        total += engine
    return total


def _throughputs(rounds, chosen, values, workers, mhz):
    """Uncompressed Gb/s of every path, engine-bound and per link; the fp32 ring per link."""
    bits = 32 * values
    out = {}
    for path in ("dense", "sketch", "auto"):
        names = _path_rounds(path, chosen)
        out[path] = {"engine": bits / _seconds(rounds, names, mhz) / 1e9}
        for gbps in links.LINKS_GBPS:
            out[path][f"{gbps}GbE"] = bits / _seconds(rounds, names, mhz, gbps) / 1e9
        out[path]["wire_bytes_per_worker"] = sum(
            links.wire_bytes(rounds[n]["chunks"], 4 * ENGINE.lanes * rounds[n]["chunks"])
            for n in names)
    out["ring_fp32"] = {f"{gbps}GbE": bits / links.ring_fp32_seconds(values, workers, gbps) / 1e9
                        for gbps in links.LINKS_GBPS}
    out["ring_fp32"]["wire_bytes_per_worker"] = links.ring_fp32_wire_bytes(values, workers)
    return out


def _fit(points):
    """Least-squares line cycles = a + b chunks through ``points`` [(chunks, cycles)] and the
    largest relative deviation of a point from it."""
    x = np.array([p[0] for p in points], dtype=np.float64)
    y = np.array([p[1] for p in points], dtype=np.float64)
    b, a = np.polyfit(x, y, 1)
    deviation = float(np.max(np.abs(a + b * x - y) / y))
    return float(a), float(b), deviation


def phase_words(values, density, rng, workers=8):
    """Words of every round of one LHC all-reduce of ``values`` values at union density
    ``density`` (a random union drawn from ``rng``), exact from the golden model's plan and
    peeling schedule: ``{"words": {round: words}, "rows", "unpeeled", "chosen",
    "union_density", "plan_seconds"}``. A full union (``density >= 1``) is not planned: its
    sketch has at least as many words as the tensor, so the choice is dense."""
    from host.golden import lhc

    if density >= 1:
        blocks = lhc.n_blocks(values)
        return {"words": {"index": blocks * lhc.B // 32, "sketch": None, "fallback": None,
                          "exponent": 1, "dense": values},
                "rows": None, "unpeeled": None, "chosen": "dense", "union_density": 1.0,
                "plan_seconds": 0.0}
    step = 1 << 22
    mask = np.zeros(values, dtype=bool)
    for start in range(0, values, step):
        stop = min(values, start + step)
        mask[start:stop] = rng.random(stop - start, dtype=np.float32) < density
    union_words = lhc._index_of_mask(mask)
    del mask
    started = time.perf_counter()
    plan = lhc.make_plan(union_words, 0, workers, values)
    auto = lhc.make_plan(union_words, 0, workers, values, path="auto")
    peeled, _ = lhc.peel_schedule(plan.elements, plan.rows, plan.blocks)
    unpeeled = int(peeled.size - np.count_nonzero(peeled))
    seconds = time.perf_counter() - started
    words = {"index": union_words.size, "sketch": plan.rows * lhc.B, "fallback": unpeeled,
             "exponent": 1, "dense": values}
    return {"words": words, "rows": plan.rows, "unpeeled": unpeeled, "chosen": auto.path,
            "union_density": plan.elements.size / values, "plan_seconds": seconds}


def _paper_row(fit, values, workers, density, mhz, rng):
    """The paper's benchmark size: exact packet counts from the golden model's plan and
    peeling schedule at ``values`` values; cycles from the 8-worker fit (scaled)."""
    p = phase_words(values, density, rng, workers)
    lanes = ENGINE.lanes
    a, b, _ = fit
    rounds = {name: {"chunks": -(-w // lanes),
                     "cycles": (a + b * -(-w // lanes)) if w else 0.0}
              for name, w in p["words"].items()}
    return {"values": values, "workers": workers, "union_density": p["union_density"],
            "rows": p["rows"], "unpeeled": p["unpeeled"], "chosen": p["chosen"],
            "plan_seconds": p["plan_seconds"], "rounds": rounds,
            "gbps": _throughputs(rounds, p["chosen"], values, workers, mhz),
            "scaled": True}


# ---------------------------------------------------------------------------------------
# the section

def _table(results, densities, workers_list, key, title):
    print(f"\n{title}")
    header = f"{'workers':>7} {'path':<7}" + "".join(f"{d:>8g}" for d in densities)
    if key != "engine":
        header += f"{'ring fp32':>11}"
    print(header)
    for n in workers_list:
        for path in ("dense", "sketch", "auto"):
            line = f"{n:>7} {path:<7}" + "".join(
                f"{results[n][d]['gbps'][path][key]:>8.2f}" for d in densities)
            if key != "engine":
                line += f"{results[n][densities[0]]['gbps']['ring_fp32'][key]:>11.2f}" \
                    if path == "dense" else ""
            print(line)


def _plot(results, densities, workers_list, out_path, mhz, clock_source, values):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    rows = [("engine", "engine alone (cycle counts)"), ("10GbE", "10 GbE per worker (modelled)")]
    fig, axes = plt.subplots(len(rows), len(workers_list),
                             figsize=(3.4 * len(workers_list), 3.2 * len(rows)),
                             sharex=True, squeeze=False)
    styles = {"dense": ("tab:blue", "s", "dense int32"), "sketch": ("tab:orange", "o", "LHC sketch"),
              "auto": ("tab:green", "^", "per-tensor choice")}
    for i, (key, label) in enumerate(rows):
        for j, n in enumerate(workers_list):
            ax = axes[i][j]
            for path, (colour, marker, name) in styles.items():
                ax.plot(densities, [results[n][d]["gbps"][path][key] for d in densities],
                        marker=marker, color=colour, label=name,
                        linestyle="--" if path == "auto" else "-")
            if key != "engine":
                ax.axhline(results[n][densities[0]]["gbps"]["ring_fp32"][key], color="grey",
                           linestyle=":", label="fp32 ring")
            ax.set_yscale("log")
            ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(ticker.NullFormatter())
            ax.set_title(f"{n} workers, {label}", fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
            if j == 0:
                ax.set_ylabel("aggregation throughput\n(Gb/s, uncompressed)", fontsize=9)
            if i == len(rows) - 1:
                ax.set_xlabel("union density", fontsize=9)
    axes[0][0].legend(fontsize=7)
    axes[-1][0].legend(fontsize=7)
    fig.suptitle(f"switch_top through the compiled harness, {values:,} values per worker\n"
                 f"engine clock {mhz:.1f} MHz: {clock_source}", fontsize=9)
    fig.tight_layout()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, dpi=110)
    plt.close(fig)


def run(quick: bool, out_dir="build/bench") -> dict:
    from sim.harness.transport import open_top

    values = QUICK["values"] if quick else VALUES
    densities = QUICK["densities"] if quick else DENSITIES
    workers_list = QUICK["workers"] if quick else WORKERS
    paper_values = QUICK["paper_values"] if quick else PAPER["values"]
    mhz, clock_source = links.engine_clock()
    rng = np.random.default_rng(SEED)
    started = time.perf_counter()
    results, fit_points = {}, []
    with open_top("switch_top", **ENGINE.as_dict()) as transport:
        for n in workers_list:
            switch = _Switch(transport, n)
            results[n] = {}
            dense_rounds = None
            for d in densities:
                case = _measure_case(switch, _union_tensors(rng, values, d, n),
                                     dense=dense_rounds is None)
                if dense_rounds is None:     # the dense rounds' cycles do not depend on data
                    dense_rounds = {k: case["rounds"][k] for k in ("exponent", "dense")}
                case["rounds"].update(dense_rounds)
                case["gbps"] = _throughputs(case["rounds"], case["chosen"], values, n, mhz)
                results[n][d] = case
                if n == PAPER["workers"]:
                    fit_points += [(r["chunks"], r["cycles"]) for r in case["rounds"].values()
                                   if r["chunks"] >= 8]
            if n == PAPER["workers"]:
                # the second size of the linearity check: the dense round at half the size
                half = _union_tensors(rng, values // 2, 0.5, n)
                from host.golden import lhc
                ws = [lhc.LhcWorker(t, n) for t in half]
                union = lhc.aggregate_index([w.index_words for w in ws])
                e_max = lhc.aggregate_exponent([w.exponent for w in ws])
                plan = lhc.make_plan(union, e_max, n, values // 2)
                for w in ws:
                    w.sketch_phase(union, e_max, plan)
                _, _, half_round = switch.round([w.q.view(np.uint32) for w in ws], ADD)
                fit_points.append((half_round["chunks"], half_round["cycles"]))
                independent = _measure_case(
                    switch, _union_tensors(rng, values, PAPER["density"], n, independent=True))
                independent["gbps"] = _throughputs(independent["rounds"], independent["chosen"],
                                                   values, n, mhz)
    simulated = time.perf_counter() - started
    fit = _fit(fit_points)
    paper = _paper_row(fit, paper_values, PAPER["workers"], PAPER["density"], mhz, rng)
    if fit[2] > LINEARITY_TOLERANCE:
        raise AssertionError(f"cycles are not linear in packets: deviation {fit[2]:.2%}")

    print(f"switch_top ({ENGINE.slots} slots x {ENGINE.lanes} lanes) through the compiled "
          f"harness, {values:,} values per worker, clock {mhz:.1f} MHz ({clock_source}); "
          f"every round's result checked, every decoded tensor bit-exact")
    print("throughput = 32 x values bits / aggregation time (uncompressed Gb/s); link-limited "
          "figures modelled: per round max(engine cycles, wire bytes per worker incl. 32-byte "
          f"header + {links.FRAMING_BYTES} bytes framing per packet / link)")
    _table(results, densities, workers_list, "engine",
           "engine alone (from the gateware's cycle counts), Gb/s, by union density:")
    for gbps in links.LINKS_GBPS:
        _table(results, densities, workers_list, f"{gbps}GbE",
               f"{gbps} GbE per worker (modelled), Gb/s, by union density:")
    print("\nper-tensor choice (auto): " + "; ".join(
        f"{n} workers " + " ".join(f"{d:g}:{results[n][d]['chosen'][0]}" for d in densities)
        for n in workers_list) + "  (s = sketch, d = dense)")
    a, b, deviation = fit
    print(f"\n8-worker rounds: cycles = {a:.1f} + {b:.4f} x packets per worker "
          f"({b / (PAPER['workers'] * (1 + ENGINE.lanes // 8)):.4f} of one beat per clock "
          f"for {PAPER['workers']} x {1 + ENGINE.lanes // 8}-beat packets); largest deviation "
          f"of a measured round from the line {deviation:.3%} over {len(fit_points)} rounds")
    g = paper["gbps"]
    print(f"\nThe paper's benchmark: {paper['values']:,} values, union density "
          f"{PAPER['density']:g}, {PAPER['workers']} workers (SCALED from the simulated "
          f"rounds: exact packet counts at this size, cycles from the fit): r = "
          f"{paper['rows']} rows, {paper['unpeeled']} unpeeled, choice {paper['chosen']}")
    print(f"{'':>12}{'engine':>9}" + "".join(f"{f'{x} GbE':>9}" for x in links.LINKS_GBPS))
    for path in ("dense", "sketch", "auto"):
        print(f"{path:>12}{g[path]['engine']:>9.2f}" + "".join(
            f"{g[path][f'{x}GbE']:>9.2f}" for x in links.LINKS_GBPS))
    print(f"{'ring fp32':>12}{'-':>9}" + "".join(
        f"{g['ring_fp32'][f'{x}GbE']:>9.2f}" for x in links.LINKS_GBPS))
    ratios = {"auto_vs_dense_engine": g["auto"]["engine"] / g["dense"]["engine"]}
    for x in links.LINKS_GBPS:
        ratios[f"auto_vs_dense_{x}GbE"] = g["auto"][f"{x}GbE"] / g["dense"][f"{x}GbE"]
        ratios[f"auto_vs_ring_fp32_{x}GbE"] = g["auto"][f"{x}GbE"] / g["ring_fp32"][f"{x}GbE"]
    print("LHC (auto) against dense in-network int32: engine "
          f"{ratios['auto_vs_dense_engine']:.2f}x, " + ", ".join(
              f"{x} GbE {ratios[f'auto_vs_dense_{x}GbE']:.2f}x" for x in links.LINKS_GBPS)
          + "; against the fp32 ring over the same link: " + ", ".join(
              f"{x} GbE {ratios[f'auto_vs_ring_fp32_{x}GbE']:.2f}x" for x in links.LINKS_GBPS)
          + f"  (paper: up to {PAPER['speedup']}x against its own baseline and testbed)")
    ig = independent["gbps"]
    print(f"8 workers each {PAPER['density']:.0%} dense at independent positions ({values:,} "
          f"values, simulated): union {independent['union_nnz'] / values:.1%}, choice "
          f"{independent['chosen']}, auto {ig['auto']['engine']:.2f} Gb/s engine "
          f"({ig['auto']['engine'] / ig['dense']['engine']:.2f}x dense), 10 GbE "
          f"{ig['auto']['10GbE']:.2f} Gb/s ({ig['auto']['10GbE'] / ig['ring_fp32']['10GbE']:.2f}x "
          f"the fp32 ring)")
    png = Path(out_dir) / "aggregation.png"
    _plot(results, densities, workers_list, png, mhz, clock_source, values)
    print(f"plot: {png}  (simulation and checks took {simulated:.0f} s)")
    return {
        "engine": ENGINE.as_dict(), "values": values, "clock_mhz": mhz,
        "clock_source": clock_source, "framing_bytes": links.FRAMING_BYTES,
        "cases": {str(n): {f"{d:g}": case for d, case in by_d.items()}
                  for n, by_d in results.items()},
        "fit_8_workers": {"a_cycles": a, "b_cycles_per_packet": b, "max_deviation": deviation,
                          "points": len(fit_points)},
        "paper_row": {**paper, "ratios": ratios, "paper_speedup": PAPER["speedup"]},
        "independent_5pct_8_workers": independent,
        "plot": str(png), "seconds": simulated,
    }
