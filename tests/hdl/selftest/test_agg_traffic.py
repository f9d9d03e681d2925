# amaranth: UnusedElaboratable=no
"""The aggregator traffic (virtual workers, arbiter, control writes, expected results)
against the reference aggregator model."""
import random
import struct

from contract.header import Header, PacketType
from hdl.selftest.agg_traffic import AggTrafficModel
from tests.amaranth_sim import run

# -- aggregator traffic --------------------------------------------------------------------------

def test_agg_traffic_model_agrees_with_reference_aggregator():
    from contract.packet import Packet
    from host.golden.aggregator import AggregatorModel
    traffic = AggTrafficModel(workers=4, lanes=16, window=3, slot_base=2, job=1, seed=7)
    agg = AggregatorModel(slots=8, lanes=16, max_workers=8, jobs=2)
    agg.configure_job(1, 4, 2, 3)
    workers = [traffic.worker_packets(w) for w in range(4)]
    expected = traffic.expected_results()
    kinds = set()
    for r in range(24):
        results = []
        for w in random.Random(r).sample(range(4), 4):
            header, words = next(workers[w])
            results += agg.process(Packet(header, struct.pack(f"<{len(words)}I", *words)))
        assert len(results) == 1
        want_header, want_words = next(expected)
        assert results[0].header == want_header
        assert results[0].payload == struct.pack(f"<{len(want_words)}I", *want_words)
        kinds.add(want_header.type)
    assert kinds == {PacketType.AGG_ADD_I32, PacketType.AGG_OR32}
    assert agg.counters["accepted"] == 96 and agg.counters["results_multicast"] == 24


def test_agg_traffic_against_reference_aggregator_in_the_loop():
    """AggTraffic's hardware (workers, arbiter, control writes, expected results, checker)
    with the reference aggregator model in place of the engine: the model is configured
    from the control writes the hardware makes, every worker packet must be the Python
    model's, and the checker must accept every result."""
    from contract.packet import Packet
    from hdl.selftest.agg_traffic import AggTraffic
    from host.golden.aggregator import AggregatorModel
    dut = AggTraffic(workers=3, lanes=16, window=2, slot_base=1, job=1, clear_cycles=4,
                     seed=5, stall_limit=400)
    model = AggregatorModel(slots=4, lanes=16, max_workers=4, jobs=2)
    expected_workers = [dut.model().worker_packets(w) for w in range(3)]
    results = []           # result beats waiting to be driven back
    seen = {"packets": 0, "writes": {}}
    rng = random.Random(12)

    async def engine_input(ctx):
        beats = []
        while seen["packets"] < 60:
            ctx.set(dut.o.ready, rng.random() < 0.8)
            _, _, payload, valid, ready, we, addr, wdata = await ctx.tick().sample(
                dut.o.payload, dut.o.valid, dut.o.ready, dut.ctrl.we, dut.ctrl.addr,
                dut.ctrl.wdata)
            if we:
                seen["writes"][int(addr)] = int(wdata)
                if int(addr) == 4 * 1 + 3:
                    w = seen["writes"]
                    model.configure_job(1, w[4], w[5], w[6])
            if not (valid and ready):
                continue
            beats.append(int(payload.data))
            if payload.last:
                data = b"".join(b.to_bytes(32, "little") for b in beats)
                beats = []
                header = Header.parse(data)
                want_header, want_words = next(expected_workers[header.worker])
                assert header == want_header
                assert data[32:] == struct.pack(f"<{len(want_words)}I", *want_words)
                for out in model.process(Packet.from_bytes(data)):
                    raw = out.to_bytes()
                    results.extend(int.from_bytes(raw[i:i + 32], "little")
                                   for i in range(0, len(raw), 32))
                seen["packets"] += 1

    async def engine_output(ctx):
        sent = 0
        while seen["packets"] < 60 or results:
            if results and rng.random() < 0.7:
                ctx.set(dut.results.valid, 1)
                ctx.set(dut.results.payload, {"data": results[0], "keep": 0xFFFFFFFF,
                                              "last": (sent % 3) == 2})
                await ctx.tick().until(dut.results.ready)
                results.pop(0)
                sent += 1
                ctx.set(dut.results.valid, 0)
            else:
                await ctx.tick()
        await ctx.tick().repeat(10)
        seen["checked"] = ctx.get(dut.packets)
        seen["errors"] = ctx.get(dut.errors)

    run(dut, engine_input, engine_output)
    assert seen["writes"] == {4: 3, 5: 1, 6: 2, 7: 1}
    assert seen["errors"] == 0
    assert seen["checked"] == model.counters["results_multicast"] >= 18
