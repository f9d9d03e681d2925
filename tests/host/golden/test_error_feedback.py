"""Error feedback's building block in the golden model: ``quantize_with_feedback``.

No process group here (the DDP hook's use of it is in tests/host/ddp/test_hooks.py): the
identity ``sent + residual' == values + residual`` (exact), mass conservation over many
steps, the step at which a value below 2^-k is finally sent, and NaN/Inf, -0.0, denormals
and class boundaries.
"""
from __future__ import annotations

import numpy as np
import pytest

from host.golden import inceptionn as inc

K_VALUES = (1, 6, 10, 15)


def _bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def _tiny_constant(k, n=128, seed=0):
    """``±m 2^-(k+6)`` with m in 0..63: below 2^-k, and few bits, so every float32 sum of
    it and a residual is exact."""
    rng = np.random.default_rng(seed)
    m = rng.integers(0, 64, n)
    return (rng.choice([-1.0, 1.0], n) * m * 2.0 ** -(k + 6)).astype(np.float32)


@pytest.mark.parametrize("k", K_VALUES)
def test_feedback_conserves_mass_bit_for_bit(k):
    """Over many steps of a constant gradient below 2^-k: sum(sent) + residual equals
    steps * gradient exactly; every step sent + residual' == gradient + residual exactly,
    sent is on the codec's grid and |residual| < 2^-k."""
    g = _tiny_constant(k)
    residual = None
    total_sent = np.zeros(g.size, np.float64)          # multiples of 2^-k: exact
    steps = 500
    for _ in range(steps):
        before = np.zeros_like(g) if residual is None else residual
        sent, residual = inc.quantize_with_feedback(g, residual, k)
        assert sent.dtype == residual.dtype == np.float32
        np.testing.assert_array_equal(sent.astype(np.float64) + residual,
                                      g.astype(np.float64) + before)
        np.testing.assert_array_equal(_bits(inc.quantize(sent, k)), _bits(sent))
        assert np.all(np.abs(residual) < 2.0 ** -k)
        total_sent += sent
    np.testing.assert_array_equal(total_sent + residual, steps * g.astype(np.float64))
    # Without feedback every one of these values would be sent as 0 forever.
    assert np.all(inc.quantize(g, k) == 0)
    assert np.count_nonzero(total_sent) == np.count_nonzero(g)


@pytest.mark.parametrize("k", K_VALUES)
def test_feedback_sends_a_small_value_once_its_residual_crosses(k):
    """5/16 of 2^-k per step is sent as 2^-k at exactly the steps where floor(5 t / 16)
    grows (t = 4, 7, 10, 13, 16, 20, ...), and as nothing in between."""
    g = np.float32(5 * 2.0 ** -(k + 4)) * np.array([1, -1], np.float32)
    residual = None
    for t in range(1, 101):
        sent, residual = inc.quantize_with_feedback(g, residual, k)
        crossings = (5 * t) // 16 - (5 * (t - 1)) // 16
        np.testing.assert_array_equal(sent, np.float32(crossings * 2.0 ** -k) * np.sign(g))
        np.testing.assert_array_equal(residual, np.float32((5 * t % 16) * 2.0 ** -(k + 4))
                                      * np.sign(g))


def _nasty_words():
    """NaN with payloads, ±Inf, the largest float, denormals, ±0, and every class boundary
    of every k with its ±1-ulp neighbours, both signs."""
    words = [0x7FC00001, 0xFFC12345, 0x7F800001, 0x7F800000, 0xFF800000, 0x7F7FFFFF,
             0xFF7FFFFF, 0x00000001, 0x807FFFFF, 0x00000000, 0x80000000]
    for e in range(112, 135):                               # 2^-15 .. 2^7
        for m in (0, 1, 0x7FFFFF):
            word = (e << 23) | m
            words += [word, word - 1, 0x80000000 | word, 0x80000000 | (word - 1)]
    return np.array(words, dtype=np.uint32).view(np.float32)


@pytest.mark.parametrize("k", K_VALUES)
def test_feedback_identity_on_random_and_nasty_inputs(k):
    """sent == quantize(values + residual) bit for bit (NaN payloads included) and
    sent + residual' == values + residual exactly wherever that is finite; where it is not
    (NaN, Inf, or an addition that overflowed) the residual is +0.0, so a NaN is not carried
    into the next step."""
    rng = np.random.default_rng(k)
    nasty = _nasty_words()
    random = (rng.choice([-1.0, 1.0], 4000) * 2.0 ** rng.uniform(-30, 10, 4000)).astype(np.float32)
    values = np.concatenate([nasty, random, nasty[::-1]])
    # Residuals as a previous step leaves them (|e| < 2^-k), also at the non-finite places.
    residual = (rng.uniform(-1, 1, values.size) * 2.0 ** -k).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        corrected = values + residual
    sent, new_residual = inc.quantize_with_feedback(values, residual, k)
    np.testing.assert_array_equal(_bits(sent), _bits(inc.quantize(corrected, k)))
    finite = np.isfinite(corrected)
    assert (~finite).sum() >= 8                # NaNs, Infs and the overflowed maxima
    np.testing.assert_array_equal(sent[finite].astype(np.float64) + new_residual[finite],
                                  corrected[finite].astype(np.float64))
    np.testing.assert_array_equal(_bits(new_residual[~finite]), 0)
    assert np.all(np.abs(new_residual) < 2.0 ** -k)
    # The next step starts clean where a NaN was.
    sent2, residual2 = inc.quantize_with_feedback(np.zeros_like(values), new_residual, k)
    assert np.all(np.isfinite(sent2)) and np.all(np.isfinite(residual2))
    # No residual = a zero residual; shapes are kept.
    first, _ = inc.quantize_with_feedback(values.reshape(2, -1), None, k)
    np.testing.assert_array_equal(_bits(first.reshape(-1)), _bits(inc.quantize(values, k)))
    assert first.shape == (2, values.size // 2)


def test_feedback_rejects_bad_input():
    x = np.zeros(4, np.float32)
    with pytest.raises(TypeError, match="float32"):
        inc.quantize_with_feedback(x.astype(np.float64), None, 10)
    with pytest.raises(TypeError, match="residual"):
        inc.quantize_with_feedback(x, x.astype(np.float64), 10)
    with pytest.raises(ValueError, match="shape"):
        inc.quantize_with_feedback(x, np.zeros(5, np.float32), 10)
    with pytest.raises(ValueError, match="k"):
        inc.quantize_with_feedback(x, None, 16)
