"""cocotb benches of the exported switch top (``switch_top``: ``hdl/switch/aggregator.py`` behind ``hdl/export.py``) against the reference model.

Every bench drives one packet sequence (``sim/switch_traffic.py``) into the Verilated
gateware through cocotbext-axi and, step by step, into :class:`host.golden.aggregator.AggregatorModel`,
then requires the same result packets (every byte, in order) and the same counters, read
back over the ``ctrl_*`` port. Job configurations go through the ``ctrl_*`` port too, between
packets, exactly where the sequence has them.

A monitor counts handshakes every clock, so each bench also reports input beats per clock
and the latency from a packet's last beat to the first beat of its result; ``measure``
collects those numbers for ``sim/benchmarks/switch.py`` (written as JSON to
``params["report"]``).

Parameters (``sim.runner.test_params()``): ``engine`` (the top's slots, lanes, max_workers,
jobs), ``seed``, ``p_in`` / ``p_out`` (probability of an idle input cycle / of a cycle
with ``m_axis_tready`` low), bench-specific sizes.
"""
from __future__ import annotations

import json
import random
import time

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge
from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamSink, AxiStreamSource

from contract.packet import Packet
from contract.registers import SWITCH_REGISTERS, JobStatus, switch_params_word
from host.golden.aggregator import AggregatorModel
from sim.runner import test_params
from sim.switch_traffic import (
    BAD_CLASSES,
    EngineParams,
    bad_packet,
    chaos_traffic,
    configure_model,
    configure_steps,
    configure_writes,
    data_packet,
    hammer_traffic,
    protocol_traffic,
    tree_traffic,
)

#: Quiet clocks after which no further result can come (the engine's latency is < 20).
QUIET_CYCLES = 64


class Monitor:
    """Per-clock handshake log of both streams (cycle numbers since the monitor started)."""

    def __init__(self, dut):
        self.dut = dut
        self.cycle = 0
        self.in_beats = 0
        self.in_last_cycles = []      # cycle of every input packet's last beat
        self.in_first_cycle = None
        self.in_stalls = 0            # cycles with tvalid high and tready low
        self.out_first_cycles = []    # cycle of every result's first beat
        self.out_beats = 0
        self.last_activity = 0
        self._out_in_packet = False
        self.active = True
        cocotb.start_soon(self._run())

    def stop(self):
        self.active = False

    async def _run(self):
        dut = self.dut
        while self.active:
            await RisingEdge(dut.clk)
            self.cycle += 1
            # Right after the edge the signals still show the cycle that just ended.
            if int(dut.s_axis_tvalid.value):
                if int(dut.s_axis_tready.value):
                    self.in_beats += 1
                    self.last_activity = self.cycle
                    if self.in_first_cycle is None:
                        self.in_first_cycle = self.cycle
                    if int(dut.s_axis_tlast.value):
                        self.in_last_cycles.append(self.cycle)
                else:
                    self.in_stalls += 1
            if int(dut.m_axis_tvalid.value) and int(dut.m_axis_tready.value):
                self.out_beats += 1
                self.last_activity = self.cycle
                if not self._out_in_packet:
                    self.out_first_cycles.append(self.cycle)
                self._out_in_packet = not int(dut.m_axis_tlast.value)


class Switch:
    """The DUT with its reference model: replay steps into both and compare."""

    def __init__(self, dut, params: EngineParams, seed):
        self.dut, self.params = dut, params
        self.rng = random.Random(seed)
        self.model = AggregatorModel(**params.as_dict())
        self.source = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis"), dut.clk, dut.rst)
        self.sink = AxiStreamSink(AxiStreamBus.from_prefix(dut, "m_axis"), dut.clk, dut.rst)
        self.expected = []            # (input packet number, result bytes)
        self.packets_in = 0

    @classmethod
    async def start(cls, dut, params, seed):
        cocotb.start_soon(Clock(dut.clk, 8, unit="ns").start())
        dut.ctrl_addr.value = 0
        dut.ctrl_wdata.value = 0
        dut.ctrl_we.value = 0
        dut.ctrl_re.value = 0
        self = cls(dut, params, seed)
        dut.rst.value = 1
        await ClockCycles(dut.clk, 4)
        dut.rst.value = 0
        await RisingEdge(dut.clk)
        self.monitor = Monitor(dut)
        assert await self.read(SWITCH_REGISTERS["params"].address) == \
            switch_params_word(slots=params.slots, lanes=params.lanes)
        return self

    # -- control port ----------------------------------------------------------------------

    async def write(self, addr, value):
        dut = self.dut
        dut.ctrl_addr.value = addr
        dut.ctrl_wdata.value = value
        dut.ctrl_we.value = 1
        await RisingEdge(dut.clk)
        dut.ctrl_we.value = 0

    async def read(self, addr):
        dut = self.dut
        dut.ctrl_addr.value = addr
        dut.ctrl_re.value = 1
        await RisingEdge(dut.clk)
        dut.ctrl_re.value = 0
        await RisingEdge(dut.clk)
        return int(dut.ctrl_rdata.value)   # registered at the first edge, shown after it

    async def counters(self):
        return {name: await self.read(address)
                for name, address in SWITCH_REGISTERS["counter"].items()}

    # -- traffic ---------------------------------------------------------------------------

    def pauses(self, p_in, p_out):
        rng = self.rng
        for end, p in ((self.source, p_in), (self.sink, p_out)):
            if p:
                end.set_pause_generator(iter(lambda p=p: rng.random() < p, None))
            else:
                # cocotbext-axi's clear leaves ``pause`` at the generator's last value: a
                # sink left paused would stall the engine for good.
                end.clear_pause_generator()
                end.pause = False

    async def replay(self, steps):
        """Queue every step: packets into the DUT and the model; configurations between
        packets (the source is drained first, as the model sees them in order)."""
        for step in steps:
            if step[0] == "packet":
                image = step[1]
                for result in self.model.process(image):
                    self.expected.append((self.packets_in, result.to_bytes()))
                self.packets_in += 1
                await self.source.send(AxiStreamFrame(image))
            elif step[0] == "beats":    # (data, keep, last) beats: tkeep as given
                for result in self.model.process_beats(step[1]):
                    self.expected.append((self.packets_in, result.to_bytes()))
                self.packets_in += 1
                data = b"".join(d.to_bytes(32, "little") for d, _, _ in step[1])
                keep = [k >> j & 1 for _, k, _ in step[1] for j in range(32)]
                await self.source.send(AxiStreamFrame(data, tkeep=keep))
            else:
                job = step[1]
                await self.source.wait()
                regs = SWITCH_REGISTERS["job"]
                for address, value in configure_writes(step):
                    await self.write(address, value)
                # The engine stalls its input while it clears the job's slots; a driver
                # waits for that (so the benches' stall counts are the datapath's own).
                status = regs.address(job, "commit")
                while await self.read(status) & JobStatus.BUSY:
                    pass
                assert not await self.read(status) & JobStatus.REJECTED, "commit rejected"
                configure_model(self.model, step)

    async def settle(self, max_cycles=2_000_000):
        """Wait for the source to finish and the engine to be quiet; collect the results."""
        start = self.monitor.cycle
        while not self.source.idle():
            await RisingEdge(self.dut.clk)
            if self.monitor.cycle - start > max_cycles:
                raise AssertionError(f"the engine took no input for {max_cycles} cycles")
        start = self.monitor.cycle
        while self.monitor.cycle - self.monitor.last_activity < QUIET_CYCLES:
            await RisingEdge(self.dut.clk)
            if self.monitor.cycle - start > max_cycles:
                raise AssertionError(f"the engine did not go quiet in {max_cycles} cycles")
        frames = []
        while not self.sink.empty():
            frames.append(bytes(self.sink.recv_nowait().tdata))
        return frames

    async def check(self, what=""):
        """Compare every result byte and every counter with the model."""
        frames = await self.settle()
        want = [image for _, image in self.expected]
        for i, (got, exp) in enumerate(zip(frames, want)):
            if got != exp:
                raise AssertionError(
                    f"{what}: result {i} (from input packet {self.expected[i][0]}) differs\n"
                    f"  got  {describe(got)}\n  want {describe(exp)}")
        assert len(frames) == len(want), \
            f"{what}: {len(frames)} results, the model gives {len(want)}"
        got_counters = await self.counters()
        assert got_counters == self.model.counters, \
            f"{what}: counters differ\n  got  {got_counters}\n  want {self.model.counters}"
        return frames

    def stats(self):
        """Input beats per clock (first to last input beat) and result latencies."""
        m = self.monitor
        span = m.in_last_cycles[-1] - m.in_first_cycle + 1 if m.in_last_cycles else 0
        latencies = [m.out_first_cycles[i] - m.in_last_cycles[src]
                     for i, (src, _) in enumerate(self.expected)
                     if i < len(m.out_first_cycles)]
        return {
            "in_beats": m.in_beats, "in_span_cycles": span,
            "in_beats_per_cycle": m.in_beats / span if span else None,
            "in_stall_cycles": m.in_stalls, "out_beats": m.out_beats,
            "results": len(self.expected),
            "latency_min": min(latencies, default=None),
            "latency_max": max(latencies, default=None),
        }


def describe(image):
    try:
        return str(Packet.from_bytes(image))
    except ValueError:
        return f"<{len(image)} bytes>"


def engine_params():
    return EngineParams(**test_params().get("engine", {}))


# ------------------------------------------------------------------------------------------

@cocotb.test()
async def random_traffic(dut):
    """Four jobs of 32, 2, 7 and 13 workers (or fewer, per max_workers) share the pool;
    protocol traffic with retransmissions, bad packets and mixed ops, random pauses."""
    p = test_params()
    params = engine_params()
    sw = await Switch.start(dut, params, p.get("seed", 1))
    sw.pauses(p.get("p_in", 0.0), p.get("p_out", 0.0))
    counts = [min(c, params.max_workers) for c in p.get("workers", [32, 2, 7, 13])]
    counts = counts[:params.jobs]
    steps = configure_steps(params, counts)
    share = params.slots // len(counts)
    jobs = {j: (n, range(j * share, (j + 1) * share)) for j, n in enumerate(counts)}
    steps += protocol_traffic(sw.rng, params, jobs=jobs, packets=p.get("packets", 600),
                              duplicate=p.get("duplicate", 0.05), bad=p.get("bad", 0.05),
                              mixed=p.get("mixed", 0.02))
    await sw.replay(steps)
    await sw.check("random traffic")
    assert sw.model.counters["results_multicast"] > 0
    dut._log.info("random traffic: %s", sw.stats())


@cocotb.test()
async def hammer(dut):
    """All workers of a job on one slot, back to back, versions alternating; then slot
    reuse after a reconfiguration with another worker count."""
    p = test_params()
    params = engine_params()
    sw = await Switch.start(dut, params, p.get("seed", 2))
    sw.pauses(p.get("p_in", 0.0), p.get("p_out", 0.0))
    steps = []
    for workers in p.get("workers", [params.max_workers, 2, 1]):
        slot = sw.rng.randrange(params.slots)
        steps += [("configure", 0, workers, 0, params.slots)]
        steps += hammer_traffic(sw.rng, params, job=0, workers=workers, slot=slot,
                                rounds=p.get("rounds", 4))
    await sw.replay(steps)
    await sw.check("hammer")
    stats = sw.stats()
    dut._log.info("hammer: %s", stats)
    if not p.get("p_in") and not p.get("p_out"):
        # Nothing in the engine may slow the input down under this pattern.
        assert stats["in_stall_cycles"] == 0, stats
    else:
        assert stats["in_beats"] == sum(len(s[1]) // 32 for s in steps if s[0] == "packet")


@cocotb.test()
async def bad_packets(dut):
    """Every bad-packet class between good packets, each slot's state must be untouched."""
    p = test_params()
    params = engine_params()
    sw = await Switch.start(dut, params, p.get("seed", 3))
    sw.pauses(p.get("p_in", 0.0), p.get("p_out", 0.0))
    rng = sw.rng
    workers = min(4, params.max_workers)
    share = params.slots // 2
    # Job 1 is configured too, so "another job's slot" is a real, live slot.
    steps = [("configure", 0, workers, 0, share), ("configure", 1, 2, share, share)]
    rounds = {}
    for _ in range(p.get("repeats", 4)):
        for kind in BAD_CLASSES:
            slot = rng.randrange(share)
            version = rounds.get(slot, 0)
            # Half a round, the bad packet, the other half: a dropped packet that touched
            # the slot would show in the result.
            order = list(range(workers))
            rng.shuffle(order)
            op = rng.choice([2, 3])
            good = [("packet", data_packet(rng, params, job=0, worker=w, slot=slot,
                                           slot_version=version, op=op)) for w in order]
            bad = ("packet", bad_packet(rng, params, kind, job=0, workers=workers,
                                        slot_range=range(0, share), unconfigured_job=2,
                                        version=version))
            mixed = ("packet", data_packet(rng, params, job=0, worker=order[-1], slot=slot,
                                           slot_version=version, op=5 - op))
            steps += good[:workers // 2] + [bad, mixed] + good[workers // 2:]
            rounds[slot] = version ^ 1
    await sw.replay(steps)
    await sw.check("bad packets")
    # A parent's result needs an upstream: tree_leaf exercises those two drops.
    drops = {k: v for k, v in sw.model.counters.items()
             if k.startswith("drop_") and not k.startswith("drop_result_")}
    assert all(drops.values()), f"a drop class was never exercised: {drops}"
    dut._log.info("bad packets: %s %s", drops, sw.stats())


@cocotb.test()
async def chaos(dut):
    """Random workers, slots, versions and ops on three slots: the odd state transitions."""
    p = test_params()
    params = engine_params()
    sw = await Switch.start(dut, params, p.get("seed", 4))
    sw.pauses(p.get("p_in", 0.0), p.get("p_out", 0.0))
    steps = [("configure", 1, 3, 2, 3)]
    steps += chaos_traffic(sw.rng, params, job=1, workers=3, slot_range=range(2, 5),
                           packets=p.get("packets", 300))
    steps += [("configure", 1, 0, 0, 0)]   # clear: later packets are unconfigured_job
    steps += chaos_traffic(sw.rng, params, job=1, workers=3, slot_range=range(2, 5),
                           packets=10)
    await sw.replay(steps)
    await sw.check("chaos")
    assert sw.model.counters["drop_unconfigured_job"] == 10


@cocotb.test()
async def tree_leaf(dut):
    """A leaf of a tree (aggregator-protocol.md section 4) beside a job without an upstream,
    at full size: completions and resends of pending rounds go upstream, results from
    upstream make rounds final (duplicates and unexpected ones dropped), then the upstream
    is configured away and the job completes final again."""
    from host.golden.aggregator import Upstream
    p = test_params()
    params = engine_params()
    sw = await Switch.start(dut, params, p.get("seed", 8))
    sw.pauses(p.get("p_in", 0.0), p.get("p_out", 0.0))
    share = params.slots // 2
    workers = min(5, params.max_workers)
    upstream = Upstream(ip=0x0A00_00F0, port=47572, job=sw.rng.randrange(256),
                        worker=sw.rng.randrange(256))
    steps = [("configure", 2, workers, 0, share, upstream), ("configure", 0, 3, share, share)]
    steps += tree_traffic(sw.rng, params, job=2, workers=workers, slot_range=range(0, share),
                          packets=p.get("packets", 300))
    steps += protocol_traffic(sw.rng, params, jobs={0: (3, range(share, 2 * share))},
                              packets=40)
    steps += tree_traffic(sw.rng, params, job=0, workers=3, slot_range=range(share, 2 * share),
                          packets=20)
    steps += [("configure", 2, workers, 0, share, None)]
    steps += hammer_traffic(sw.rng, params, job=2, workers=workers, slot=1, rounds=2)
    await sw.replay(steps)
    await sw.check("tree leaf")
    counters = sw.model.counters
    for name in ("upstream_sent", "upstream_resent", "results_upstream",
                 "drop_result_duplicate", "drop_result_unexpected", "results_unicast"):
        assert counters[name] > 0, (name, counters)
    dut._log.info("tree leaf: %s", {k: v for k, v in counters.items() if v})


@cocotb.test()
async def measure(dut):
    """Throughput and latency numbers for the benchmark (JSON to params["report"])."""
    p = test_params()
    params = engine_params()
    report = {"engine": params.as_dict()}
    cases = [
        # name, pauses (in, out), builder
        ("hammer", (0.0, 0.0), lambda sw: [("configure", 0, params.max_workers, 0,
                                            params.slots)] + hammer_traffic(
            sw.rng, params, job=0, workers=params.max_workers, slot=0,
            rounds=p.get("rounds", 8))),
        ("hammer_n1", (0.0, 0.0), lambda sw: [("configure", 0, 1, 0, params.slots)]
         + hammer_traffic(sw.rng, params, job=0, workers=1, slot=0,
                          rounds=p.get("rounds", 8) * 8)),
        ("hammer_n1_backpressure", (0.0, 0.5), lambda sw: [("configure", 0, 1, 0,
                                                            params.slots)]
         + hammer_traffic(sw.rng, params, job=0, workers=1, slot=0,
                          rounds=p.get("rounds", 8) * 8)),
        ("random", (0.0, 0.0), lambda sw: random_steps(sw, params, p)),
        ("random_backpressure", (0.0, 0.5), lambda sw: random_steps(sw, params, p)),
    ]
    sw = await Switch.start(dut, params, p.get("seed", 5))
    for name, (p_in, p_out), build in cases:
        sw.pauses(p_in, p_out)
        sw.monitor.stop()
        sw.monitor = Monitor(dut)           # fresh statistics
        sw.expected = []
        sw.packets_in = 0
        steps = build(sw)
        began, cycle0 = time.perf_counter(), sw.monitor.cycle
        await sw.replay(steps)
        await sw.check(name)
        wall = time.perf_counter() - began
        stats = sw.stats()
        stats["sim_cycles_per_second"] = (sw.monitor.cycle - cycle0) / wall
        report[name] = stats
    if p.get("report"):
        with open(p["report"], "w") as f:
            json.dump(report, f, indent=2)
    dut._log.warning("measure: %s", json.dumps(report))


def random_steps(sw, params, p):
    counts = [min(c, params.max_workers) for c in (32, 2, 7, 13)][:params.jobs]
    share = params.slots // len(counts)
    jobs = {j: (n, range(j * share, (j + 1) * share)) for j, n in enumerate(counts)}
    return configure_steps(params, counts) + protocol_traffic(
        sw.rng, params, jobs=jobs, packets=p.get("packets", 400), duplicate=0.0, bad=0.05,
        mixed=0.02)
