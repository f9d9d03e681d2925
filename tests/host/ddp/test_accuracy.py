"""The accuracy experiment (host/ddp/accuracy.py): a tiny run of it inside the hooks' test
group (tests/host/ddp/group_run.py), its outputs, and its recommender data."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed (it comes with the 'ddp' extra: "
                    "pip install -e '.[ddp]')")

from host.ddp import accuracy  # noqa: E402
from tests.host.ddp.group_run import ACCURACY_SETTINGS  # noqa: E402


def test_accuracy_pipeline(group_run, tmp_path):
    runs = group_run["ranks"][0]["accuracy"]
    assert [(r["task"], r["codec"]) for r in runs] == \
        [(t, c) for t in accuracy.TASKS for c in accuracy.CODECS]
    for run in runs:
        assert run["replicas_identical"], (run["task"], run["codec"])
        assert len(run["train_loss"]) == 3 and np.isfinite(run["train_loss"]).all()
        assert [e[0] for e in run["evals"]] == [2, 3]
        assert 0.0 <= run["final_metric"] <= 1.0
        if run["codec"].startswith("inceptionn"):
            assert 0 < run["bytes_per_step"] < run["dense_ring_bytes_per_step"]
            assert 0 <= run["ring_offgrid_values"] <= run["ring_quantised_values"]
            assert 0 <= run["ring_rounded_adds"] <= run["ring_added_values"]
            assert run["ring_added_values"] > 0
        if run["codec"] == "lhc":
            assert run["lhc_mean_rows"] >= 1
    # Same seeds and batches: the paths differ only by their gradient arithmetic, so the
    # first step's loss (before any update) is the same for every path of a task.
    for task in accuracy.TASKS:
        first = {r["train_loss"][0] for r in runs if r["task"] == task}
        assert len(first) == 1, task
    results = {"settings": dataclasses.asdict(ACCURACY_SETTINGS), "runs": runs,
               "wall_seconds": 0.0}
    paths = accuracy.write_outputs(results, tmp_path)
    assert json.loads(paths["json"].read_text())["runs"][0]["codec"] == "fp32"
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = paths["md"].read_text()
    ring_runs = [r for r in runs if r["codec"].startswith("inceptionn")]
    # the results, the ring's rounding, and who computed every row (all golden here)
    assert sum(line.startswith("| ") for line in table.splitlines()) == \
        3 + 2 * len(runs) + len(ring_runs)
    computed_by = [line.split(" | ")[2:4] for line in table.splitlines()
                   if line.startswith("| ") and " | - | " in line]
    assert sorted(computed_by) == sorted(
        [["gloo" if r["codec"] in ("fp32", "fsdp-fp32") else "golden", "-"] for r in runs])
    # the FSDP2 rows: compressed bytes against FSDP2's own fp32 reduce-scatter
    fsdp_runs = {(r["task"], r["codec"]): r for r in runs if r["codec"].startswith("fsdp-")}
    assert fsdp_runs
    for (task, codec), run in fsdp_runs.items():
        assert "max_param_diff_vs_ddp" in run
        if codec == "fsdp-fp32":
            assert run["bytes_per_step"] == run["dense_ring_bytes_per_step"] > 0
            assert run["max_param_diff_vs_ddp"] < 1e-6      # the order of fp32 sums
        if codec.startswith("fsdp-inceptionn"):
            assert 0 < run["bytes_per_step"] < run["dense_ring_bytes_per_step"]
            assert run["dense_ring_bytes_per_step"] == \
                fsdp_runs[task, "fsdp-fp32"]["dense_ring_bytes_per_step"]
    assert {"inceptionn-k6-ef", "inceptionn-k8-ef", "inceptionn-k10-ef"} <= \
        {r["codec"] for r in ring_runs}


def test_ncf_data_is_consistent():
    data = accuracy.make_ncf_data(60, 130, 12, seed=5)
    assert data["train_users"].shape == (60 * 11,)
    assert data["test_items"].shape == (60, 100)
    for user in range(60):
        train = set(data["train_items"][data["train_users"] == user].tolist())
        positive, negatives = data["test_items"][user, 0], data["test_items"][user, 1:]
        assert len(train) == 11 and positive not in train
        assert len(set(negatives.tolist())) == 99
        assert not (set(negatives.tolist()) & (train | {positive}))
    again = accuracy.make_ncf_data(60, 130, 12, seed=5)
    assert all(np.array_equal(data[key], again[key]) for key in ("train_items", "test_items"))
    with pytest.raises(ValueError):
        accuracy.make_ncf_data(10, 100, 5, seed=0)
