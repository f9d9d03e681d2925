"""The skid buffer passes every beat once, in order, under random stalls on both sides."""
import random

from amaranth.lib import data

from hdl.stream.skid_buffer import SkidBuffer
from tests.amaranth_sim import run_stream

WORD = data.StructLayout({"value": 16})


def test_skid_buffer_passes_every_beat_once_in_order_under_random_stalls():
    dut = SkidBuffer(WORD)
    rng = random.Random(5)
    sent = [rng.getrandbits(16) for _ in range(300)]
    received = run_stream(dut, sent, lambda ctx, value: ctx.set(dut.i.p, {"value": value}),
                          lambda payload: payload.value, len(sent), seed=5, p_stall=0.3,
                          p_block=0.4)
    assert received == sent
