# amaranth: UnusedElaboratable=no
"""The lane ALU (wrap-around ADD, OR, first contribution) against its reference."""
import random

from hdl.switch.lane_alu import LaneALU, lane_alu_reference
from tests.amaranth_sim import run

# -- LaneALU -------------------------------------------------------------------------------

def test_lane_alu_matches_reference():
    rng = random.Random(3)
    dut = LaneALU(lanes=8)
    nasty = [0, 1, 0x7FFF_FFFF, 0x8000_0000, 0xFFFF_FFFF, 0xFFFF_FFFE]

    def beat():
        return sum((rng.choice(nasty) if rng.random() < 0.4 else rng.getrandbits(32)) << (32 * j)
                   for j in range(8))

    async def bench(ctx):
        for _ in range(400):
            old, payload = beat(), beat()
            first, op_or, keep_old = (rng.random() < 0.3 for _ in range(3))
            for name, value in (("old", old), ("payload", payload), ("first", first),
                                ("op_or", op_or), ("keep_old", keep_old)):
                ctx.set(getattr(dut, name), value)
            want = lane_alu_reference(old, payload, first=first, op_or=op_or,
                                      keep_old=keep_old)
            assert ctx.get(dut.result) == want, (hex(old), hex(payload), first, op_or, keep_old)

    run(dut, bench, clocked=False)


def test_lane_alu_reference_wraps():
    assert lane_alu_reference(0xFFFF_FFFF, 2, first=False, op_or=False, keep_old=False) == 1
    assert lane_alu_reference(0xF0, 0x0F, first=False, op_or=True, keep_old=False) == 0xFF
