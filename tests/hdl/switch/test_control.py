# amaranth: UnusedElaboratable=no
"""The aggregator's control registers (``contract.registers.SWITCH_REGISTERS``): pending
values, commit, rejection, slot clearing, counters."""
import random

from contract.registers import (COMMIT, SWITCH_REGISTERS, JobStatus, decode_switch_limits,
                                switch_params_word)
from hdl.switch.control import AggControl
from tests.amaranth_sim import RegisterPort, run

JOB = SWITCH_REGISTERS["job"]
COUNTERS = SWITCH_REGISTERS["counter"]
PARAMS = SWITCH_REGISTERS["params"]
LIMITS = SWITCH_REGISTERS["limits"]
from contract.counters import AGG_COUNTERS


def test_control_register_map_commit_and_clear():
    slots, lanes, max_workers, jobs = 16, 64, 8, 3
    dut = AggControl(slots=slots, lanes=lanes, max_workers=max_workers, jobs=jobs)
    cleared = []

    async def bench(ctx):
        port = RegisterPort(ctx, dut)
        assert await port.read(PARAMS.address) == switch_params_word(slots=slots, lanes=lanes)
        for job in range(jobs):
            assert await port.read(JOB.address(job, "workers")) == 0        # unconfigured after reset
        # Configure job 1: pending values read back, but take effect only at the commit.
        await port.write(JOB.address(1, "workers"), 5)
        await port.write(JOB.address(1, "slot_base"), 4)
        await port.write(JOB.address(1, "slot_count"), 6)
        assert [await port.read(JOB.address(1, f)) for f in ("workers", "slot_base", "slot_count")] == [5, 4, 6]
        ctx.set(dut.lookup_job, 1)
        assert not ctx.get(dut.lookup_configured)
        ctx.set(dut.drained, 0)
        await port.write(JOB.address(1, "commit"), COMMIT + 1)   # only COMMIT commits
        await ctx.tick()
        assert not ctx.get(dut.busy)
        await port.write(JOB.address(1, "commit"), COMMIT)
        for _ in range(5):      # not drained: the commit waits, busy stays up
            await ctx.tick()
            assert ctx.get(dut.busy) and not ctx.get(dut.clear_en)
        assert await port.read(JOB.address(1, "commit")) & JobStatus.BUSY
        ctx.set(dut.drained, 1)
        for _ in range(slots + 4):
            await ctx.tick()
        assert not ctx.get(dut.busy)
        assert await port.read(JOB.address(1, "commit")) == 0           # idle, not rejected
        # Lookup of the header checks.
        ctx.set(dut.lookup_job, 1)
        assert (ctx.get(dut.lookup_configured), ctx.get(dut.lookup_workers),
                ctx.get(dut.lookup_base), ctx.get(dut.lookup_end)) == (1, 5, 4, 10)
        for job in (0, 2, jobs, 255):
            ctx.set(dut.lookup_job, job)
            assert not ctx.get(dut.lookup_configured)
        # A range beyond the pool and too many workers are rejected (job unconfigured).
        for workers, base, count in ((5, 10, 7), (max_workers + 1, 0, 1), (1, slots, 0)):
            await port.write(JOB.address(1, "workers"), workers)
            await port.write(JOB.address(1, "slot_base"), base)
            await port.write(JOB.address(1, "slot_count"), count)
            await port.write(JOB.address(1, "commit"), COMMIT)
            for _ in range(3):
                await ctx.tick()
            assert await port.read(JOB.address(1, "commit")) == JobStatus.REJECTED
            ctx.set(dut.lookup_job, 1)
            assert not ctx.get(dut.lookup_configured)
        # Two commits queued back to back are both applied.
        for job, (workers, base, count) in ((0, (2, 0, 3)), (2, (8, 3, 13))):
            await port.write(JOB.address(job, "workers"), workers)
            await port.write(JOB.address(job, "slot_base"), base)
            await port.write(JOB.address(job, "slot_count"), count)
        ctx.set(dut.drained, 0)     # both wait; then the lowest job goes first
        await port.write(JOB.address(2, "commit"), COMMIT)
        await port.write(JOB.address(0, "commit"), COMMIT)
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
            assert await port.read(COUNTERS.base + i) == increments[i], AGG_COUNTERS[i]
        assert await port.read(COUNTERS.base + len(AGG_COUNTERS)) == 0

    async def watch_clears(ctx):
        async for _, _, en, slot in ctx.tick().sample(dut.clear_en, dut.clear_slot):
            if en:
                cleared.append(slot)

    run(dut, bench, background=(watch_clears,))
    # Job 1 cleared slots 4..9; then job 0 (lowest queued first) 0..2, job 2 3..15.
    assert cleared == list(range(4, 10)) + list(range(0, 3)) + list(range(3, 16))


def test_control_refuses_overlaps_and_jobs_beyond_the_engine():
    """Isolation in hardware: a range overlapping another configured job's is refused and
    reported (the job unconfigured); an empty range too; a job beyond the engine's count
    always reads rejected; unconfiguring takes any pending range; the limits register."""
    slots, lanes, max_workers, jobs = 16, 8, 4, 3
    dut = AggControl(slots=slots, lanes=lanes, max_workers=max_workers, jobs=jobs)

    async def bench(ctx):
        port = RegisterPort(ctx, dut)
        ctx.set(dut.drained, 1)

        async def commit(job, workers, base, count):
            for field, value in (("workers", workers), ("slot_base", base),
                                 ("slot_count", count), ("commit", COMMIT)):
                await port.write(JOB.address(job, field), value)
            for _ in range(slots + 4):
                await ctx.tick()
            ctx.set(dut.lookup_job, job)
            configured = ctx.get(dut.lookup_configured)
            return await port.read(JOB.address(job, "commit")), configured

        assert decode_switch_limits(await port.read(LIMITS.address)) == \
            {"jobs": jobs, "max_workers": max_workers}
        assert await commit(0, 2, 4, 4) == (0, 1)                    # slots 4..7
        for base, count in ((0, 5), (7, 2), (4, 4), (5, 1), (2, 14)):   # each touches 4..7
            assert await commit(1, 2, base, count) == (JobStatus.REJECTED, 0), (base, count)
        assert await commit(1, 2, 0, 4) == (0, 1)                    # 0..3: next to it, fine
        assert await commit(1, 2, 8, 0) == (JobStatus.REJECTED, 0)   # an empty range
        assert await commit(2, 1, 8, 8) == (0, 1)
        assert await commit(0, 0, 999, 999) == (0, 0)                # unconfigure: any range
        assert await commit(1, 3, 0, 8) == (0, 1)                    # 4..7 is free again
        # Two commits queued together, granted lowest job first: job 1 (slots 0..7) leaves,
        # job 2 (8..15) moves onto job 1's slots; job 2's check must see job 1 gone.
        ctx.set(dut.drained, 0)
        await port.write(JOB.address(1, "workers"), 0)
        for field, value in (("slot_base", 0), ("slot_count", 8)):
            await port.write(JOB.address(2, field), value)
        await port.write(JOB.address(2, "commit"), COMMIT)
        await port.write(JOB.address(1, "commit"), COMMIT)
        await ctx.tick()
        ctx.set(dut.drained, 1)
        for _ in range(2 * slots + 8):
            await ctx.tick()
        assert await port.read(JOB.address(2, "commit")) == 0
        ctx.set(dut.lookup_job, 2)
        assert (ctx.get(dut.lookup_base), ctx.get(dut.lookup_end)) == (0, 8)
        for job in (jobs, 7, JOB.count - 1):                         # beyond the engine
            await port.write(JOB.address(job, "commit"), COMMIT)
            assert await port.read(JOB.address(job, "commit")) == JobStatus.REJECTED

    run(dut, bench)
