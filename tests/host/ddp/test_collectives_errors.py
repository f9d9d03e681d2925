"""DDP hooks on inputs the ranks disagree about (issue 16, item 9).

A bucket length, ``k``, ``load`` that differ between ranks, or one rank's gradient that the
sketch path refuses (NaN, |x| >= 2^127): every rank must raise the same clear
``ValueError`` before any data moves, and the group must stay usable afterwards (today:
silent wrong sums of different lengths, a hang, SIGABRT inside gloo, or a clear error on one
rank and "connection closed" on the others).

One 3-process gloo group runs every case; each rank catches its own error and returns it.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed (it comes with the 'ddp' extra: "
                    "pip install -e '.[ddp]')")

from host import ddp  # noqa: E402
from host.golden import lhc  # noqa: E402

WORLD = 3


def _ring_lengths(rank):
    return ddp.inceptionn_ring_allreduce(np.ones(12 if rank == 1 else 10, np.float32), 10)


def _ring_k(rank):
    return ddp.inceptionn_ring_allreduce(np.ones(10, np.float32), 8 if rank == 2 else 10)


def _lhc_lengths(other):
    def run(rank):
        return ddp.lhc_allreduce(np.ones(other if rank == 1 else 3000, np.float32))
    return run


def _lhc_values(rank, bad_rank, bad_value):
    x = np.linspace(-1, 1, 3000).astype(np.float32)
    if rank == bad_rank:
        x[5] = bad_value
    return x


def _lhc_nan(rank):
    return ddp.lhc_allreduce(_lhc_values(rank, 1, np.nan))


def _lhc_huge(rank):
    return ddp.lhc_allreduce(_lhc_values(rank, 2, np.float32(2.0 ** 127)))


def _lhc_load(rank):
    return ddp.lhc_allreduce(np.ones(100, np.float32), load=0.5 if rank == 0 else 0.7)


def _lhc_path(rank):
    return ddp.lhc_allreduce(np.ones(100, np.float32), path="dense" if rank == 1 else "auto")


def _ddp_lhc_nan(asynchronous):
    def case(rank):
        """A real DDP model whose input on rank 1 holds a NaN: the error comes out of
        ``backward()`` on every rank."""
        from torch.nn.parallel import DistributedDataParallel

        torch.manual_seed(0)
        model = DistributedDataParallel(torch.nn.Linear(4, 2))
        model.register_comm_hook(state=None, hook=ddp.LhcHook(asynchronous=asynchronous))
        x = torch.ones(3, 4)
        if rank == 1:
            x[0, 0] = float("nan")
        model(x).sum().backward()
    return case


CASES = {
    "ring_lengths": _ring_lengths, "ring_k": _ring_k,
    "lhc_lengths_2999": _lhc_lengths(2999), "lhc_lengths_2000": _lhc_lengths(2000),
    "lhc_nan": _lhc_nan, "lhc_huge": _lhc_huge, "lhc_load": _lhc_load, "lhc_path": _lhc_path,
    "ddp_lhc_nan": _ddp_lhc_nan(False), "ddp_lhc_nan_async": _ddp_lhc_nan(True),
}


def _rank_main(rank, world):
    out = {}
    for name, case in CASES.items():
        try:
            case(rank)
            out[name] = None
        except Exception as exc:                         # noqa: BLE001 (reported)
            out[name] = (type(exc).__name__, str(exc))
    # The group is still in step: a correct call of each kind works afterwards.
    x = np.linspace(-1, 1, 50).astype(np.float32) * (rank + 1)
    out["after"] = (ddp.inceptionn_ring_allreduce(x, 10)[0], ddp.lhc_allreduce(x)[0], x)
    return out


@pytest.fixture(scope="module")
def ranks():
    return ddp.run_local_group(_rank_main, WORLD, timeout=60)


def _same_error_everywhere(ranks, name, kind="ValueError"):
    errors = [r[name] for r in ranks]
    assert all(e is not None for e in errors), f"{name}: some rank raised nothing: {errors}"
    assert len(set(errors)) == 1, f"{name}: ranks raised different errors: {errors}"
    raised, message = errors[0]
    assert raised == kind, errors[0]
    assert "every rank of the group raises this error" in message
    return message


def test_ring_bucket_lengths_differ(ranks):
    message = _same_error_everywhere(ranks, "ring_lengths")
    assert "INCEPTIONN" in message
    assert "rank 0: 10, rank 1: 12, rank 2: 10 values" in message


def test_ring_k_differs(ranks):
    message = _same_error_everywhere(ranks, "ring_k")
    assert "k=10 on rank(s) 0, 1; k=8 on rank(s) 2" in message


@pytest.mark.parametrize("other", [2999, 2000])
def test_lhc_bucket_lengths_differ(ranks, other):
    message = _same_error_everywhere(ranks, f"lhc_lengths_{other}")
    assert f"rank 0: 3000, rank 1: {other}, rank 2: 3000 values" in message


def test_lhc_nan_on_one_rank_is_reported_by_every_rank(ranks):
    message = _same_error_everywhere(ranks, "lhc_nan")
    assert "rank 1 refused its input" in message and "non-finite" in message
    assert "index 5" in message and "rank 0 refused" not in message


def test_lhc_huge_value_on_one_rank_is_reported_by_every_rank(ranks):
    message = _same_error_everywhere(ranks, "lhc_huge")
    assert "rank 2 refused its input" in message and "2**127" in message


def test_lhc_load_differs(ranks):
    message = _same_error_everywhere(ranks, "lhc_load")
    assert "load=0.5 on rank(s) 0; load=0.7 on rank(s) 1, 2" in message


def test_lhc_path_differs(ranks):
    """Ranks on different paths would run different collectives (a hang): refused first."""
    message = _same_error_everywhere(ranks, "lhc_path")
    assert "path (0 sketch, 1 dense, 2 auto)=2 on rank(s) 0, 2; " \
           "path (0 sketch, 1 dense, 2 auto)=1 on rank(s) 1" in message


def test_ddp_lhc_hook_nan_raises_from_backward_on_every_rank(ranks):
    message = _same_error_everywhere(ranks, "ddp_lhc_nan")
    assert "rank 1 refused its input" in message and "non-finite" in message


def test_ddp_async_hook_nan_raises_from_backward_on_every_rank(ranks):
    # DDP's C++ reducer raises a failed future as a RuntimeError that names the original.
    message = _same_error_everywhere(ranks, "ddp_lhc_nan_async", kind="RuntimeError")
    assert "ValueError: LHC sketch all-reduce: rank 1 refused its input" in message
    assert "non-finite" in message


def test_group_still_works_after_the_errors(ranks):
    inputs = [r["after"][2] for r in ranks]
    exact = np.sum(inputs, axis=0, dtype=np.float64)
    expected_lhc, _ = lhc.allreduce(inputs)
    for r in ranks:
        ring, sketch, _ = r["after"]
        assert np.all(np.abs(ring - exact) < WORLD * 2.0 ** -10 + 1e-6)
        np.testing.assert_array_equal(sketch.view(np.uint32), expected_lhc.view(np.uint32))
