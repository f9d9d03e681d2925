"""JobGate and ResultSeal (section 7's jobs): job keys, tags, the replay filter and tagged
results, bit-exact against the golden side (``host.golden.siphash``, ``JobAuthTable``)."""
import random

import pytest
from amaranth import Module
from amaranth.lib import wiring

from contract.header import Flags, Header, PacketType
from hdl.net.front_end.ingress import IngressBuffer
from hdl.net.front_end.job_auth import JobGate, ResultSeal
from host.golden.job_auth import PASSED, JobAuthTable
from host.golden.siphash import check_tag, job_key, tag_datagram
from tests.amaranth_sim import run
from tests.hdl.net.front_end.test_ingress import wide_beats

KEY = bytes(range(0x40, 0x50))
JOBS, SLOTS, WORKERS = 4, 16, 8


class GatedBuffer(wiring.Component):
    """The switch's input: ``IngressBuffer(hold=True)`` -> ``JobGate``, as the front end
    connects them."""

    def __init__(self):
        self.buffer = IngressBuffer(depth=64, datagrams=8, byte_keep=True, hold=True)
        self.gate = JobGate(key=KEY, jobs=JOBS, slots=SLOTS, max_workers=WORKERS)
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.submodules.buffer, m.submodules.gate = self.buffer, self.gate
        wiring.connect(m, self.buffer.o, self.gate.i)
        m.d.comb += [self.buffer.again.eq(self.gate.again),
                     self.buffer.release.eq(self.gate.release)]
        return m


def packet(job, worker, slot, seq, size, *, result=False, payload=None):
    header = Header(type=PacketType.AGG_ADD_I32, job=job, worker=worker, slot=slot, seq=seq,
                    count=max(0, (size - 32) // 4),
                    flags=Flags.RESULT if result else 0).pack()
    body = payload if payload is not None else random.randbytes(max(0, size - 32))
    return (header + body)[:size]


async def commit(ctx, gate, job, *, enable, epoch, configured=True, base=0, end=0):
    """The switch grants job's commit, with the job_auth registers as written."""
    ctx.set(gate.pending[job].enable, enable)
    ctx.set(gate.pending[job].epoch, epoch)
    ctx.set(gate.active[job].base, base)
    ctx.set(gate.active[job].end, end)
    ctx.set(gate.commit.done, 1)
    ctx.set(gate.commit.job, job)
    ctx.set(gate.commit.configured, configured)
    await ctx.tick()
    ctx.set(gate.commit.done, 0)


def test_job_keys_are_derived_as_the_golden_side_derives_them():
    dut = GatedBuffer()
    gate = dut.gate
    rng = random.Random(7)
    epochs = [rng.getrandbits(32) for _ in range(JOBS)] + [0, 0xFFFFFFFF]

    async def bench(ctx):
        for job, epoch in enumerate(epochs):
            job %= JOBS
            await commit(ctx, gate, job, enable=1, epoch=epoch)
            for _ in range(80):
                await ctx.tick()
            assert ctx.get(gate.keys[job].on) == 1
            want = int.from_bytes(job_key(KEY, job, epoch), "little")
            assert ctx.get(gate.keys[job].key) == want, (job, epoch)
        # disabled, or the commit left the job unconfigured: no authentication
        await commit(ctx, gate, 2, enable=0, epoch=5)
        await commit(ctx, gate, 3, enable=1, epoch=5, configured=False)
        for _ in range(80):
            await ctx.tick()
        assert [ctx.get(gate.keys[j].on) for j in range(JOBS)] == [1, 1, 0, 0]

    run(dut, bench)


@pytest.mark.parametrize("seed,p_block", [(1, 0.0), (2, 0.4)])
def test_tags_and_the_replay_filter_as_the_golden_board(seed, p_block):
    """Random datagrams of two authenticated jobs and an unauthenticated one: right and
    wrong tags, seqs that go back, slots in and out of the job's range, results, datagrams
    shorter than a header. Exactly the golden side's survivors reach the engine, whole and
    in order; every drop is counted as the golden side counts it; a new commit empties the
    job's filter."""
    rng = random.Random(seed)
    random.seed(seed)
    ranges = {0: range(2, 6), 1: range(8, 16)}
    epochs = {0: rng.getrandbits(32), 1: rng.getrandbits(32)}
    keys = {j: job_key(KEY, j, e) for j, e in epochs.items()}
    model = JobAuthTable(KEY, JOBS)
    for job, epoch in epochs.items():
        model.set_register(job, "enable", 1)
        model.set_register(job, "epoch", epoch)
        model.commit(job)

    def draw(n):
        job = rng.choice([0, 0, 1, 2])
        size = rng.choice([20, 32, 33, 40, 63, 64, 65, 96, 100, rng.randint(32, 300)])
        # mostly the job's own slots and a few workers, so that seqs meet again
        slot = rng.choice([*ranges.get(job, range(4))[:3], rng.randrange(SLOTS)])
        data = packet(job, rng.randrange(3), slot, rng.randrange(6), size,
                      result=rng.random() < 0.1)
        if job in keys and size >= 32 and rng.random() < 0.8:
            data = tag_datagram(keys[job], data)
            if rng.random() < 0.1:
                data = bytearray(data)
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
                data = bytes(data)
        return data

    first = [draw(n) for n in range(120)]
    second = [draw(n) for n in range(60)]

    def verdicts(datagrams):
        out = []
        for data in datagrams:
            job, worker = data[5], data[6]
            if model.active(job) is None or len(data) < 32 or data[3] & Flags.RESULT:
                out.append(PASSED)
            elif not model.check_tag(job, data):
                out.append("drop_bad_tag")
            else:
                out.append(model.filter(job, worker, data, ranges[job]))
        return out

    want_first = verdicts(first)
    model.commit(0)                      # job 0 again: its filter starts empty
    want_second = verdicts(second)
    assert want_first.count(PASSED) < len(first) and "drop_replay" in want_first
    dut = GatedBuffer()
    gate, buffer = dut.gate, dut.buffer
    got, events = [], []

    async def producer(ctx):
        for job, epoch in epochs.items():
            await commit(ctx, gate, job, enable=1, epoch=epoch,
                         base=ranges[job].start, end=ranges[job].stop)
        sent = 0
        for batch in (first, second):
            if batch is second:
                while len(got) + len(events) < len(first):
                    await ctx.tick()
                await commit(ctx, gate, 0, enable=1, epoch=epochs[0],
                             base=ranges[0].start, end=ranges[0].stop)
            for n, data in enumerate(batch):
                # a few datagrams in the buffer at most: none is dropped for room
                while sent - len(got) - len(events) >= 3:
                    await ctx.tick()
                for beat in wide_beats(data, n):
                    ctx.set(buffer.i.valid, 1)
                    ctx.set(buffer.i.p, beat)
                    await ctx.tick()
                ctx.set(buffer.i.valid, 0)
                sent += 1
                for _ in range(rng.randrange(3)):
                    await ctx.tick()

    async def consumer(ctx):
        current = b""
        total = len(first) + len(second)
        for _ in range(400000):
            if len(got) + len(events) == total:
                break
            ctx.set(gate.o.ready, rng.random() >= p_block)
            _, _, valid, ready, p, ev = await ctx.tick().sample(
                gate.o.valid, gate.o.ready, gate.o.p, gate.events)
            if ev.bad_tag:
                events.append("drop_bad_tag")
            if ev.replay:
                events.append("drop_replay")
            if valid and ready:
                raw = int(p.data).to_bytes(32, "little")
                current += bytes(raw[i] for i in range(32) if int(p.keep) >> i & 1)
                if p.last:
                    got.append(current)
                    current = b""

    run(dut, producer, consumer)
    datagrams = first + second
    verdict = want_first + want_second
    survivors = [d for d, v in zip(datagrams, verdict) if v == PASSED]
    where = next((n for n, (a, b) in enumerate(zip(got, survivors)) if a != b), None)
    assert got == survivors, f"{len(got)} of {len(survivors)} out, first differing: {where}"
    assert events == [v for v in verdict if v != PASSED]


def result_words(data, job, *, upstream=False):
    """A stored result as the output buffer's 32-bit words."""
    words = [int.from_bytes(data[i:i + 4], "little") for i in range(0, len(data), 4)] or [0]
    return [{"data": w, "last": int(n == len(words) - 1), "length": len(data),
             "tag": {"job": job, "worker": 0xFF, "upstream": int(upstream)}}
            for n, w in enumerate(words)]


@pytest.mark.parametrize("seed,p_block", [(1, 0.0), (2, 0.5)])
def test_results_leave_tagged_under_their_jobs_key_on_every_copy(seed, p_block):
    """Results of an authenticated job leave with the golden side's tag on every copy the
    fan-out asks for (odd and even word counts, the shortest); others leave as they are."""
    rng = random.Random(seed)
    random.seed(seed)
    dut = ResultSeal(jobs=JOBS)
    job_keys = {0: job_key(KEY, 0, 11), 2: job_key(KEY, 2, 12)}
    results = []
    for n in range(30):
        job = rng.choice([0, 1, 2, 0])
        size = 4 * rng.choice([8, 9, 10, 17, 40, rng.randint(8, 200)])
        data = packet(job, 0xFF, rng.randrange(SLOTS), n, size, result=True)
        results.append((job, data, rng.random() < 0.15, rng.randint(1, 3)))

    def expected(job, data, upstream):
        if job in job_keys and not upstream:
            return tag_datagram(job_keys[job], data)
        return data

    got = []

    async def producer(ctx):
        for j, key in job_keys.items():
            ctx.set(dut.keys[j].on, 1)
            ctx.set(dut.keys[j].key, int.from_bytes(key, "little"))
        for job, data, upstream, copies in results:
            # the output buffer: the result again while the replay asks for it (sampled
            # with its last word)
            again = 1
            for _ in range(copies + 1):        # one reading for the tag, then the copies
                if not again:
                    break
                for w in result_words(data, job, upstream=upstream):
                    ctx.set(dut.i.valid, 1)
                    ctx.set(dut.i.p, w)
                    while True:
                        _, _, ready, replay = await ctx.tick().sample(dut.i.ready,
                                                                      dut.replay)
                        if ready:
                            break
                    again = replay
                ctx.set(dut.i.valid, 0)
            assert not again

    async def fanout(ctx):
        current, r, sent = [], 0, 0
        order = [copies for *_, copies in results]
        for _ in range(200000):
            if len(got) == sum(order):
                break
            ctx.set(dut.o.ready, rng.random() >= p_block)
            ctx.set(dut.o_replay, int(sent + 1 < order[r]))
            _, _, valid, ready, p = await ctx.tick().sample(dut.o.valid, dut.o.ready, dut.o.p)
            if valid and ready:
                current.append(int(p.data))
                if p.last:
                    got.append(b"".join(w.to_bytes(4, "little") for w in current))
                    current, sent = [], sent + 1
                    if sent == order[r]:
                        r, sent = r + 1, 0

    run(dut, producer, fanout)
    want = [expected(job, data, up) for job, data, up, copies in results for _ in range(copies)]
    assert got == want
    assert any(check_tag(job_keys[0], g) for g in got)


def test_parameters_are_checked():
    with pytest.raises(ValueError, match="16 bytes"):
        JobGate(key=0x1234, jobs=4, slots=64, max_workers=32)
    with pytest.raises(ValueError, match="max_workers must be 1..32"):
        JobGate(key=KEY, jobs=4, slots=64, max_workers=33)
    with pytest.raises(ValueError, match="jobs must be 1..64"):
        ResultSeal(jobs=0)
    assert "secret" in repr(JobGate(key=KEY, jobs=4, slots=64, max_workers=32))
    assert KEY.hex() not in repr(JobGate(key=KEY, jobs=4, slots=64, max_workers=32))
