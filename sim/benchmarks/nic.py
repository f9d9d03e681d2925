"""NIC engines gateware: beats per clock, latency and simulation speed, from Verilator.

The cocotb bench ``throughput`` of ``sim/tb_nic.py`` runs on the Verilated NIC top (the same
build as ``tests/hdl/nic/test_nic_top.py``) with the sources never pausing and the sinks always
ready, checks every output byte against the golden model, and counts handshakes per clock
on the four AXI-Stream ports. Workloads (``k = 10``, packets of ``values`` values):

- **gradients**: normal values scaled by 1e-3 with 1 % outliers above 1 (realistic);
- **all_raw**: every value ``abs >= 1``, Inf or NaN: 34-byte blocks, the worst case;
- **all_zero**: every value below the bound: 2-byte blocks, the best case;
- **bypass**: packets without the ``COMPRESS`` flag (pure pass-through).

Each TX workload's output is then fed to RX. Ratios:

- beats per clock (from the first to the last beat on a port) against the ideal 1.0; the
  all-raw compressor input against its bound 16/17 (34-byte blocks for 32-byte beats);
- latency: clocks from a packet's header beat in to its header beat out (TX cut-through;
  RX stores and forwards, so its latency is a whole packet);
- Verilator speed in clock cycles per second with cocotb driving and checking every clock,
  against the baseline of the same Verilated model with only the cocotb clock running
  (no drivers, no traffic) in the same run.
"""
from __future__ import annotations

from . import cocotb_measurement

TOP = "nic_top"
ALL_RAW_BOUND = 16 / 17


def _verilator_measure(quick):
    from hdl.export import export_verilog, make_top

    return cocotb_measurement(TOP, export_verilog(make_top(TOP), TOP), "sim.tb_nic", "throughput",
                              {"seed": 4, "packets": 2 if quick else 8, "values": 2048,
                               "baseline_cycles": 5000 if quick else 30000},
                              report_param="results")


def run(quick: bool) -> dict:
    raw = _verilator_measure(quick)
    baseline = raw["baseline_clock_only_cycles_per_second"]
    rows, out = [], {"baseline_clock_only_cycles_per_second": baseline, "workloads": {}}
    for name, r in raw.items():
        if not isinstance(r, dict):
            continue
        entry = {
            "packets": r["packets"],
            "beats_in": r["beats_in"],
            "beats_out": r["beats_out"],
            "in_beats_per_clock": r["in_beats_per_clock"],
            "out_beats_per_clock": r["out_beats_per_clock"],
            "in_vs_ideal": r["in_beats_per_clock"] / 1.0,
            "out_vs_ideal": r["out_beats_per_clock"] / 1.0,
            "clocks_per_in_beat": 1 / r["in_beats_per_clock"],
            "clocks_per_out_beat": 1 / r["out_beats_per_clock"],
            "latency_cycles_first": r["latency_cycles_first"],
            "latency_cycles_mean": r["latency_cycles_mean"],
            "sim_cycles_per_second": r["sim_cycles_per_second"],
            "sim_speed_vs_clock_only": r["sim_cycles_per_second"] / baseline,
        }
        if "compression_ratio" in r:
            entry["compression_ratio"] = r["compression_ratio"]
        if name == "tx_all_raw":
            entry["in_vs_bound_16_17"] = r["in_beats_per_clock"] / ALL_RAW_BOUND
        out["workloads"][name] = entry
        rows.append((name, entry))

    print(f"Verilator NIC top, k=10, {raw['tx_gradients']['packets']} packets x 2048 values "
          f"per workload; baseline (clock only) {baseline:,.0f} cycles/s")
    print(f"{'workload':<14}{'in b/clk':>9}{'out b/clk':>10}{'clk/in':>8}{'clk/out':>8}"
          f"{'latency':>9}{'ratio':>7}{'sim cyc/s':>11}{'vs base':>8}")
    for name, e in rows:
        ratio = f"{e['compression_ratio']:.2f}" if "compression_ratio" in e else "-"
        print(f"{name:<14}{e['in_beats_per_clock']:>9.4f}{e['out_beats_per_clock']:>10.4f}"
              f"{e['clocks_per_in_beat']:>8.3f}{e['clocks_per_out_beat']:>8.3f}"
              f"{e['latency_cycles_mean']:>9.1f}{ratio:>7}{e['sim_cycles_per_second']:>11,.0f}"
              f"{e['sim_speed_vs_clock_only']:>8.3f}")
    tx_raw = out["workloads"]["tx_all_raw"]
    print(f"all-raw compressor input: {tx_raw['in_beats_per_clock']:.4f} beats/clock = "
          f"{tx_raw['in_vs_bound_16_17']:.4f} x the 16/17 bound")
    return out
