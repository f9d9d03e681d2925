# amaranth: UnusedElaboratable=no
"""The self-test's independent lane quantiser against the spec's arithmetic and the
golden codec."""
import fractions
import random
import struct

import pytest
from amaranth import Module
from amaranth.lib import wiring

from hdl.selftest.gradient_gen import GradientGenerator, GradientModel
from hdl.selftest.lane_quantizer import QuantizeStream, quantize_model
from tests.amaranth_sim import consume, run

# -- the independent lane quantiser ------------------------------------------------------------

def _nasty_words():
    words = [0, 0x80000000, 1, 0x807FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001,
             0xFFFFFFFF, 0x7F7FFFFF, 0x3F800000, 0xBF800000, 0x3F7FFFFF]
    for k in range(1, 16):
        for e in {127 - k, min(134 - k, 127), 127}:
            for s in (0, 1):
                words += [s << 31 | e << 23, s << 31 | (e - 1) << 23 | 0x7FFFFF,
                          s << 31 | e << 23 | 1]
    return words


def _spec_arithmetic(u, k):
    """Section 2 from the value side: floor(|x| * 2^k) * 2^-k or floor(|x| * 2^15) * 2^-15,
    computed with exact rationals and converted back to a word."""
    s, e, m = u >> 31, u >> 23 & 0xFF, u & 0x7FFFFF
    if e >= 127:
        return u
    magnitude = fractions.Fraction(m if e == 0 else (1 << 23) | m, 1 << 23) \
        * fractions.Fraction(2) ** ((1 if e == 0 else e) - 127)
    if magnitude < fractions.Fraction(1, 1 << k):
        return 0
    scale = k if magnitude < fractions.Fraction(2) ** (7 - k) else 15
    q = fractions.Fraction((magnitude * (1 << scale)).__floor__(), 1 << scale)
    word = struct.unpack("<I", struct.pack("<f", float(q)))[0]   # exact: q has <= 15 bits
    return word | s << 31


def test_quantize_model_matches_spec_arithmetic():
    rng = random.Random(5)
    words = _nasty_words() + [rng.getrandbits(32) for _ in range(3000)]
    # plus plenty of values in (2^-16, 1), where all the work is
    words += [rng.getrandbits(1) << 31 | rng.randrange(110, 127) << 23 | rng.getrandbits(23)
              for _ in range(3000)]
    for k in range(1, 16):
        bad = [(hex(u), hex(quantize_model(u, k)), hex(_spec_arithmetic(u, k)))
               for u in words if quantize_model(u, k) != _spec_arithmetic(u, k)]
        assert not bad, f"k={k}: {bad[:5]}"


def test_quantize_model_matches_golden_codec():
    np = pytest.importorskip("numpy")
    golden = pytest.importorskip("host.golden.inceptionn")
    rng = random.Random(6)
    words = _nasty_words() + [rng.getrandbits(32) for _ in range(5000)]
    array = np.array(words, dtype=np.uint32)
    for k in range(1, 16):
        want = golden.quantize(array.view(np.float32), k).view(np.uint32)
        assert [quantize_model(u, k) for u in words] == [int(w) for w in want], f"k={k}"


def _quantised_beats(model, n):
    """The first ``n`` beats of a GradientModel after the NIC's round trip."""
    out = []
    for fields, k, beats in model.packets():
        for i, (data, keep, last) in enumerate(beats):
            if i and k is not None:
                data = sum(quantize_model(data >> 32 * j & 0xFFFFFFFF, k) << 32 * j
                           for j in range(8))
            out.append((data, keep, last))
        if len(out) >= n:
            return out[:n]


def test_quantize_stream_matches_model_under_back_pressure():
    m = Module()
    m.submodules.gen = gen = GradientGenerator(seed=11, max_count=32)
    m.submodules.quantise = quantise = QuantizeStream()
    wiring.connect(m, gen.o, quantise.i)
    n, got = 800, []

    async def tb(ctx):
        got.extend(await consume(ctx, quantise.o, n, random.Random(3)))

    run(m, tb)
    want = _quantised_beats(GradientModel(seed=11, max_count=32), n)
    bad = [i for i in range(n) if got[i] != want[i]]
    assert not bad, f"{len(bad)} beats differ, first at {bad[0]}"
