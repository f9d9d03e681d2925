"""Golden model of Lossless Homomorphic Compression (host/golden/lhc.py) against the spec."""
import math
from fractions import Fraction

import numpy as np
import pytest

from host.golden import lhc
from host.golden.murmur3 import murmur3_32, murmur3_32_u32

B = lhc.B


# ---------------------------------------------------------------------------------------
# independent references (written from the spec, sharing no code with the model)

def ref_exponent(x):
    """biased_exponent(max |x|) - 126, from the float's bits."""
    bits = np.abs(np.asarray(x, dtype=np.float32)).view(np.uint32)
    return int(bits.max() >> 23) - 126 if bits.size else -126


def ref_quantized_sum(tensors, f):
    """int64 sum of q = int32(round_half_away(float32(x) * f)), q computed with floor/ceil."""
    total = np.zeros(np.asarray(tensors[0]).size, dtype=np.int64)
    for x in tensors:
        y = (np.asarray(x, dtype=np.float32).reshape(-1) * np.float32(f)).astype(np.float64)
        q = np.where(y >= 0, np.floor(y + 0.5), np.ceil(y - 0.5))
        assert np.all(np.abs(q) <= 2**31 - 1)
        total += q.astype(np.int64)
    return total


def ref_allreduce(tensors):
    """What the hardware path must give: dequantised exact int32 sum of quantised tensors."""
    n = len(tensors)
    e_max = max(ref_exponent(t) for t in tensors)
    all_zero = not any(np.any(np.asarray(t) != 0) for t in tensors)
    f = np.float32(1.0) if all_zero else np.float32((2**31 - 1) / (n * 2.0**e_max))
    assert np.isfinite(f), "reference only covers the unclamped scale"
    total = ref_quantized_sum(tensors, f)
    assert np.all(np.abs(total) <= 2**31 - 1), "the scale must keep the sum inside int32"
    wrapped = ((total + 2**31) % 2**32 - 2**31).astype(np.int32)
    return (wrapped.astype(np.float32) / f).reshape(np.shape(tensors[0]))


def exact_float32(value: Fraction) -> np.float32:
    """Round a positive rational to the nearest float32 (ties to even), exactly."""
    assert value > 0
    e = value.numerator.bit_length() - value.denominator.bit_length()
    while Fraction(2) ** e > value:
        e -= 1
    while Fraction(2) ** (e + 1) <= value:
        e += 1
    e = max(e, -126)                                  # subnormal spacing
    ulp = Fraction(2) ** (e - 23)
    m = value / ulp
    lo = math.floor(m)
    rem = m - lo
    m = lo + (1 if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and lo % 2) else 0)
    result = m * ulp
    return np.float32(np.inf) if result >= Fraction(2) ** 128 else np.float32(float(result))


def spec_sketch(q, rows):
    """Y[row_j(b)*B + t] += sign_j(b) * q[i], element by element, with the scalar hash."""
    cells = [0] * (rows * B)
    for i in np.flatnonzero(q):
        b, t = divmod(int(i), B)
        for j in range(3):
            h = murmur3_32(b.to_bytes(4, "little"), j)
            sign = -1 if h >> 31 else 1
            c = (h % rows) * B + t
            cells[c] = (cells[c] + sign * int(q[i]) + 2**31) % 2**32 - 2**31
    return np.array(cells, dtype=np.int32)


def spec_peel(Y, union, rows):
    """Literal spec peeling: snapshot per round, ascending order, sequential updates."""
    Y = [int(v) for v in Y]
    def where(i):
        b, t = divmod(int(i), B)
        out = []
        for j in range(3):
            h = murmur3_32(b.to_bytes(4, "little"), j)
            out.append(((h % rows) * B + t, -1 if h >> 31 else 1))
        return out
    C = [0] * (rows * B)
    for i in union:
        for c, _ in where(i):
            C[c] += 1
    out, pending, rounds = {}, list(union), 0
    while True:
        snapshot = list(C)
        picks = []
        for i in pending:                                   # ascending
            for j, (c, s) in enumerate(where(i)):
                if snapshot[c] == 1:
                    picks.append((i, j))
                    break
        if not picks:
            break
        for i, j in picks:
            c, s = where(i)[j]
            v = (s * Y[c] + 2**31) % 2**32 - 2**31
            out[i] = v
            for c2, s2 in where(i):
                Y[c2] = (Y[c2] - s2 * v + 2**31) % 2**32 - 2**31
                C[c2] -= 1
        picked = {i for i, _ in picks}
        pending = [i for i in pending if i not in picked]
        rounds += 1
    return out, pending, rounds


def sparse_tensors(rng, n, length, density, dtype=np.float32, scale=1.0):
    return [(rng.standard_normal(length) * scale * (rng.random(length) < density)).astype(dtype)
            for _ in range(n)]


def same_bits(a, b):
    a, b = np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


# ---------------------------------------------------------------------------------------
# MurmurHash3

def test_murmur3_check_values_of_the_spec():
    assert murmur3_32_u32([0], 0)[0] == 0x2362F9DE
    assert murmur3_32_u32([0], 1)[0] == 0x78ED212D
    assert murmur3_32_u32([0], 2)[0] == 0x06DFADFC
    assert murmur3_32_u32([1], 0)[0] == 0xFBF1402A
    assert [murmur3_32(b"\0\0\0\0", j) for j in range(3)] == [0x2362F9DE, 0x78ED212D, 0x06DFADFC]


def test_murmur3_scalar_reference_known_vectors():
    # published MurmurHash3_x86_32 test vectors (all key lengths / tails)
    assert murmur3_32(b"", 0) == 0
    assert murmur3_32(b"", 1) == 0x514E28B7
    assert murmur3_32(b"", 0xFFFFFFFF) == 0x81F16F39
    assert murmur3_32(b"\xff\xff\xff\xff", 0) == 0x76293B50
    assert murmur3_32(b"\x21\x43\x65\x87", 0) == 0xF55B516B
    assert murmur3_32(b"\x21\x43\x65", 0) == 0x7E4A8634
    assert murmur3_32(b"\x21\x43", 0) == 0xA0F7B07A
    assert murmur3_32(b"\x21", 0) == 0x72661CF4
    assert murmur3_32(b"hello", 0) == 0x248BFA47
    assert murmur3_32(b"The quick brown fox jumps over the lazy dog", 0x9747B28C) == 0x2FA826CD


def test_murmur3_vectorised_matches_scalar_on_random_keys():
    rng = np.random.default_rng(10)
    keys = np.concatenate([rng.integers(0, 2**32, 300, dtype=np.uint64),
                           [0, 1, 2**31 - 1, 2**31, 2**32 - 1]]).astype(np.uint32)
    for seed in (0, 1, 2, 0x9747B28C, 0xFFFFFFFF):
        got = murmur3_32_u32(keys, seed)
        assert got.dtype == np.uint32
        assert got.tolist() == [murmur3_32(int(k).to_bytes(4, "little"), seed) for k in keys]


def test_murmur3_rejects_bad_keys():
    with pytest.raises(ValueError):
        murmur3_32_u32([-1])
    with pytest.raises(ValueError):
        murmur3_32_u32([2**32])
    with pytest.raises(TypeError):
        murmur3_32_u32([1.5])


# ---------------------------------------------------------------------------------------
# quantisation

def test_exponent_bounds_every_magnitude():
    f32 = np.float32
    tiny = np.uint32(1).view(np.float32)                      # smallest denormal
    # pairs, not a dict: -0.0 and 0.0 are one key
    cases = [(0.0, -126), (-0.0, -126), (float(tiny), -126),
             (float(np.uint32(0x007FFFFF).view(f32)), -126),   # largest denormal
             (float(np.finfo(f32).tiny), -125),                 # 2**-126
             (0.5, 0), (0.99999994, 0), (1.0, 1), (-1.0, 1), (1.5, 1), (2.0, 2), (3.0, 2),
             (float(np.nextafter(f32(2.0**127), f32(0))), 127)]
    for value, e in cases:
        assert lhc.worker_exponent(np.array([0.25 * 0, value], dtype=f32)) == e, value
        if value:
            assert abs(value) < 2.0**e
    rng = np.random.default_rng(11)
    for _ in range(200):
        x = (rng.standard_normal(50) * 10.0 ** rng.integers(-30, 30)).astype(f32)
        e = lhc.worker_exponent(x)
        m = float(np.abs(x).max())
        assert 2.0 ** (e - 1) <= m < 2.0**e
    assert lhc.worker_exponent(np.zeros(0, f32)) == -126


def test_exponent_out_of_the_header_byte_is_rejected():
    with pytest.raises(ValueError, match=r"2\*\*127"):
        lhc.worker_exponent(np.array([2.0**127], dtype=np.float32))
    with pytest.raises(ValueError, match=r"2\*\*127"):
        lhc.allreduce([np.array([1.0, -np.finfo(np.float32).max], dtype=np.float32)])


def test_scale_is_the_correctly_rounded_float32_of_the_formula():
    for n in range(1, 33):
        floor = lhc.scale_exponent_floor(n)
        for e in range(-128, 128):
            f = lhc.scale(e, n)
            assert f.dtype == np.float32 and np.isfinite(f)
            exact = exact_float32(Fraction(2**31 - 1) / (n * Fraction(2) ** max(e, floor)))
            assert f.view(np.uint32) == exact.view(np.uint32), (n, e)
            if e >= floor:
                assert exact == exact_float32(Fraction(2**31 - 1) / (n * Fraction(2) ** e))
        # the floor is exactly where the unclamped formula stops overflowing
        assert np.isinf(exact_float32(Fraction(2**31 - 1) / (n * Fraction(2) ** (floor - 1))))
    assert lhc.scale(3, 4, all_zero=True) == np.float32(1.0)
    with pytest.raises(ValueError):
        lhc.scale(128, 2)


def test_the_scale_for_every_worker_count_of_a_tree():
    """The scale's ``n`` is every worker of the sum: up to 32 x 32 in a tree of aggregators
    (aggregator-protocol.md section 4). It is the correctly rounded formula, stepped down
    (lhc-sketch.md section 2) exactly as far as the worst value needs: the largest float32
    below 2**e quantises to at most floor((2**31-1)/n), and one ulp more would not. The
    power of two only shifts the exponent, so e = 0 and 127 and the clamp are checked for
    every n."""
    assert lhc.MAX_TREE_WORKERS == 1024 == lhc.MAX_WORKERS ** 2
    stepped = {}
    for n in range(1, lhc.MAX_TREE_WORKERS + 1):
        floor = lhc.scale_exponent_floor(n)
        steps = lhc.scale_steps_down(n)
        if steps:
            stepped[n] = steps
        budget = (2**31 - 1) // n
        for e in (floor, 0, 127):
            want = exact_float32(Fraction(2**31 - 1) / (n * Fraction(2) ** e))
            for _ in range(steps):
                want = np.nextafter(want, np.float32(0))
            f = lhc.scale(e, n)
            assert f.view(np.uint32) == want.view(np.uint32), (n, e)
            top = np.nextafter(np.float32(2.0**e), np.float32(0))
            assert lhc.quantize(np.array([top, -top], np.float32), f).tolist() == \
                [q := lhc.quantize(np.array([top], np.float32), f)[0], -q]
            assert q <= budget, (n, e)
            if steps:
                up = np.nextafter(f, np.float32(np.inf))
                assert lhc.quantize(np.array([top], np.float32), up)[0] > budget, (n, e)
        assert lhc.scale(floor - 1, n) == lhc.scale(floor, n)
        assert np.isinf(exact_float32(Fraction(2**31 - 1) / (n * Fraction(2) ** (floor - 1))))
    # one aggregator's counts (and far beyond) keep the formula's bits
    assert min(stepped) == 256 and max(stepped.values()) == 4 and len(stepped) == 244


@pytest.mark.parametrize("n", [0, 1025, 4096, 2.5, True])
def test_a_worker_count_beyond_a_tree_is_refused_where_the_scale_is_made(n):
    message = r"number of workers must be 1\.\.1024, got .*room in int32 for the sum over " \
              r"at most 1024 workers \(every worker of a tree of aggregators, 32 x 32\)"
    with pytest.raises(ValueError, match=message):
        lhc.scale(0, n)
    with pytest.raises(ValueError, match=message):
        lhc.LhcWorker(np.ones(3, np.float32), n)


def test_rounding_is_half_away_from_zero_in_float32():
    f32 = np.float32
    x = np.array([0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 0.49999997, -0.49999997,
                  np.nextafter(f32(0.5), f32(1)), 2.0**23 + 1, -(2.0**23 + 1), 2.0**23 + 3,
                  2.0**24 - 1, 2.0**30, -(2.0**31 - 128), 0.0, -0.0, 1e-45], dtype=f32)
    q = lhc.quantize(x, 1.0)
    assert q.dtype == np.int32
    assert q.tolist() == [1, -1, 2, -2, 3, -3, 0, 0, 1, 2**23 + 1, -(2**23 + 1), 2**23 + 3,
                          2**24 - 1, 2**30, -(2**31 - 128), 0, 0, 0]


def test_quantize_matches_exact_rational_rounding():
    rng = np.random.default_rng(12)
    for _ in range(20):
        x = (rng.standard_normal(100) * 10.0 ** rng.integers(-5, 5)).astype(np.float32)
        f = lhc.scale(lhc.worker_exponent(x), int(rng.integers(1, 33)))
        q = lhc.quantize(x, f)
        for xi, qi in zip(x, q):
            y = Fraction(float(np.float32(xi) * f))          # the float32 product, exactly
            expect = math.floor(abs(y) + Fraction(1, 2)) * (1 if y >= 0 else -1)
            assert qi == expect


@pytest.mark.parametrize("n", [*range(1, 33), 33, 100, 512, 999, 1023, 1024])
def test_worst_case_sum_stays_inside_int32(n):
    """Every worker at the largest float32 below 2**e_max (both signs): n*|q| <= 2**31-1."""
    for e in (-90, -3, 0, 1, 7, 30, 127):
        top = np.nextafter(np.float32(2.0**e), np.float32(0)) if e < 128 else None
        f = lhc.scale(e, n)
        q = lhc.quantize(np.array([top, -top], dtype=np.float32), f)
        assert n * int(q[0]) <= 2**31 - 1 and n * int(-q[1]) <= 2**31 - 1
        assert q[0] > 0.99 * (2**31 - 1) / n        # and the budget is nearly used


def test_the_sum_over_a_whole_tree_stays_exact_with_the_trees_worker_count():
    """1024 workers (a 32 x 32 tree), every one at the worst case: with the tree's count the
    int32 sum is exact; a leaf's count (32) would give each worker 32 times the room and the
    sum would wrap (what the scale's check is for)."""
    n = lhc.MAX_TREE_WORKERS
    top = np.nextafter(np.float32(2.0**3), np.float32(0))
    x = np.array([top, -top, 1.0, 0.0], dtype=np.float32)
    result, stats = lhc.allreduce([x] * n, path="dense")
    f = lhc.scale(lhc.worker_exponent(x), n)
    q = lhc.quantize(x, f).astype(np.int64)
    assert np.all(np.abs(q * n) <= 2**31 - 1)
    assert same_bits(result, lhc.dequantize((q * n).astype(np.int32), f))
    assert stats.workers == n
    leaf = lhc.quantize(x, lhc.scale(lhc.worker_exponent(x), 32)).astype(np.int64)
    assert np.abs(leaf * n).max() > 2**31 - 1


def test_quantize_overflow_is_an_error_not_a_wrap():
    with pytest.raises(OverflowError):
        lhc.quantize(np.array([1.0], dtype=np.float32), np.float32(2.0**31))
    with pytest.raises(ValueError):
        lhc.quantize(np.array([1.0], dtype=np.float32), np.float32(0))


def test_dequantize_is_float32_division():
    q = np.array([0, 1, -1, 2**31 - 1, -(2**31), 12345679], dtype=np.int32)
    f = np.float32(3.0)
    out = lhc.dequantize(q, f)
    assert out.dtype == np.float32
    assert same_bits(out, q.astype(np.float32) / f)


# ---------------------------------------------------------------------------------------
# index bitmap and sketch

def test_index_bitmap_is_lsb_first_and_padded():
    x = np.zeros(1500, dtype=np.float32)
    x[[0, 9, 31, 32, 1023, 1024, 1499]] = [1, 2, -3, 1e-45, 5, -6, 7]
    x[5] = -0.0
    words = lhc.encode_index(x)
    assert words.dtype == np.uint32 and words.size == 2 * 32      # 2 blocks of 1024 bits
    expect = np.zeros(64, dtype=np.uint64)
    for i in (0, 9, 31, 32, 1023, 1024, 1499):
        expect[i // 32] |= np.uint64(1) << np.uint64(i % 32)
    assert words.tolist() == expect.tolist()
    assert lhc.decode_index(words).tolist() == [0, 9, 31, 32, 1023, 1024, 1499]
    assert np.packbits(x != 0, bitorder="little")[1] == 0b00000010   # element 9: bit 1 of byte 1
    with pytest.raises(ValueError):
        lhc.decode_index(words, n_elements=1499)


def test_index_of_union_is_or_of_indices():
    rng = np.random.default_rng(13)
    xs = sparse_tensors(rng, 5, 3000, 0.05)
    union = lhc.aggregate_index([lhc.encode_index(x) for x in xs])
    assert np.array_equal(union, lhc.encode_index(np.any([x != 0 for x in xs], axis=0)
                                                  .astype(np.float32)))


def test_sketch_follows_the_spec_cell_by_cell():
    rng = np.random.default_rng(14)
    for rows in (1, 2, 5):
        q = np.where(rng.random(3100) < 0.03,
                     rng.integers(-2**31, 2**31, 3100), 0).astype(np.int32)
        assert np.array_equal(lhc.encode_sketch(q, rows), spec_sketch(q, rows))


def test_sketch_is_homomorphic_with_wraparound():
    rng = np.random.default_rng(15)
    qs = [np.where(rng.random(5000) < 0.2, rng.integers(-2**31, 2**31, 5000), 0)
          .astype(np.int32) for _ in range(6)]
    total = np.zeros(5000, dtype=np.int64)
    for q in qs:
        total += q
    q_sum = ((total + 2**31) % 2**32 - 2**31).astype(np.int32)     # genuinely wraps
    assert np.any(np.abs(total) > 2**31)
    for rows in (1, 3, 17):
        summed = lhc.aggregate_sketch([lhc.encode_sketch(q, rows) for q in qs])
        assert np.array_equal(summed, lhc.encode_sketch(q_sum, rows))


def test_count_map_counts_every_element_hash_pair():
    rng = np.random.default_rng(16)
    union = np.flatnonzero(rng.random(4096) < 0.1)
    rows = 4
    C = lhc.count_map(union, rows, 4)
    expect = np.zeros(rows * B, dtype=np.int64)
    for i in union:
        b, t = divmod(int(i), B)
        for j in range(3):
            expect[(murmur3_32(b.to_bytes(4, "little"), j) % rows) * B + t] += 1
    assert np.array_equal(C, expect) and C.sum() == 3 * union.size


@pytest.mark.parametrize("rows,density", [(2, 0.03), (3, 0.3), (40, 0.5), (1, 0.002)])
def test_vectorised_peeling_equals_literal_spec_peeling(rows, density):
    rng = np.random.default_rng(17 + rows)
    n_el = 4 * B
    q = np.where(rng.random(n_el) < density, rng.integers(-2**31, 2**31, n_el), 0)\
        .astype(np.int32)
    union = np.flatnonzero(q)
    Y = lhc.encode_sketch(q, rows)
    got = lhc.peel(Y, union, rows, 4)
    values, unpeeled, rounds = spec_peel(Y, union.tolist(), rows)
    assert got.rounds == rounds
    assert got.unpeeled.tolist() == unpeeled
    assert {int(i): int(v) for i, v, p in zip(union, got.values, got.peeled) if p} == values
    # and every peeled value is the true one
    assert np.array_equal(got.values[got.peeled], q[union][got.peeled])


# ---------------------------------------------------------------------------------------
# allreduce

@pytest.mark.parametrize("n", [1, 2, 3, 4, 8, 32])
@pytest.mark.parametrize("length", [1, 1023, 1025, 5000])
def test_allreduce_is_exact(n, length):
    rng = np.random.default_rng(1000 * n + length)
    for density in (0.001, 0.01, 0.1, 0.6):
        xs = sparse_tensors(rng, n, length, density, scale=10.0 ** rng.integers(-3, 4))
        result, stats = lhc.allreduce(xs)
        assert result.dtype == np.float32
        assert same_bits(result, ref_allreduce(xs)), (n, length, density)
        assert stats.peeled + stats.unpeeled == stats.union_nnz
        assert stats.union_nnz == int(np.count_nonzero(np.any([x != 0 for x in xs], axis=0)))


def test_allreduce_with_nasty_values():
    rng = np.random.default_rng(18)
    f32 = np.float32
    specials = np.array([-0.0, 0.0, 1e-45, -1e-45, np.finfo(f32).tiny, 1.0, -1.0,
                         np.nextafter(f32(1), f32(2)), np.nextafter(f32(1), f32(0)), 2.0**100,
                         -(2.0**100), np.nextafter(f32(2.0**100), f32(0))], dtype=f32)
    for n in (2, 3, 7):
        xs = []
        for _ in range(n):
            x = sparse_tensors(rng, 1, 2100, 0.3, scale=2.0**90)[0]
            x[rng.integers(0, 2100, specials.size)] = specials
            xs.append(x)
        result, _ = lhc.allreduce(xs)
        assert same_bits(result, ref_allreduce(xs))
        # everything below the quantisation step of 2**100 vanishes, nothing blows up
        assert np.all(np.isfinite(result))


def test_allreduce_keeps_shape_and_accepts_other_dtypes():
    rng = np.random.default_rng(19)
    xs = [rng.standard_normal((3, 700)).astype(np.float32) for _ in range(3)]
    result, _ = lhc.allreduce(xs)
    assert result.shape == (3, 700) and same_bits(result, ref_allreduce(xs))
    as64 = [x.astype(np.float64) for x in xs]
    assert same_bits(lhc.allreduce(as64)[0], result)


def test_allreduce_stats_and_bytes():
    rng = np.random.default_rng(20)
    n_el, n = 5000, 4
    xs = sparse_tensors(rng, n, n_el, 0.05)
    _, stats = lhc.allreduce(xs)
    union = np.flatnonzero(np.any([x != 0 for x in xs], axis=0))
    max_col = int(np.bincount(union % B, minlength=B).max())
    assert stats.max_column == max_col
    assert stats.rows == max(1, math.ceil(max_col / 0.7))
    assert stats.blocks == 5 and stats.index_bytes == 5 * B // 8
    assert stats.sketch_bytes == 4 * stats.rows * B
    assert stats.fallback_bytes == 4 * stats.unpeeled
    assert stats.total_bytes == stats.index_bytes + stats.sketch_bytes + stats.fallback_bytes
    assert stats.dense_bytes == 4 * n_el
    assert stats["rows"] == stats.rows and stats.as_dict()["compression"] == stats.compression
    assert stats.load == 0.7 and stats.workers == n and stats.elements == n_el
    assert stats.exponent == max(ref_exponent(x) for x in xs)


def test_rows_follow_load_and_r_min():
    rng = np.random.default_rng(21)
    xs = sparse_tensors(rng, 2, 3 * B, 0.4)
    _, base = lhc.allreduce(xs)
    for load, r_min in ((0.35, 1), (1.4, 1), (0.7, 500), (1000.0, 3)):
        result, stats = lhc.allreduce(xs, load=load, r_min=r_min)
        assert stats.rows == max(r_min, math.ceil(base.max_column / load))
        assert same_bits(result, ref_allreduce(xs))
    words = lhc.aggregate_index([lhc.encode_index(x) for x in xs])
    assert lhc.rows_for(words) == base.rows
    assert lhc.rows_for(words, load=0.35, r_min=7) == max(7, math.ceil(base.max_column / 0.35))


def test_large_sketch_at_load_0_7_peels_nearly_everything():
    rng = np.random.default_rng(22)
    n_el = 2**20
    xs = sparse_tensors(rng, 4, n_el, 0.05)
    result, stats = lhc.allreduce(xs)
    assert stats.union_nnz > 150_000
    assert stats.peeled >= 0.995 * stats.union_nnz
    assert stats.rounds >= 2
    assert stats.total_bytes < stats.dense_bytes / 2
    assert same_bits(result, ref_allreduce(xs))


def test_lighter_load_peels_at_least_as_well():
    rng = np.random.default_rng(23)
    xs = sparse_tensors(rng, 3, 64 * B, 0.05)
    unpeeled = [lhc.allreduce(xs, load=load)[1].unpeeled for load in (2.0, 1.0, 0.7, 0.4)]
    assert unpeeled[0] > unpeeled[1] > 0
    assert unpeeled[-1] <= unpeeled[2] <= unpeeled[1]


def test_tiny_sketch_falls_back_and_stays_exact():
    rng = np.random.default_rng(24)
    for n, length in ((2, 5000), (4, 3 * B + 7), (1, 2500)):
        xs = sparse_tensors(rng, n, length, 0.3)
        result, stats = lhc.allreduce(xs, load=1e6, r_min=1)
        assert stats.rows == 1
        assert stats.unpeeled > 0.5 * stats.union_nnz
        assert stats.fallback_bytes == 4 * stats.unpeeled > 0
        assert same_bits(result, ref_allreduce(xs))


def test_all_zero_tensors():
    for length in (1, 1024, 3000):
        xs = [np.zeros(length, np.float32), np.full(length, -0.0, np.float32)]
        result, stats = lhc.allreduce(xs)
        assert result.view(np.uint32).tolist() == [0] * length       # +0.0
        assert stats.union_nnz == 0 and stats.scale == 1.0 and stats.unpeeled == 0
        assert stats.rows == 1 and stats.exponent == -126


def test_only_denormals_use_the_clamped_scale_and_stay_exact():
    rng = np.random.default_rng(25)
    n = 3
    xs = [np.where(rng.random(2000) < 0.2, rng.integers(1, 2**23, 2000), 0).astype(np.uint32)
          .view(np.float32) * np.where(rng.random(2000) < 0.5, 1, -1).astype(np.float32)
          for _ in range(n)]
    result, stats = lhc.allreduce(xs)
    floor = lhc.scale_exponent_floor(n)
    f = np.float32((2**31 - 1) / (n * 2.0**floor))
    assert stats.exponent == -126 and stats.scale == f
    total = ref_quantized_sum(xs, f)
    assert same_bits(result, total.astype(np.int32).astype(np.float32) / f)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf,
                                 np.uint32(0x7FC12345).view(np.float32),     # NaN payload
                                 np.uint32(0xFF800001).view(np.float32)])    # -NaN signalling
def test_non_finite_gradients_are_rejected(bad):
    xs = [np.ones(2000, np.float32) for _ in range(3)]
    xs[2][1234] = bad
    with pytest.raises(ValueError, match=r"worker 2.*non-finite.*index 1234"):
        lhc.allreduce(xs)


def test_float64_overflowing_float32_is_rejected():
    with pytest.raises(ValueError, match="non-finite"):
        lhc.allreduce([np.array([1.0, 1e39])])


@pytest.mark.parametrize("call,match", [
    (lambda: lhc.allreduce([]), r"1\.\.1024"),
    (lambda: lhc.allreduce([np.ones(3, np.float32)] * 1025), r"1\.\.1024"),
    (lambda: lhc.allreduce([np.ones(3, np.float32), np.ones(4, np.float32)]), "same shape"),
    (lambda: lhc.allreduce([np.ones(3, np.float32)], load=0), "load"),
    (lambda: lhc.allreduce([np.ones(3, np.float32)], load=float("nan")), "load"),
    (lambda: lhc.allreduce([np.ones(3, np.float32)], r_min=0), "r_min"),
    (lambda: lhc.allreduce([np.array(["a"])]), "real numbers"),
])
def test_bad_arguments_raise_clear_errors(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


def test_worker_detects_a_switch_that_lost_index_bits():
    x = np.zeros(2048, np.float32)
    x[[3, 1500]] = 1.0
    w = lhc.LhcWorker(x, 1)
    broken = w.index_words.copy()
    broken[1500 // 32] = 0
    with pytest.raises(RuntimeError, match="OR result"):
        w.sketch_phase(broken, w.exponent)
