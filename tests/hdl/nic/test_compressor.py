# amaranth: UnusedElaboratable=no
"""The compressor (NIC transmit path) end to end in the Amaranth simulator: packets and
counter strobes against the golden model (the long runs are on Verilator,
``tests/hdl/nic/test_nic_top.py``)."""

import numpy as np
import pytest

from contract.header import NIC_MAX_COUNT, Flags, Header, PacketType
from contract.packet import Packet
from hdl.nic.compressor import Compressor
from host.golden.inceptionn import nic_tx
from sim.nic_stimulus import gradient_words, random_words, raw_words, tx_packet

LANES = 8

from tests.amaranth_sim import (
    collect_axis,
    count_events,
    packet_beats,
    reassemble,
    run_stream,
)


def test_compressor_end_to_end():
    rng = np.random.default_rng(11)
    packets = [tx_packet(gradient_words(rng, n, 1e-3), k) for n, k in ((0, 3), (1, 15), (13, 10))]
    packets += [tx_packet(raw_words(rng, 17), 5),
                Packet(Header(type=PacketType.AGG_ADD_I32, count=3), bytes(12)),
                tx_packet(random_words(rng, 9), 0),                       # bad k
                tx_packet(random_words(rng, 9), 4).__class__(              # length mismatch
                    Header(type=0, flags=Flags.COMPRESS, k=4, count=7), bytes(36))]
    inputs = [b for p in packets for b in packet_beats(p)]
    expected = [nic_tx(p)[0].to_bytes() for p in packets]
    dut = Compressor()
    got = run_stream(dut, inputs, lambda ctx, x: ctx.set(dut.i.p, x), collect_axis,
                     sum(-(-len(e) // 32) for e in expected), seed=11)
    assert reassemble(got) == expected


@pytest.mark.parametrize("p_stall", [0.0, 0.4])
def test_compressor_counters_back_to_back(p_stall):
    """Counter strobes match the golden causes, also when a packet's end and the next
    header-only packet's end fall on consecutive cycles (no stalls)."""
    from contract.counters import NIC_TX_COUNTERS
    rng = np.random.default_rng(13)
    empty = lambda count: Packet(Header(type=0, flags=Flags.COMPRESS, k=6, count=count))
    packets = [tx_packet(gradient_words(rng, 8, 1e-2), 10), empty(0), empty(3),
               tx_packet(gradient_words(rng, 9, 1e-2), 10), empty(0), empty(0),
               Packet(Header(type=0, flags=Flags.COMPRESS, k=3, count=5), bytes(16)),
               empty(1), Packet(Header(type=0, flags=Flags.COMPRESS, k=0, count=0)),
               Packet(Header(type=3, count=0)), empty(0),
               # above the NIC maximum: passed through raw (too_large), bad k first
               empty(NIC_MAX_COUNT + 1), empty(2**32 - 1), empty(NIC_MAX_COUNT),
               Packet(Header(type=0, flags=Flags.COMPRESS, k=0, count=NIC_MAX_COUNT + 1)),
               tx_packet(gradient_words(rng, NIC_MAX_COUNT + 1, 1e-2), 10)]
    inputs = [b for p in packets for b in packet_beats(p)]
    expected = [nic_tx(p) for p in packets]
    tally = dict.fromkeys(NIC_TX_COUNTERS, 0)
    dut = Compressor()
    got = run_stream(dut, inputs, lambda ctx, x: ctx.set(dut.i.p, x), collect_axis,
                     sum(o.beats for o, _ in expected), seed=13, p_stall=p_stall, p_block=0.0,
                     extra=count_events(dut, NIC_TX_COUNTERS, tally))
    assert reassemble(got) == [o.to_bytes() for o, _ in expected]
    want = dict.fromkeys(NIC_TX_COUNTERS, 0)
    want["packets"] = len(packets)
    for _, cause in expected:
        want[cause] += 1
    assert tally == want
