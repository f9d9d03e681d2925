"""INCEPTIONN golden model: values (spec section 2) and bitstreams (section 3).

The vectorised model is checked against the spec's worked example, the section-2
guarantees on fresh random and nasty values, and an independent scalar reference written
here in plain Python from the spec text (one value, one bit at a time).
"""
import math
import secrets
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from host.golden import inceptionn as inc

ALL_K = range(1, 16)


# -- independent scalar reference (spec text, one value / one bit at a time) -------------

def ref_value(u, k):
    """(tag, code, payload bits) of one fp32 word, straight from the section-2 table."""
    s, e, m = u >> 31, (u >> 23) & 0xFF, u & 0x7FFFFF
    e8 = min(134 - k, 127)
    if e < 127 - k:
        return 0, 0, 0
    if e >= 127:
        return 3, u, 32
    big_f = ((1 << 23) | m) >> (127 - e)
    if e < e8:
        return 1, (s << 7) | (big_f >> (23 - k)), 8
    return 2, (s << 15) | (big_f >> 8), 16


def ref_word(tag, code, k):
    """The fp32 word a (tag, code) decodes to, computed with Python floats."""
    if tag == 0:
        return 0
    if tag == 3:
        return code
    sign, magnitude, scale = ((code >> 7, code & 0x7F, 2.0 ** -k) if tag == 1
                              else (code >> 15, code & 0x7FFF, 2.0 ** -15))
    word = struct.unpack("<I", struct.pack("<f", magnitude * scale))[0]
    return word | (sign << 31)


def ref_encode(words, k):
    bits = []

    def put(value, width):
        bits.extend((value >> i) & 1 for i in range(width))

    for b in range(0, len(words), 8):
        lanes = [ref_value(int(u), k) for u in words[b:b + 8]]
        lanes += [(0, 0, 0)] * (8 - len(lanes))
        put(sum(tag << (2 * j) for j, (tag, _, _) in enumerate(lanes)), 16)
        for _, code, width in lanes:
            put(code, width)
    bits += [0] * (-len(bits) % 32)
    return bytes(sum(bits[i + j] << j for j in range(8)) for i in range(0, len(bits), 8))


def ref_decode(data, count, k):
    """Decoded words, or the string "truncated"/"overlong"."""
    total = 8 * len(data)
    position = 0

    def get(width):
        nonlocal position
        value = 0
        for i in range(width):
            if position + i < total:
                value |= ((data[(position + i) // 8] >> ((position + i) % 8)) & 1) << i
        position += width
        return value

    words = []
    for b in range(0, count, 8):
        vector = get(16)
        for j in range(min(8, count - b)):
            tag = (vector >> (2 * j)) & 3
            words.append(ref_word(tag, get((0, 8, 16, 32)[tag]), k))
    if position > total:
        return "truncated"
    if len(data) > 4 * math.ceil(position / 32):
        return "overlong"
    return words


# -- inputs ------------------------------------------------------------------------------

def fresh_rng():
    seed = secrets.randbits(64)
    return np.random.default_rng(seed), seed


def f32(*values):
    return np.array(values, dtype=np.float32)


def words(*values):
    return np.array(values, dtype=np.uint32)


def bits_of(array):
    return np.asarray(array, dtype=np.float32).view(np.uint32)


def gradient_like(rng, n):
    """Magnitudes spread over every exponent, both signs."""
    magnitude = np.exp2(rng.uniform(-30, 4, n))
    return (magnitude * rng.choice([-1.0, 1.0], n)).astype(np.float32)


def nasty_words():
    """NaNs with payloads, infinities, zeros, denormals, extremes."""
    return words(0x00000000, 0x80000000,                     # +0, -0
                 0x00000001, 0x80000001, 0x007FFFFF, 0x807FFFFF, 0x00400000,   # denormals
                 0x00800000, 0x80800000,                     # smallest normals
                 0x7F800000, 0xFF800000,                     # +-Inf
                 0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFBFFFFF, 0x7FC12345, 0x7FA00ABC,  # NaNs
                 0x7F7FFFFF, 0xFF7FFFFF,                     # +-max
                 0x3F800000, 0xBF800000, 0x3F7FFFFF, 0xBF7FFFFF)   # +-1 and 1 - ulp


def random_words(rng, n):
    """Uniformly random bit patterns mixed with gradient-like values and nasty ones."""
    parts = [rng.integers(0, 2 ** 32, n, dtype=np.uint32),
             gradient_like(rng, n).view(np.uint32), nasty_words()]
    out = np.concatenate(parts)
    rng.shuffle(out)
    return out


def boundary_values(k):
    """Every class boundary for k (2^-k, 2^(7-k), 1) and its +-1-ulp neighbours."""
    out = []
    for edge in (2.0 ** -k, 2.0 ** (7 - k), 1.0):
        edge32 = np.float32(edge)
        out += [np.nextafter(edge32, np.float32(0)), edge32, np.nextafter(edge32, np.float32(np.inf))]
    values = np.array(out, dtype=np.float32)
    return np.concatenate([values, -values])


def expected_tag(x, k):
    """Tag from the value-range column of the section-2 table (not from the exponent)."""
    a = abs(float(x))
    if math.isnan(a) or a >= 1:
        return 3
    if a < 2.0 ** -k:
        return 0
    return 1 if a < min(2.0 ** (7 - k), 1.0) else 2


def check_guarantees(x_words, k, context=""):
    """Every testable section-2 guarantee, bit for bit."""
    x = x_words.view(np.float32)
    q = inc.quantize(x_words, k)
    q_words = q.view(np.uint32)
    tags = inc.classify(x_words, k)
    finite = np.isfinite(x)
    error = np.abs(x[finite].astype(np.float64) - q[finite].astype(np.float64))
    assert np.all(error < 2.0 ** -k), f"{context} error bound: max {error.max()}"
    assert np.all(np.abs(q[finite].astype(np.float64)) <= np.abs(x[finite].astype(np.float64))), context
    zero = tags == inc.TAG_ZERO
    assert np.all(q_words[zero] == 0), f"{context} tag 00 must give +0.0"
    assert np.array_equal(q_words[~zero] >> 31, x_words[~zero] >> 31), f"{context} sign"
    raw = tags == inc.TAG_RAW
    assert np.array_equal(q_words[raw], x_words[raw]), f"{context} raw words (NaN payloads)"
    # Idempotence: the same words, tags and codes the second time.
    assert np.array_equal(inc.quantize(q, k).view(np.uint32), q_words), f"{context} idempotence"
    tags_x, codes_x = inc.codes(x_words, k)
    tags_q, codes_q = inc.codes(q_words, k)
    assert np.array_equal(tags_x, tags_q) and np.array_equal(codes_x, codes_q), context


# -- section 3: the worked example -------------------------------------------------------

def test_spec_worked_example():
    stream = inc.encode(f32(0.3, -0.3, 0.75), 10)
    assert stream == bytes.fromhex("2a 00 66 26 66 a6 00 60")
    assert int.from_bytes(stream[0:2], "little") == 0x002A
    assert [int.from_bytes(stream[i:i + 2], "little") for i in (2, 4, 6)] == [0x2666, 0xA666, 0x6000]
    decoded = inc.decode(stream, 3, 10)
    assert np.array_equal(decoded.view(np.uint32),
                          bits_of([0x2666 * 2.0 ** -15, -0x2666 * 2.0 ** -15, 0.75]))
    assert ref_encode(bits_of([0.3, -0.3, 0.75]), 10) == stream


# -- section 2: one value ----------------------------------------------------------------

@pytest.mark.parametrize("k", ALL_K)
def test_guarantees_on_fresh_random_values(k):
    rng, seed = fresh_rng()
    check_guarantees(random_words(rng, 4000), k, f"seed={seed} k={k}")


@pytest.mark.parametrize("k", ALL_K)
def test_every_class_boundary(k):
    values = boundary_values(k)
    tags = inc.classify(values, k)
    assert tags.tolist() == [expected_tag(x, k) for x in values]
    for x, tag in zip(values, tags):
        assert tag == ref_value(int(np.float32(x).view(np.uint32)), k)[0]
    q = inc.quantize(values, k)
    # A boundary value is exactly representable: it decodes to itself.
    for edge in (2.0 ** -k, 2.0 ** (7 - k), 1.0):
        for sign in (1, -1):
            got = inc.quantize(f32(sign * edge), k)
            assert got.view(np.uint32)[0] == f32(sign * edge).view(np.uint32)[0], (edge, sign)
    # Just below 2^-k is tag 00 (+0.0); just above, P8 = 1 and the value drops to 2^-k.
    below, above = np.nextafter(np.float32(2.0 ** -k), np.float32(0)), \
        np.nextafter(np.float32(2.0 ** -k), np.float32(1))
    assert inc.quantize(f32(below, -below), k).view(np.uint32).tolist() == [0, 0]
    assert inc.quantize(f32(above), k)[0] == np.float32(2.0 ** -k)
    check_guarantees(values.view(np.uint32), k, f"boundaries k={k}")
    if k <= 7:
        assert not np.any(tags == inc.TAG_HALF), "the 16-bit class is empty for k <= 7"
    assert q.dtype == np.float32


@pytest.mark.parametrize("k", [1, 7, 8, 10, 15])
def test_special_values(k):
    nasty = nasty_words()
    q = inc.quantize(nasty, k).view(np.uint32)
    tags = inc.classify(nasty, k)
    # Zeros and denormals: tag 00, decoded as +0.0 (bits 0), whatever their sign.
    small = nasty[:7]
    assert inc.classify(small, k).tolist() == [0] * 7
    assert q[:7].tolist() == [0] * 7
    # Inf, NaN (payloads included), max, +-1: raw, bit for bit.
    raw = nasty[9:]
    assert np.all(inc.classify(raw, k)[:-2] == inc.TAG_RAW)
    assert np.array_equal(q[9:21], raw[:12])
    # Through the bitstream too.
    assert np.array_equal(inc.decode(inc.encode(nasty, k), nasty.size, k).view(np.uint32), q)
    check_guarantees(nasty, k)
    assert tags.dtype == np.uint8


def test_every_denormal_exponent_pattern_is_zero():
    rng, seed = fresh_rng()
    denormals = rng.integers(0, 1 << 23, 5000, dtype=np.uint32) | \
        (rng.integers(0, 2, 5000, dtype=np.uint32) << 31)
    for k in ALL_K:
        assert np.all(inc.quantize(denormals, k).view(np.uint32) == 0), seed


def test_input_types():
    x = f32(0.3, -0.3, 0.75, np.nan)
    assert inc.encode(x, 10) == inc.encode(x.view(np.uint32), 10) == inc.encode(x.tolist(), 10)
    assert inc.encode(x.astype(np.float64), 10) == inc.encode(x, 10)
    # uint32 is taken as raw words (a NaN payload survives), not converted numerically.
    payload_nan = words(0x7FC0BEEF)
    assert inc.decode(inc.encode(payload_nan, 3), 1, 3).view(np.uint32)[0] == 0x7FC0BEEF
    # quantize/classify keep the shape.
    grid = np.arange(12, dtype=np.float32).reshape(3, 4) / 16
    assert inc.quantize(grid, 4).shape == (3, 4) and inc.classify(grid, 4).shape == (3, 4)
    with pytest.raises(TypeError):
        inc.encode(np.array(["a"]), 10)


@pytest.mark.parametrize("bad", [0, 16, -1, 10.0, True, "10", None])
def test_k_is_checked(bad):
    for call in (lambda: inc.encode(f32(1), bad), lambda: inc.decode(b"", 0, bad),
                 lambda: inc.quantize(f32(1), bad), lambda: inc.classify(f32(1), bad)):
        with pytest.raises(ValueError, match="k"):
            call()


# -- section 3: streams ------------------------------------------------------------------

@pytest.mark.parametrize("k", [2, 9, 10, 15])
def test_matches_scalar_reference(k):
    rng, seed = fresh_rng()
    for n in list(range(0, 18)) + [40, 333]:
        x = random_words(rng, n)[:n]
        stream = inc.encode(x, k)
        assert stream == ref_encode(x, k), f"seed={seed} k={k} n={n}"
        assert len(stream) == inc.stream_bytes(inc.classify(x, k))
        decoded = inc.decode(stream, n, k).view(np.uint32)
        assert decoded.tolist() == ref_decode(stream, n, k), f"seed={seed} k={k} n={n}"
        assert np.array_equal(decoded, inc.quantize(x, k).view(np.uint32))


def test_lengths_not_multiple_of_eight():
    rng, seed = fresh_rng()
    for n in range(1, 18):
        for k in (3, 10):
            x = random_words(rng, n)[:n]
            stream = inc.encode(x, k)
            tags = inc.classify(x, k)
            expected_bits = 16 * -(-n // 8) + sum(inc.PAYLOAD_BITS[t] for t in tags)
            assert inc.stream_bits(tags) == expected_bits
            assert len(stream) == 4 * -(-expected_bits // 32), (seed, n)
            decoded = inc.decode(stream, n, k)
            assert np.array_equal(decoded.view(np.uint32), inc.quantize(x, k).view(np.uint32))


def test_block_bits():
    tags = np.array([0, 1, 2, 3, 0, 0, 0, 0, 3, 3], dtype=np.uint8)
    assert inc.block_bits(tags).tolist() == [16 + 8 + 16 + 32, 16 + 64]
    assert inc.stream_bits([]) == 0 and inc.stream_bytes([]) == 0
    assert inc.stream_bytes([3] * 8) == 36   # worst case: 272 bits -> 9 words


def test_all_zero_and_all_raw_extremes():
    n = 8 * 100
    zeros = np.zeros(n, dtype=np.float32)
    assert inc.encode(zeros, 10) == bytes(2 * n // 8)           # 16x: tag vectors only
    raw = np.full(n, 3.5, dtype=np.float32)
    assert len(inc.encode(raw, 10)) == 4 * n * 272 // 256           # 17/16 of the input
    assert np.array_equal(inc.decode(inc.encode(raw, 10), n, 10), raw)


def test_malformed_streams_raise():
    rng, seed = fresh_rng()
    x = random_words(rng, 50)[:50]
    stream = inc.encode(x, 10)
    with pytest.raises(inc.StreamError, match="truncated") as info:
        inc.decode(stream[:-4], 50, 10)
    assert info.value.cause == "drop_truncated"
    with pytest.raises(inc.StreamError, match="over-long") as info:
        inc.decode(stream + bytes(4), 50, 10)
    assert info.value.cause == "drop_overlong"
    with pytest.raises(inc.StreamError, match="truncated"):
        inc.decode(b"", 1, 10)
    with pytest.raises(inc.StreamError, match="over-long"):
        inc.decode(bytes(4), 0, 10)
    assert inc.decode(b"", 0, 10).size == 0
    # A stream decodes for one count only... unless the extra values fit in the padding:
    # 5 zero-tag values take 16 bits, so a 32-bit stream also holds 9 of them (two blocks).
    assert inc.decode(inc.encode(np.zeros(5, np.float32), 10), 9, 10).tolist() == [0.0] * 9
    with pytest.raises(ValueError, match="count"):
        inc.decode(stream, -1, 10)
    # An absurd count is refused before anything is allocated for it.
    with pytest.raises(inc.StreamError, match="truncated"):
        inc.decode(stream, 10 ** 15, 10)
    with pytest.raises(inc.StreamError, match="stream 1: .*truncated"):
        inc.decode_many([stream, stream], [50, 10 ** 15], 10)
    assert isinstance(info.value, ValueError)


def test_padding_bits_are_not_checked():
    x = f32(0.3, -0.3)
    # 16 + 2*16 = 48 bits: 16 bits of padding.
    two = bytearray(inc.encode(x, 10))
    assert len(two) == 8 and two[6:] == b"\x00\x00"
    two[6:] = b"\xff\xff"
    assert np.array_equal(inc.decode(bytes(two), 2, 10), inc.quantize(x, 10))


def test_tags_of_missing_lanes_are_ignored():
    """Lanes past `count` in the last block carry nothing, whatever their tag bits say
    (the decoder knows `count`); the stream length is judged on the valid lanes only."""
    stream = bytearray(inc.encode(f32(0.5), 10))   # tag vector 0x0002, payload 2 bytes
    assert bytes(stream) == bytes([0x02, 0x00, 0x00, 0x40])
    stream[1] = 0xFF   # lanes 4..7 now claim raw payloads
    assert inc.decode(bytes(stream), 1, 10).tolist() == [0.5]
    assert ref_decode(bytes(stream), 1, 10) == [bits_of([0.5])[0]]


def test_random_streams_decode_like_the_reference():
    """Arbitrary bytes (valid streams with random corruption): same words or same error."""
    rng, seed = fresh_rng()
    outcomes = set()
    for trial in range(300):
        k = int(rng.integers(1, 16))
        n = int(rng.integers(0, 40))
        stream = bytearray(inc.encode(random_words(rng, n)[:n], k))
        for _ in range(int(rng.integers(0, 3))):
            if stream:
                stream[int(rng.integers(0, len(stream)))] = int(rng.integers(0, 256))
        cut = int(rng.integers(-1, 2))
        stream = stream[:len(stream) - 4] if cut < 0 and stream else \
            stream + bytes(4) if cut > 0 else stream
        count = max(0, n + int(rng.integers(-2, 3)))
        expected = ref_decode(bytes(stream), count, k)
        try:
            got = inc.decode(bytes(stream), count, k).view(np.uint32).tolist()
        except inc.StreamError as exc:
            got = exc.cause.removeprefix("drop_")
        assert got == expected, f"seed={seed} trial={trial}"
        outcomes.add(expected if isinstance(expected, str) else "ok")
    assert outcomes == {"ok", "truncated", "overlong"}


def test_many_streams_at_once():
    rng, seed = fresh_rng()
    x = random_words(rng, 3000)
    for chunk in (1, 7, 8, 13, 256, 2048, 5000):
        streams = inc.encode_many(x, 10, chunk)
        pieces = [x[i:i + chunk] for i in range(0, x.size, chunk)]
        assert streams == [inc.encode(p, 10) for p in pieces], (seed, chunk)
        decoded = inc.decode_many(streams, [p.size for p in pieces], 10)
        assert np.array_equal(np.concatenate(decoded).view(np.uint32),
                              inc.quantize(x, 10).view(np.uint32))
    counts = [0, 5, 0, 16, 9]
    streams = [inc.encode(x[:c], 4) for c in counts]
    assert [d.size for d in inc.decode_many(streams, counts, 4)] == counts
    streams[3] = streams[3][:-4]
    with pytest.raises(inc.StreamError, match="stream 3"):
        inc.decode_many(streams, counts, 4)


def test_long_single_stream():
    """Enough blocks for the decoder's pointer doubling to take several levels."""
    rng, seed = fresh_rng()
    x = np.concatenate([gradient_like(rng, 150_000), rng.normal(0, 1e-3, 150_000)
                        .astype(np.float32)])
    for k in (6, 10):
        stream = inc.encode(x, k)
        assert inc._doubling_levels(len(stream) + 1, 1, -(-x.size // 8)) > 0
        assert len(stream) == inc.stream_bytes(inc.classify(x, k))
        decoded = inc.decode(stream, x.size, k)
        assert np.array_equal(decoded.view(np.uint32), inc.quantize(x, k).view(np.uint32)), seed
        with pytest.raises(inc.StreamError):
            inc.decode(stream[:-4], x.size, k)


def test_streams_longer_than_a_pass():
    """The codec works in passes of inc._PASS_VALUES values; a stream longer than that is
    cut into pieces whose bytes must join seamlessly, padded once at the very end."""
    n = inc._PASS_VALUES + 1
    assert inc.encode(np.zeros(n, np.float32), 10) == bytes(4 * -(-2 * -(-n // 8) // 4))
    rng, seed = fresh_rng()
    x = gradient_like(rng, 2 * inc._PASS_VALUES + 1000)
    x[::97] = 0.0
    for chunk in (inc._PASS_VALUES + 3, 2 * inc._PASS_VALUES + 999):
        streams = inc.encode_many(x, 10, chunk)
        assert [len(s) for s in streams] == [
            inc.stream_bytes(inc.classify(x[i:i + chunk], 10)) for i in range(0, x.size, chunk)]
        decoded = inc.decode_many(streams, [len(x[i:i + chunk]) for i in
                                            range(0, x.size, chunk)], 10)
        assert np.array_equal(np.concatenate(decoded).view(np.uint32),
                              inc.quantize(x, 10).view(np.uint32)), seed


def test_many_streams_in_several_passes():
    rng, seed = fresh_rng()
    x = gradient_like(rng, 300 * 2048)
    streams = inc.encode_many(x, 8, 2048)
    assert streams[150] == inc.encode(x[150 * 2048:151 * 2048], 8)
    decoded = inc.decode_many(streams, [2048] * 300, 8)
    assert np.array_equal(np.concatenate(decoded).view(np.uint32),
                          inc.quantize(x, 8).view(np.uint32)), seed
    # Status of every stream is reported at its own index, whatever pass it falls in.
    buf = np.frombuffer(b"".join(streams), np.uint8)
    sizes = np.array([len(s) for s in streams])
    first = np.cumsum(sizes) - sizes
    cut = sizes.copy()
    cut[[3, 200, 299]] -= 4
    _, status = inc._decode_segments(buf, first, cut, [2048] * 300, 8)
    assert np.flatnonzero(status).tolist() == [3, 200, 299]
    assert np.all(status[[3, 200, 299]] == inc.STREAM_TRUNCATED)


# -- properties (hypothesis) -------------------------------------------------------------

word_arrays = hnp.arrays(np.uint32, st.integers(0, 40),
                         elements=st.integers(0, 2 ** 32 - 1))
float_arrays = hnp.arrays(np.float32, st.integers(0, 40),
                          elements=st.floats(width=32, allow_nan=True, allow_subnormal=True))


@settings(max_examples=150, deadline=None)
@given(word_arrays, st.integers(1, 15))
def test_property_round_trip_and_guarantees(x, k):
    stream = inc.encode(x, k)
    q = inc.quantize(x, k)
    assert np.array_equal(inc.decode(stream, x.size, k).view(np.uint32), q.view(np.uint32))
    check_guarantees(x, k)
    # Idempotence at the stream level: re-encoding decoded values gives the same bytes.
    assert inc.encode(q, k) == stream


@settings(max_examples=150, deadline=None)
@given(float_arrays, st.integers(1, 15))
def test_property_error_bound_on_floats(x, k):
    q = inc.quantize(x, k)
    finite = np.isfinite(x)
    assert np.all(np.abs(x[finite].astype(np.float64) - q[finite]) < 2.0 ** -k)
    assert inc.encode(x, k) == ref_encode(x.view(np.uint32), k)


# -- bounded passes ----------------------------------------------------------------------

def _outcome(function, *args):
    """The words a decode gives (copied), or its StreamError's cause."""
    try:
        result = function(*args)
    except inc.StreamError as exc:
        return exc.cause
    if isinstance(result, list):
        return [r.view(np.uint32).copy() for r in result]
    return result.view(np.uint32).copy()


def _same_outcome(a, b):
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    if isinstance(a, list):
        return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))
    return np.array_equal(a, b)


def _record_passes(monkeypatch):
    """Wrap the pass machinery: every pass's (bytes, values, blocks, streams)."""
    passes = []
    real = inc._find_blocks

    def spy(buf, first, sizes, counts):
        passes.append((buf.size, int(np.sum(counts)), int(np.sum(-(-counts // inc.LANES))),
                       len(counts)))
        return real(buf, first, sizes, counts)

    monkeypatch.setattr(inc, "_find_blocks", spy)
    return passes


def _check_pass_bounds(passes, pass_values):
    """No pass looks at more values or bytes than a pass may hold."""
    most_values = 2 * max(pass_values, inc.LANES)
    for size, values, blocks, streams in passes:
        assert values <= most_values, (size, values, pass_values)
        assert size <= 34 * blocks + 12 * streams, (size, blocks, streams, pass_values)


def _pass_test_streams(rng, k, n):
    """(name, values) of every kind worth decoding across pass boundaries."""
    all_raw = rng.integers(0x3F800000, 0x7FFFFFFF, n, dtype=np.uint32) | \
        (rng.integers(0, 2, n, dtype=np.uint32) << 31)   # |x| >= 1, Inf and NaN payloads
    boundaries = np.resize(boundary_values(k).view(np.uint32), n)
    mixed = gradient_like(rng, n).view(np.uint32).copy()
    mixed[rng.random(n) < 0.3] = 0
    zero_then_raw = all_raw.copy()
    zero_then_raw[:n // 2] = 0
    return [("random", random_words(rng, n)[:n]), ("all-raw", all_raw),
            ("all-zero", np.zeros(n, np.uint32)), ("boundaries", boundaries),
            ("mixed", mixed), ("zero-then-raw", zero_then_raw),
            ("raw-then-zero", zero_then_raw[::-1].copy())]


@pytest.mark.parametrize("pass_values", [8, 13, 24, 64])
def test_decode_in_bounded_passes_is_bit_exact(monkeypatch, pass_values):
    """A stream longer than a pass is decoded in pieces of whole blocks (13 values round
    down to one block; a piece's byte window ends in the middle of a later block), bit for
    bit like one pass over the whole stream and like the scalar reference: every kind of
    value, counts around every piece boundary and ending in a partial block, and
    truncated, over-long and corrupted streams (same error)."""
    rng, seed = fresh_rng()
    piece = inc.LANES * max(1, pass_values // inc.LANES)
    counts = sorted({1, 7, piece - 1, piece, piece + 1, 2 * piece, 2 * piece + 3,
                     3 * piece - 1, 9 * piece + 5} - {0})
    passes = _record_passes(monkeypatch)
    encoder_pass = inc._PASS_VALUES   # the encoder's passes must be whole blocks
    checked = 0
    for k in (1, 15):   # the extreme class boundaries
        for n in counts:
            for name, x in _pass_test_streams(rng, k, n):
                monkeypatch.setattr(inc, "_PASS_VALUES", encoder_pass)
                good = inc.encode(x, k)
                corrupt = bytearray(good)
                for _ in range(3):
                    corrupt[int(rng.integers(0, len(corrupt)))] = int(rng.integers(0, 256))
                variants = [good, good[:-1], good[:-4], good + bytes(1), good + bytes(4),
                            bytes(corrupt)]
                for data, count in [(v, n) for v in variants] + [(good, n - 1), (good, n + 1)]:
                    monkeypatch.setattr(inc, "_PASS_VALUES", 1 << 40)
                    single = _outcome(inc.decode, data, count, k)
                    monkeypatch.setattr(inc, "_PASS_VALUES", pass_values)
                    passes.clear()
                    bounded = _outcome(inc.decode, data, count, k)
                    context = f"seed={seed} k={k} n={n} {name} count={count} size={len(data)}"
                    assert _same_outcome(bounded, single), context
                    _check_pass_bounds(passes, pass_values)
                    if count <= 3 * piece:
                        expected = ref_decode(data, count, k)
                        expected = expected if isinstance(expected, str) else \
                            np.array(expected, np.uint32)
                        assert _same_outcome(bounded, expected if isinstance(expected, np.ndarray)
                                             else "drop_" + expected), context
                    checked += 1
                assert np.array_equal(_outcome(inc.decode, good, n, k),
                                      inc.quantize(x, k).view(np.uint32)), context
    assert checked > 700


def test_long_stream_window_too_short_is_walked_again(monkeypatch):
    """A piece is first walked in a window sized after the piece before it; when the
    stream turns from compressible to raw the window is too short and the piece is walked
    again in a long enough one: same words, and the retries did happen."""
    monkeypatch.setattr(inc, "_PASS_VALUES", 64)
    rng, seed = fresh_rng()
    x = np.concatenate([np.zeros(50 * 64, np.uint32), rng.integers(0x3F800000, 0x7F800000,
                                                                   50 * 64, dtype=np.uint32)])
    monkeypatch.setattr(inc, "_PASS_VALUES", 1 << 18)
    stream = inc.encode(x, 10)
    monkeypatch.setattr(inc, "_PASS_VALUES", 64)
    passes = _record_passes(monkeypatch)
    assert np.array_equal(inc.decode(stream, x.size, 10).view(np.uint32), x), seed
    assert len(passes) > x.size // 64   # more walks than pieces
    _check_pass_bounds(passes, 64)


def test_many_streams_long_and_short_in_bounded_passes(monkeypatch):
    """decode_many and tag_histogram over short streams (grouped several to a pass) and
    long ones (cut into pieces), with malformed ones anywhere: like one pass."""
    rng, seed = fresh_rng()
    pass_values = 24
    counts = [3, 200, 0, 9, 150, 24, 25, 1000, 16, 1]
    x = random_words(rng, sum(counts))[:sum(counts)]
    pieces = np.split(x, np.cumsum(counts)[:-1])
    streams = [inc.encode(p, 10) for p in pieces]
    passes = _record_passes(monkeypatch)
    cases = [streams]
    for i in (1, 4, 7, 9):
        for change in (lambda s: s[:-4], lambda s: s + bytes(4), lambda s: s + bytes(100_000)):
            bad = list(streams)
            bad[i] = change(bad[i])
            cases.append(bad)
    for case in cases:
        monkeypatch.setattr(inc, "_PASS_VALUES", 1 << 40)
        single = _outcome(inc.decode_many, case, counts, 10)
        single_message = None
        try:
            inc.decode_many(case, counts, 10)
        except inc.StreamError as exc:
            single_message = (exc.cause, str(exc).split(":")[0])   # cause, "stream i"
        monkeypatch.setattr(inc, "_PASS_VALUES", pass_values)
        passes.clear()
        assert _same_outcome(_outcome(inc.decode_many, case, counts, 10), single), seed
        _check_pass_bounds(passes, pass_values)
        try:
            histogram = inc.tag_histogram(case, counts)
        except inc.StreamError as exc:
            assert (exc.cause, str(exc).split(":")[0]) == single_message, seed
        else:
            assert single_message is None
            assert histogram.tolist() == np.bincount(inc.classify(x, 10),
                                                     minlength=4).tolist(), seed
    assert _same_outcome(_outcome(inc.decode_many, streams, counts, 10),
                         [inc.quantize(p, 10).view(np.uint32) for p in pieces])
    # A status lands at its own stream's index, whichever kind of pass found it.
    buf = np.frombuffer(b"".join(streams), np.uint8)
    sizes = np.array([len(s) for s in streams])
    first = np.cumsum(sizes) - sizes
    cut = sizes.copy()
    cut[[1, 3, 7]] -= 4
    _, status = inc._decode_segments(buf, first, cut, counts, 10)
    assert np.flatnonzero(status).tolist() == [1, 3, 7]


def test_tag_histogram_reads_the_stream_tags():
    """The tags the stream carries: a zero magnitude (tag 01 code 0x80, which decodes to
    -0.0) counts as tag 01; junk tags of lanes past count count nowhere."""
    stream = bytearray(inc.encode(f32(0.5, 0.01, 0.3, 3.0, 0.0), 10))
    assert inc.tag_histogram([bytes(stream)], [5]).tolist() == [1, 1, 2, 1]
    stream[1] |= 0xFC   # lanes 5..7: tag 11, past count
    assert inc.tag_histogram([bytes(stream)], [5]).tolist() == [1, 1, 2, 1]
    forged = bytes([0x01, 0x00, 0x80, 0x00])   # lane 0: tag 01, code 0x80 (-0 magnitude)
    assert inc.decode(forged, 1, 10).view(np.uint32).tolist() == [0x80000000]
    assert inc.tag_histogram([forged], [1]).tolist() == [0, 1, 0, 0]
    assert inc.tag_histogram([], []).tolist() == [0, 0, 0, 0]
    with pytest.raises(inc.StreamError, match="stream 1: .*truncated"):
        inc.tag_histogram([forged, forged], [1, 9])
    with pytest.raises(inc.StreamError, match="stream 0: .*over-long"):
        inc.tag_histogram([forged + bytes(4)], [1])


def test_long_stream_decodes_in_bounded_memory(monkeypatch):
    """Besides the result, decoding a long all-raw stream allocates no more than a pass's
    temporaries (one pass over 2^20 values would take about 30x the result)."""
    import tracemalloc

    monkeypatch.setattr(inc, "_PASS_VALUES", 1 << 14)
    rng, seed = fresh_rng()
    n = 1 << 20
    x = rng.integers(0x3F800000, 0x7F800000, n, dtype=np.uint32)
    stream = inc.encode(x, 10)
    tracemalloc.start()
    try:
        decoded = inc.decode(stream, n, 10)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert np.array_equal(decoded.view(np.uint32), x), seed
    assert peak < 1.5 * 4 * n, f"peak {peak / (4 * n):.2f}x the result"
