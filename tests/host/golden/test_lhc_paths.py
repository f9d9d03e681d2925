"""Dense or sketch per tensor (host/golden/lhc.py: ``path``, ``choose_path``,
``peel_schedule``): the same result bits on every path, the exact break-even rule, the
statistics of each path, and the protocol's misuse errors."""
import numpy as np
import pytest

from host.golden import lhc

B = lhc.B


def bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def sparse(rng, n, length, density, scale=1.0):
    return [(rng.standard_normal(length) * scale * (rng.random(length) < density))
            .astype(np.float32) for _ in range(n)]


def with_union(rng, union, length, n):
    """``n`` tensors that are non-zero exactly on ``union`` (so U is known)."""
    out = []
    for _ in range(n):
        x = np.zeros(length, np.float32)
        x[union] = rng.standard_normal(union.size).astype(np.float32)
        x[union[x[union] == 0]] = 1.0
        out.append(x)
    return out


def column_union(rng, blocks, per_column):
    """A union with exactly ``per_column`` elements in every column (max column known)."""
    chosen = np.stack([rng.choice(blocks, per_column, replace=False) for _ in range(B)], 1)
    return np.sort((chosen * B + np.arange(B)).reshape(-1))


# ---------------------------------------------------------------------------------------
# peeling's outcome is known from U alone

@pytest.mark.parametrize("rows, density, seed", [(1, 0.9, 0), (2, 0.5, 1), (5, 0.3, 2),
                                                 (12, 0.2, 3), (40, 0.05, 4), (3, 0.0, 5)])
def test_peel_schedule_is_peel_without_the_values(rows, density, seed):
    rng = np.random.default_rng(seed)
    blocks = 9
    union = np.flatnonzero(rng.random(blocks * B) < density)
    for values_seed in range(2):
        sketch = np.random.default_rng(values_seed).integers(
            -2**31, 2**31, rows * B, dtype=np.int64).astype(np.int32)
        peeling = lhc.peel(sketch, union, rows, blocks)
        peeled, rounds = lhc.peel_schedule(union, rows, blocks)
        np.testing.assert_array_equal(peeled, peeling.peeled)
        assert rounds == peeling.rounds


# ---------------------------------------------------------------------------------------
# the same bits on every path

@pytest.mark.parametrize("n, length, density", [(1, 100, 0.5), (2, 3000, 0.01),
                                                (4, 50000, 0.02), (4, 50000, 0.9),
                                                (32, 4096, 0.3), (7, 1, 1.0)])
def test_every_path_gives_the_same_bits(n, length, density):
    rng = np.random.default_rng(n * 1000 + length)
    tensors = sparse(rng, n, length, density, scale=10.0 ** rng.uniform(-6, 3))
    results = {path: lhc.allreduce(tensors, path=path) for path in lhc.PATHS}
    for path, (result, stats) in results.items():
        np.testing.assert_array_equal(bits(result), bits(results["sketch"][0]), err_msg=path)
        assert stats.requested_path == path
        assert stats.scale == results["sketch"][1].scale
    assert results["dense"][1].path == "dense" and results["sketch"][1].path == "sketch"
    assert results["auto"][1].path in ("sketch", "dense")


@pytest.mark.parametrize("case", ["specials", "denormals", "zeros", "negative_zeros",
                                  "empty", "int32_edge"])
def test_every_path_gives_the_same_bits_on_nasty_values(case):
    if case == "specials":
        base = np.array([0.0, -0.0, 1e-45, -1e-45, 1.1754942e-38, 1.0e38, -2.5, 1e-30,
                         np.float32(2.0 ** 127) * 0.999], np.float32)
        tensors = [np.roll(base, r) for r in range(5)]
    elif case == "denormals":
        tensors = [np.array([1e-45, -3e-45, 0.0, 1e-40], np.float32) * (r + 1)
                   for r in range(3)]
    elif case == "zeros":
        tensors = [np.zeros(2000, np.float32)] * 3
    elif case == "negative_zeros":
        tensors = [np.full(2000, -0.0, np.float32)] * 3
    elif case == "empty":
        tensors = [np.zeros(0, np.float32)] * 4
    else:   # the largest magnitudes on every one of 32 workers: the int32 headroom
        tensors = [np.full(3000, 1.0e38 if r % 2 else -1.0e38, np.float32) for r in range(32)]
    results = {path: lhc.allreduce(tensors, path=path) for path in lhc.PATHS}
    for path, (result, stats) in results.items():
        np.testing.assert_array_equal(bits(result), bits(results["sketch"][0]), err_msg=path)
        # the same scale on every path: also f = 1 for all-zero tensors without an index
        assert stats.scale == results["sketch"][1].scale, path


# ---------------------------------------------------------------------------------------
# the break-even rule

def _brute_force_path(tensors, load=lhc.DEFAULT_LOAD):
    """The rule from its definition: the sketch path's real cost (its rows and the elements
    the real peeling left) against 4 bytes per value."""
    _, stats = lhc.allreduce(tensors, path="sketch", load=load)
    sketch_cost = stats.sketch_bytes + stats.fallback_bytes
    return ("sketch" if sketch_cost < 4 * stats.elements else "dense"), stats


@pytest.mark.parametrize("density", [0.001, 0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0])
def test_auto_takes_the_cheaper_path(density):
    rng = np.random.default_rng(int(density * 1000))
    tensors = with_union(rng, np.flatnonzero(rng.random(64 * B) < density), 64 * B, 4)
    want, sketch_stats = _brute_force_path(tensors)
    _, stats = lhc.allreduce(tensors, path="auto")
    assert stats.path == want
    cost = stats.total_bytes - stats.index_bytes
    assert cost == min(sketch_stats.sketch_bytes + sketch_stats.fallback_bytes,
                       4 * stats.elements) or (cost == 4 * stats.elements and want == "dense")
    # never more than the index phase above a dense all-reduce, never above the sketch
    assert stats.total_bytes <= stats.dense_bytes + stats.index_bytes
    assert stats.total_bytes <= sketch_stats.total_bytes


@pytest.mark.parametrize("per_column, load, expected", [
    (64, 0.62, "sketch"),     # 4rB < 4N <= 4rB + 4|U|: peels nearly all, the sketch wins
    (96, 0.8, "dense"),       # 4rB < 4N, but the fallback the sketch would need tips it
    (115, 1.0, "dense"),      # load above the peeling threshold: most elements unpeeled
])
def test_choice_uses_the_exact_fallback_when_it_decides(per_column, load, expected):
    rng = np.random.default_rng(per_column)
    blocks = 128
    union = column_union(rng, blocks, per_column)
    tensors = with_union(rng, union, blocks * B, 3)
    want, sketch_stats = _brute_force_path(tensors, load)
    _, stats = lhc.allreduce(tensors, path="auto", load=load)
    rows = sketch_stats.rows
    assert rows * B < blocks * B <= rows * B + union.size      # the branch that peels first
    assert stats.predicted_unpeeled == sketch_stats.unpeeled    # exact, not an estimate
    assert stats.path == want == expected
    assert sketch_stats.unpeeled > 0


def test_choice_skips_the_schedule_where_bounds_decide_and_ties_go_dense():
    rng = np.random.default_rng(3)
    # every element in U: r = G rows at load 1, so 4 r B == 4 N: a tie goes dense
    tensors = with_union(rng, np.arange(8 * B), 8 * B, 2)
    _, stats = lhc.allreduce(tensors, path="auto", load=1.0)
    assert (stats.path, stats.predicted_unpeeled, stats.rows) == ("dense", None, 8)
    # Whole blocks 0 and 1 of 3, 2 rows at load 1: every column peels alike, one block's
    # worth stays (u = 1024) and 4 r B + 4 u == 4 N exactly: the tie in the exact branch
    tensors = with_union(rng, np.arange(2 * B), 3 * B, 2)
    _, stats = lhc.allreduce(tensors, path="auto", load=1.0)
    _, sketch = lhc.allreduce(tensors, path="sketch", load=1.0)
    assert (sketch.rows, sketch.unpeeled) == (2, B)
    assert (stats.path, stats.predicted_unpeeled) == ("dense", B)
    # very sparse: even if nothing peeled the sketch would win
    tensors = with_union(rng, np.arange(0, 64 * B, 997), 64 * B, 2)
    _, stats = lhc.allreduce(tensors, path="auto")
    assert (stats.path, stats.predicted_unpeeled) == ("sketch", None)
    plan = lhc.make_plan(lhc.aggregate_index([lhc.encode_index(t) for t in tensors]), 0, 2,
                         64 * B, path="auto")
    assert lhc.choose_path(plan) == ("sketch", None)


def test_choice_is_the_same_for_every_worker_from_the_merged_index():
    rng = np.random.default_rng(11)
    tensors = sparse(rng, 5, 20 * B, 0.3)
    workers = [lhc.LhcWorker(t, 5, path="auto") for t in tensors]
    union = lhc.aggregate_index([w.phase_a_words for w in workers])
    e_max = lhc.aggregate_exponent([w.exponent for w in workers])
    assert len({w.plan_phase(union, e_max) for w in workers}) == 1


# ---------------------------------------------------------------------------------------
# statistics and the protocol

def test_statistics_of_each_path():
    rng = np.random.default_rng(2)
    tensors = sparse(rng, 4, 10 * B + 5, 0.9)
    n = tensors[0].size
    _, dense = lhc.allreduce(tensors, path="dense")
    assert (dense.path, dense.requested_path, dense.index_bytes) == ("dense", "dense", 4)
    assert dense.dense_round_bytes == 4 * n and dense.total_bytes == 4 + 4 * n
    assert dense.union_nnz is None and dense.rows is None and dense.cells is None
    assert dense.sketch_bytes == dense.fallback_bytes == dense.unpeeled == 0
    _, auto = lhc.allreduce(tensors, path="auto")
    assert (auto.path, auto.requested_path) == ("dense", "auto")
    assert auto.index_bytes == lhc.n_blocks(n) * B // 8 and auto.union_nnz > 0.9 * n
    assert auto.total_bytes == auto.index_bytes + 4 * n and auto.rows >= 1
    _, sketch = lhc.allreduce(tensors)
    assert (sketch.path, sketch.requested_path, sketch.dense_round_bytes) == \
        ("sketch", "sketch", 0)
    assert sketch.as_dict()["path"] == "sketch" and "predicted_unpeeled" in sketch.keys()


def test_worker_follows_its_plan_and_checks_the_switch():
    rng = np.random.default_rng(4)
    tensors = sparse(rng, 2, 3 * B, 0.95, scale=0.1)
    workers = [lhc.LhcWorker(t, 2, path="auto") for t in tensors]
    union = lhc.aggregate_index([w.index_words for w in workers])
    assert workers[0].plan_phase(union, 0) == "dense"
    with pytest.raises(RuntimeError, match="dense path"):
        workers[0].sketch_phase(union, 0)
    workers[1].plan_phase(union, 0)
    with pytest.raises(RuntimeError, match="dense_phase"):
        workers[1].finish([])
    sparse_worker = lhc.LhcWorker(sparse(rng, 1, 64 * B, 0.001, 0.1)[0], 1, path="auto")
    sparse_worker.plan_phase(sparse_worker.index_words, 0)
    with pytest.raises(RuntimeError, match="sketch path"):
        sparse_worker.dense_phase(sparse_worker.index_words, 0)
    # A forced dense worker's phase A is one word; a switch that loses it is caught.
    dense = lhc.LhcWorker(tensors[0], 2, path="dense")
    assert dense.phase_a_words.tolist() == [1]
    with pytest.raises(RuntimeError, match="OR result"):
        dense.dense_phase(np.zeros(1, np.uint32), 0)
    with pytest.raises(ValueError, match="one word in phase A"):
        dense.dense_phase(union, 0)
    with pytest.raises(ValueError, match="path"):
        lhc.LhcWorker(tensors[0], 2, path="sparse")
    with pytest.raises(ValueError, match="path"):
        lhc.allreduce(tensors, path=None)
    with pytest.raises(ValueError, match="forced dense"):
        lhc.choose_path(lhc.make_plan(np.ones(1, np.uint32), 0, 2, 10, path="dense"))
