# amaranth: UnusedElaboratable=no
"""The decompressor (NIC receive path) in the Amaranth simulator: parameter checks, packets
and counter strobes against the golden model (the long runs are on Verilator,
``tests/hdl/nic/test_nic_top.py``)."""

import numpy as np
import pytest

from contract.header import Header, PacketType
from contract.packet import Packet
from hdl.nic.decompressor import Decompressor, buffer_depth
from hdl.nic.unpacker import Unpacker
from hdl.stream.packet_buffer import PacketBuffer
from host.golden.inceptionn import nic_rx, nic_tx
from sim.nic_stimulus import gradient_words, tx_packet
from tests.amaranth_sim import (
    collect_axis,
    count_events,
    packet_beats,
    reassemble,
    run_stream,
)


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
