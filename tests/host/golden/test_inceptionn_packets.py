"""INCEPTIONN packet helpers and the NIC transmit/receive reference (docs/nic-contract.md)."""
import secrets

import numpy as np
import pytest

from contract.counters import NIC_RX_COUNTERS, NIC_TX_COUNTERS
from host.golden import inceptionn as inc
from contract.header import Flags, Header, PacketType
from contract.packet import Packet


def fresh_rng():
    seed = secrets.randbits(64)
    return np.random.default_rng(seed), seed


def tensor(rng, n):
    """Gradient-like values plus some large ones and a NaN with a payload."""
    x = rng.normal(0, 1e-3, n).astype(np.float32)
    if n:
        big = rng.integers(0, n, max(1, n // 50))
        x[big] = rng.normal(0, 2, big.size).astype(np.float32)
        x.view(np.uint32)[rng.integers(0, n)] = 0x7FC0DEAD
    return x


def same_bits(a, b):
    return np.array_equal(np.asarray(a, np.float32).view(np.uint32),
                          np.asarray(b, np.float32).view(np.uint32))


def raw_packet(values, k=10, flags=Flags.COMPRESS, count=None, **fields):
    values = np.asarray(values, dtype=np.float32)
    header = Header(type=PacketType.RAW_F32, flags=flags, k=k,
                    count=values.size if count is None else count, **fields)
    return Packet(header, values.tobytes())


def inc_packet(values, k=10, count=None, **fields):
    values = np.asarray(values, dtype=np.float32)
    header = Header(type=PacketType.INC_F32, flags=Flags.COMPRESS, k=k,
                    count=values.size if count is None else count, **fields)
    return Packet(header, inc.encode(values, k))


# -- tensor_to_packets / packets_to_tensor -----------------------------------------------

@pytest.mark.parametrize("n, per_packet", [(5000, 2048), (4096, 2048), (1, 2048), (100, 13),
                                           (77, 8), (300, 1)])
def test_split_headers_and_payloads(n, per_packet):
    rng, seed = fresh_rng()
    x = tensor(rng, n)
    raw = inc.tensor_to_packets(x, 7, packet_values=per_packet, job=3, worker=5, seq=40)
    compressed = inc.tensor_to_packets(x, 7, compress=True, packet_values=per_packet, job=3,
                                       worker=5, seq=40)
    expected_counts = [min(per_packet, n - o) for o in range(0, n, per_packet)]
    assert [p.header.count for p in raw] == expected_counts
    for i, (r, c) in enumerate(zip(raw, compressed)):
        offset = i * per_packet
        piece = x[offset:offset + per_packet]
        common = dict(flags=Flags.COMPRESS, k=7, job=3, worker=5, seq=40 + i, offset=offset,
                      count=piece.size)
        assert r.header == Header(type=PacketType.RAW_F32, **common)
        assert c.header == Header(type=PacketType.INC_F32, **common)
        assert r.payload == piece.tobytes()
        assert c.payload == inc.encode(piece, 7), seed
    assert same_bits(inc.packets_to_tensor(raw), x)
    assert same_bits(inc.packets_to_tensor(compressed), inc.quantize(x, 7))


def test_reassembly_in_any_order_mixed_types_and_k():
    rng, seed = fresh_rng()
    x = tensor(rng, 3000)
    packets = inc.tensor_to_packets(x, 10, compress=True, packet_values=256)
    # Some packets raw, some with another k: each is decoded as its header says.
    packets[3] = inc.tensor_to_packets(x[768:1024], 10, packet_values=256, offset=768)[0]
    packets[5] = inc.tensor_to_packets(x[1280:1536], 4, compress=True, packet_values=256,
                                       offset=1280)[0]
    expected = inc.quantize(x, 10)
    expected[768:1024] = x[768:1024]
    expected[1280:1536] = inc.quantize(x[1280:1536], 4)
    order = rng.permutation(len(packets))
    assert same_bits(inc.packets_to_tensor([packets[i] for i in order]), expected), seed
    assert same_bits(inc.packets_to_tensor(packets, 3000), expected)
    # A piece of a tensor: packets 2..4 are elements 512..1280.
    assert same_bits(inc.packets_to_tensor(packets[2:5][::-1], 768, offset=512),
                     expected[512:1280])


def test_empty_tensor():
    assert inc.tensor_to_packets(np.zeros(0, np.float32)) == []
    assert inc.packets_to_tensor([]).size == 0
    assert inc.packets_to_tensor([], 0).size == 0


def test_reassembly_errors():
    rng, _ = fresh_rng()
    x = tensor(rng, 1000)
    packets = inc.tensor_to_packets(x, 10, compress=True, packet_values=100)
    with pytest.raises(inc.ReassemblyError, match="gap"):
        inc.packets_to_tensor(packets[:4] + packets[5:])
    with pytest.raises(inc.ReassemblyError, match="overlap"):
        inc.packets_to_tensor(packets + [packets[7]])
    with pytest.raises(inc.ReassemblyError, match="gap"):
        inc.packets_to_tensor(packets[1:])
    with pytest.raises(inc.ReassemblyError, match="cover"):
        inc.packets_to_tensor(packets, 1001)
    with pytest.raises(inc.ReassemblyError, match="cover"):
        inc.packets_to_tensor(packets[:-1], 1000)
    bad = list(packets)
    bad[2] = Packet(bad[2].header, bad[2].payload[:-4])
    with pytest.raises(inc.ReassemblyError, match="truncated"):
        inc.packets_to_tensor(bad)
    bad[2] = Packet(packets[2].header.replace(count=2 ** 32 - 1), packets[2].payload)
    with pytest.raises(inc.ReassemblyError, match="truncated"):
        inc.packets_to_tensor(bad)
    bad[2] = Packet(packets[2].header.replace(magic=0x48), packets[2].payload)
    with pytest.raises(inc.ReassemblyError, match="magic"):
        inc.packets_to_tensor(bad)
    bad[2] = Packet(packets[2].header.replace(type=PacketType.AGG_ADD_I32), packets[2].payload)
    with pytest.raises(inc.ReassemblyError, match="type"):
        inc.packets_to_tensor(bad)
    bad[2] = Packet(packets[2].header.replace(k=0), packets[2].payload)
    with pytest.raises(inc.ReassemblyError, match="k=0"):
        inc.packets_to_tensor(bad)
    raw = inc.tensor_to_packets(x, 10, packet_values=100)
    raw[0] = Packet(raw[0].header.replace(count=99), raw[0].payload)
    with pytest.raises(inc.ReassemblyError, match="RAW_F32 payload"):
        inc.packets_to_tensor(raw)


def test_split_arguments_are_checked():
    with pytest.raises(ValueError, match="k"):
        inc.tensor_to_packets(np.zeros(4, np.float32), 0)
    for bad in (0, -1, 2.5):
        with pytest.raises(ValueError, match="packet_values"):
            inc.tensor_to_packets(np.zeros(4, np.float32), packet_values=bad)


# -- nic_tx ------------------------------------------------------------------------------

def test_tx_compresses():
    rng, seed = fresh_rng()
    x = tensor(rng, 100)
    packet = raw_packet(x, k=9, job=2, worker=7, exponent=-3, slot=11, slot_version=1, seq=99,
                        offset=1234)
    out, cause = nic_tx_checked(packet)
    assert cause == "compressed"
    assert out.header == packet.header.replace(type=PacketType.INC_F32)
    assert out.payload == inc.encode(x, 9)
    # Header-only packet.
    out, cause = nic_tx_checked(raw_packet([], k=9))
    assert cause == "compressed" and out.payload == b"" and out.beats == 1
    # The transmit path emits exactly what tensor_to_packets(compress=True) builds.
    fed = inc.tensor_to_packets(x, 12, packet_values=32, seq=5)
    emitted = inc.tensor_to_packets(x, 12, compress=True, packet_values=32, seq=5)
    assert [nic_tx_checked(p)[0] for p in fed] == emitted


def test_tx_length_mismatch_still_compresses():
    x = np.linspace(-2, 2, 20, dtype=np.float32)
    for count in (19, 21, 0, 1000):
        packet = raw_packet(x, count=count)
        out, cause = nic_tx_checked(packet)
        assert cause == "length_mismatch"
        assert out.header == packet.header.replace(type=PacketType.INC_F32)
        assert out.header.count == count
        assert out.payload == inc.encode(x, 10)


@pytest.mark.parametrize("k", [0, 16, 255])
def test_tx_bad_k_passes_through(k):
    packet = raw_packet([0.5, 1.5], k=k)
    out, cause = nic_tx_checked(packet)
    assert cause == "bad_k" and out.to_bytes() == packet.to_bytes()


@pytest.mark.parametrize("change", [
    dict(flags=Flags.NONE), dict(flags=Flags.RESULT | Flags.ERROR), dict(type=PacketType.INC_F32),
    dict(type=PacketType.AGG_ADD_I32), dict(type=PacketType.AGG_OR32), dict(type=9),
    dict(magic=0x46), dict(version=2), dict(magic=0, k=0)])
def test_tx_bypasses_everything_else(change):
    packet = raw_packet([0.25, -3.0, 1e-9], k=10)
    packet = Packet(packet.header.replace(**change), packet.payload)
    out, cause = nic_tx_checked(packet)
    assert cause == "bypassed" and out.to_bytes() == packet.to_bytes()


@pytest.mark.parametrize("count", [inc.MAX_COUNT + 1, inc.MAX_COUNT + 8, 1 << 20, 2**32 - 1])
def test_tx_too_large_passes_through_raw(count):
    """Spec section 4: a COMPRESS packet above the NIC maximum leaves raw (the receive path
    would drop it), counted as too_large; bad_k is checked first."""
    rng, seed = fresh_rng()
    values = tensor(rng, min(count, inc.MAX_COUNT + 8))
    packet = raw_packet(values, count=count)
    out, cause = nic_tx_checked(packet)
    assert cause == "too_large" and out.to_bytes() == packet.to_bytes(), seed
    assert nic_tx_checked(raw_packet(values, k=0, count=count))[1] == "bad_k"


@pytest.mark.parametrize("n", [0, 1, inc.MAX_COUNT - 1, inc.MAX_COUNT, inc.MAX_COUNT + 1])
def test_rx_takes_whatever_tx_sends(n):
    """Nothing the transmit path produces from a well-formed packet is dropped by the
    receive path, at the size limit and one past it."""
    rng, seed = fresh_rng()
    values = tensor(rng, n)
    sent, _ = nic_tx_checked(raw_packet(values))
    out, cause = nic_rx_checked(sent)
    assert cause in ("decompressed", "bypassed"), (n, cause, seed)
    want = inc.quantize(values, 10) if n <= inc.MAX_COUNT else values
    assert same_bits(np.frombuffer(out.payload, dtype="<f4"), want), (n, seed)


def nic_tx_checked(packet):
    out, cause = inc.nic_tx(packet)
    assert cause in NIC_TX_COUNTERS and cause != "packets"
    return out, cause


# -- nic_rx ------------------------------------------------------------------------------

def nic_rx_checked(packet, **kw):
    out, cause = inc.nic_rx(packet, **kw)
    assert cause in NIC_RX_COUNTERS and cause != "packets"
    assert (out is None) == cause.startswith("drop_")
    return out, cause


def test_rx_decompresses():
    rng, seed = fresh_rng()
    for n in (0, 1, 7, 8, 9, 100, 2048):
        x = tensor(rng, n)
        packet = inc_packet(x, k=11, job=1, worker=2, exponent=5, slot=3, seq=4, offset=8)
        out, cause = nic_rx_checked(packet)
        assert cause == "decompressed"
        assert out.header == packet.header.replace(type=PacketType.RAW_F32)
        assert same_bits(np.frombuffer(out.payload, "<f4"), inc.quantize(x, 11)), seed


def test_tx_then_rx_round_trip():
    rng, seed = fresh_rng()
    x = tensor(rng, 5000)
    for fed in inc.tensor_to_packets(x, 10, packet_values=2048, job=4):
        sent, tx_cause = inc.nic_tx(fed)
        received, rx_cause = inc.nic_rx(sent)
        assert (tx_cause, rx_cause) == ("compressed", "decompressed")
        assert received.header == fed.header
        piece = np.frombuffer(fed.payload, "<f4")
        assert same_bits(np.frombuffer(received.payload, "<f4"), inc.quantize(piece, 10)), seed


@pytest.mark.parametrize("kind", [PacketType.RAW_F32, PacketType.AGG_ADD_I32,
                                  PacketType.AGG_OR32, 7])
def test_rx_bypasses_other_types(kind):
    packet = raw_packet([1.0, 2.0, 3.0], k=99)
    packet = Packet(packet.header.replace(type=kind), packet.payload)
    out, cause = nic_rx_checked(packet)
    assert cause == "bypassed" and out.to_bytes() == packet.to_bytes()


def test_rx_drop_causes():
    x = np.linspace(-1.5, 1.5, 40, dtype=np.float32)
    good = inc_packet(x)
    cases = {
        "drop_bad_header": [Packet(good.header.replace(magic=0x00), good.payload),
                            Packet(good.header.replace(version=0), good.payload),
                            # bad header wins over the type check: RAW packets too
                            Packet(raw_packet(x).header.replace(version=2), x.tobytes())],
        "drop_bad_k": [Packet(good.header.replace(k=0), good.payload),
                       Packet(good.header.replace(k=16), good.payload)],
        "drop_too_large": [Packet(good.header.replace(count=inc.MAX_COUNT + 1), good.payload)],
        "drop_truncated": [Packet(good.header, good.payload[:-4]),
                           Packet(good.header, b""),
                           Packet(good.header.replace(count=80), good.payload)],
        "drop_overlong": [Packet(good.header, good.payload + bytes(4)),
                          Packet(good.header.replace(count=0), good.payload),
                          Packet(good.header, good.payload + good.payload)],
    }
    for expected, packets in cases.items():
        for packet in packets:
            assert nic_rx_checked(packet) == (None, expected), (expected, str(packet))
    # The engine's size limit is a parameter.
    assert nic_rx_checked(good, max_count=39) == (None, "drop_too_large")
    assert nic_rx_checked(good, max_count=40)[1] == "decompressed"


def test_rx_drop_priority():
    """A packet bad in several ways is counted under the first cause in counter order."""
    x = np.linspace(-1.5, 1.5, 40, dtype=np.float32)
    good = inc_packet(x)
    defects = {
        "drop_bad_header": dict(magic=0x11),
        "drop_bad_k": dict(k=0),
        "drop_too_large": dict(count=5000),      # with 40 values of payload: also truncated
        "drop_truncated": "truncate",
    }
    names = list(defects)
    for mask in range(1, 1 << len(names)):
        chosen = [names[i] for i in range(len(names)) if mask >> i & 1]
        header, payload = good.header, good.payload
        for name in chosen:
            if defects[name] == "truncate":
                payload = payload[:8]
            else:
                header = header.replace(**defects[name])
        expected = min(chosen, key=NIC_RX_COUNTERS.index)
        assert nic_rx_checked(Packet(header, payload)) == (None, expected), chosen


def test_rx_length_mismatch_is_not_always_detectable():
    """TX encodes the payload's own words when they differ from `count`; RX judges the
    stream against `count`, so a mismatch is dropped only when the stream length gives it
    away. Here 8 zero words become 32 bits that hold 9 zero values just as well."""
    sent, cause = inc.nic_tx(raw_packet(np.zeros(8, np.float32), count=9))
    assert cause == "length_mismatch"
    received, cause = inc.nic_rx(sent)
    assert cause == "decompressed" and received.payload == bytes(36)
    # 8 raw values: 34 bytes, padded to 36; the 9th value's tag vector fits in the padding.
    sent, _ = inc.nic_tx(raw_packet(np.full(8, 3.0, np.float32), count=9))
    assert inc.nic_rx(sent)[1] == "decompressed"
    # One 16-bit payload: 4 bytes, no padding left for a 9th value.
    sent, _ = inc.nic_tx(raw_packet(np.float32([0.5] + [0] * 7), count=9))
    assert inc.nic_rx(sent) == (None, "drop_truncated")
    sent, _ = inc.nic_tx(raw_packet(np.full(16, 3.0, np.float32), count=8))
    assert inc.nic_rx(sent) == (None, "drop_overlong")


def test_rx_ignores_padding_bits():
    good = inc_packet(np.float32([0.3, -0.3]))   # 48 bits + 16 bits of padding
    payload = bytearray(good.payload)
    payload[-2:] = b"\xa5\x5a"
    out, cause = nic_rx_checked(Packet(good.header, bytes(payload)))
    assert cause == "decompressed" and out.payload == nic_rx_checked(good)[0].payload
