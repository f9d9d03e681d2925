# amaranth: UnusedElaboratable=no
"""The aggregator's parameter checks, and the whole engine against the reference model in
the Amaranth simulator (small parameters; the long runs are on Verilator,
``tests/hdl/switch/test_switch_top.py``)."""
import random

import pytest

from contract.packet import Packet
from contract.registers import SWITCH_REGISTERS
from hdl.switch.aggregator import Aggregator, check_parameters, slot_state_layout
from host.golden.aggregator import AggregatorModel, Upstream
from sim.switch_traffic import (OPS, EngineParams, bad_packet, chaos_traffic, data_packet,
                                configure_model, configure_writes, hammer_traffic,
                                partial_middle_beat, protocol_traffic, tree_traffic)
from tests.amaranth_sim import RegisterPort, run


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
    with pytest.raises(ValueError, match=message):
        Aggregator(**kwargs)


def test_non_integer_parameter():
    with pytest.raises(TypeError, match="lanes"):
        check_parameters(16, 64.0, 32, 4)


def test_ram_bits_per_slot():
    agg = Aggregator(slots=16, lanes=64, max_workers=32, jobs=4)
    # 2 versions x 64 lanes x 32 bits, and per version 32 seen bits, 6 count bits, op, exp.
    assert agg.ram_bits_per_slot == 2 * 64 * 32 + 2 * (32 + 6 + 1 + 8 + 1)
    assert slot_state_layout(32).size == 96


# -- the whole engine in the Amaranth simulator (small parameters) ------------------------

def model_replay(params, steps):
    """The reference model's outputs (byte images, in order) and counters for ``steps``."""
    model = AggregatorModel(**params.as_dict())
    out = []
    for step in steps:
        if step[0] == "packet":
            out.extend(p.to_bytes() for p in model.process(step[1]))
        elif step[0] == "beats":
            out.extend(p.to_bytes() for p in model.process_beats(step[1]))
        else:
            configure_model(model, step)
    return out, dict(model.counters)


def engine_replay(params, steps, *, seed, pause_in=0.0, pause_out=0.0):
    """Run ``steps`` through :class:`Aggregator` (Amaranth simulator); outputs, counters."""
    rng = random.Random(seed)
    dut = Aggregator(**params.as_dict())
    frames, counters = [], {}
    done = [False]

    async def producer(ctx):
        port = RegisterPort(ctx, dut)
        for step in steps:
            if step[0] == "configure":
                for address, value in configure_writes(step):
                    await port.write(address, value)
                continue
            if step[0] == "beats":
                beats = step[1]
            else:
                image = step[1]
                beats = [(int.from_bytes(image[i:i + 32], "little"),
                          (1 << len(image[i:i + 32])) - 1, i + 32 >= len(image))
                         for i in range(0, len(image), 32)]
            for data, keep, last in beats:
                while rng.random() < pause_in:
                    await ctx.tick()
                ctx.set(dut.i.valid, 1)
                ctx.set(dut.i.payload, {"data": data, "keep": keep, "last": last})
                await ctx.tick().until(dut.i.ready)
                ctx.set(dut.i.valid, 0)
        for _ in range(60):      # let the last results out
            await ctx.tick()
        for name, address in SWITCH_REGISTERS["counter"].items():
            counters[name] = await port.read(address)
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

    run(dut, producer, background=(consumer,))
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


@pytest.mark.parametrize("lanes", [8, 24])
def test_bad_slot_version_and_partial_beats_are_dropped_whole(lanes):
    """A slot_version other than 0 or 1 and a beat other than the last whose tkeep is not
    all ones (the header beat included) are dropped and counted, in the middle of rounds
    whose results must stay exact (aggregator-protocol.md section 2)."""
    params = EngineParams(slots=4, lanes=lanes, max_workers=3, jobs=1)
    rng = random.Random(lanes + 100)
    steps = [("configure", 0, 3, 0, 4)]
    versions = [0] * 4
    for _ in range(12):
        slot = rng.randrange(4)
        version = versions[slot]
        good = [("packet", data_packet(rng, params, job=0, worker=w, slot=slot,
                                       slot_version=version, op=OPS[0])) for w in range(3)]
        bad = [("packet", bad_packet(rng, params, "slot_version", job=0, workers=3,
                                     slot_range=range(slot, slot + 1), version=version)),
               ("beats", partial_middle_beat(rng, params, job=0, workers=3,
                                             slot_range=range(slot, slot + 1),
                                             version=version))]
        steps += good[:1] + bad + good[1:]
        versions[slot] ^= 1
    counters = assert_same(params, steps, seed=lanes, pause_in=0.1, pause_out=0.2)
    assert counters["drop_bad_slot_version"] == 12 and counters["drop_bad_length"] == 12
    assert counters["results_multicast"] == 12


@pytest.mark.parametrize("lanes", [8, 16])
def test_engine_matches_model_with_an_upstream(lanes):
    """A leaf's job (aggregator-protocol.md section 4) beside a job without an upstream:
    completions go upstream and stay pending, retransmissions of pending rounds go upstream
    again, results from upstream make rounds final (or are dropped as duplicates or
    unexpected), final rounds answer retransmissions; then the upstream is configured
    away and the same job completes final again."""
    params = EngineParams(slots=6, lanes=lanes, max_workers=4, jobs=3)
    rng = random.Random(lanes + 7)
    upstream = Upstream(ip=0x0A00_0002, port=47572, job=5, worker=3)
    steps = [("configure", 0, 3, 0, 3, upstream), ("configure", 1, 2, 3, 2)]
    steps += tree_traffic(rng, params, job=0, workers=3, slot_range=range(0, 3), packets=220)
    steps += protocol_traffic(rng, params, jobs={1: (2, range(3, 5))}, packets=30)
    # a result from upstream for a job without one: unexpected
    steps += tree_traffic(rng, params, job=1, workers=2, slot_range=range(3, 5), packets=20)
    steps += [("configure", 0, 3, 0, 3, None)]
    steps += hammer_traffic(rng, params, job=0, workers=3, slot=1, rounds=2)
    counters = assert_same(params, steps, seed=lanes, pause_in=0.2, pause_out=0.3)
    for name in ("upstream_sent", "upstream_resent", "results_upstream",
                 "drop_result_duplicate", "drop_result_unexpected", "results_unicast",
                 "results_multicast"):
        assert counters[name] > 0, (name, counters)


def test_drained_is_high_only_while_the_engine_holds_no_packet():
    """``drained`` (the network front end's copy of the jobs' configuration follows it): 1 at
    rest, 0 while a packet is taken and its commit runs, 1 again after."""
    dut = Aggregator(slots=8, lanes=8, max_workers=4, jobs=2)
    trace = []

    async def bench(ctx):
        ctx.set(dut.o.ready, 1)
        for _ in range(3):
            await ctx.tick()
        trace.append(ctx.get(dut.drained))
        # a two-beat packet (the engine drops it, unconfigured; it is taken all the same)
        for last in (0, 1):
            ctx.set(dut.i.valid, 1)
            ctx.set(dut.i.p.keep, (1 << 32) - 1)
            ctx.set(dut.i.p.last, last)
            await ctx.tick().until(dut.i.ready)
        ctx.set(dut.i.valid, 0)
        for _ in range(60):
            trace.append(ctx.get(dut.drained))
            await ctx.tick()

    run(dut, bench)
    assert trace[0] == 1 and 0 in trace and trace[-1] == 1
