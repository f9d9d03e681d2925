# amaranth: UnusedElaboratable=no
"""INCEPTIONN: compression, the ring's wire bytes, the NIC engines' throughput, and the
communication time of one all-reduce with the codec in the NIC and on the CPU.

Per k in :data:`K_VALUES` and per gradient set (every figure of a row from the same data,
in the same run):

- the accuracy experiment's models (``host/ddp/accuracy.py``: the digits MLP and the NeuMF
  recommender, each rank's gradient of the first training step; needs torch), the
  ``make sim`` workloads (``sim/workloads.py``: DenseMLP and NcfModel, step 0), and
  gradient-like synthetic values (``host.benchmarks.inceptionn.gradients``), each for
  :data:`WORKERS` workers;
- **compression ratio**: fp32 bytes / the compressed packets' payload bytes of the workers'
  own gradients (golden codec, 2048-value packets) (and with the 32-byte headers);
- **ring wire bytes against fp32**: the INCEPTIONN ring all-reduce (``host.golden.ring``, every hop
  through the NIC model, which the gateware equals bit for bit) counted packet by packet,
  headers included, against the same hops as RAW_F32 packets;
- **engine throughput**: the real ``nic_top`` through the compiled harness: a slice of the
  gradients (:data:`SLICE_VALUES` values of worker 0) in 2048-value packets through the
  transmit path (compressor) and its output through the receive path (decompressor),
  every output byte checked against the golden model; Gb/s of fp32 values (uncompressed)
  = 32 x values / (busy clock cycles / clock), at the clock of the latest ``make
  bitstream`` or the board's default target (said which);
- **communication time of one all-reduce** over 1, 10 and 100 GbE per worker, a **model**
  (``sim/benchmarks/links.py``) on counted numbers: the ring's 2 (N - 1) steps, each as
  long as its slowest worker; per worker and step, *fp32*: its RAW_F32 packets' wire time;
  *INCEPTIONN in the NIC*: the longer of its compressed packets' wire time (counted in the
  ring run) and the engines' time for its chunk (the slice's measured values per clock;
  both engines stream packet by packet); *INCEPTIONN on the CPU*: the longer of the same
  wire time and the golden codec's time for its chunk, encoding its outgoing chunk plus
  decoding its incoming one on one core, at the speed measured in this run on the same
  data and k (best of :data:`REPEATS`). The CPU figure is optimistic for the CPU (its
  codec work overlaps the wire completely); the paper's point is that it still eats the
  gain.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from . import links

__all__ = ["run", "K_VALUES", "WORKERS", "SLICE_VALUES"]

K_VALUES = (6, 8, 10, 12)
WORKERS = 4
SLICE_VALUES = 1 << 18
REPEATS = 3
SYNTHETIC_VALUES = 1 << 20
QUICK = {"slice": 1 << 13, "synthetic": 1 << 14, "k": (8, 10)}


class _CountingNic:
    """The ring's NIC, counting every step's compressed packets per worker."""

    def __init__(self, nic):
        self.nic = nic
        self.steps = {}          # step -> worker -> (values, wire bytes, packets)

    def transmit(self, values, k, *, worker, seq, offset):
        wire = self.nic.transmit(values, k, worker=worker, seq=seq, offset=offset)
        nbytes = sum(links.HEADER_BYTES + len(p.payload) for p in wire)
        self.steps.setdefault(seq, {})[worker] = (len(values), nbytes, len(wire))
        return wire

    def receive(self, packets, n, *, offset):
        return self.nic.receive(packets, n, offset=offset)


def _gradient_sets(quick):
    """name -> list of WORKERS float32 gradients (and a note of what was left out)."""
    from host.benchmarks.inceptionn import gradients
    from sim.workloads import DenseMLP, NcfModel
    from sim.e2e import SIZES

    sets, notes = {}, []
    try:
        import torch  # noqa: F401
        from host.ddp import accuracy
        settings = accuracy.Settings(world_size=WORKERS)
        if quick:
            settings = accuracy.Settings.quick(world_size=WORKERS)
        datasets = accuracy.prepare_datasets(settings)
        sets["accuracy digits MLP"] = accuracy.first_step_gradients(settings, datasets, "digits")
        sets["accuracy NeuMF"] = accuracy.first_step_gradients(settings, datasets, "ncf")
    except ImportError as exc:
        notes.append(f"accuracy models left out: {exc} (pip install -e '.[ddp]')")
    size = "small" if quick else "default"
    mlp = DenseMLP(seed=0, **SIZES[size]["mlp"])
    ncf = NcfModel(seed=0, **SIZES[size]["ncf"])
    sets["make sim DenseMLP"] = [mlp.gradient(w, 0) for w in range(WORKERS)]
    sets["make sim NcfModel"] = [ncf.gradient(w, 0) for w in range(WORKERS)]
    n = QUICK["synthetic"] if quick else SYNTHETIC_VALUES
    sets["synthetic"] = [gradients(n, seed=1000 + w) for w in range(WORKERS)]
    return sets, notes


def _engines(transport, values, k, mhz):
    """TX then RX of ``values`` through the Verilated NIC, checked; Gb/s of fp32 values."""
    from host.golden import inceptionn as inc

    raw = inc.tensor_to_packets(values, k, packet_values=inc.MAX_COUNT)
    want = inc.tensor_to_packets(values, k, compress=True, packet_values=inc.MAX_COUNT)

    def through(stream, packets):
        before = transport.stats[stream].busy_cycles if stream in transport.stats else 0
        # idle: the receive path stores and forwards; an all-zero packet decodes for 256
        # quiet clocks before its first beat out (host.driver.nic.NicInterface.receive)
        got = transport.exchange(stream, packets, idle=2048 // 8 + 64)
        cycles = transport.stats[stream].busy_cycles - before
        return got, {"cycles": cycles, "values_per_cycle": values.size / cycles,
                     "gbps": 32 * values.size / (cycles / (mhz * 1e6)) / 1e9}

    wire, tx = through("tx", raw)
    if [p.to_bytes() for p in wire] != [p.to_bytes() for p in want]:
        raise AssertionError(f"the NIC's compressed packets differ from the golden model "
                             f"(k={k})")
    back, rx = through("rx", wire)
    decoded = inc.packets_to_tensor(back, values.size)
    if not np.array_equal(decoded.view(np.uint32), inc.quantize(values, k).view(np.uint32)):
        raise AssertionError(f"the NIC's decompressed values differ from the golden model "
                             f"(k={k})")
    return {"tx": tx, "rx": rx}


def _codec_speed(values, k):
    """Seconds per value of the golden codec on the CPU: encode + pack, unpack + decode."""
    from host.benchmarks import best_time
    from host.golden import inceptionn as inc

    t_encode, packets = best_time(
        lambda: inc.tensor_to_packets(values, k, compress=True, packet_values=inc.MAX_COUNT),
        REPEATS)
    t_decode, _ = best_time(lambda: inc.packets_to_tensor(packets, values.size), REPEATS)
    return {"encode_s_per_value": t_encode / values.size,
            "decode_s_per_value": t_decode / values.size,
            "encode_mb_per_s": 4 * values.size / t_encode / 1e6,
            "decode_mb_per_s": 4 * values.size / t_decode / 1e6}


def _ring(grads, k):
    from host.driver.models import NicModelTransport
    from host.driver.nic import NicInterface
    from host.golden.ring import ring_allreduce

    nic = _CountingNic(NicInterface(NicModelTransport()))
    _, stats = ring_allreduce(grads, nic, k)
    return stats, nic.steps


def _times(steps, engines, codec, mhz):
    """Modelled seconds of one all-reduce per link: fp32, NIC, CPU."""
    out = {}
    nic_values_per_s = min(engines["tx"]["values_per_cycle"],
                           engines["rx"]["values_per_cycle"]) * mhz * 1e6
    cpu_s_per_value = codec["encode_s_per_value"] + codec["decode_s_per_value"]
    for gbps in links.LINKS_GBPS:
        fp32 = nic = cpu = 0.0
        for per_worker in steps.values():
            fp32_step = nic_step = cpu_step = 0.0
            for values, nbytes, packets in per_worker.values():
                wire = links.link_seconds(nbytes + packets * links.FRAMING_BYTES, gbps)
                raw = links.link_seconds(
                    links.wire_bytes(-(-values // links.RING_PACKET_VALUES), 4 * values), gbps)
                fp32_step = max(fp32_step, raw)
                nic_step = max(nic_step, wire, values / nic_values_per_s)
                cpu_step = max(cpu_step, wire, values * cpu_s_per_value)
            fp32, nic, cpu = fp32 + fp32_step, nic + nic_step, cpu + cpu_step
        out[f"{gbps}GbE"] = {"fp32_s": fp32, "nic_s": nic, "cpu_s": cpu,
                             "nic_vs_fp32": fp32 / nic, "cpu_vs_fp32": fp32 / cpu}
    return out


def _plot(results, k_values, out_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, axes = plt.subplots(1, len(links.LINKS_GBPS), figsize=(4.2 * len(links.LINKS_GBPS), 3.6),
                             squeeze=False)
    width = 0.8 / len(names)
    for i, gbps in enumerate(links.LINKS_GBPS):
        ax = axes[0][i]
        for j, name in enumerate(names):
            nic = [results[name][k]["time"][f"{gbps}GbE"]["nic_vs_fp32"] for k in k_values]
            cpu = [results[name][k]["time"][f"{gbps}GbE"]["cpu_vs_fp32"] for k in k_values]
            x = np.arange(len(k_values)) + j * width
            ax.bar(x, nic, width * 0.9, label=name if i == 0 else None)
            ax.scatter(x, cpu, marker="x", color="black", zorder=3,
                       label="codec on the CPU" if i == 0 and j == 0 else None)
        ax.axhline(1.0, color="grey", linestyle=":")
        ax.set_yscale("log")
        ax.set_xticks(np.arange(len(k_values)) + 0.4 - width / 2, [f"k={k}" for k in k_values])
        ax.set_title(f"{gbps} GbE per worker (modelled)", fontsize=9)
        ax.set_ylabel("speed-up of one all-reduce (x)", fontsize=8)
        ax.grid(True, axis="y", which="both", alpha=0.3)
    fig.legend(loc="lower center", ncol=len(names) + 1, fontsize=7,
               title="bars: codec in the NIC (gradients); x: the golden codec on one CPU core",
               title_fontsize=7)
    fig.suptitle(f"INCEPTIONN ring all-reduce, {WORKERS} workers: fp32 ring time / time "
                 f"(above 1: faster than the fp32 ring)", fontsize=9)
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, dpi=110)
    plt.close(fig)


def run(quick: bool, out_dir="build/bench") -> dict:
    from hdl.export import export_verilog, make_top
    from host.driver.nic import NIC_STREAMS
    from sim.harness import HarnessTransport

    k_values = QUICK["k"] if quick else K_VALUES
    slice_values = QUICK["slice"] if quick else SLICE_VALUES
    mhz, clock_source = links.engine_clock()
    started = time.perf_counter()
    sets, notes = _gradient_sets(quick)
    results = {}
    with HarnessTransport("nic_top", export_verilog(make_top("nic_top"), "nic_top"),
                          NIC_STREAMS) as transport:
        for name, grads in sets.items():
            results[name] = {}
            values = grads[0][:slice_values]
            for k in k_values:
                from host.golden import inceptionn as inc
                own = [inc.tensor_to_packets(g, k, compress=True, packet_values=inc.MAX_COUNT)
                       for g in grads]
                payload = sum(len(p.payload) for ps in own for p in ps)
                headers = sum(len(ps) for ps in own) * links.HEADER_BYTES
                fp32 = 4 * sum(g.size for g in grads)
                ring_stats, steps = _ring(grads, k)
                engines = _engines(transport, values, k, mhz)
                codec = _codec_speed(grads[0], k)
                results[name][k] = {
                    "values": int(grads[0].size), "workers": WORKERS,
                    "compression_ratio": fp32 / payload,
                    "compression_ratio_with_headers": fp32 / (payload + headers),
                    "ring_wire_bytes": ring_stats.wire_bytes,
                    "ring_fp32_bytes": ring_stats.raw_bytes,
                    "ring_wire_vs_fp32": ring_stats.wire_bytes / ring_stats.raw_bytes,
                    "engines": engines, "engine_slice_values": int(values.size),
                    "cpu_codec": codec, "time": _times(steps, engines, codec, mhz),
                }
    seconds = time.perf_counter() - started

    print(f"INCEPTIONN, {WORKERS}-worker ring; engines: nic_top through the compiled harness "
          f"on {slice_values:,}-value slices, clock {mhz:.1f} MHz ({clock_source}); times "
          f"modelled from counted bytes (+{links.FRAMING_BYTES} B framing per packet), the "
          f"engines' cycles and the golden codec's speed measured in this run")
    for note in notes:
        print(f"  note: {note}")
    print(f"\n{'gradients':<22}{'k':>3}{'ratio':>7}{'ring/fp32':>10}{'TX Gb/s':>9}{'RX Gb/s':>9}"
          f"{'CPU MB/s':>10}" + "".join(f"{f'{g} GbE fp32/NIC/CPU ms':>30}"
                                         for g in links.LINKS_GBPS))
    for name, by_k in results.items():
        for k, r in by_k.items():
            c = r["cpu_codec"]
            cpu_speed = 4 / (c["encode_s_per_value"] + c["decode_s_per_value"]) / 1e6
            line = (f"{name:<22}{k:>3}{r['compression_ratio']:>7.2f}"
                    f"{r['ring_wire_vs_fp32']:>10.3f}{r['engines']['tx']['gbps']:>9.2f}"
                    f"{r['engines']['rx']['gbps']:>9.2f}{cpu_speed:>10.0f}")
            for gbps in links.LINKS_GBPS:
                t = r["time"][f"{gbps}GbE"]
                line += f"{t['fp32_s'] * 1e3:>12.3f}{t['nic_s'] * 1e3:>9.3f}{t['cpu_s'] * 1e3:>9.3f}"
            print(line)
    print("(ratio: fp32 bytes / compressed payload of the workers' own gradients; ring/fp32: the "
          "ring's wire bytes over the same hops' RAW_F32 bytes, headers included; CPU MB/s: "
          "fp32 MB per second of encode + decode on one core)")
    png = Path(out_dir) / "inceptionn.png"
    _plot(results, k_values, png)
    print(f"plot: {png}  ({seconds:.0f} s)")
    return {"clock_mhz": mhz, "clock_source": clock_source, "workers": WORKERS,
            "framing_bytes": links.FRAMING_BYTES, "notes": notes,
            "sets": {name: {str(k): r for k, r in by_k.items()}
                     for name, by_k in results.items()},
            "plot": str(png), "seconds": seconds}
