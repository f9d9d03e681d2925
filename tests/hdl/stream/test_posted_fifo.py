# amaranth: UnusedElaboratable=no
"""The posted-write FIFO: the producer sees a SyncFIFO's room exactly (the posted write
counted), entries come out in order a clock after they were taken (Amaranth simulator)."""
import random

import pytest

from hdl.stream.posted_fifo import PostedWriteFIFO
from tests.amaranth_sim import run


@pytest.mark.parametrize("depth", [1, 2, 5, 16])
@pytest.mark.parametrize("seed", [1, 2])
def test_room_order_and_latency_against_a_model(depth, seed):
    dut = PostedWriteFIFO(width=12, depth=depth)
    rng = random.Random(seed * 100 + depth)
    stored = []          # in the FIFO, readable
    posted = []          # taken this clock, readable next clock
    out = []
    taken = []

    async def bench(ctx):
        for cycle in range(600):
            # bursts of writes and of reads, so that the FIFO is full and empty in turn
            phase = (cycle // 40) % 2
            write = rng.random() < (0.9 if phase == 0 else 0.2)
            read = rng.random() < (0.2 if phase == 0 else 0.9)
            w_rdy = ctx.get(dut.w_rdy)
            assert w_rdy == (len(stored) + len(posted) < depth), cycle
            assert ctx.get(dut.r_rdy) == bool(stored), cycle
            if stored:
                assert ctx.get(dut.r_data) == stored[0], cycle
            value = rng.getrandbits(12)
            ctx.set(dut.w_en, write and w_rdy)
            ctx.set(dut.w_data, value)
            ctx.set(dut.r_en, read)
            await ctx.tick()
            if read and stored:
                out.append(stored.pop(0))
            stored.extend(posted)
            posted.clear()
            if write and w_rdy:
                posted.append(value)
                taken.append(value)
        assert out == taken[:len(out)] and len(out) > 50

    run(dut, bench)


def test_parameters_are_checked():
    with pytest.raises(ValueError, match="depth"):
        PostedWriteFIFO(width=8, depth=0)
    with pytest.raises(ValueError, match="width"):
        PostedWriteFIFO(width=0, depth=4)
