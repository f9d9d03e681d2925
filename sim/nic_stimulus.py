"""Test values and packets for the NIC engines (pure NumPy; shared by the cocotb benches,
the Amaranth unit tests and the NIC benchmark).

Everything returns raw fp32 words (``uint32``) so NaN payloads and -0.0 survive.
"""
from __future__ import annotations

import numpy as np

from contract.header import LANES, Flags, Header, PacketType
from contract.packet import Packet
from host.golden.inceptionn import MAX_COUNT, nic_tx

__all__ = ["SPECIAL_WORDS", "boundary_words", "nasty_words", "gradient_words", "raw_words",
           "random_words", "value_mix", "tx_packet", "tx_traffic", "rx_traffic", "stream_bytes"]

#: Words every value test must see: zeros, denormals, Inf, NaNs with payloads, 1.0 and the
#: largest value below it, the smallest normal.
SPECIAL_WORDS = np.array([
    0x00000000, 0x80000000,                 # +0.0, -0.0
    0x00000001, 0x807FFFFF, 0x00400000,     # denormals
    0x00800000, 0x80800000,                 # smallest normals
    0x7F800000, 0xFF800000,                 # +-Inf
    0x7FC00000, 0x7FC00001, 0xFFFFFFFF,     # quiet NaNs with payloads
    0x7F800001, 0xFFA5A5A5,                 # signalling NaNs
    0x3F800000, 0xBF800000, 0x3F7FFFFF, 0xBF7FFFFF,   # +-1.0, +-(1 - ulp)
    0x7F7FFFFF, 0xFF7FFFFF,                 # +-max finite
], dtype=np.uint32)


def boundary_words(k):
    """For error bound ``2^-k``: every class boundary exponent and its neighbours, with the
    smallest, largest and a middle mantissa, both signs (the ±1-ulp neighbours of each
    power-of-two threshold are the largest mantissa one exponent below)."""
    e8 = min(134 - k, 127)
    exponents = sorted({e for b in (127 - k, e8, 127) for e in (b - 2, b - 1, b, b + 1)
                        if 0 <= e <= 255})
    mantissas = (0, 1, 0x400000, 0x7FFFFE, 0x7FFFFF)
    words = [(s << 31) | (e << 23) | mant for s in (0, 1) for e in exponents for mant in mantissas]
    return np.array(words, dtype=np.uint32)


def nasty_words(k):
    """Special words plus every class boundary of ``k``."""
    return np.concatenate([SPECIAL_WORDS, boundary_words(k)])


def gradient_words(rng, n, scale=1e-3):
    """Gradient-like values: mostly small normals, a few outliers above 1."""
    x = rng.standard_normal(n).astype(np.float32) * np.float32(scale)
    outliers = rng.random(n) < 0.01
    x[outliers] *= np.float32(3000.0)
    return x.view(np.uint32)


def raw_words(rng, n):
    """Values that are all tag 11 (``abs >= 1``, Inf, NaN): the worst case, 272 bits/block."""
    return (rng.integers(127, 256, n, dtype=np.uint32) << 23 |
            rng.integers(0, 1 << 23, n, dtype=np.uint32) |
            rng.integers(0, 2, n, dtype=np.uint32) << 31)


def random_words(rng, n):
    """Uniformly random 32-bit patterns."""
    return rng.integers(0, 1 << 32, n, dtype=np.uint32)


def value_mix(rng, n, k):
    """A random mixture: gradients at several scales, nasty words, random bit patterns."""
    if n == 0:
        return np.zeros(0, dtype=np.uint32)
    kind = rng.integers(0, 6)
    if kind == 0:
        return gradient_words(rng, n, scale=float(10.0 ** rng.uniform(-6, 0)))
    if kind == 1:
        return raw_words(rng, n)
    if kind == 2:
        return np.zeros(n, dtype=np.uint32)
    if kind == 3:
        return random_words(rng, n)
    nasty = nasty_words(k)
    picks = nasty[rng.integers(0, nasty.size, n)]
    if kind == 4:
        return picks
    out = gradient_words(rng, n, scale=2.0 ** -k)
    mask = rng.random(n) < 0.3
    out[mask] = picks[mask]
    return out


def tx_packet(words, k, **header):
    """A ``RAW_F32`` + ``COMPRESS`` packet of ``words`` (what the host hands the NIC)."""
    words = np.asarray(words, dtype=np.uint32)
    h = Header(type=PacketType.RAW_F32, flags=Flags.COMPRESS, k=k, count=words.size)
    return Packet(h.replace(**header), words.astype("<u4").tobytes())


def stream_bytes(tags, code_words):
    """A bitstream built directly from per-value tags and codes (8 lanes per block, spec
    section 3), independently of the golden encoder, for the decoders' tests."""
    payload_bytes = (0, 1, 2, 4)    # by tag: 00 none, 01 P8, 10 P16, 11 raw
    out = bytearray()
    for b in range(0, len(tags), LANES):
        block_tags, block_codes = tags[b:b + LANES], code_words[b:b + LANES]
        out += int(sum(int(t) << 2 * j for j, t in enumerate(block_tags))).to_bytes(2, "little")
        for t, c in zip(block_tags, block_codes):
            out += int(c).to_bytes(4, "little")[:payload_bytes[int(t)]]
    out += bytes(-len(out) % 4)
    return bytes(out)


def _length(rng, max_values):
    pick = rng.random()
    if pick < 0.15:
        return int(rng.integers(0, 3))
    if pick < 0.6:
        return int(rng.integers(0, 64))
    if pick < 0.9:
        return int(rng.integers(64, 600))
    return int(rng.integers(max_values - 16, max_values + 1))


def tx_traffic(rng, packets, *, max_values=MAX_COUNT):
    """Packets for the transmit path: every k in turn, lengths from 0 to ``max_values``,
    bypassed types, bad k, wrong counts, bad magic."""
    out = []
    for i in range(packets):
        k = 1 + i % 15
        n = _length(rng, max_values)
        words = value_mix(rng, n, k)
        hdr = dict(job=int(rng.integers(256)), worker=int(rng.integers(256)),
                   seq=int(rng.integers(1 << 32)), offset=int(rng.integers(1 << 32)),
                   exponent=int(rng.integers(-128, 128)), slot=int(rng.integers(1 << 16)))
        pick = rng.random()
        if pick < 0.08:
            hdr["k"] = int(rng.choice([0, 16, 17, 255]))                       # bad_k
        elif pick < 0.14:
            hdr["count"] = int(max(0, n + int(rng.integers(-9, 10)))) or n + 1  # mismatch
        elif pick < 0.2:
            hdr["type"] = int(rng.choice([PacketType.INC_F32, PacketType.AGG_ADD_I32,
                                          PacketType.AGG_OR32, 7]))            # bypassed
        elif pick < 0.24:
            hdr["flags"] = int(rng.choice([0, Flags.RESULT, Flags.ERROR]))     # no COMPRESS
        elif pick < 0.27:
            hdr["magic"] = int(rng.integers(256)) if rng.random() < 0.5 else 0x47
            hdr["version"] = 1 if hdr["magic"] != 0x47 else 2
        elif pick < 0.3:
            hdr["flags"] = int(Flags.COMPRESS | Flags.ERROR | Flags.RESULT)
        out.append(tx_packet(words, hdr.pop("k", k), **hdr))
    return out


def rx_traffic(rng, packets, *, max_count=MAX_COUNT):
    """Packets for the receive path: good compressed packets (from the golden transmit path)
    and malformed ones (truncated, over-long, wrong count, bad k, too large, bad header,
    random bitstreams), mixed with bypassed packets."""
    out = []
    for i in range(packets):
        k = 1 + i % 15
        n = _length(rng, max_count)
        good, _ = nic_tx(tx_packet(value_mix(rng, n, k), k, seq=i))
        h, payload = good.header, good.payload
        pick = rng.random()
        if pick < 0.45:
            out.append(good)
            continue
        if pick < 0.52:          # truncated by whole words
            cut = int(rng.integers(1, 5)) * 4
            out.append(Packet(h, payload[:max(0, len(payload) - cut)]))
        elif pick < 0.59:        # over-long by whole words (possibly several beats)
            extra = int(rng.choice([1, 2, 7, 8, 9, 20])) * 4
            out.append(Packet(h, payload + rng.bytes(extra)))
        elif pick < 0.66:        # count off by a little
            out.append(Packet(h.replace(count=max(0, h.count + int(rng.integers(-9, 10)))),
                              payload))
        elif pick < 0.7:         # bad k
            out.append(Packet(h.replace(k=int(rng.choice([0, 16, 200]))), payload))
        elif pick < 0.74:        # too large
            out.append(Packet(h.replace(count=int(rng.choice(
                [max_count + 1, max_count + 8, (1 << 32) - 1]))), payload))
        elif pick < 0.78:        # bad magic or version
            if rng.random() < 0.5:
                out.append(Packet(h.replace(magic=int(rng.integers(0, 0x47))), payload))
            else:
                out.append(Packet(h.replace(version=int(rng.choice([0, 2, 255]))), payload))
        elif pick < 0.86:        # random bitstream, random count
            words = int(rng.integers(0, 80))
            out.append(Packet(h.replace(count=int(rng.integers(0, 8 * words + 9))),
                              rng.bytes(4 * words)))
        else:                    # bypassed: other types, raw payload of any length
            kind = int(rng.choice([PacketType.RAW_F32, PacketType.AGG_ADD_I32,
                                   PacketType.AGG_OR32, 9]))
            # now and then longer than the receive buffer (cut-through must not deadlock)
            words = n if rng.random() < 0.8 else int(rng.choice([1000, 4100, 4999]))
            out.append(Packet(h.replace(type=kind, count=words),
                              random_words(rng, words).astype("<u4").tobytes()))
    return out
