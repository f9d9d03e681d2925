"""The INCEPTIONN ring as docs/accuracy.md states it, and its exact error bound (issue 16, item 10).

The NIC-driven ring of ``host.golden.ring`` (one NIC model serving every hop, no process
group) against a model written from that page's text, and against the stated bound with the
float32 rounding term; the DDP hook's ring is checked against the same bound in
tests/host/ddp/test_collectives.py.
"""
from __future__ import annotations

import fractions

import numpy as np
import pytest

from host.driver.models import NicModelTransport
from host.driver.nic import NicInterface
from host.golden import inceptionn as inc
from host.golden.ring import ring_allreduce, ring_error_bound, ring_sum_error_bound


def _bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def _stated_ring(vectors, k):
    """The algorithm of docs/accuracy.md: chunk c = [c n // N, (c+1) n // N) starts at worker c and
    travels to c+1, c+2, ...; p_0 = x_c, p_j = fl32(q(p_{j-1}) + x_{c+j}); everyone gets
    q(p_{N-1})."""
    workers, n = len(vectors), vectors[0].size
    out = np.empty(n, np.float32)
    for c in range(workers):
        a, b = c * n // workers, (c + 1) * n // workers
        p = vectors[c][a:b]
        for j in range(1, workers):
            p = inc.quantize(p, k) + vectors[(c + j) % workers][a:b]
        out[a:b] = inc.quantize(p, k)
    return out


def _adversarial(rng, workers, n):
    """Every magnitude 2^-20 .. 2^26 with both signs, class boundaries with their ulp
    neighbours, values just below 2^-k for several k, and docs/accuracy.md's example range."""
    vectors = []
    for _ in range(workers):
        x = rng.choice([-1.0, 1.0], n) * 2.0 ** rng.uniform(-20, 26, n)
        quarter = n // 4
        x[:quarter] = 2.0 ** rng.integers(-16, 26, quarter) \
            * rng.choice([1 - 2.0 ** -24, 1.0, 1 + 2.0 ** -23], quarter)
        x[quarter:2 * quarter] = 0.999 * 2.0 ** -rng.integers(1, 16, quarter)
        x[2 * quarter:3 * quarter] = rng.uniform(1, 2001, quarter)
        vectors.append(x.astype(np.float32))
    return vectors


def _exact_errors(vectors, total):
    exact = [sum(fractions.Fraction(float(v[i])) for v in vectors) for i in range(total.size)]
    return [abs(fractions.Fraction(float(t)) - e) for t, e in zip(total, exact)]


@pytest.mark.parametrize("workers,k,n", [(2, 1, 5), (3, 10, 1001), (5, 15, 803), (4, 6, 3)])
def test_nic_ring_is_the_stated_algorithm_within_the_stated_bound(workers, k, n):
    rng = np.random.default_rng(workers * 100 + k)
    vectors = _adversarial(rng, workers, n)
    results, _ = ring_allreduce(vectors, NicInterface(NicModelTransport(), packet_values=128), k)
    expected = _stated_ring(vectors, k)
    for result in results:
        np.testing.assert_array_equal(_bits(result), _bits(expected))
    bound = ring_sum_error_bound(vectors, k)
    errors = _exact_errors(vectors, expected)
    assert all(e < fractions.Fraction(float(b)) for e, b in zip(errors, bound))
    if n > 100:
        # ... and the quantisation part alone is not a bound on these inputs.
        assert float(max(errors)) > ring_error_bound(workers, k)


def test_ring_sum_error_bound_formula():
    """N 2^-k + 2^-24 sum_{j>=1} (1 + 2^-24)^j sum_{i<=j} |x_{c+i}|, in ring order per chunk;
    one worker sends nothing and has no error."""
    u = 2.0 ** -24
    vectors = [np.array([1.0, -2.0, 4.0], np.float32), np.array([8.0, 16.0, -32.0], np.float32)]
    bound = ring_sum_error_bound(vectors, 3)
    # n = 3, N = 2: chunk 0 = [0, 1) starts at worker 0, chunk 1 = [1, 3) at worker 1.
    expected = [2 * 2.0 ** -3 + u * (1 + u) * (1 + 8), 2 * 2.0 ** -3 + u * (1 + u) * (16 + 2),
                2 * 2.0 ** -3 + u * (1 + u) * (32 + 4)]
    np.testing.assert_allclose(bound, expected, rtol=1e-15)
    np.testing.assert_array_equal(ring_sum_error_bound(vectors[:1], 3), 0)
