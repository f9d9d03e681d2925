# amaranth: UnusedElaboratable=no
"""Fast Amaranth-simulator tests of the aggregator's sub-blocks (and its parameter checks).

The whole engine is checked against the reference model on Verilator in
``tests/test_switch_cocotb.py``; here each block is checked alone against a few lines of
software that state what it must do.
"""
import random

import pytest
from amaranth import unsigned
from amaranth.sim import Simulator

from hdl.switch.control import JOB_STRIDE, REG_COUNTERS, REG_PARAMS, AggControl
from hdl.switch.header_check import CAUSE, CAUSE_NONE, HeaderCheck
from hdl.switch.aggregator import Aggregator, check_parameters, slot_state_layout
from hdl.switch.lane_alu import LaneALU, lane_alu_reference
from hdl.switch.slot_memory import ForwardedMemory
from host.aggregator import AggregatorModel
from contract.counters import AGG_COUNTERS, AGG_DROP_CAUSES
from contract.header import MAGIC, VERSION, Header, PacketType
from contract.packet import Packet
from sim.switch_traffic import EngineParams, chaos_traffic, hammer_traffic, protocol_traffic


def run(dut, *testbenches, clocked=True):
    sim = Simulator(dut)
    if clocked:
        sim.add_clock(1e-8)
    for tb in testbenches:
        sim.add_testbench(tb)
    sim.run()


# -- ForwardedMemory -----------------------------------------------------------------------

@pytest.mark.parametrize("depth", [1, 3, 8])
def test_forwarded_memory_returns_every_write_up_to_the_cycle_before_the_data(depth):
    """Read in cycle t -> data in t + 2 = the row after all writes issued up to t + 1.

    A small depth and frequent writes make the read and write addresses collide in the
    same cycle and one cycle apart all the time: the two forwarding paths.
    """
    rng = random.Random(depth)
    cycles = 600
    dut = ForwardedMemory(shape=unsigned(16), depth=depth)
    seen = []

    async def bench(ctx):
        memory = [0] * depth
        snapshots = []          # memory after the writes of cycles 0..c
        reads = []
        for c in range(cycles):
            read_addr = rng.randrange(depth)
            write = rng.random() < 0.7
            write_addr, write_data = rng.randrange(depth), rng.getrandbits(16)
            ctx.set(dut.read_addr, read_addr)
            ctx.set(dut.write_en, write)
            ctx.set(dut.write_addr, write_addr)
            ctx.set(dut.write_data, write_data)
            reads.append(read_addr)
            if write:
                memory[write_addr] = write_data
            snapshots.append(list(memory))
            await ctx.tick()
            if c >= 1:   # now in cycle c + 1: the data of the read issued in cycle c - 1
                seen.append((ctx.get(dut.read_data), snapshots[c][reads[c - 1]]))

    run(dut, bench)
    assert len(seen) == cycles - 1
    bad = [(i, got, want) for i, (got, want) in enumerate(seen) if got != want]
    assert not bad, f"stale or wrong reads (read index, got, want): {bad[:5]}"


def expect_construction_error(error, match, factory):
    with pytest.raises(error, match=match):
        factory()


def test_forwarded_memory_rejects_bad_depth():
    expect_construction_error(ValueError, "depth",
                              lambda: ForwardedMemory(shape=unsigned(8), depth=0))


# -- LaneALU -------------------------------------------------------------------------------

def test_lane_alu_matches_reference():
    rng = random.Random(3)
    dut = LaneALU(lanes=8)
    nasty = [0, 1, 0x7FFF_FFFF, 0x8000_0000, 0xFFFF_FFFF, 0xFFFF_FFFE]

    def beat():
        return sum((rng.choice(nasty) if rng.random() < 0.4 else rng.getrandbits(32)) << (32 * j)
                   for j in range(8))

    async def bench(ctx):
        for _ in range(400):
            old, payload = beat(), beat()
            first, op_or, keep_old = (rng.random() < 0.3 for _ in range(3))
            for name, value in (("old", old), ("payload", payload), ("first", first),
                                ("op_or", op_or), ("keep_old", keep_old)):
                ctx.set(getattr(dut, name), value)
            want = lane_alu_reference(old, payload, first=first, op_or=op_or,
                                      keep_old=keep_old)
            assert ctx.get(dut.result) == want, (hex(old), hex(payload), first, op_or, keep_old)

    run(dut, bench, clocked=False)


def test_lane_alu_reference_wraps():
    assert lane_alu_reference(0xFFFF_FFFF, 2, first=False, op_or=False, keep_old=False) == 1
    assert lane_alu_reference(0xF0, 0x0F, first=False, op_or=True, keep_old=False) == 0xFF


# -- HeaderCheck ---------------------------------------------------------------------------

def reference_header_cause(h: Header, *, lanes, configured, workers, base, end):
    """The contract's header-time checks, in priority order (None = passes)."""
    if h.magic != MAGIC or h.version != VERSION:
        return "bad_header"
    if h.type not in (PacketType.AGG_ADD_I32, PacketType.AGG_OR32):
        return "bad_type"
    if not configured:
        return "unconfigured_job"
    if h.worker >= workers:
        return "bad_worker"
    if not base <= h.slot < end:
        return "bad_slot"
    if h.count != lanes:
        return "bad_count"
    return None


def test_header_check_priority():
    rng = random.Random(4)
    lanes, max_workers = 64, 32
    dut = HeaderCheck(lanes=lanes, max_workers=max_workers)

    def field(good, bad, p=0.15):
        return bad() if rng.random() < p else good

    causes = set()

    async def bench(ctx):
        for _ in range(3000):
            workers = rng.randrange(1, max_workers + 1)
            base = rng.randrange(0, 100)
            end = base + rng.randrange(0, 20)
            configured = rng.random() > 0.1
            h = Header(
                magic=field(MAGIC, lambda: rng.randrange(256)),
                version=field(VERSION, lambda: rng.randrange(256)),
                type=field(rng.choice([2, 3]), lambda: rng.randrange(256)),
                worker=field(rng.randrange(workers), lambda: rng.randrange(workers, 256)),
                slot=field(rng.randrange(base, end) if end > base else base,
                           lambda: rng.choice([rng.randrange(0, base + 1),
                                               rng.randrange(end, 0x10000)])),
                count=field(lanes, lambda: rng.choice([0, lanes - 1, lanes + 1,
                                                       rng.getrandbits(32)])),
                slot_version=rng.randrange(256),   # any value: only bit 0 is used
                job=rng.randrange(256), flags=rng.randrange(256), k=rng.randrange(256),
                exponent=rng.randrange(-128, 128), seq=rng.getrandbits(32),
                offset=rng.getrandbits(32))
            ctx.set(dut.header.as_value(), h.to_int())
            ctx.set(dut.job_configured, configured)
            ctx.set(dut.workers, workers)
            ctx.set(dut.slot_base, base)
            ctx.set(dut.slot_end, end)
            want = reference_header_cause(h, lanes=lanes, configured=configured,
                                          workers=workers, base=base, end=end)
            causes.add(want)
            got = ctx.get(dut.cause)
            assert got == (CAUSE_NONE if want is None else CAUSE[want]), (str(h), want, got)

    run(dut, bench, clocked=False)
    # Every header-time cause and the good case were exercised.
    assert causes == {None, *AGG_DROP_CAUSES[:6]}


# -- AggControl ----------------------------------------------------------------------------

class CtrlPort:
    """Drives the ctrl_* port of a component from an Amaranth testbench."""

    def __init__(self, ctx, dut):
        self.ctx, self.dut = ctx, dut

    async def write(self, addr, value):
        ctx, dut = self.ctx, self.dut
        ctx.set(dut.ctrl_addr, addr)
        ctx.set(dut.ctrl_wdata, value)
        ctx.set(dut.ctrl_we, 1)
        await ctx.tick()
        ctx.set(dut.ctrl_we, 0)

    async def read(self, addr):
        ctx, dut = self.ctx, self.dut
        ctx.set(dut.ctrl_addr, addr)
        ctx.set(dut.ctrl_re, 1)
        await ctx.tick()
        ctx.set(dut.ctrl_re, 0)
        return ctx.get(dut.ctrl_rdata)   # registered on the edge: valid the cycle after re


def test_control_register_map_commit_and_clear():
    slots, lanes, max_workers, jobs = 16, 64, 8, 3
    dut = AggControl(slots=slots, lanes=lanes, max_workers=max_workers, jobs=jobs)
    cleared = []

    async def bench(ctx):
        port = CtrlPort(ctx, dut)
        assert await port.read(REG_PARAMS) == slots | (lanes << 16)
        for job in range(jobs):
            assert await port.read(JOB_STRIDE * job) == 0        # unconfigured after reset
        # Configure job 1: pending values read back, but take effect only at the commit.
        await port.write(JOB_STRIDE * 1 + 0, 5)
        await port.write(JOB_STRIDE * 1 + 1, 4)
        await port.write(JOB_STRIDE * 1 + 2, 6)
        assert [await port.read(JOB_STRIDE * 1 + f) for f in range(3)] == [5, 4, 6]
        ctx.set(dut.lookup_job, 1)
        assert not ctx.get(dut.lookup_configured)
        ctx.set(dut.drained, 0)
        await port.write(JOB_STRIDE * 1 + 3, 2)      # only the value 1 commits
        await ctx.tick()
        assert not ctx.get(dut.busy)
        await port.write(JOB_STRIDE * 1 + 3, 1)
        for _ in range(5):      # not drained: the commit waits, busy stays up
            await ctx.tick()
            assert ctx.get(dut.busy) and not ctx.get(dut.clear_en)
        assert await port.read(JOB_STRIDE * 1 + 3) & 1
        ctx.set(dut.drained, 1)
        for _ in range(slots + 4):
            await ctx.tick()
        assert not ctx.get(dut.busy)
        assert await port.read(JOB_STRIDE * 1 + 3) == 0           # idle, not rejected
        # Lookup of the header checks.
        ctx.set(dut.lookup_job, 1)
        assert (ctx.get(dut.lookup_configured), ctx.get(dut.lookup_workers),
                ctx.get(dut.lookup_base), ctx.get(dut.lookup_end)) == (1, 5, 4, 10)
        for job in (0, 2, jobs, 255):
            ctx.set(dut.lookup_job, job)
            assert not ctx.get(dut.lookup_configured)
        # A range beyond the pool and too many workers are rejected (job unconfigured).
        for workers, base, count in ((5, 10, 7), (max_workers + 1, 0, 1), (1, slots, 0)):
            await port.write(JOB_STRIDE * 1 + 0, workers)
            await port.write(JOB_STRIDE * 1 + 1, base)
            await port.write(JOB_STRIDE * 1 + 2, count)
            await port.write(JOB_STRIDE * 1 + 3, 1)
            for _ in range(3):
                await ctx.tick()
            assert await port.read(JOB_STRIDE * 1 + 3) == 0b10
            ctx.set(dut.lookup_job, 1)
            assert not ctx.get(dut.lookup_configured)
        # Two commits queued back to back are both applied.
        for job, (workers, base, count) in ((0, (2, 0, 3)), (2, (8, 3, 13))):
            await port.write(JOB_STRIDE * job + 0, workers)
            await port.write(JOB_STRIDE * job + 1, base)
            await port.write(JOB_STRIDE * job + 2, count)
        ctx.set(dut.drained, 0)     # both wait; then the lowest job goes first
        await port.write(JOB_STRIDE * 2 + 3, 1)
        await port.write(JOB_STRIDE * 0 + 3, 1)
        ctx.set(dut.drained, 1)
        for _ in range(40):
            await ctx.tick()
        for job, want in ((0, (1, 2, 0, 3)), (2, (1, 8, 3, 16))):
            ctx.set(dut.lookup_job, job)
            assert (ctx.get(dut.lookup_configured), ctx.get(dut.lookup_workers),
                    ctx.get(dut.lookup_base), ctx.get(dut.lookup_end)) == want
        # Counters: strobes add one each, reads return them by index.
        increments = [0] * len(AGG_COUNTERS)
        rng = random.Random(5)
        for _ in range(50):
            strobes = rng.getrandbits(len(AGG_COUNTERS))
            ctx.set(dut.count_inc, strobes)
            for i in range(len(AGG_COUNTERS)):
                increments[i] += strobes >> i & 1
            await ctx.tick()
        ctx.set(dut.count_inc, 0)
        for i in range(len(AGG_COUNTERS)):
            assert await port.read(REG_COUNTERS + i) == increments[i], AGG_COUNTERS[i]
        assert await port.read(REG_COUNTERS + len(AGG_COUNTERS)) == 0

    async def watch_clears(ctx):
        async for _, _, en, slot in ctx.tick().sample(dut.clear_en, dut.clear_slot):
            if en:
                cleared.append(slot)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.add_process(watch_clears)
    sim.run()
    # Job 1 cleared slots 4..9; then job 0 (lowest queued first) 0..2, job 2 3..15.
    assert cleared == list(range(4, 10)) + list(range(0, 3)) + list(range(3, 16))


# -- parameters ----------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    (dict(lanes=60), "multiple of 8"),
    (dict(lanes=0), "multiple of 8"),
    (dict(max_workers=33), "max_workers"),
    (dict(max_workers=0), "max_workers"),
    (dict(slots=0), "slots"),
    (dict(slots=70000), "slots"),
    (dict(jobs=0), "jobs"),
    (dict(jobs=65), "jobs"),
])
def test_bad_parameters_are_named(kwargs, message):
    expect_construction_error(ValueError, message, lambda: Aggregator(**kwargs))


def test_non_integer_parameter():
    with pytest.raises(TypeError, match="lanes"):
        check_parameters(16, 64.0, 32, 4)


def test_ram_bits_per_slot():
    agg = Aggregator(slots=16, lanes=64, max_workers=32, jobs=4)
    # 2 versions x 64 lanes x 32 bits, and per version 32 seen bits, 6 count bits, op, exp.
    assert agg.ram_bits_per_slot == 2 * 64 * 32 + 2 * (32 + 6 + 1 + 8)
    assert slot_state_layout(32).size == 94


# -- the whole engine in the Amaranth simulator (small parameters) ------------------------

def model_replay(params, steps):
    """The reference model's outputs (byte images, in order) and counters for ``steps``."""
    model = AggregatorModel(**params.as_dict())
    out = []
    for step in steps:
        if step[0] == "packet":
            out.extend(p.to_bytes() for p in model.process(step[1]))
        else:
            _, job, workers, base, count = step
            if workers:
                model.configure_job(job, workers, base, count)
            else:
                model.clear_job(job)
    return out, dict(model.counters)


def engine_replay(params, steps, *, seed, pause_in=0.0, pause_out=0.0):
    """Run ``steps`` through :class:`Aggregator` (Amaranth simulator); outputs, counters."""
    rng = random.Random(seed)
    dut = Aggregator(**params.as_dict())
    frames, counters = [], {}
    done = [False]

    async def producer(ctx):
        port = CtrlPort(ctx, dut)
        for step in steps:
            if step[0] == "configure":
                _, job, workers, base, count = step
                for field, value in enumerate((workers, base, count, 1)):
                    await port.write(JOB_STRIDE * job + field, value)
                continue
            image = step[1]
            beats = [image[i:i + 32] for i in range(0, len(image), 32)]
            for n, beat in enumerate(beats):
                while rng.random() < pause_in:
                    await ctx.tick()
                ctx.set(dut.i.valid, 1)
                ctx.set(dut.i.payload, {"data": int.from_bytes(beat, "little"),
                                        "keep": (1 << len(beat)) - 1,
                                        "last": n == len(beats) - 1})
                await ctx.tick().until(dut.i.ready)
                ctx.set(dut.i.valid, 0)
        for _ in range(60):      # let the last results out
            await ctx.tick()
        for i, name in enumerate(AGG_COUNTERS):
            counters[name] = await port.read(REG_COUNTERS + i)
        done[0] = True

    async def consumer(ctx):
        frame = b""
        while not done[0]:
            ctx.set(dut.o.ready, rng.random() >= pause_out)
            _, _, payload, valid, ready = await ctx.tick().sample(dut.o.payload, dut.o.valid,
                                                                  dut.o.ready)
            if valid and ready:
                assert payload.keep == (1 << 32) - 1
                frame += int(payload.data).to_bytes(32, "little")
                if payload.last:
                    frames.append(frame)
                    frame = b""
        assert frame == b"", "a result packet was cut short"

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(producer)
    sim.add_testbench(consumer, background=True)
    sim.run()
    return frames, counters


def assert_same(params, steps, *, seed, **pauses):
    want_frames, want_counters = model_replay(params, steps)
    got_frames, got_counters = engine_replay(params, steps, seed=seed, **pauses)
    for i, (got, want) in enumerate(zip(got_frames, want_frames)):
        assert got == want, (f"result {i} differs:\n  got  {Packet.from_bytes(got)}\n"
                             f"  want {Packet.from_bytes(want)}")
    assert len(got_frames) == len(want_frames)
    assert got_counters == want_counters
    return want_counters


@pytest.mark.parametrize("lanes", [8, 16])
def test_engine_matches_model_small(lanes):
    """Every behaviour once, on a small engine (P = 8 is the tightest pipeline timing)."""
    params = EngineParams(slots=6, lanes=lanes, max_workers=4, jobs=3)
    rng = random.Random(lanes)
    steps = [("configure", 0, 3, 0, 3), ("configure", 1, 1, 3, 2)]
    steps += hammer_traffic(rng, params, job=0, workers=3, slot=1, rounds=4)
    steps += protocol_traffic(rng, params, jobs={0: (3, range(0, 3)), 1: (1, range(3, 5))},
                              packets=120, duplicate=0.1, bad=0.15, mixed=0.05)
    steps += chaos_traffic(rng, params, job=0, workers=3, slot_range=range(0, 3), packets=60)
    steps += [("configure", 0, 4, 0, 3)]        # reconfigure: the slots start afresh
    steps += hammer_traffic(rng, params, job=0, workers=4, slot=2, rounds=2)
    steps += [("configure", 1, 0, 0, 0)]        # clear job 1
    steps += protocol_traffic(rng, params, jobs={1: (1, range(3, 5))}, packets=4)
    counters = assert_same(params, steps, seed=lanes, pause_in=0.2, pause_out=0.3)
    assert counters["results_multicast"] > 20 and counters["results_unicast"] > 0
    assert counters["drop_mixed_op"] > 0 and counters["drop_unconfigured_job"] > 0
