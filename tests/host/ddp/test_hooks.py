"""The DDP hooks (host/ddp/hooks.py) on a real gloo process group on 127.0.0.1, checked
against the golden models (the group's run: tests/host/ddp/group_run.py):

* the DDP buckets: the hook's output is the collective's sum divided by the world size, bit
  for bit, and ``LhcHook()`` chooses the sketch or the dense path per bucket;
* error feedback through real DDP models: a constant gradient below 2^-k is sent exactly
  when its accumulated residual crosses 2^-k, and the residuals follow DDP's bucket rebuild
  (checked against a per-parameter NumPy model of every step), ranks identical;
* short 2-rank training runs on a subgroup (the hooks honour ``state``), and the hooks'
  arguments checked where the caller sees them.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed (it comes with the 'ddp' extra: "
                    "pip install -e '.[ddp]')")

from host import ddp  # noqa: E402
from host.golden import inceptionn as inc  # noqa: E402
from host.golden import lhc  # noqa: E402
from tests.host.ddp.group_run import (EF_K, EF_REBUILD_ITERATIONS, EF_STEPS,  # noqa: E402
                                      TRAIN_STEPS, WORLD, bits, same_on_every_rank,
                                      simulate_ring, tiny_constant_gradient)


# ---------------------------------------------------------------------------------------
# arguments

def test_hooks_reject_bad_arguments():
    with pytest.raises(ValueError):
        ddp.InceptionnHook(k=0)
    with pytest.raises(ValueError):
        ddp.InceptionnHook(k=16)
    with pytest.raises(TypeError):
        ddp.InceptionnHook(k=10.0)
    with pytest.raises(ValueError):
        ddp.LhcHook(load=0)
    with pytest.raises(ValueError):
        ddp.LhcHook(r_min=0)
    with pytest.raises(ValueError, match="path"):
        ddp.LhcHook(path="sparse")
    assert ddp.LhcHook().path == "auto" and ddp.LhcHook(path="dense").path == "dense"
    with pytest.raises(TypeError):
        ddp.InceptionnHook(k=10, error_feedback=1)
    assert repr(ddp.InceptionnHook(6, error_feedback=True)) == \
        "InceptionnHook(k=6, error_feedback=True)"
    assert not ddp.InceptionnHook().error_feedback


def test_lhc_hook_chooses_the_path_per_bucket(group_run):
    """LhcHook() defaults to path "auto": the embedding table's sparse bucket goes as a
    sketch, the linear layer's dense ones go dense, every output bit for bit the golden
    allreduce (with path "auto", and also the forced sketch) divided by the world size."""
    runs = [rank["ddp"]["lhc_mixed"] for rank in group_run["ranks"]]
    assert runs[0]["repr"] == "LhcHook(load=0.7, r_min=1, path='auto')"
    records = [run["records"] for run in runs]
    seen = {}
    for call_index, calls in enumerate(zip(*records)):
        inputs = [c[1] for c in calls]
        same_on_every_rank([c[2] for c in calls])
        expected, stats = lhc.allreduce(inputs, path="auto")
        sketch, _ = lhc.allreduce(inputs, path="sketch")
        np.testing.assert_array_equal(bits(expected), bits(sketch))
        np.testing.assert_array_equal(bits(calls[0][2]), bits(expected / np.float32(WORLD)))
        assert {run["paths"][call_index] for run in runs} == {stats.path}
        seen.setdefault(inputs[0].size, set()).add(stats.path)
    table, weight = 4096 * 16, 16 * 2048
    assert seen[table] == {"sketch"}, seen
    assert seen[weight] == {"dense"}, seen


# ---------------------------------------------------------------------------------------
# through DDP

@pytest.mark.parametrize("codec", ["inceptionn", "lhc"])
def test_ddp_buckets_are_sum_then_divide_and_identical(group_run, codec):
    per_rank = [rank["ddp"][codec] for rank in group_run["ranks"]]
    records = [r["records"] for r in per_rank]
    assert len(records[0]) >= 3, "the tiny bucket cap should give several buckets"
    sizes = [rec[1].size for rec in records[0]]
    assert min(sizes) < WORLD, sizes
    for calls in zip(*records):
        assert len({c[0] for c in calls}) == 1          # same bucket on every rank
        inputs = [c[1] for c in calls]
        same_on_every_rank([c[2] for c in calls])
        if codec == "lhc":
            total, _ = lhc.allreduce(inputs)
        else:
            total, _ = simulate_ring(inputs, 6)
        expected = total / np.float32(WORLD)
        np.testing.assert_array_equal(bits(calls[0][2]), bits(expected))
    for grads in zip(*[r["grads"] for r in per_rank]):
        same_on_every_rank(grads)


# ---------------------------------------------------------------------------------------
# error feedback through DDP

def test_feedback_sends_a_tiny_constant_gradient_when_its_residual_crosses(group_run):
    """A constant gradient m 2^-(k+6) (m < 64, below 2^-k) through the DDP hook: rank r's
    residual after t steps is t m 2^-(k+6) minus the multiples of 2^-k sent so far, so the
    value is sent (as 2^-k) exactly at the steps where floor(t m / 64) grows; the averaged
    gradient of every step and the final residuals match that, bit for bit, on every rank,
    and sum(sent) + residual == steps * gradient exactly (nothing lost)."""
    runs = [rank["feedback"]["constant"] for rank in group_run["ranks"]]
    q = 2.0 ** -EF_K
    grads = [tiny_constant_gradient(r).astype(np.float64) for r in range(WORLD)]
    counts = [np.rint(np.abs(g) / (q / 64)) for g in grads]        # m of every element
    signs = [np.sign(g) for g in grads]

    def sent_until(r, t):                                           # exact (float64)
        return signs[r] * q * np.floor(t * counts[r] / 64)

    for t in range(1, EF_STEPS + 1):
        step_sum = sum(sent_until(r, t) - sent_until(r, t - 1) for r in range(WORLD))
        expected = np.float32(step_sum) / np.float32(WORLD)       # exact sum, one division
        for run in runs:
            np.testing.assert_array_equal(bits(run["averaged"][t - 1]), bits(expected))
    for r, run in enumerate(runs):
        # Mass: what was sent plus what is left is exactly what came in.
        assert np.array_equal(sent_until(r, EF_STEPS) + run["residual"].astype(np.float64),
                              EF_STEPS * grads[r])
        assert np.all(np.abs(run["residual"]) < q)
    # A value below 2^-k first moves the sum at the first step where a rank's residual
    # crosses 2^-k (and not before).
    first = np.min([np.where(counts[r] > 0, np.ceil(64 / np.maximum(counts[r], 1)), np.inf)
                    for r in range(WORLD)], axis=0)
    averaged = np.stack(runs[0]["averaged"])
    for i in range(first.size):
        if np.isfinite(first[i]):
            t = int(first[i])
            assert np.all(averaged[:t - 1, i] == 0) and averaged[t - 1, i] != 0, i
        else:
            assert np.all(averaged[:, i] == 0)
    assert runs[0]["bytes_sent"] > 0
    # Sums of values on the 2^-k grid never leave it: the ring itself lost nothing.
    assert all(run["offgrid"] == 0 and run["rounded"] == 0 for run in runs)


def _feedback_model(gradients, k):
    """Error feedback of one parameter over its steps, element by element (NumPy):
    ``(what was sent each step, the final residual)``."""
    residual = np.zeros_like(gradients[0])
    sent = []
    for g in gradients:
        corrected = g + residual
        sent.append(inc.quantize(corrected, k))
        residual = corrected - sent[-1]
    return sent, residual


def test_feedback_residuals_follow_ddp_bucket_rebuild(group_run):
    """DDP puts all parameters in one bucket in iteration 0 and rebuilds its buckets (one
    parameter each) for iteration 1. Every parameter's residual must follow it: each bucket's
    output and each final residual equal, bit for bit, a per-parameter model of error
    feedback over all iterations (a residual keyed by bucket index, or reset by the
    rebuild, loses iteration 0's residuals); all ranks agree."""
    runs = [rank["feedback"]["rebuild"] for rank in group_run["ranks"]]
    records = [run["records"] for run in runs]
    grouping = {it: sorted(tuple(rec["params"]) for rec in records[0] if rec["iteration"] == it)
                for it in range(EF_REBUILD_ITERATIONS)}
    assert grouping[0] != grouping[1], "DDP should rebuild its buckets after iteration 0"
    assert max(len(p) for p in grouping[0]) > 1
    shapes = runs[0]["shapes"]
    sizes = {name: int(np.prod(shape)) for name, shape in shapes.items()}
    # Every rank's gradient of every parameter, per iteration, cut out of its buckets.
    gradients = [{name: [None] * EF_REBUILD_ITERATIONS for name in shapes} for _ in runs]
    for r, recs in enumerate(records):
        for rec in recs:
            offset = 0
            for name in rec["params"]:
                gradients[r][name][rec["iteration"]] = rec["before"][offset:offset + sizes[name]]
                offset += sizes[name]
            assert offset == rec["before"].size
    model = [{name: _feedback_model(per_it, EF_K) for name, per_it in grads.items()}
             for grads in gradients]
    carried = 0
    for r, run in enumerate(runs):
        for name in shapes:
            np.testing.assert_array_equal(bits(run["residuals"][name].reshape(-1)),
                                          bits(model[r][name][1]), err_msg=name)
            # The residual left by iteration 0 (the big bucket) is what iteration 1 needs.
            carried += np.count_nonzero(gradients[r][name][0] - model[r][name][0][0])
    assert carried > 0, "iteration 0 should leave residuals for the rebuilt buckets"
    for calls in zip(*records):
        assert len({(c["iteration"], c["index"], tuple(c["params"])) for c in calls}) == 1
        it = calls[0]["iteration"]
        sent = [np.concatenate([model[r][name][0][it] for name in calls[0]["params"]])
                for r in range(WORLD)]
        total, _ = simulate_ring(sent, EF_K)
        for c in calls:
            np.testing.assert_array_equal(bits(c["after"]), bits(total / np.float32(WORLD)))
    for name in shapes:
        same_on_every_rank([run["grads"][name] for run in runs])


@pytest.mark.parametrize("codec", ["inceptionn", "lhc"])
def test_two_rank_training(group_run, codec):
    ranks = group_run["ranks"][:2]
    runs = [r["train"][codec] for r in ranks]
    plain = ranks[0]["train"]["plain"]
    for a, b in zip(runs[0]["params"], runs[1]["params"]):
        np.testing.assert_array_equal(bits(a), bits(b))
    losses = runs[0]["losses"]
    assert np.isfinite(losses).all()
    assert losses[-1] < 0.8 * losses[0]
    bytes_sent, dense, calls = runs[0]["stats"]
    assert calls >= TRAIN_STEPS and bytes_sent > 0 and dense > 0
    # Lossless up to the int32 quantisation: the LHC run stays next to the fp32 run.
    if codec == "lhc":
        for a, b in zip(runs[0]["params"], plain["params"]):
            np.testing.assert_allclose(a, b, atol=1e-5)
