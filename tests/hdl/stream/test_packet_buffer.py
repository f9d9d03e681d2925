# amaranth: UnusedElaboratable=no
"""The packet buffer: committed beats come out in order, rewound ones never do."""
import random

from hdl.stream.packet_buffer import End, PacketBuffer
from tests.amaranth_sim import collect_axis, run_stream


def test_packet_buffer_commit_and_rewind():
    """Committed packets come out in order; rewound ones never appear; full buffer stalls."""
    rng = random.Random(7)
    depth = 16
    items, expected = [], []
    for p in range(40):
        beats = rng.randint(1, 12)
        good = rng.random() < 0.6
        datas = [rng.getrandbits(256) for _ in range(beats)]
        for b, d in enumerate(datas):
            last = b == beats - 1
            end = (End.COMMIT if good else End.REWIND) if last else End.NONE
            items.append({"data": d, "keep": 0xFFFFFFFF, "last": last, "write": 1,
                          "end": end})
        if rng.random() < 0.2:   # a verdict-only item after a packet changes nothing
            items.append({"data": 0, "keep": 0, "last": 0, "write": 0, "end": End.COMMIT})
        if good:
            expected += [(d, 0xFFFFFFFF, int(b == beats - 1)) for b, d in enumerate(datas)]
    dut = PacketBuffer(depth=depth)
    got = run_stream(dut, items, lambda ctx, x: ctx.set(dut.i.p, x), collect_axis,
                     len(expected), seed=7, p_stall=0.2, p_block=0.4)
    assert got == expected
