# amaranth: UnusedElaboratable=no
"""JobWorkers: each job's configured worker count, as the switch's reference model holds it.

Random writes to the switch's job registers (pending values, commits, ignored values, jobs
beyond the engine's, configurations the engine rejects: too many workers, an empty range,
one beyond the pool, one overlapping another job's) go to the component and to
:class:`host.golden.aggregator.AggregatorModel`; after each round the component's lookup must give every
job's ``workers`` of the model's active configuration (0 where unconfigured).
"""
import random

import pytest

from contract.registers import COMMIT, SWITCH_REGISTERS, JobStatus
from hdl.net.front_end.job_workers import JobWorkers
from host.golden.aggregator import AggregatorModel
from tests.amaranth_sim import run

SLOTS, MAX_WORKERS, JOBS = 16, 8, 4
_JOB = SWITCH_REGISTERS["job"]


def model_workers(model, job):
    config = model.job_config(job) if job < model.jobs else None
    return config.workers if config is not None else 0


async def write(ctx, dut, address, value):
    ctx.set(dut.writes.addr, address)
    ctx.set(dut.writes.wdata, value)
    ctx.set(dut.writes.we, 1)
    await ctx.tick()
    ctx.set(dut.writes.we, 0)


def lookups(ctx, dut, jobs):
    got = {}
    for job in jobs:
        ctx.set(dut.lookup.job, job)
        got[job] = ctx.get(dut.lookup.workers)
    return got


def random_config(rng):
    """A job's pending values: mostly ones the engine takes, often ones it rejects."""
    workers = rng.choice([0, 1, 2, MAX_WORKERS, MAX_WORKERS + 1, 2**32 - 1,
                          rng.randint(1, MAX_WORKERS)])
    count = rng.choice([0, 1, 2, 4, SLOTS, SLOTS + 1, 2**32 - 1, rng.randint(1, 6)])
    base = rng.choice([0, SLOTS - 1, SLOTS, 2**31, rng.randrange(SLOTS)])
    return {"workers": workers, "slot_base": base, "slot_count": count}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_job_workers_follow_the_switch_commits(seed):
    rng = random.Random(seed)
    dut = JobWorkers(slots=SLOTS, max_workers=MAX_WORKERS, jobs=JOBS)
    model = AggregatorModel(slots=SLOTS, lanes=8, max_workers=MAX_WORKERS, jobs=JOBS)
    seen = {"rejected": 0, "configured": 0}

    async def bench(ctx):
        ctx.set(dut.drained, 1)
        for round_ in range(40):
            # a busy engine (not drained) queues the commits; each job once, lowest first,
            # the order in which the engine grants them
            busy = rng.random() < 0.4
            ctx.set(dut.drained, not busy)
            before = lookups(ctx, dut, range(JOBS))
            jobs = sorted(rng.sample(range(JOBS + 2), rng.randint(1, 3)))
            for job in jobs:
                config = random_config(rng)
                for field in rng.sample(list(config), rng.randint(1, 3)):
                    await write(ctx, dut, _JOB.address(job, field), config[field])
                    model.write(_JOB.address(job, field), config[field])
                value = rng.choice([COMMIT, COMMIT, COMMIT, 0, 2])
                await write(ctx, dut, _JOB.address(job, "commit"), value)
                model.write(_JOB.address(job, "commit"), value)
            if busy:
                for _ in range(rng.randint(0, 30)):
                    await ctx.tick()
                # nothing is applied before the engine is drained
                assert lookups(ctx, dut, range(JOBS)) == before
                ctx.set(dut.drained, 1)
            for _ in range(len(jobs) * (SLOTS + 4) + 4):     # grants and slot clearing
                await ctx.tick()
            want = {job: model_workers(model, job) for job in (*range(JOBS + 2), 0xFF)}
            assert lookups(ctx, dut, want) == want, f"round {round_}"
            seen["configured"] += sum(want[j] != 0 for j in range(JOBS))
            seen["rejected"] += sum(bool(model.read(_JOB.address(j, "commit"))
                                         & JobStatus.REJECTED) for j in range(JOBS))

    run(dut, bench)
    # the random rounds reached both outcomes
    assert seen["configured"] and seen["rejected"]


def test_job_workers_checks_its_parameters():
    with pytest.raises(ValueError, match="jobs"):
        JobWorkers(slots=SLOTS, max_workers=MAX_WORKERS, jobs=0)
    with pytest.raises(ValueError, match="max_workers"):
        JobWorkers(slots=SLOTS, max_workers=33, jobs=JOBS)
    with pytest.raises(ValueError, match="slots"):
        JobWorkers(slots=0, max_workers=MAX_WORKERS, jobs=JOBS)
