# amaranth: UnusedElaboratable=no
"""The gradient generator against its Python model."""
import collections
import random

from contract.header import Flags, Header, PacketType
from hdl.selftest.gradient_gen import GradientGenerator, GradientModel, lane_value_model
from hdl.selftest.lane_quantizer import nic_applies_k
from tests.amaranth_sim import consume, run

# -- the gradient generator --------------------------------------------------------------------

def test_generator_matches_model_under_back_pressure():
    dut = GradientGenerator(seed=9, max_count=64)
    n, got = 700, []

    async def tb(ctx):
        got.extend(await consume(ctx, dut.o, n, random.Random(4), ready_rate=0.5))

    run(dut, tb)
    model = GradientModel(seed=9, max_count=64).beats()
    want = [next(model) for _ in range(n)]
    bad = [i for i in range(n) if got[i] != want[i]]
    assert not bad, f"{len(bad)} beats differ, first at {bad[0]}"


def test_generator_packets_are_well_formed_and_varied():
    kinds = collections.Counter()
    counts = set()
    for fields, k, beats in _take(GradientModel(seed=1, max_count=128).packets(), 400):
        header = Header.from_int(beats[0][0])
        assert header == Header(**fields)
        assert nic_applies_k(fields) == k
        words = sum(bin(keep).count("1") // 4 for _, keep, _ in beats[1:])
        assert words == header.count == fields["count"]
        assert [last for _, _, last in beats] == [False] * (len(beats) - 1) + [True]
        counts.add(header.count)
        if header.type != PacketType.RAW_F32:
            kinds["other type"] += 1
        elif not header.flags & Flags.COMPRESS:
            kinds["no compress"] += 1
        elif k is None:
            kinds["bad k"] += 1
        else:
            kinds[f"k={k}"] += 1
    assert {0, 128} <= counts and len(counts) > 50
    assert kinds["other type"] and kinds["no compress"] and kinds["bad k"]
    assert all(kinds[f"k={k}"] for k in range(1, 16)), kinds


def _take(iterator, n):
    return [next(iterator) for _ in range(n)]


def _tag(u, k):
    e = u >> 23 & 0xFF
    return 0 if e < 127 - k else 1 if e < min(134 - k, 127) else 2 if e < 127 else 3


def test_generator_values_cover_every_class_and_the_nasty_cases():
    rng = random.Random(8)
    for k in range(1, 16):
        words = [lane_value_model(rng.getrandbits(64), k) for _ in range(4000)]
        tags = collections.Counter(_tag(u, k) for u in words)
        assert tags[0] == max(tags.values()), f"k={k}: small values must dominate: {tags}"
        assert tags[1] > 200 and tags[3] > 200, f"k={k}: {tags}"
        assert (tags[2] > 200) == (k > 7), f"k={k}: tag 10 exists only for k > 7: {tags}"
        edge = 127 - k
        for name, word in {"+0": 0, "-0": 1 << 31, "+Inf": 0x7F800000, "-Inf": 0xFF800000,
                           "largest finite": 0x7F7FFFFF, "1.0": 0x3F800000,
                           "1 ulp below 1": 0x3F7FFFFF, "2^-k": edge << 23,
                           "1 ulp below 2^-k": (edge - 1) << 23 | 0x7FFFFF,
                           "smallest denormal": 1}.items():
            assert word in words or word | 1 << 31 in words, f"k={k}: no {name}"
        assert any(u & 0x7F800000 == 0x7F800000 and u & 0x7FFFFF for u in words), "no NaN"
        assert any(u & 0x7F800000 == 0 and u & 0x7FFFFF for u in words), "no denormal"
