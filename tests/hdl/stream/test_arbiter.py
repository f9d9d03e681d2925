"""The packet arbiter, both forms: whole packets, round-robin, each input's packets in order;
the registered form without the pass-through form's clock between packets."""
import random

import pytest
from amaranth.lib import data

from hdl.net.front_end.layouts import TxBeat
from hdl.stream.arbiter import PacketArbiter
from tests.amaranth_sim import run, send_items

BEAT = data.StructLayout({"data": 16, "last": 1})


@pytest.mark.parametrize("registered", [False, True])
@pytest.mark.parametrize("seed", [7, 8])
def test_arbiter_sends_whole_datagrams_round_robin(seed, registered):
    rng = random.Random(seed)
    dut = PacketArbiter(4, shape=TxBeat, registered=registered)
    plans = {k: [rng.randint(1, 6) for _ in range(15)] for k in range(4)}
    got = []

    def source(k):
        async def bench(ctx):
            port = getattr(dut, f"i{k}")
            items = []
            for n, words in enumerate(plans[k]):
                meta = {"ip_address": k, "src_port": n, "dst_port": 0, "length": 4 * words}
                items += [{"data": k << 16 | n << 8 | w, "last_be": 0b1000 * (w == words - 1),
                           "last": int(w == words - 1), "meta": meta} for w in range(words)]
            await send_items(ctx, port, items, rng, 0.3)
        return bench

    async def sink(ctx):
        total = sum(sum(p) for p in plans.values())
        while len(got) < total:
            ctx.set(dut.o.ready, rng.random() < 0.7)
            _, _, valid, ready, p = await ctx.tick().sample(dut.o.valid, dut.o.ready, dut.o.p)
            if valid and ready:
                got.append((int(p.data), int(p.last), int(p.meta.ip_address),
                            int(p.meta.src_port)))

    run(dut, *[source(k) for k in range(4)], sink)
    # datagrams never interleave and carry their own meta
    datagrams, current = [], []
    for data_, last, k, n in got:
        current.append(data_)
        assert data_ >> 16 == k and (data_ >> 8) & 0xFF == n
        if last:
            datagrams.append((k, n, len(current)))
            current = []
    for k in range(4):
        assert [(n, length) for kk, n, length in datagrams if kk == k] == \
            list(enumerate(plans[k]))


@pytest.mark.parametrize("registered,gap", [(False, 1), (True, 0)])
def test_arbiter_serves_busy_inputs_in_turn(registered, gap):
    """Every input always has a 3-beat packet waiting: they take turns, 0, 1, 2, 0, ...; the
    pass-through form idles a clock between packets, the registered one none."""
    dut = PacketArbiter(3, shape=BEAT, registered=registered)
    cycles, beats = 120, []

    async def bench(ctx):
        counts = [0, 0, 0]
        ctx.set(dut.o.ready, 1)
        for k in range(3):
            ctx.set(getattr(dut, f"i{k}").valid, 1)
        for _ in range(cycles):
            for k in range(3):
                ctx.set(getattr(dut, f"i{k}").p, {"data": k << 8 | counts[k],
                                                   "last": counts[k] % 3 == 2})
            _, _, valid, p, *readies = await ctx.tick().sample(
                dut.o.valid, dut.o.p, *(getattr(dut, f"i{k}").ready for k in range(3)))
            for k in range(3):
                counts[k] += readies[k]
            beats.append((int(p.data), int(p.last)) if valid else None)

    run(dut, bench)
    first = next(n for n, beat in enumerate(beats) if beat is not None)
    sent = [beat for beat in beats[first:] if beat is not None]
    packets = len(sent) // 3
    assert packets >= 10
    owners = [data_ >> 8 for data_, _ in sent[:3 * packets:3]]
    assert all(b == (a + 1) % 3 for a, b in zip(owners, owners[1:])), owners
    # each packet whole, then `gap` idle clocks before the next
    expected = sum((sent[3 * n:3 * n + 3] + [None] * gap for n in range(packets - 1)), [])
    assert beats[first:first + len(expected)] == expected
