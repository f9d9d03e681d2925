"""OneInFlight, ReplyPort, FanOut: replies addressed and sent whole (the arbiter that sends
them one at a time: tests/hdl/stream/test_arbiter.py)."""
import random

import pytest
from amaranth import Module, Mux, Signal
from amaranth.lib import wiring

from hdl.net.front_end.egress import EgressBuffer
from hdl.net.front_end.fanout import FanOut, ResultTag
from hdl.net.front_end.reply import OneInFlight, ReplyPort
from hdl.net.front_end.worker_table import WorkerTable
from tests.amaranth_sim import run, send_items
from tests.hdl.net.front_end.test_egress import packet_beats
from tests.hdl.net.front_end.test_worker_table import write_entry


def service_beats(n_beats, src_port, ip=0x0A000002):
    meta = {"ip_address": ip, "src_port": src_port, "dst_port": 47571, "length": 32 * n_beats}
    return [{"data": src_port << 8 | b, "keep": (1 << 32) - 1, "last": int(b == n_beats - 1),
             "first": int(b == 0), "meta": meta} for b in range(n_beats)]


@pytest.mark.parametrize("seed", [1, 2])
def test_one_in_flight_pairs_every_reply_with_its_request(seed):
    """An engine model with a random latency answers or drops each request; every answer
    must leave with its own request's address, and no second request may enter early."""
    rng = random.Random(seed)
    dut = OneInFlight()
    requests = [(40000 + n, rng.randint(1, 4), rng.random() < 0.3) for n in range(40)]
    replies = []

    async def producer(ctx):
        await send_items(ctx, dut.i, [b for src, n, _ in requests for b in service_beats(n, src)],
                         rng, 0.2)

    async def engine(ctx):
        """Takes a request whole, waits, then emits one output beat (or drops it)."""
        for src, n, drop in requests:
            taken = 0
            while taken < n:
                ctx.set(dut.o.ready, rng.random() < 0.7)
                _, _, valid, ready, p = await ctx.tick().sample(dut.o.valid, dut.o.ready, dut.o.p)
                if valid and ready:
                    assert int(p.meta.src_port) == src
                    assert bool(p.first) == (taken == 0) and bool(p.last) == (taken == n - 1)
                    taken += 1
            ctx.set(dut.o.ready, 0)
            # the next request must not be offered while this one is unanswered
            for _ in range(rng.randint(0, 12)):
                await ctx.tick()
                assert not (ctx.get(dut.o.valid) and ctx.get(dut.o.p.first))
            if drop:
                ctx.set(dut.dropped, 1)
            else:
                replies.append((src, ctx.get(dut.reply.dst_port), ctx.get(dut.reply.src_port),
                                ctx.get(dut.reply.ip_address)))
                ctx.set(dut.output_done, 1)
            await ctx.tick()
            ctx.set(dut.dropped, 0)
            ctx.set(dut.output_done, 0)

    run(dut, producer, engine)
    assert replies == [(src, src, 47571, 0x0A000002) for src, _, drop in requests if not drop]


@pytest.mark.parametrize("when", ["after_first", "with_first", "with_single", "before_first"])
def test_drop_strobe_early_or_with_the_first_beat(when):
    """A drop strobe after the header beat (the decompressor's bad header) must not let the
    next request in before the dropped one's remaining beats have entered; one that comes
    in the very clock the first beat is taken (the control service's wrong key) counts for
    that request, also for a one-beat request, and so does one that comes while the first
    beat still waits to be taken (the control service's ERROR reply)."""
    dut = OneInFlight()
    first_len = 1 if when == "with_single" else 5
    order = []

    async def producer(ctx):
        items = service_beats(first_len, 1) + service_beats(2, 2) + service_beats(1, 3)
        ctx.set(dut.i.valid, 1)
        for _ in range(50):          # bounded: a lost strobe shuts the gate for good
            ctx.set(dut.i.p, items[0])
            _, _, ready = await ctx.tick().sample(dut.i.ready)
            if ready:
                items.pop(0)
                if not items:
                    break
        ctx.set(dut.i.valid, 0)

    async def engine(ctx):
        ctx.set(dut.o.ready, 1)
        if when == "before_first":
            # answer request 1 while its first beat waits, then take it
            ctx.set(dut.o.ready, 0)
            await ctx.tick().until(dut.o.valid)
            ctx.set(dut.dropped, 1)
            await ctx.tick()
            ctx.set(dut.dropped, 0)
            await ctx.tick()
            ctx.set(dut.o.ready, 1)
        for cycle in range(60):
            if when in ("with_first", "with_single"):
                ctx.set(dut.dropped, ctx.get(dut.o.valid) and ctx.get(dut.o.p.first)
                        and ctx.get(dut.o.p.meta.src_port) == 1)
            _, _, valid, p = await ctx.tick().sample(dut.o.valid, dut.o.p)
            if when == "after_first":
                ctx.set(dut.dropped, 0)
            if valid:
                order.append((int(p.meta.src_port), int(p.first)))
                if when == "after_first" and int(p.meta.src_port) == 1 and p.first:
                    ctx.set(dut.dropped, 1)
            # requests 2 and 3 are answered as soon as their last beat is in
            ctx.set(dut.output_done, bool(valid and p.last and int(p.meta.src_port) > 1))

    run(dut, producer, engine)
    assert [src for src, _ in order] == [1] * first_len + [2] * 2 + [3], order


class FanOutBench(wiring.Component):
    """A FanOut behind its output buffer and a worker table; ``job_workers[j]`` is job j's
    configured worker count (what :class:`hdl.net.front_end.job_workers.JobWorkers` reports)."""

    def __init__(self, workers, jobs=4):
        self.buffer = EgressBuffer(depth=512, packets=32, tag_shape=ResultTag)
        self.fanout = FanOut(port=47572, max_workers=workers)
        self.table = WorkerTable(jobs=jobs, max_workers=workers)
        self.job_workers = [Signal(range(33), name=f"job_workers{j}") for j in range(jobs)]
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.submodules.buffer, m.submodules.fanout = self.buffer, self.fanout
        m.submodules.table = self.table
        wiring.connect(m, self.buffer.o, self.fanout.i)
        m.d.comb += self.buffer.replay.eq(self.fanout.replay)
        wiring.connect(m, self.fanout.table, self.table.fanout)
        lookup = self.fanout.jobs
        n = 0
        for j, workers in enumerate(self.job_workers):
            n = Mux(lookup.job == j, workers, n)
        m.d.comb += lookup.workers.eq(n)
        return m


@pytest.mark.parametrize("seed,workers,p_block", [(4, 8, 0.0), (5, 8, 0.5), (6, 32, 0.3)])
def test_fanout_sends_each_result_to_every_worker_of_its_job(seed, workers, p_block):
    """A multicast result goes to the job's workers 0 .. n - 1 with an entry, in worker
    order: not to an entry beyond n (job 1's last, a stale entry), nor anywhere for an
    unconfigured job (job 0, n = 0, entries set) or a job without entries (job 2)."""
    rng = random.Random(seed)
    dut = FanOutBench(workers)
    configured = {0: 0, 1: 6, 2: 3, 3: workers}
    table = {}
    for w in (0, 2, 5, workers - 1):
        table[1, w] = (0x0A000100 | w, 50000 + w)
    for w in range(workers):
        table[3, w] = (0x0A000300 | w, 51000 + w)
    table[3, 4] = (0x0A000304, 0)               # cleared entry: no worker
    for w in (0, 1):
        table[0, w] = (0x0A000000 | w, 52000 + w)
    results = []
    for n in range(30):
        job = rng.choice([0, 1, 1, 2, 3])
        worker = rng.choice([0xFF, 0xFF, rng.randrange(configured[job] or workers)])
        words = [rng.getrandbits(32) for _ in range(rng.choice([8, 72, 16, 3]))]
        results.append((job, worker, words))
    want = []
    undeliverable = 0
    for job, worker, words in results:
        targets = [w for w in range(workers)
                   if (w == worker or worker == 0xFF and w < configured[job])
                   and table.get((job, w), (0, 0))[1]]
        want += [(table[job, w][0], table[job, w][1], words) for w in targets]
        undeliverable += not targets
    got, strobes = [], {"sent": 0, "undeliverable": 0}

    async def producer(ctx):
        for job, n in configured.items():
            ctx.set(dut.job_workers[job], n)
        for (job, w), (ip, port) in table.items():
            await write_entry(ctx, dut.table, job, w, ip, port)
        for job, worker, words in results:
            for beat in packet_beats(words):
                ctx.set(dut.buffer.i.valid, 1)
                ctx.set(dut.buffer.i.p, beat)
                ctx.set(dut.buffer.tag, {"job": job, "worker": worker})
                await ctx.tick()
            ctx.set(dut.buffer.i.valid, 0)
            for _ in range(rng.randint(0, 100)):
                await ctx.tick()

    async def consumer(ctx):
        o = dut.fanout.o
        current = []
        for cycle in range(20000):
            if len(got) >= len(want):
                break
            ctx.set(o.ready, rng.random() >= p_block)
            _, _, valid, ready, p, sent, und, full = await ctx.tick().sample(
                o.valid, o.ready, o.p, dut.fanout.sent, dut.fanout.undeliverable,
                dut.buffer.events.full)
            assert not full, "the test's buffer is too small"
            strobes["sent"] += sent
            strobes["undeliverable"] += und
            if valid and ready:
                current.append(int(p.data))
                if p.last:
                    assert int(p.meta.src_port) == 47572
                    assert int(p.meta.length) == 4 * len(current)
                    assert int(p.last_be) == 0b1000
                    got.append((int(p.meta.ip_address), int(p.meta.dst_port), current))
                    current = []
        assert len(got) == len(want), (len(got), len(want), got[-1:], want[len(got)][:2])
        for _ in range(300):
            _, _, valid, sent, und = await ctx.tick().sample(o.valid, dut.fanout.sent,
                                                             dut.fanout.undeliverable)
            assert not valid, "more datagrams than workers"
            strobes["sent"] += sent
            strobes["undeliverable"] += und

    run(dut, producer, consumer)
    assert got == want
    assert strobes == {"sent": len(want), "undeliverable": undeliverable}


def test_reply_port_addresses_to_the_requester():
    rng = random.Random(9)
    dut = ReplyPort()
    tag = {"ip_address": 0x0A0B0C0D, "src_port": 47573, "dst_port": 41000}
    words = [{"data": w, "last": int(w == 2), "length": 12, "tag": tag} for w in range(3)]
    words += [{"data": 0, "last": 1, "length": 0, "tag": tag}]
    got = []

    async def producer(ctx):
        await send_items(ctx, dut.i, words, rng, 0.3)

    async def consumer(ctx):
        while len(got) < 4:
            ctx.set(dut.o.ready, 1)
            _, _, valid, p = await ctx.tick().sample(dut.o.valid, dut.o.p)
            if valid:
                got.append((int(p.data), int(p.last), int(p.last_be), int(p.meta.ip_address),
                            int(p.meta.src_port), int(p.meta.dst_port), int(p.meta.length)))

    run(dut, producer, consumer)
    addr = (0x0A0B0C0D, 47573, 41000)
    assert got == [(0, 0, 0, *addr, 12), (1, 0, 0, *addr, 12), (2, 1, 0b1000, *addr, 12),
                   (0, 1, 0, *addr, 0)]
