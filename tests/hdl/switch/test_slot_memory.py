# amaranth: UnusedElaboratable=no
"""The forwarded slot memory: every read sees every write up to the cycle before its data."""
import random

import pytest
from amaranth import unsigned

from hdl.switch.slot_memory import ForwardedMemory
from tests.amaranth_sim import run

# -- ForwardedMemory -----------------------------------------------------------------------

@pytest.mark.parametrize("depth", [1, 3, 8])
def test_forwarded_memory_returns_every_write_up_to_the_cycle_before_the_data(depth):
    """Read in cycle t -> data in t + 2 = the row after all writes issued up to t + 1.

    A small depth and frequent writes make the read and write addresses collide in the
    same cycle and one cycle apart all the time: the two forwarding paths.
    """
    rng = random.Random(depth)
    cycles = 600
    dut = ForwardedMemory(shape=unsigned(16), depth=depth)
    seen = []

    async def bench(ctx):
        memory = [0] * depth
        snapshots = []          # memory after the writes of cycles 0..c
        reads = []
        for c in range(cycles):
            read_addr = rng.randrange(depth)
            write = rng.random() < 0.7
            write_addr, write_data = rng.randrange(depth), rng.getrandbits(16)
            ctx.set(dut.read_addr, read_addr)
            ctx.set(dut.write_en, write)
            ctx.set(dut.write_addr, write_addr)
            ctx.set(dut.write_data, write_data)
            reads.append(read_addr)
            if write:
                memory[write_addr] = write_data
            snapshots.append(list(memory))
            await ctx.tick()
            if c >= 1:   # now in cycle c + 1: the data of the read issued in cycle c - 1
                seen.append((ctx.get(dut.read_data), snapshots[c][reads[c - 1]]))

    run(dut, bench)
    assert len(seen) == cycles - 1
    bad = [(i, got, want) for i, (got, want) in enumerate(seen) if got != want]
    assert not bad, f"stale or wrong reads (read index, got, want): {bad[:5]}"


def expect_construction_error(error, match, factory):
    with pytest.raises(error, match=match):
        factory()


def test_forwarded_memory_rejects_bad_depth():
    expect_construction_error(ValueError, "depth",
                              lambda: ForwardedMemory(shape=unsigned(8), depth=0))
