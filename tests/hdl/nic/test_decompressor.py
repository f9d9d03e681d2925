# amaranth: UnusedElaboratable=no
"""The decompressor (NIC receive path) and its packet buffer in the Amaranth simulator:
commit and rewind, parameter checks, packets and counter strobes against the golden
model (the long runs are on Verilator, ``tests/hdl/nic/test_top.py``)."""
import random

import numpy as np
import pytest

from hdl.nic.decompressor import Decompressor, PacketBuffer, buffer_depth
from hdl.nic.unpacker import End, Unpacker
from host.golden.inceptionn import nic_rx, nic_tx
from contract.header import Header, PacketType
from contract.packet import Packet
from sim.nic_stimulus import gradient_words, tx_packet

LANES = 8

from tests.amaranth_sim import (collect_axis, count_events, packet_beats, reassemble, run_stream)


# -- packet buffer ---------------------------------------------------------------------------

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


def test_parameters_are_checked():
    with pytest.raises(ValueError, match="power of two"):
        PacketBuffer(depth=12)
    with pytest.raises(ValueError, match="headroom"):
        PacketBuffer(depth=8, headroom=8)
    with pytest.raises(ValueError, match="max_count"):
        Decompressor(max_count=0)
    with pytest.raises(TypeError, match="max_count"):
        Unpacker(max_count=2.5)
    assert buffer_depth(2048) == 512


def test_decompressor_end_to_end():
    rng = np.random.default_rng(12)
    good = [nic_tx(tx_packet(gradient_words(rng, n, 1e-2), k))[0]
            for n, k in ((0, 3), (1, 15), (21, 10), (64, 7))]
    packets = [good[0], Packet(good[2].header, good[2].payload[:-4]), good[1],
               Packet(good[3].header, good[3].payload + bytes(8)), good[2],
               Packet(good[1].header.replace(k=0), good[1].payload),
               Packet(good[1].header.replace(magic=1), good[1].payload),
               Packet(good[3].header.replace(count=4000), good[3].payload), good[3]]
    inputs = [b for p in packets for b in packet_beats(p)]
    expected = [o.to_bytes() for o, _ in map(nic_rx, packets) if o is not None]
    dut = Decompressor()
    got = run_stream(dut, inputs, lambda ctx, x: ctx.set(dut.i.p, x), collect_axis,
                     sum(-(-len(e) // 32) for e in expected), seed=12)
    assert reassemble(got) == expected


def test_decompressor_small_buffer_under_back_pressure():
    """With the smallest packet buffer its max_count allows and a mostly stalled output,
    the decoder (which never stalls) still never meets a full buffer: nothing is lost."""
    rng = np.random.default_rng(15)
    max_count = 16
    packets = [nic_tx(tx_packet(gradient_words(rng, int(n), 1e-2), 9))[0]
               for n in rng.integers(0, max_count + 1, 12)]
    packets.insert(3, Packet(Header(type=PacketType.AGG_ADD_I32, count=40), bytes(160)))
    inputs = [b for p in packets for b in packet_beats(p)]
    expected = [o.to_bytes() for o, _ in map(nic_rx, packets) if o is not None]
    dut = Decompressor(max_count=max_count)
    assert buffer_depth(max_count) == 8
    got = run_stream(dut, inputs, lambda ctx, x: ctx.set(dut.i.p, x), collect_axis,
                     sum(-(-len(e) // 32) for e in expected), seed=15, p_stall=0.1,
                     p_block=0.8)
    assert reassemble(got) == expected


def test_decompressor_counters():
    from contract.counters import NIC_RX_COUNTERS
    rng = np.random.default_rng(14)
    good = [nic_tx(tx_packet(gradient_words(rng, n, 1e-2), 9))[0] for n in (0, 5, 16)]
    packets = [good[0], good[0], Packet(good[1].header, good[1].payload[:-4]), good[2],
               Packet(good[0].header, bytes(4)), Packet(good[2].header.replace(version=3)),
               Packet(good[1].header.replace(k=16), good[1].payload),
               Packet(Header(type=2, count=1), bytes(4)), good[0],
               Packet(good[2].header.replace(count=2049), good[2].payload), good[1]]
    inputs = [b for p in packets for b in packet_beats(p)]
    expected = [nic_rx(p) for p in packets]
    outputs = [o for o, _ in expected if o is not None]
    tally = dict.fromkeys(NIC_RX_COUNTERS, 0)
    dut = Decompressor()
    got = run_stream(dut, inputs, lambda ctx, x: ctx.set(dut.i.p, x), collect_axis,
                     sum(o.beats for o in outputs), seed=14, p_stall=0.0, p_block=0.0,
                     extra=count_events(dut, NIC_RX_COUNTERS, tally))
    assert reassemble(got) == [o.to_bytes() for o in outputs]
    want = dict.fromkeys(NIC_RX_COUNTERS, 0)
    want["packets"] = len(packets)
    for _, cause in expected:
        want[cause] += 1
    assert tally == want
