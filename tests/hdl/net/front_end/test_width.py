"""Width conversion: datagram words -> 256-bit beats (Upsizer) and back (Downsizer)."""
import random

import pytest

from hdl.net.core.eth_core import UdpMeta
from hdl.net.front_end.layouts import ReplyTag
from hdl.stream.width import Downsizer, Upsizer
from tests.amaranth_sim import datagram_words, run, send_items, take_items

META = {"ip_address": 0xC0A84D0A, "src_port": 40000, "dst_port": 47570, "length": 0}


def padded_beats(payload):
    """What the engines must see: the bytes, zero-filled to whole 32-byte beats."""
    n = max(1, -(-len(payload) // 32))
    return bytes(payload) + bytes(32 * n - len(payload))


@pytest.mark.parametrize("seed,p_stall,p_block", [(1, 0.0, 0.0), (2, 0.4, 0.0), (3, 0.3, 0.5)])
def test_upsizer_packs_words_into_beats(seed, p_stall, p_block):
    rng = random.Random(seed)
    lengths = [0, 1, 2, 3, 4, 5, 31, 32, 33, 63, 64, 65] + [rng.randint(0, 300) for _ in range(20)]
    datagrams = [bytes(rng.getrandbits(8) for _ in range(n)) for n in lengths]
    dut = Upsizer(UdpMeta)
    words = []
    for n, payload in enumerate(datagrams):
        meta = dict(META, length=len(payload), src_port=1000 + n)
        words += datagram_words(payload, meta, rng=rng, error=(n % 5 == 4))
    total_beats = sum(max(1, -(-len(p) // 32)) for p in datagrams)
    got = []

    async def producer(ctx):
        await send_items(ctx, dut.i, words, rng, p_stall)

    async def consumer(ctx):
        got.extend(await take_items(ctx, dut.o, rng, count=total_beats, p_block=p_block,
                                    convert=lambda p: (int(p.data), int(p.last), int(p.error),
                                                       int(p.drop), int(p.meta.src_port))))

    run(dut, producer, consumer)
    position = 0
    for n, payload in enumerate(datagrams):
        want = padded_beats(payload)
        beats = got[position:position + len(want) // 32]
        position += len(want) // 32
        data = b"".join(d.to_bytes(32, "little") for d, *_ in beats)
        assert data == want, f"datagram {n} ({len(payload)} bytes)"
        assert [last for _, last, *_ in beats] == [0] * (len(beats) - 1) + [1]
        assert beats[-1][2] == (n % 5 == 4)              # error travels with the last beat
        assert all(src == 1000 + n and drop == 0 for *_, drop, src in beats)
    assert position == len(got)


@pytest.mark.parametrize("seed,p_stall,p_block", [(4, 0.0, 0.0), (5, 0.5, 0.3), (6, 0.1, 0.7)])
def test_downsizer_unpacks_kept_words(seed, p_stall, p_block):
    rng = random.Random(seed)
    dut = Downsizer(ReplyTag)
    beats, want = [], []
    for packet in range(25):
        n_beats = rng.randint(1, 4)
        for b in range(n_beats):
            last = b == n_beats - 1
            words = rng.randint(0, 8) if last else 8
            data = rng.getrandbits(256)
            side = {"ip_address": packet, "src_port": 1, "dst_port": b}
            beats.append({"data": data, "words": words, "last": int(last), "side": side})
            for w in range(max(1, words)):
                value = (data >> (32 * w)) & 0xFFFFFFFF if words else 0
                want.append((value if words else None, int(last and w == max(1, words) - 1),
                             packet, b))
    got = []

    async def producer(ctx):
        await send_items(ctx, dut.i, beats, rng, p_stall)

    async def consumer(ctx):
        got.extend(await take_items(ctx, dut.o, rng, count=len(want), p_block=p_block,
                                    convert=lambda p: (int(p.data), int(p.last),
                                                       int(p.side.ip_address),
                                                       int(p.side.dst_port))))

    run(dut, producer, consumer)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        # an empty packet's one word carries no data: only its framing matters
        assert g[1:] == w[1:] and (w[0] is None or g[0] == w[0]), (g, w)
