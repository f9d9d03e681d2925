"""Co-simulation speed: the compiled harness against a bare C++ loop and the cocotb bridge.

Same run, same Verilated top, same workload of realistic gradient packets, three ways of
clocking it, in clock cycles per second of wall time:

- **bare** (the baseline): the plainest C++ loop around the model (``HarnessTransport.
  bare_speed``): the workload's input beats replayed back to back, every output ready, no
  pauses, no accounting, no Python;
- **compiled**: the driver's ``Transport`` API over the compiled harness
  (``backend="verilator"``), end to end: packet encoding, the pipe, the C++ clock loop
  with its handshake accounting, the packets back and decoded;
- **cocotb**: the same API over the cocotb bridge (``backend="cocotb"``), on a prefix of
  the same requests (it is about 50 times slower).

Workloads: ``nic_top`` gets the fp32 gradient of the end-to-end DenseMLP (2048-value
packets through TX, then TX's compressed output through RX); ``switch_top`` (the 16-slot
engine of the switch section) gets the packets of an LHC all-reduce of four workers' sparse
NcfModel gradients (index, sketch and fallback phases), recorded once from the reference
model and replayed. Every replayed answer is checked against the reference model's.
Results: ``results["sim_speed"][top]``.
"""
from __future__ import annotations

import os
import time

__all__ = ["run"]

#: cycles of the cocotb prefix (quick, full)
COCOTB_CYCLES = (3_000, 20_000)


class _Recorder:
    """A transport wrapper that records every request and the reference answers."""

    def __init__(self, inner):
        self.inner, self.log = inner, []
        self.clocked = False

    def exchange(self, stream, packets, **options):
        packets = list(packets)
        out = self.inner.exchange(stream, packets, **options)
        self.log.append(("exchange", stream, packets, options, [p.to_bytes() for p in out]))
        return out

    def write(self, addr, value):
        self.inner.write(addr, value)
        self.log.append(("write", addr, value))

    def read(self, addr):
        value = self.inner.read(addr)
        self.log.append(("read", addr, value))
        return value


def _nic_requests(quick):
    import numpy as np

    from host.driver.models import NicModelTransport
    from host.driver.nic import NicInterface
    from sim.workloads import DenseMLP
    from sim.e2e import SIZES

    model = DenseMLP(seed=0, **SIZES["small" if quick else "default"]["mlp"])
    grad = model.gradient(0, 0)
    if quick:
        grad = np.tile(grad, 40)
    recorder = _Recorder(NicModelTransport())
    nic = NicInterface(recorder)
    wire = nic.transmit(grad, 10)
    nic.receive(wire, grad.size)
    return recorder.log, f"DenseMLP gradient, {grad.size} fp32 values, k=10, TX then RX"


def _switch_requests(quick, engine):
    import numpy as np

    from host.driver.models import SwitchModelTransport
    from host.driver.switch import SwitchInterface
    from sim.workloads import NcfModel
    from sim.e2e import SIZES

    model = NcfModel(seed=0, **SIZES["small" if quick else "default"]["ncf"])
    recorder = _Recorder(SwitchModelTransport(**engine.as_dict()))
    switch = SwitchInterface(recorder)
    steps = 1 if quick else 3
    for step in range(steps):   # as in make sim
        grads = [model.gradient(w, step) for w in range(4)]
        result, _ = switch.allreduce(grads, job=0)
        model.apply(result / np.float32(4), lr=5.0)
    density = float(np.mean(np.any(np.array(grads) != 0, axis=0)))
    return recorder.log, (f"LHC all-reduce of 4 NcfModel gradients ({grads[0].size} values, "
                          f"{density:.1%} non-zero in the union), {steps} steps")


def _replay(transport, log, *, cycle_budget=None):
    """Replay ``log`` on ``transport``; return (seconds inside exchanges, cycles, exchanges).

    Register reads must give what the model gave, but for the bits the register map calls
    volatile (a commit's busy flag, which a model without a clock never shows). Stops after
    the first exchange that reaches ``cycle_budget`` cycles in total."""
    from contract.tops import TOP_PORTS
    from host.driver.lockstep import MismatchError

    registers = TOP_PORTS[transport.top].registers

    seconds = cycles = exchanges = 0
    for entry in log:
        if entry[0] == "write":
            transport.write(entry[1], entry[2])
            continue
        if entry[0] == "read":
            got = transport.read(entry[1])
            decoded = registers.decode(entry[1])
            volatile = decoded.register.volatile if decoded is not None else 0
            if got & ~volatile != entry[2] & ~volatile:
                raise MismatchError(f"register 0x{entry[1]:03x}: {got}, reference {entry[2]}")
            continue
        _, stream, packets, options, want = entry
        before = transport.stats[stream].cycles if stream in transport.stats else 0
        start = time.perf_counter()
        got = transport.exchange(stream, packets, **options)
        seconds += time.perf_counter() - start
        exchanges += 1
        if [p.to_bytes() for p in got] != want:
            raise MismatchError(f"exchange {exchanges} on {stream!r} differs from the "
                                f"reference model")
        cycles += transport.stats[stream].cycles - before
        if cycle_budget is not None and cycles >= cycle_budget:
            break
    return seconds, cycles, exchanges


def _all_packets(log):
    streams = {}
    for entry in log:
        if entry[0] == "exchange":
            streams.setdefault(entry[1], []).extend(entry[2])
    return streams


def _measure(top, verilog, streams, log, quick):
    from sim.cocotb_transport import CocotbTransport
    from sim.harness import HarnessTransport

    # Best of a few runs, the compiled and the bare loop taking turns, as the machine is
    # shared (a fresh harness each time: every replay starts from reset, and a bare run
    # leaves the design mid-packet). The cocotb bridge runs once: its factor to the
    # others is large.
    repeats = 1 if quick else 5
    per_stream = _all_packets(log)
    share = {s: sum(len(p.to_bytes()) for p in ps) for s, ps in per_stream.items()}
    total = sum(share.values())
    compiled, bare = [], []
    for _ in range(repeats):
        with HarnessTransport(top, verilog, streams, waves=False) as t:
            build = t.build.as_dict()
            seconds, compiled_cycles, compiled_n = _replay(t, log)
            compiled.append((seconds, t.loop_seconds))
        # The bare loop over each stream's input for that stream's share of the compiled
        # run's cycles, after the same register writes.
        bare_s = bare_cycles = 0
        for stream, packets in per_stream.items():
            cycles = max(200_000, int(compiled_cycles * share[stream] / total))
            with HarnessTransport(top, verilog, streams, waves=False) as t:
                for entry in log:
                    if entry[0] == "write":
                        t.write(entry[1], entry[2])
                t.idle(100)
                bare_s += cycles / t.bare_speed(stream, packets, cycles)[0]
            bare_cycles += cycles
        bare.append((bare_s, bare_cycles))
    compiled_s, loop_s = min(compiled)
    bare_s, bare_cycles = min(bare)

    budget = COCOTB_CYCLES[0 if quick else 1]
    with CocotbTransport(top, verilog, streams, waves=False) as t:
        cocotb_s, cocotb_cycles, cocotb_n = _replay(t, log, cycle_budget=budget)

    out = {
        "bare_cycles_per_s": bare_cycles / bare_s,
        "compiled_cycles_per_s": compiled_cycles / compiled_s,
        "cocotb_cycles_per_s": cocotb_cycles / cocotb_s,
        "compiled_loop_fraction": loop_s / compiled_s,
        "cycles": {"bare": bare_cycles, "compiled": compiled_cycles, "cocotb": cocotb_cycles},
        "exchanges": {"compiled": compiled_n, "cocotb": cocotb_n},
        "harness_build_seconds": build["build_seconds"],
        "harness_build_cached": build["cached"],
    }
    out["compiled_vs_bare"] = out["compiled_cycles_per_s"] / out["bare_cycles_per_s"]
    out["compiled_vs_cocotb"] = out["compiled_cycles_per_s"] / out["cocotb_cycles_per_s"]
    return out


def run(quick: bool) -> dict:
    from hdl.export import export_verilog, make_top
    from host.driver.nic import NIC_STREAMS
    from host.driver.switch import SWITCH_STREAMS

    from .switch import ENGINE

    results = {}
    load_before = os.getloadavg()[0]
    nic_log, nic_load = _nic_requests(quick)
    results["nic_top"] = {"workload": nic_load, **_measure(
        "nic_top", export_verilog(make_top("nic_top"), "nic_top"), NIC_STREAMS, nic_log, quick)}
    switch_log, switch_load = _switch_requests(quick, ENGINE)
    results["switch_top"] = {"workload": switch_load, **_measure(
        "switch_top", export_verilog(make_top("switch_top", **ENGINE.as_dict()), "switch_top"),
        SWITCH_STREAMS, switch_log, quick)}

    # Every exchange wakes the harness and then the host: on a shared machine each wake-up
    # may wait for another process's time slice, which the bare loop never does.
    load = {"before": load_before, "after": os.getloadavg()[0], "cpus": os.cpu_count()}
    for r in results.values():
        r["load_average"] = load
    print(f"machine load average {load['before']:.1f} -> {load['after']:.1f} on "
          f"{load['cpus']} CPUs")
    print(f"{'top':<11}{'bare cyc/s':>12}{'compiled':>12}{'cocotb':>10}{'comp/bare':>10}"
          f"{'comp/cocotb':>12}{'build s':>9}")
    for top, r in results.items():
        print(f"{top:<11}{r['bare_cycles_per_s']:>12,.0f}{r['compiled_cycles_per_s']:>12,.0f}"
              f"{r['cocotb_cycles_per_s']:>10,.0f}{r['compiled_vs_bare']:>10.2f}"
              f"{r['compiled_vs_cocotb']:>12.1f}{r['harness_build_seconds']:>9.1f}"
              f"{' (cached)' if r['harness_build_cached'] else ''}")
        print(f"  {r['workload']}; {r['cycles']['compiled']:,} cycles compiled in "
              f"{r['exchanges']['compiled']} exchanges ({r['compiled_loop_fraction']:.0%} of "
              f"the time in the C++ clock loop), {r['cycles']['cocotb']:,} through cocotb")
    return results
