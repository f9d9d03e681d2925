"""WorkerTable, SourceCheck and Dispatch: the switch's table, its check, port dispatch."""
import random

import pytest
from amaranth import Module
from amaranth.lib import wiring

from contract.network import Service, service_ports
from contract.registers import MAX_WORKERS_IN_TABLE
from hdl.net.front_end.dispatch import Dispatch
from hdl.net.front_end.source_check import SourceCheck
from hdl.net.front_end.worker_table import WorkerTable
from tests.amaranth_sim import run, send_items

JOBS, WORKERS = 4, 8


async def write_entry(ctx, table, job, worker, ip, port):
    for field, value in ((0, ip), (1, port)):
        ctx.set(table.reg_entry, job * MAX_WORKERS_IN_TABLE + worker)
        ctx.set(table.reg_port_field, field)
        ctx.set(table.reg_wdata, value)
        ctx.set(table.reg_we, 1)
        await ctx.tick()
        ctx.set(table.reg_we, 0)


async def read_entry(ctx, table, job, worker):
    values = []
    for field in (0, 1):
        ctx.set(table.reg_entry, job * MAX_WORKERS_IN_TABLE + worker)
        ctx.set(table.reg_port_field, field)
        ctx.set(table.reg_re, 1)
        await ctx.tick()
        ctx.set(table.reg_re, 0)
        values.append(ctx.get(table.reg_rdata))
    return tuple(values)


def test_table_registers_and_lookups():
    rng = random.Random(1)
    dut = WorkerTable(jobs=JOBS, max_workers=WORKERS)
    entries = {(j, w): (rng.getrandbits(32), rng.getrandbits(16))
               for j in range(JOBS) for w in range(WORKERS)}

    async def bench(ctx):
        for (j, w), (ip, port) in entries.items():
            await write_entry(ctx, dut, j, w, ip, port)
        # outside the board's table: writes ignored, reads 0 (a write there must not alias)
        await write_entry(ctx, dut, 0, WORKERS, 0xDEAD, 0xBEEF)
        await write_entry(ctx, dut, JOBS, 0, 0xDEAD, 0xBEEF)
        assert await read_entry(ctx, dut, 0, WORKERS) == (0, 0)
        assert await read_entry(ctx, dut, JOBS, 0) == (0, 0)
        assert await read_entry(ctx, dut, 63, 31) == (0, 0)
        for (j, w), want in entries.items():
            assert await read_entry(ctx, dut, j, w) == want
        # one field rewritten leaves the other
        await write_entry(ctx, dut, 1, 2, entries[1, 2][0], 0)
        assert await read_entry(ctx, dut, 1, 2) == (entries[1, 2][0], 0)
        entries[1, 2] = (entries[1, 2][0], 0)
        # both lookup ports, data the clock after en, held while en is low
        for port in (dut.check, dut.fanout):
            for (j, w), (ip, p) in list(entries.items())[:12] + [((JOBS, 0), (None, None)),
                                                                 ((0, 255), (None, None))]:
                ctx.set(port.job, j)
                ctx.set(port.worker, w)
                ctx.set(port.en, 1)
                await ctx.tick()
                ctx.set(port.en, 0)
                ctx.set(port.job, 0)
                await ctx.tick()
                if ip is None:
                    assert not ctx.get(port.valid)
                else:
                    assert ctx.get(port.valid)
                    assert (ctx.get(port.entry.ip_address), ctx.get(port.entry.port)) == (ip, p)

    run(dut, bench)


class CheckBench(wiring.Component):
    def __init__(self):
        self.check = SourceCheck(jobs=JOBS)
        self.table = WorkerTable(jobs=JOBS, max_workers=WORKERS)
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.submodules.check, m.submodules.table = self.check, self.table
        wiring.connect(m, self.check.table, self.table.check)
        return m


def agg_datagram(job, worker, length, src_ip, src_port, *, error=False, result=False, rng):
    payload = bytearray(rng.getrandbits(8) for _ in range(length))
    if length > 3:     # a worker's datagram never has RESULT; one from upstream has
        payload[3] = payload[3] | 2 if result else payload[3] & ~2
    if length > 6:
        payload[5], payload[6] = job, worker
    padded = bytes(payload) + bytes(-len(payload) % 32 or (0 if payload else 32))
    chunks = [padded[i:i + 32] for i in range(0, len(padded), 32)]
    meta = {"ip_address": src_ip, "src_port": src_port, "dst_port": 47572, "length": length}
    return [{"data": int.from_bytes(c, "little"), "last": int(n == len(chunks) - 1),
             "error": int(error and n == len(chunks) - 1), "drop": 0, "meta": meta}
            for n, c in enumerate(chunks)]


@pytest.mark.parametrize("seed,p_stall,p_block", [(2, 0.0, 0.0), (3, 0.5, 0.5)])
def test_source_check_refuses_strangers(seed, p_stall, p_block):
    rng = random.Random(seed)
    dut = CheckBench()
    entries = {(j, w): (0x0A000000 | rng.getrandbits(8), 40000 + rng.getrandbits(8))
               for j in range(JOBS) for w in range(WORKERS - 1)}
    entries[2, 3] = (0x0A000099, 0)        # port 0: no worker
    # jobs 1 and 3 have an upstream (job 3's the same aggregator as job 1's, another job
    # there); job 2 a stale one (its upstream flag clear: not configured)
    upstreams = {1: (0x0A0000F1, 47572, 9), 2: (0x0A0000F2, 47572, 4),
                 3: (0x0A0000F1, 47572, 4)}
    active_upstream = {1, 3}
    cases = []
    for n in range(60):       # results: from a job's upstream, or a stranger's
        leaf = rng.choice([1, 2, 3])
        ip, port, up_job = upstreams[leaf]
        kind = rng.choice(["good", "good", "ip", "port", "job", "error"])
        if kind == "ip":
            ip ^= 1 << rng.randrange(32)
        if kind == "port":
            port ^= 1 << rng.randrange(16)
        if kind == "job":
            up_job ^= 1 << rng.randrange(8)
        good = kind in ("good", "error") and leaf in active_upstream
        length = rng.choice([7, 32, 288])
        beats = agg_datagram(up_job, rng.choice([0xFF, 2]), length, ip, port,
                             error=kind == "error", result=True, rng=rng)
        if good:    # passed on with the leaf's job number in place of the upstream's
            first = beats[0]["data"] & ~(0xFF << 40) | leaf << 40
            cases.append((beats, False, kind == "error", first, True))
        else:
            cases.append((beats, True, kind == "error", beats[0]["data"], True))
    for n in range(80):
        job, worker = rng.randrange(JOBS + 1), rng.choice([rng.randrange(WORKERS), 0xFF])
        ip, port = entries.get((job, worker), (0x0A000001, 40001))
        kind = rng.choice(["good", "good", "ip", "port", "short", "error"])
        if kind == "ip":
            ip ^= 1 << rng.randrange(32)
        if kind == "port":
            port ^= 1 << rng.randrange(16)
        length = rng.choice([7, 8, 31, 32, 33, 288]) if kind != "short" else rng.randint(0, 6)
        good = (kind == "short") or (
            kind in ("good", "error") and (job, worker) in entries and entries[job, worker][1])
        beats = agg_datagram(job, worker, length, ip, port, error=kind == "error", rng=rng)
        cases.append((beats, not good, kind == "error", beats[0]["data"], False))
    rng.shuffle(cases)
    got = []
    strobes, result_strobes = [], []

    async def producer(ctx):
        for leaf, (ip, port, up_job) in upstreams.items():
            active = dut.check.active[leaf]
            ctx.set(active.upstream, leaf in active_upstream)
            ctx.set(active.up_ip, ip)
            ctx.set(active.up_port, port)
            ctx.set(active.up_job, up_job)
        table = dut.table
        for (j, w), (ip, port) in entries.items():
            await write_entry(ctx, table, j, w, ip, port)
        await send_items(ctx, dut.check.i, [b for beats, *_ in cases for b in beats], rng, p_stall)

    async def consumer(ctx):
        total = sum(len(beats) for beats, *_ in cases)
        while len(got) < total:
            ctx.set(dut.check.o.ready, rng.random() >= p_block)
            _, _, p, valid, ready, bad, bad_result = await ctx.tick().sample(
                dut.check.o.p, dut.check.o.valid, dut.check.o.ready, dut.check.bad_source,
                dut.check.result_source)
            strobes.append(int(bad))
            result_strobes.append(int(bad_result))
            if valid and ready:
                got.append((int(p.data), int(p.last), int(p.drop), int(p.error)))
        for _ in range(4):
            _, _, bad, bad_result = await ctx.tick().sample(dut.check.bad_source,
                                                            dut.check.result_source)
            strobes.append(int(bad))
            result_strobes.append(int(bad_result))

    run(dut, producer, consumer)
    position = 0
    for n, (beats, refused, error, first, result) in enumerate(cases):
        out = got[position:position + len(beats)]
        position += len(beats)
        assert [d for d, *_ in out] == [first] + [b["data"] for b in beats[1:]], n
        assert [drop for _, _, drop, _ in out] == [0] * (len(beats) - 1) + [int(refused)], n
    assert sum(strobes) == sum(refused and not error and not result
                               for _, refused, error, _, result in cases)
    assert sum(result_strobes) == sum(refused and not error and result
                                      for _, refused, error, _, result in cases)
    assert any(result and not refused for _, refused, _, _, result in cases)


def test_dispatch_by_port_and_closed_ports():
    rng = random.Random(4)
    base = 50000
    ports = service_ports(base)
    services = (Service.NIC_TX, Service.SWITCH, Service.CTRL)     # no NIC RX on this board
    dut = Dispatch(port_base=base, services=services)
    plan = []
    for n in range(60):
        dst = rng.choice(list(ports.values()) + [base - 1, base + 4, 47570])
        error = rng.random() < 0.2
        plan.append((dst, rng.randint(1, 3), error))
    beats = []
    for n, (dst, count, error) in enumerate(plan):
        meta = {"ip_address": n, "src_port": 1, "dst_port": dst, "length": 32 * count}
        beats += [{"data": n, "last": int(b == count - 1), "error": int(error and b == count - 1),
                   "drop": 0, "meta": meta} for b in range(count)]
    seen = {s: [] for s in services}
    closed = []

    async def producer(ctx):
        for s in services:
            ctx.set(getattr(dut, s.value).ready, 1)
        await send_items(ctx, dut.i, beats, rng, 0.3)
        for _ in range(3):
            await ctx.tick()

    async def watch(ctx):
        outs = [getattr(dut, s.value) for s in services]
        async for _, _, strobe, *rest in ctx.tick().sample(
                dut.closed_port, *[o.valid for o in outs], *[o.p.data for o in outs]):
            closed.append(int(strobe))
            for s, valid, data in zip(services, rest[:3], rest[3:]):
                if valid:
                    seen[s].append(int(data))

    run(dut, producer, background=(watch,))
    by_port = {ports[s]: s for s in services}
    for s in services:
        want = [n for n, (dst, count, _) in enumerate(plan) if by_port.get(dst) == s
                for _ in range(count)]
        assert seen[s] == want, s
    assert sum(closed) == sum(1 for dst, _, error in plan if dst not in by_port and not error)
