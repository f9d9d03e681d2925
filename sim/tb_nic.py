"""cocotb testbenches of the exported NIC top (``nic_top``: ``hdl/nic/engine.py`` behind ``hdl/export.py``) on Verilator.

Every output byte is compared with the golden model (``host.golden.inceptionn.nic_tx`` /
``nic_rx``, packet by packet), and the counters read back through the ``ctrl`` port with the
golden causes. Launched from ``tests/hdl/nic/test_nic_top.py`` through ``sim.runner.run_cocotb``;
parameters (seed, packet counts, pause probabilities, where to write measurements) arrive
through :func:`sim.runner.test_params`.
"""
from __future__ import annotations

import json
import random
import time

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge, with_timeout
from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamSink, AxiStreamSource

from contract.counters import NIC_RX_COUNTERS, NIC_TX_COUNTERS
from contract.header import BEAT_BYTES, PacketType
from contract.packet import Packet
from contract.registers import NIC_REGISTERS
from host.golden.inceptionn import MAX_COUNT, nic_rx, nic_tx, quantize
from sim.nic_stimulus import (
    gradient_words,
    nasty_words,
    raw_words,
    rx_traffic,
    tx_packet,
    tx_traffic,
)
from sim.runner import test_params

CLOCK_NS = 8               # 125 MHz, the ECP5 target
#: Generous per-beat time allowance before a test declares the engine hung.
TIMEOUT_PER_BEAT_NS = 20 * CLOCK_NS


def pause_generator(rng, probability):
    """Random idle (source) or back-pressure (sink) cycles, sometimes in bursts."""
    while True:
        if rng.random() < probability:
            for _ in range(1 if rng.random() < 0.8 else rng.randint(2, 12)):
                yield True
        else:
            yield False


class NicBench:
    """Clock, reset, the four AXI-Stream endpoints and the counter port of the NIC top."""

    def __init__(self, dut):
        self.dut = dut
        self.tx_in = AxiStreamSource(AxiStreamBus.from_prefix(dut, "tx_s_axis"), dut.clk, dut.rst)
        self.tx_out = AxiStreamSink(AxiStreamBus.from_prefix(dut, "tx_m_axis"), dut.clk, dut.rst)
        self.rx_in = AxiStreamSource(AxiStreamBus.from_prefix(dut, "rx_s_axis"), dut.clk, dut.rst)
        self.rx_out = AxiStreamSink(AxiStreamBus.from_prefix(dut, "rx_m_axis"), dut.clk, dut.rst)
        for endpoint in (self.tx_in, self.tx_out, self.rx_in, self.rx_out):
            endpoint.log.setLevel("WARNING")
        dut.ctrl_re.value = 0
        dut.ctrl_addr.value = 0

    async def reset(self):
        self.dut.rst.value = 1
        await ClockCycles(self.dut.clk, 3)
        self.dut.rst.value = 0
        await ClockCycles(self.dut.clk, 2)

    def set_pauses(self, seed, p_in, p_out):
        rng = random.Random(seed)
        for source in (self.tx_in, self.rx_in):
            source.set_pause_generator(pause_generator(random.Random(rng.random()), p_in)
                                       if p_in else None)
        for sink in (self.tx_out, self.rx_out):
            sink.set_pause_generator(pause_generator(random.Random(rng.random()), p_out)
                                     if p_out else None)

    async def read_register(self, address):
        """One read on the ctrl port: ``ctrl_rdata`` is valid the cycle after ``ctrl_re``."""
        self.dut.ctrl_addr.value = address
        self.dut.ctrl_re.value = 1
        await RisingEdge(self.dut.clk)
        self.dut.ctrl_re.value = 0
        await RisingEdge(self.dut.clk)      # sampled right after the edge: the registered value
        return int(self.dut.ctrl_rdata.value)

    async def counters(self):
        await ClockCycles(self.dut.clk, 4)   # let the last strobes land
        tx = {name: await self.read_register(address)
              for name, address in NIC_REGISTERS["tx"].items()}
        rx = {name: await self.read_register(address)
              for name, address in NIC_REGISTERS["rx"].items()}
        return tx, rx


async def receive_packet(sink, beats_hint):
    """Next packet from ``sink``, with its ``tkeep`` checked: every beat but the last fully
    kept, the last one kept on a prefix of whole 32-bit words."""
    frame = await with_timeout(sink.recv(compact=False),
                               max(beats_hint, 8) * TIMEOUT_PER_BEAT_NS + 20000, "ns")
    data, keep = bytes(frame.tdata), list(frame.tkeep)
    assert len(data) % BEAT_BYTES == 0 and len(keep) == len(data)
    body, tail = keep[:-BEAT_BYTES], keep[-BEAT_BYTES:]
    assert all(body), "tkeep clear on a beat before the last"
    kept = sum(tail)
    assert tail == [1] * kept + [0] * (BEAT_BYTES - kept) and kept % 4 == 0, \
        f"last beat tkeep {tail} is not a prefix of whole 32-bit words"
    return Packet.from_bytes(data[:len(data) - BEAT_BYTES + kept])


def describe_mismatch(i, sent, want, got):
    w, g = want.to_bytes(), got.to_bytes()
    first = next((j for j in range(min(len(w), len(g))) if w[j] != g[j]), min(len(w), len(g)))
    return (f"packet {i}: {sent}\n  expected {want} ({len(w)} bytes)\n  got      {got} "
            f"({len(g)} bytes)\n  first difference at byte {first} (beat {first // 32}): "
            f"expected {w[first:first + 8].hex()} got {g[first:first + 8].hex()}")


async def check_stream(sink, sent, expected, beats_of):
    """Receive ``len(expected)`` packets and compare each with the golden one."""
    for i, (source_packet, want) in enumerate(zip(sent, expected)):
        got = await receive_packet(sink, beats_of(source_packet))
        assert got.to_bytes() == want.to_bytes(), describe_mismatch(i, source_packet, want, got)


def check_counters(got, names, causes, what):
    want = expected_counters(names, causes)
    assert got == want, f"{what} counters {got} != golden {want}"


def expected_counters(names, causes):
    counts = dict.fromkeys(names, 0)
    counts["packets"] = len(causes)
    for cause in causes:
        counts[cause] += 1
    return counts


def send_all(source, packets):
    for p in packets:
        source.send_nowait(AxiStreamFrame(p.to_bytes()))


def nasty_tx_packets(rng):
    """For every k: one packet of all the special and boundary words (shuffled, a length
    that is not a multiple of 8), one all-raw, one all-zero; then packets of the NIC's
    largest count and one value more."""
    out = []
    for k in range(1, 16):
        words = nasty_words(k)
        out.append(tx_packet(rng.permutation(words)[:words.size - (words.size % 8 == 0)], k))
        out.append(tx_packet(raw_words(rng, 8 * int(rng.integers(1, 20)) + k % 8), k))
        out.append(tx_packet(np.zeros(int(rng.integers(1, 40)), dtype=np.uint32), k))
    # The size limit and one past it: the larger packet leaves raw (too_large), and the
    # receive path must take whatever the transmit path sends.
    out += [tx_packet(raw_words(rng, MAX_COUNT), 10), tx_packet(raw_words(rng, MAX_COUNT + 1), 9)]
    return out


def edge_rx_packets(rng):
    """Receive-path corner cases: the largest packets (all raw, count = MAX_COUNT, back to
    back), one count too many, header-only packets (good, with a stray word, with a count),
    and a bypassed packet longer than the packet buffer (626 beats > 512)."""
    big = [nic_tx(tx_packet(raw_words(rng, MAX_COUNT), 1 + i, seq=i))[0] for i in range(2)]
    empty = nic_tx(tx_packet(np.zeros(0, dtype=np.uint32), 10))[0]
    jumbo = tx_packet(raw_words(rng, 4999), 10, type=PacketType.AGG_ADD_I32)
    return big + [
        Packet(big[0].header.replace(count=MAX_COUNT + 1), big[0].payload),
        empty,
        Packet(empty.header, bytes(4)),
        Packet(empty.header.replace(count=1), b""),
        Packet(empty.header.replace(count=8), bytes(4)),
        jumbo,
    ]


@cocotb.test()
async def tx_bit_exact(dut):
    """Transmit path: random and adversarial packets with idle cycles and back-pressure."""
    params = test_params()
    rng = np.random.default_rng(params.get("seed", 1))
    cocotb.start_soon(Clock(dut.clk, CLOCK_NS, unit="ns").start())
    tb = NicBench(dut)
    await tb.reset()
    tb.set_pauses(params.get("seed", 1), params.get("p_in", 0.2), params.get("p_out", 0.2))

    traffic = nasty_tx_packets(rng) + tx_traffic(rng, params.get("packets", 120))
    if params.get("shuffle", True):
        traffic = [traffic[i] for i in rng.permutation(len(traffic))]
    golden = [nic_tx(p) for p in traffic]
    send_all(tb.tx_in, traffic)
    await check_stream(tb.tx_out, traffic, [g[0] for g in golden], lambda p: p.beats)
    tx, _ = await tb.counters()
    check_counters(tx, NIC_TX_COUNTERS, [g[1] for g in golden], "tx")
    dut._log.warning("tx: %d packets bit-exact, counters %s", len(traffic), tx)


@cocotb.test()
async def rx_bit_exact(dut):
    """Receive path: good, malformed and bypassed packets; drops never spill over."""
    params = test_params()
    rng = np.random.default_rng(params.get("seed", 2))
    cocotb.start_soon(Clock(dut.clk, CLOCK_NS, unit="ns").start())
    tb = NicBench(dut)
    await tb.reset()
    tb.set_pauses(params.get("seed", 2), params.get("p_in", 0.2), params.get("p_out", 0.2))

    traffic = rx_traffic(rng, params.get("packets", 150))
    for special in edge_rx_packets(rng):
        traffic.insert(int(rng.integers(0, len(traffic) + 1)), special)
    golden = [nic_rx(p) for p in traffic]
    kept = [(p, out) for p, (out, _) in zip(traffic, golden) if out is not None]
    send_all(tb.rx_in, traffic)
    await check_stream(tb.rx_out, [p for p, _ in kept], [o for _, o in kept],
                       lambda p: 1 + 9 * p.header.count // 8 if p.header.count < 1 << 20
                       else p.beats)
    _, rx = await tb.counters()
    check_counters(rx, NIC_RX_COUNTERS, [g[1] for g in golden], "rx")
    # Nothing else may come out (a dropped packet must not leak a single beat).
    await ClockCycles(dut.clk, 50)
    assert tb.rx_out.empty() and not tb.rx_out.active, "extra output after the last packet"
    dut._log.warning("rx: %d packets (%d out) bit-exact, counters %s", len(traffic), len(kept), rx)


@cocotb.test()
async def round_trip(dut):
    """Transmit output fed into the receive input: values come back quantised, bit-exact."""
    params = test_params()
    rng = np.random.default_rng(params.get("seed", 3))
    cocotb.start_soon(Clock(dut.clk, CLOCK_NS, unit="ns").start())
    tb = NicBench(dut)
    await tb.reset()
    tb.set_pauses(params.get("seed", 3), params.get("p_in", 0.2), params.get("p_out", 0.2))

    traffic = tx_traffic(rng, params.get("packets", 60))
    # The largest packet and one past it: the receive path takes whatever the transmit path
    # sends (spec section 4), the second one raw.
    for n in (MAX_COUNT, MAX_COUNT + 1):
        traffic.insert(int(rng.integers(0, len(traffic) + 1)),
                       tx_packet(gradient_words(rng, n), 10, seq=n))
    sent_tx = [nic_tx(p) for p in traffic]
    golden = [nic_rx(out) for out, _ in sent_tx]
    assert not any(cause == "drop_too_large" for _, cause in golden)
    kept = [(p, out) for p, (out, _) in zip(traffic, golden) if out is not None]

    async def forward():
        for i, (p, (want, _)) in enumerate(zip(traffic, sent_tx)):
            frame = await tb.tx_out.recv()
            got = Packet.from_bytes(bytes(frame.tdata))
            assert got == want, describe_mismatch(i, p, want, got)
            await tb.rx_in.send(frame)

    forwarder = cocotb.start_soon(forward())
    send_all(tb.tx_in, traffic)
    await check_stream(tb.rx_out, [p for p, _ in kept], [o for _, o in kept],
                       lambda p: 2 * p.beats)
    await forwarder
    tx, rx = await tb.counters()
    check_counters(tx, NIC_TX_COUNTERS, [c for _, c in sent_tx], "tx")
    check_counters(rx, NIC_RX_COUNTERS, [c for _, c in golden], "rx")
    # The decompressed values are the golden quantisation of what was sent.
    for p, out in kept:
        if p.header.type == PacketType.RAW_F32 and out.header.type == PacketType.RAW_F32 \
                and nic_tx(p)[1] == "compressed":
            q = quantize(np.frombuffer(p.payload, dtype="<u4"), p.header.k).view(np.uint32)
            assert np.array_equal(np.frombuffer(out.payload, dtype="<u4"), q)
    dut._log.warning("round trip: %d packets, %d out", len(traffic), len(kept))


# -- measurements --------------------------------------------------------------------------

class HandshakeMonitor:
    """Counts clock cycles and records, per AXI-Stream port, the cycle of every beat and of
    every packet's first beat (``tvalid & tready`` sampled at the rising edge)."""

    PORTS = ("tx_s_axis", "tx_m_axis", "rx_s_axis", "rx_m_axis")

    def __init__(self, dut):
        self.dut = dut
        self.cycle = 0
        self.beats = {p: [] for p in self.PORTS}
        self.heads = {p: [] for p in self.PORTS}
        self._task = cocotb.start_soon(self._run())

    async def _run(self):
        dut = self.dut
        handles = {p: (getattr(dut, f"{p}_tvalid"), getattr(dut, f"{p}_tready"),
                       getattr(dut, f"{p}_tlast")) for p in self.PORTS}
        at_head = dict.fromkeys(self.PORTS, True)
        while True:
            await RisingEdge(dut.clk)
            self.cycle += 1
            for port, (valid, ready, last) in handles.items():
                if valid.value and ready.value:
                    self.beats[port].append(self.cycle)
                    if at_head[port]:
                        self.heads[port].append(self.cycle)
                    at_head[port] = bool(last.value)

    def stop(self):
        self._task.cancel()

    def rate(self, port):
        """Beats per clock between the first and the last beat on ``port``."""
        b = self.beats[port]
        return len(b) / (b[-1] - b[0] + 1) if len(b) > 1 else float("nan")


async def measure(tb, dut, source, sink, packets, in_port, out_port, expected):
    monitor = HandshakeMonitor(dut)
    start = time.perf_counter()
    send_all(source, packets)
    await check_stream(sink, packets, expected, lambda p: 2 * p.beats)
    await ClockCycles(dut.clk, 2)
    seconds = time.perf_counter() - start
    monitor.stop()
    latency = [o - i for i, o in zip(monitor.heads[in_port], monitor.heads[out_port])]
    return {
        "packets": len(packets),
        "beats_in": len(monitor.beats[in_port]),
        "beats_out": len(monitor.beats[out_port]),
        "in_beats_per_clock": monitor.rate(in_port),
        "out_beats_per_clock": monitor.rate(out_port),
        "cycles": monitor.cycle,
        "latency_cycles_first": latency[0] if latency else None,
        "latency_cycles_mean": float(np.mean(latency)) if latency else None,
        "sim_cycles_per_second": monitor.cycle / seconds,
    }


@cocotb.test()
async def throughput(dut):
    """Cycles per beat, latency and simulation speed, with no idle cycles or back-pressure.

    Baseline for the simulation speed: the same Verilator model with only the cocotb clock
    running (no drivers, no traffic) for the same number of cycles.
    """
    params = test_params()
    rng = np.random.default_rng(params.get("seed", 4))
    packets = params.get("packets", 4)
    values = params.get("values", MAX_COUNT)
    cocotb.start_soon(Clock(dut.clk, CLOCK_NS, unit="ns").start())
    dut.ctrl_re.value = 0
    dut.rst.value = 1
    baseline_cycles = params.get("baseline_cycles", 20000)
    start = time.perf_counter()
    await ClockCycles(dut.clk, baseline_cycles)
    baseline = baseline_cycles / (time.perf_counter() - start)

    tb = NicBench(dut)
    await tb.reset()
    results = {"baseline_clock_only_cycles_per_second": baseline}
    workloads = {
        "gradients": lambda: gradient_words(rng, values, 1e-3),
        "all_raw": lambda: raw_words(rng, values),
        "all_zero": lambda: np.zeros(values, dtype=np.uint32),
    }
    for name, make in workloads.items():
        raw = [tx_packet(make(), 10, seq=i) for i in range(packets)]
        compressed = [nic_tx(p)[0] for p in raw]
        results[f"tx_{name}"] = await measure(tb, dut, tb.tx_in, tb.tx_out, raw,
                                              "tx_s_axis", "tx_m_axis", compressed)
        results[f"rx_{name}"] = await measure(
            tb, dut, tb.rx_in, tb.rx_out, compressed, "rx_s_axis", "rx_m_axis",
            [nic_rx(p)[0] for p in compressed])
        results[f"tx_{name}"]["compression_ratio"] = \
            sum(len(p.payload) for p in raw) / max(1, sum(len(p.payload) for p in compressed))
    bypass = [tx_packet(raw_words(rng, values), 10, seq=i, flags=0) for i in range(packets)]
    results["tx_bypass"] = await measure(tb, dut, tb.tx_in, tb.tx_out, bypass,
                                         "tx_s_axis", "tx_m_axis", bypass)
    results["rx_bypass"] = await measure(tb, dut, tb.rx_in, tb.rx_out, bypass,
                                         "rx_s_axis", "rx_m_axis", bypass)
    for key, value in results.items():
        dut._log.warning("%s: %s", key, value)
    # The throughput contract, in clock cycles (exact: no wall clock involved).
    for name in ("tx_gradients", "tx_all_zero", "tx_bypass", "rx_bypass"):
        assert results[name]["in_beats_per_clock"] == 1.0, (name, results[name])
    for name in ("tx_bypass", "rx_bypass", "tx_all_raw"):
        assert results[name]["out_beats_per_clock"] == 1.0, (name, results[name])
    assert results["tx_all_raw"]["in_beats_per_clock"] >= 16 / 17, results["tx_all_raw"]
    # Receive output: one beat per clock within a packet; at most one bubble per packet.
    for name in ("rx_gradients", "rx_all_zero"):
        r = results[name]
        assert r["out_beats_per_clock"] >= r["beats_out"] / (r["beats_out"] + r["packets"]), r
    if "results" in params:
        with open(params["results"], "w") as f:
            json.dump(results, f, indent=2)
