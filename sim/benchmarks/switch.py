# amaranth: UnusedElaboratable=no
"""Switch aggregator gateware: input beats per clock, result latency, memory, sim speed.

The cocotb bench ``measure`` of ``sim/tb_switch.py`` runs on the Verilated switch top (the
test suite's build: 16 slots, P = 64, 32 workers, 4 jobs; throughput and latency do not
depend on the pool size) and checks every result and counter against the reference model
while it counts handshakes per clock:

- **hammer**: 32 workers, one slot, back to back, versions alternating (a result every 32
  packets); **hammer_n1**: a one-worker job, so every packet completes its slot and the
  result stream is as busy as the input; **hammer_n1_backpressure**: the same with
  ``m_axis_tready`` low half of the time (the input must slow down to the output's pace);
- **random**: four jobs of 32, 2, 7 and 13 workers interleaving rounds on the whole pool
  (bad packets and mixed ops included, no retransmissions);
- **random_backpressure**: the same with ``m_axis_tready`` low half of the time.

Input beats per clock are counted from the first to the last input beat with the source
never pausing, and reported against the ideal 1.0 (the contract's one beat per clock).
Latency is from the clock of a packet's last input beat to the clock of its result's first
output beat. Memory is the block RAM per slot from the memory shapes
(:attr:`hdl.switch.aggregator.Aggregator.ram_bits_per_slot`). Simulation speed is Verilator (with
cocotb driving and checking every clock) in clock cycles per second, against the baseline
of the Amaranth Python simulator running the same engine on the same hammer traffic in
this run.
"""
from __future__ import annotations

import random
import time

from hdl.switch.aggregator import Aggregator
from sim.switch_traffic import EngineParams, hammer_traffic

from . import cocotb_measurement

TOP = "switch_top"
#: The cocotb suite's engine (one Verilator build shared with ``tests/hdl/switch/test_switch_top.py``).
ENGINE = EngineParams(slots=16, lanes=64, max_workers=32, jobs=4)
DEFAULT_ENGINE = EngineParams(slots=64, lanes=64, max_workers=32, jobs=4)


def _verilator_measure(quick):
    from hdl.export import export_verilog, make_top

    return cocotb_measurement(TOP, export_verilog(make_top(TOP, **ENGINE.as_dict()), TOP),
                              "sim.tb_switch", "measure",
                              {"engine": ENGINE.as_dict(), "seed": 5,
                               "rounds": 2 if quick else 16,
                               "packets": 120 if quick else 1500},
                              report_param="report")


def _amaranth_cycles_per_second(params, steps):
    """Clock cycles per second of the Amaranth simulator on ``steps`` (packets only,
    source and sink never pausing); also returns the cycle count."""
    from amaranth.sim import Simulator

    dut = Aggregator(**params.as_dict())
    images = [step[1] for step in steps if step[0] == "packet"]
    config = [step for step in steps if step[0] == "configure"]
    cycles, seconds = [0], [0.0]

    async def bench(ctx):
        for _, job, workers, base, count in config:
            for field, value in enumerate((workers, base, count, 1)):
                ctx.set(dut.ctrl.addr, 4 * job + field)
                ctx.set(dut.ctrl.wdata, value)
                ctx.set(dut.ctrl.we, 1)
                await ctx.tick()
            ctx.set(dut.ctrl.we, 0)
        for _ in range(params.slots + 40):   # the job's slots are cleared
            await ctx.tick()
        ctx.set(dut.o.ready, 1)
        start = time.perf_counter()
        for image in images:
            beats = [image[i:i + 32] for i in range(0, len(image), 32)]
            for n, beat in enumerate(beats):
                ctx.set(dut.i.valid, 1)
                ctx.set(dut.i.payload, {"data": int.from_bytes(beat, "little"),
                                        "keep": (1 << len(beat)) - 1,
                                        "last": n == len(beats) - 1})
                await ctx.tick().until(dut.i.ready)
                cycles[0] += 1
        ctx.set(dut.i.valid, 0)
        seconds[0] = time.perf_counter() - start

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return cycles[0] / seconds[0], cycles[0]


def run(quick: bool) -> dict:
    measured = _verilator_measure(quick)
    rng = random.Random(6)
    workers = ENGINE.max_workers
    steps = [("configure", 0, workers, 0, ENGINE.slots)] + hammer_traffic(
        rng, ENGINE, job=0, workers=workers, slot=0, rounds=1 if quick else 3)
    amaranth_cps, amaranth_cycles = _amaranth_cycles_per_second(ENGINE, steps)
    verilator_cps = measured["hammer"]["sim_cycles_per_second"]

    engines = {name: Aggregator(**params.as_dict()) for name, params in
               (("bench", ENGINE), ("default", DEFAULT_ENGINE))}
    memory = {name: {"ram_bits_per_slot": agg.ram_bits_per_slot,
                     "ram_bits_fixed": agg.ram_bits_fixed,
                     "ram_bits_total": agg.slots * agg.ram_bits_per_slot + agg.ram_bits_fixed,
                     "result_fifo_beats": agg.result_fifo_depth, **params.as_dict()}
              for (name, agg), params in zip(engines.items(), (ENGINE, DEFAULT_ENGINE))}

    cases = {}
    print(f"{'case':22s} {'in beats':>9s} {'beats/clk':>10s} {'vs ideal':>9s} "
          f"{'stalls':>7s} {'results':>8s} {'latency':>9s}")
    for name in ("hammer", "hammer_n1", "hammer_n1_backpressure", "random",
                 "random_backpressure"):
        s = measured[name]
        cases[name] = {**s, "in_beats_per_cycle_vs_ideal": s["in_beats_per_cycle"] / 1.0}
        print(f"{name:22s} {s['in_beats']:9d} {s['in_beats_per_cycle']:10.4f} "
              f"{s['in_beats_per_cycle'] / 1.0:9.4f} {s['in_stall_cycles']:7d} "
              f"{s['results']:8d} {s['latency_min']:>4}-{s['latency_max']:<4}")
    print(f"\nblock RAM per slot: {memory['default']['ram_bits_per_slot']} bits "
          f"(2 versions x {DEFAULT_ENGINE.lanes} lanes x 32 + metadata); fixed (staging + "
          f"result FIFO): {memory['default']['ram_bits_fixed']} bits; default engine "
          f"({DEFAULT_ENGINE.slots} slots) total {memory['default']['ram_bits_total']} bits")
    ratio = verilator_cps / amaranth_cps
    print(f"simulation: Verilator+cocotb {verilator_cps:,.0f} cycles/s vs Amaranth simulator "
          f"{amaranth_cps:,.0f} cycles/s (baseline, {amaranth_cycles} cycles): x{ratio:.1f}")
    return {
        "engine": ENGINE.as_dict(),
        "cases": cases,
        "latency_cycles_min": min(c["latency_min"] for c in cases.values()),
        "latency_cycles_max_no_backpressure": max(
            cases[n]["latency_max"] for n in ("hammer", "hammer_n1", "random")),
        "memory": memory,
        "sim_speed": {"verilator_cocotb_cycles_per_second": verilator_cps,
                      "baseline_amaranth_sim_cycles_per_second": amaranth_cps,
                      "ratio_vs_baseline": ratio},
    }
