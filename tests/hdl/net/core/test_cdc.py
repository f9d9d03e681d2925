"""EthCrossing: datagram words both ways between 62.5 MHz and 125 MHz, events, link."""
import random

from amaranth.sim import Simulator

from hdl.net.core.cdc import EthCrossing
from hdl.net.core.liteeth import EVENTS
from tests.amaranth_sim import datagram_words


def test_words_events_and_link_cross_unchanged():
    rng = random.Random(1)
    dut = EthCrossing(eth_domain="eth", domain="sync", depth=8)
    datagrams = [bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 70))) for _ in range(30)]
    meta = lambda n, d: {"ip_address": n, "src_port": n, "dst_port": 2, "length": len(d)}
    rx_words = [w for n, d in enumerate(datagrams) for w in datagram_words(d, meta(n, d))]
    tx_words = [{k: v for k, v in w.items() if k != "error"}
                for n, d in enumerate(datagrams) for w in datagram_words(d, meta(n, d),
                                                                          error=None)]
    pulses = [(rng.choice(list(EVENTS)), rng.randint(0, 40)) for _ in range(40)]
    got_rx, got_tx, counted = [], [], {name: 0 for name in EVENTS}

    async def core_side(ctx):
        """The core: writes rx at most one word per eth clock, never stalled here; takes tx
        with random stalls and checks the metadata is held across each datagram."""
        pending = list(rx_words)
        meta_at_first, in_datagram = None, False
        cycle = 0
        pulse_plan = {}
        for name, gap in pulses:
            cycle += gap + 3
            pulse_plan.setdefault(cycle, []).append(name)
        for cycle in range(4000):
            if pending:
                ctx.set(dut.core_rx.valid, 1)
                ctx.set(dut.core_rx.p, pending[0])
            else:
                ctx.set(dut.core_rx.valid, 0)
            ctx.set(dut.core_tx.ready, rng.random() < 0.6)
            for name in EVENTS:
                ctx.set(dut.core_events[name], name in pulse_plan.get(cycle, ()))
            ctx.set(dut.core_link, cycle > 100)
            _, _, rx_ready, valid, ready, p = await ctx.tick("eth").sample(
                dut.core_rx.ready, dut.core_tx.valid, dut.core_tx.ready, dut.core_tx.p)
            if pending:
                assert rx_ready, "the receive FIFO stalled the core"
                pending.pop(0)
            if valid and ready:
                item = (int(p.data), int(p.last), int(p.last_be), int(p.meta.ip_address),
                        int(p.meta.length))
                if in_datagram:
                    assert item[3:] == meta_at_first
                else:
                    meta_at_first = item[3:]
                in_datagram = not p.last
                got_tx.append(item)

    async def engine_side(ctx):
        pending = list(tx_words)
        for cycle in range(8000):
            ctx.set(dut.rx.ready, 1)
            if pending:
                ctx.set(dut.tx.valid, 1)
                ctx.set(dut.tx.p, pending[0])
            else:
                ctx.set(dut.tx.valid, 0)
            _, _, valid, p, tx_ready, *events = await ctx.tick("sync").sample(
                dut.rx.valid, dut.rx.p, dut.tx.ready, *[dut.events[n] for n in EVENTS])
            if pending and tx_ready:
                pending.pop(0)
            if valid:
                got_rx.append((int(p.data), int(p.last), int(p.last_be), int(p.error),
                               int(p.meta.ip_address), int(p.meta.length)))
            for name, strobe in zip(EVENTS, events):
                counted[name] += strobe
        assert ctx.get(dut.link) == 1

    sim = Simulator(dut)
    sim.add_clock(16e-9, domain="eth")
    sim.add_clock(8e-9, domain="sync", phase=3e-9)
    sim.add_testbench(core_side)
    sim.add_testbench(engine_side)
    sim.run()
    assert got_rx == [(w["data"], w["last"], w["last_be"], w["error"], w["meta"]["ip_address"],
                       w["meta"]["length"]) for w in rx_words]
    assert got_tx == [(w["data"], w["last"], w["last_be"], w["meta"]["ip_address"],
                       w["meta"]["length"]) for w in tx_words]
    want = {name: sum(1 for n, _ in pulses if n == name) for name in EVENTS}
    assert counted == want
