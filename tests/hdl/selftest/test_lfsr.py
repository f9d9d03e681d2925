# amaranth: UnusedElaboratable=no
"""The LFSR against the bit-serial reference."""
import random

import pytest

from hdl.selftest.lfsr import LFSR, lfsr_advance, lfsr_step
from tests.amaranth_sim import run

# -- LFSR ------------------------------------------------------------------------------------

def test_lfsr_16_bit_is_maximal_length():
    state, seen = 1, set()
    while state not in seen:
        seen.add(state)
        state = lfsr_step(state, 16)
    assert len(seen) == (1 << 16) - 1 and state == 1


@pytest.mark.parametrize("width, steps", [(16, 5), (64, 64), (31, 31)])
def test_lfsr_hardware_matches_bit_serial_reference(width, steps):
    dut = LFSR(width=width, seed=0x1234 & ((1 << width) - 1) or 1, steps=steps)
    rng = random.Random(width)
    pattern = [rng.random() < 0.6 for _ in range(300)]

    async def tb(ctx):
        state = dut.seed
        for advance in pattern:
            assert ctx.get(dut.value) == state
            ctx.set(dut.advance, advance)
            await ctx.tick()
            if advance:
                state = lfsr_advance(state, width, steps)
        assert ctx.get(dut.value) == state

    run(dut, tb)


def test_lfsr_rejects_bad_parameters():
    with pytest.raises(ValueError, match="seed"):
        LFSR(width=32, seed=0)
    with pytest.raises(ValueError, match="width 33"):
        LFSR(width=33)
    with pytest.raises(ValueError, match="steps"):
        LFSR(width=32, steps=0)
