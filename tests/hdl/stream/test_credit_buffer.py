# amaranth: UnusedElaboratable=no
"""The credit buffer: never overflows, keeps order, and its default depth keeps a stalling
consumer busy (Amaranth simulator)."""
import random

import pytest
from amaranth.lib import data

from hdl.stream.credit_buffer import CreditBuffer
from tests.amaranth_sim import run

WORD = data.StructLayout({"value": 16})


def _run_credit(latency, depth, consumer_ready, cycles, seed, offer_rate=1.0,
                registered_output=True):
    """A producer that issues a beat on every clock ``space`` is high (with probability
    ``offer_rate``), through a ``latency``-clock pipeline, into a credit buffer whose consumer
    is ready when ``consumer_ready(cycle)`` says so.

    Returns (beats issued, beats received in order, clocks the consumer was ready and no
    beat was there after the start-up, overflow seen)."""
    dut = CreditBuffer(WORD, latency=latency, depth=depth, registered_output=registered_output)
    rng = random.Random(seed)
    issued, received = [], []
    result = {"bubbles": 0, "overflow": False}

    async def testbench(ctx):
        pipeline = [None] * latency
        for cycle in range(cycles):
            beat = None
            if ctx.get(dut.space) and rng.random() < offer_rate:
                beat = len(issued)
                issued.append(beat)
            pipeline.append(beat)
            arriving = pipeline.pop(0)
            ctx.set(dut.i.valid, arriving is not None)
            ctx.set(dut.i.p, {"value": 0 if arriving is None else arriving & 0xFFFF})
            ready = consumer_ready(cycle, rng)
            ctx.set(dut.o.ready, ready)
            valid, payload, in_ready = ctx.get(dut.o.valid), ctx.get(dut.o.p), \
                ctx.get(dut.i.ready)
            if arriving is not None and not in_ready:
                result["overflow"] = True
            if valid and ready:
                received.append(payload.value)
            elif ready and cycle > 4 * dut.depth and offer_rate == 1.0:
                result["bubbles"] += 1
            await ctx.tick()

    run(dut, testbench)
    return issued, received, result


@pytest.mark.parametrize("registered_output", [True, False])
@pytest.mark.parametrize("latency", [0, 2, 3, 4])
def test_credit_buffer_never_overflows_and_keeps_order(latency, registered_output):
    """Random consumer: every issued beat fits when it arrives and comes out in order."""
    issued, received, result = _run_credit(
        latency, None, lambda cycle, rng: rng.random() < 0.3, 600, seed=latency,
        registered_output=registered_output)
    assert not result["overflow"]
    assert received == [b & 0xFFFF for b in issued[:len(received)]]
    assert len(issued) - len(received) <= 2 * (latency + 1) + 5   # the rest is inside


@pytest.mark.parametrize("registered_output", [True, False])
@pytest.mark.parametrize("latency", [2, 3, 4])
@pytest.mark.parametrize("period", [17, 5, 1000])
def test_credit_buffer_default_depth_keeps_a_stalling_consumer_busy(latency, period,
                                                                    registered_output):
    """With beats always on offer, a consumer that stalls one clock in ``period`` never
    finds the buffer empty (the compressor's accumulator with all-raw blocks: period 17)."""
    _, _, result = _run_credit(latency, None, lambda cycle, rng: cycle % period != period - 1,
                               500, seed=period, registered_output=registered_output)
    assert not result["overflow"]
    assert result["bubbles"] == 0


def test_credit_buffer_one_entry_short_runs_dry():
    """The default depth is the smallest that keeps the period-17 consumer busy (so the
    test above can fail)."""
    _, _, result = _run_credit(3, 2 * (3 + 1) + 4, lambda cycle, rng: cycle % 17 != 16, 500,
                               seed=1)
    assert result["bubbles"] > 0


def test_credit_buffer_parameters_are_checked():
    with pytest.raises(ValueError, match="latency"):
        CreditBuffer(WORD, latency=-1)
    with pytest.raises(ValueError, match="cannot cover"):
        CreditBuffer(WORD, latency=3, depth=6)       # needs 3 + 1 (space delay) + 3
    with pytest.raises(ValueError, match="space_delay"):
        CreditBuffer(WORD, latency=3, space_delay=-1)
