"""Shared helpers for tests in the Amaranth simulator.

Stream producer/consumer testbenches with random stalls on both sides, combinational
evaluation, event counting and AXI-Stream beat helpers. Every Amaranth-simulator test of
the project drives its components through these, so each idiom exists once. (The cocotb
benches, one class per exported top, live in ``sim/tb_*.py``.)
"""
import random

from amaranth.sim import Simulator

__all__ = ["run", "run_stream", "comb_eval", "consume", "count_events", "RegisterPort",
           "packet_beats", "collect_axis", "reassemble", "beat_words", "send_items",
           "take_items", "datagram_words", "words_to_bytes"]

LANES = 8


def run(dut, *testbenches, period=1e-8, clocked=True, background=()):
    """Simulate ``dut`` with a clock of ``period`` (none if not ``clocked``) until every
    testbench returns; ``background`` testbenches run alongside without holding it up."""
    sim = Simulator(dut)
    if clocked:
        sim.add_clock(period)
    for testbench in testbenches:
        sim.add_testbench(testbench)
    for testbench in background:
        sim.add_testbench(testbench, background=True)
    sim.run()


def run_stream(dut, inputs, set_input, collect, expected_outputs, *, seed, p_stall=0.3,
               p_block=0.3, extra=None, timeout_cycles=200000):
    """Drive ``inputs`` into ``dut.i`` (idle cycles with probability ``p_stall``) and collect
    from ``dut.o`` (not ready with probability ``p_block``) until ``expected_outputs`` items.

    ``set_input(ctx, item)`` sets the payload of one input item; ``collect(payload)`` turns
    a sampled output payload into the value returned in the list; ``extra`` is a background
    testbench (an event counter, say).
    """
    rng = random.Random(seed)
    got = []

    async def producer(ctx):
        for item in inputs:
            while rng.random() < p_stall:
                await ctx.tick()
            ctx.set(dut.i.valid, 1)
            set_input(ctx, item)
            await ctx.tick().until(dut.i.ready)
            ctx.set(dut.i.valid, 0)

    async def consumer(ctx):
        cycles = 0
        while len(got) < expected_outputs:
            ctx.set(dut.o.ready, rng.random() >= p_block)
            _, _, payload, valid, ready = await ctx.tick().sample(dut.o.p, dut.o.valid,
                                                                  dut.o.ready)
            if valid and ready:
                got.append(collect(payload))
            cycles += 1
            assert cycles < timeout_cycles, "no progress: the engine hangs"

    run(dut, producer, consumer, background=(extra,) if extra else ())
    return got


def comb_eval(dut, cases, apply, read):
    """Evaluate a combinational component on every case; return the outputs."""
    results = []

    async def bench(ctx):
        for case in cases:
            apply(ctx, case)
            await ctx.delay(1e-9)
            results.append(read(ctx))

    run(dut, bench, clocked=False)
    return results


def consume(ctx, stream, n, rng, ready_rate=0.7):
    """Async helper: take ``n`` AXI beats ``(data, keep, last)`` from ``stream`` with random
    back-pressure (ready with probability ``ready_rate``)."""
    async def take():
        got = []
        while len(got) < n:
            ctx.set(stream.ready, rng.random() < ready_rate)
            _, _, payload, valid, ready = await ctx.tick().sample(stream.payload, stream.valid,
                                                                  stream.ready)
            if valid and ready:
                got.append(collect_axis(payload))
        return got
    return take()


def count_events(dut, names, tally):
    """Background testbench: add up the one-cycle counter strobes of ``dut.events``."""
    async def watch(ctx):
        fields = [getattr(dut.events, name) for name in names]
        async for _, _, *strobes in ctx.tick().sample(*fields):
            for name, strobe in zip(names, strobes):
                tally[name] += int(strobe)
    return watch


class RegisterPort:
    """Drives the register port ``ctrl`` (:class:`hdl.ctrl_port.RegisterPort`) of a component
    from an Amaranth testbench."""

    def __init__(self, ctx, dut):
        self.ctx, self.dut = ctx, dut

    async def write(self, addr, value):
        ctx, dut = self.ctx, self.dut
        ctx.set(dut.ctrl.addr, addr)
        ctx.set(dut.ctrl.wdata, value)
        ctx.set(dut.ctrl.we, 1)
        await ctx.tick()
        ctx.set(dut.ctrl.we, 0)

    async def read(self, addr):
        ctx, dut = self.ctx, self.dut
        ctx.set(dut.ctrl.addr, addr)
        ctx.set(dut.ctrl.re, 1)
        await ctx.tick()
        ctx.set(dut.ctrl.re, 0)
        return ctx.get(dut.ctrl.rdata)   # registered on the edge: valid the cycle after re


def beat_words(beat_data):
    """The eight 32-bit lanes of a 256-bit beat, lane 0 first."""
    return [(int(beat_data) >> (32 * j)) & 0xFFFFFFFF for j in range(LANES)]


def packet_beats(packet):
    """A :class:`~contract.packet.Packet` as AXI beat payloads for ``ctx.set``."""
    return [{"data": d, "keep": k, "last": int(last)} for d, k, last in packet.to_beats()]


def collect_axis(payload):
    """A sampled AXI beat payload as ``(data, keep, last)`` integers."""
    return int(payload.data), int(payload.keep), int(payload.last)


def reassemble(beats):
    """Packets (as bytes, kept bytes only) from collected ``(data, keep, last)`` beats."""
    packets, current = [], b""
    for data, keep, last in beats:
        raw = data.to_bytes(32, "little")
        current += bytes(raw[i] for i in range(32) if keep >> i & 1)
        if last:
            packets.append(current)
            current = b""
    return packets


# -- streams by name (components with several ports) and datagram words ---------------------

async def send_items(ctx, port, items, rng, p_stall=0.0):
    """Drive ``items`` (payload values for ``ctx.set``) into the stream ``port``, idling
    with probability ``p_stall`` before each; returns when the last one is taken."""
    for item in items:
        while rng.random() < p_stall:
            await ctx.tick()
        ctx.set(port.valid, 1)
        ctx.set(port.p, item)
        await ctx.tick().until(port.ready)
        ctx.set(port.valid, 0)


async def take_items(ctx, port, rng, *, count=None, until=None, p_block=0.0,
                     timeout_cycles=100000, convert=None):
    """Take payloads from the stream ``port`` (not ready with probability ``p_block``) until
    ``count`` items, or until ``until(item)`` is true for one; ``convert`` maps a sampled
    payload to the returned item (default: the sampled value itself)."""
    got = []
    for _ in range(timeout_cycles):
        ctx.set(port.ready, rng.random() >= p_block)
        _, _, payload, valid, ready = await ctx.tick().sample(port.p, port.valid, port.ready)
        if valid and ready:
            item = convert(payload) if convert else payload
            got.append(item)
            if (count is not None and len(got) == count) or (until and until(item)):
                ctx.set(port.ready, 0)
                return got
    raise AssertionError(f"no progress after {timeout_cycles} cycles ({len(got)} items)")


def datagram_words(payload, meta, *, rng=None, error=False):
    """A datagram as the core's 32-bit words (``RxBeat``/``TxBeat`` payload dicts): byte 0 in
    bits 7..0, ``last_be`` one-hot on the last byte (0 for an empty datagram), the same
    ``meta`` on every word. With ``rng``, the bytes past the end of the last word are random
    (as on the wire: the core does not clear them); ``error`` marks the last word."""
    words = []
    n = len(payload)
    count = max(1, -(-n // 4))
    for w in range(count):
        chunk = bytes(payload[4 * w:4 * w + 4])
        filler = bytes(rng.getrandbits(8) for _ in range(4 - len(chunk))) if rng else b""
        word = int.from_bytes(chunk + filler + bytes(4), "little") & 0xFFFFFFFF
        last = w == count - 1
        last_be = (1 << (len(chunk) - 1)) if (last and chunk) else 0
        item = {"data": word, "last_be": last_be, "last": int(last), "meta": dict(meta)}
        if error is not None:
            item["error"] = int(last and error)
        words.append(item)
    return words


def words_to_bytes(words, length):
    """Bytes of a datagram from sampled 32-bit word payloads, cut at ``length``."""
    raw = b"".join(int(w.data).to_bytes(4, "little") for w in words)
    return raw[:length]
