"""``make bench``'s ddp_hardware section, small (4 gloo ranks, the digits model, 2 steps, every
path: fp32, the golden hooks, every rank's Verilated NIC, a virtual board's NIC and switch):
every figure is there and consistent with its definition, and the check against the golden
path fails when the bits differ."""
import copy

import pytest

pytest.importorskip("torch", reason="PyTorch is not installed (the 'ddp' extra)")
pytest.importorskip("sklearn", reason="scikit-learn is not installed (the 'ddp' extra)")

from host.benchmarks import ddp_hardware  # noqa: E402

STEPS = 2


@pytest.fixture(scope="module")
def results():
    return ddp_hardware.run(quick=True, steps=STEPS)


def _rows(results):
    return {r["path"]: r for r in results["runs"]}


def test_every_path_ran_and_the_hardware_gave_the_golden_bits(results):
    assert results["steps"] == STEPS and results["tasks"] == ["digits"]
    rows = _rows(results)
    assert list(rows) == list(ddp_hardware.PATHS)
    for path, (family, backend) in ddp_hardware.PATHS.items():
        row = rows[path]
        assert row["task"] == "digits" and row["params"] > 0
        if family is None:
            assert row["backend"] == "gloo" and "hardware" not in row
        elif backend == "golden":
            assert row["backend"] == "golden" and "packets_in_per_step_rank" not in row
        else:
            # who computed the row is named, and it is not the golden model
            assert row["backend"].startswith(backend), row["backend"]
            assert row["identical_to_golden"] is True


def test_the_figures_are_their_definitions(results):
    rows = _rows(results)
    fp32 = rows["fp32"]
    assert fp32["step_vs_fp32"] == 1.0
    for path, (family, backend) in ddp_hardware.PATHS.items():
        row = rows[path]
        assert row["step_ms"] > 0
        assert row["step_vs_fp32"] == pytest.approx(row["step_ms"] / fp32["step_ms"])
        if family is None:
            continue
        # the hardware (or golden) path is a part of the hook's calls, which are a part
        # of the step
        assert 0 < row["path_ms"] <= row["hook_ms"] <= row["step_ms"]
        assert row["bytes_sent_per_step_rank"] > 0
        if backend == "golden":
            continue
        golden = rows[f"{family}-golden"]
        assert row["path_vs_golden"] == pytest.approx(row["path_ms"] / golden["path_ms"])
        assert row["step_vs_golden"] == pytest.approx(row["step_ms"] / golden["step_ms"])
        # every packet into the hardware came back out; whole packets, so an integer count
        # over all ranks and steps
        assert row["packets_in_per_step_rank"] >= 1
        assert row["packets_out_per_step_rank"] == row["packets_in_per_step_rank"]
        total = row["packets_in_per_step_rank"] * STEPS * ddp_hardware.WORLD
        assert total == pytest.approx(round(total))
        # packets carry at least the compressed payload the hook counts
        assert row["bytes_in_per_step_rank"] >= row["bytes_sent_per_step_rank"]
        assert row["resends"] >= 0 and row["startup_seconds"] >= 0
        if backend == "verilator":
            # simulated clock cycles, and what they take at 125 MHz
            assert row["cycles_per_step_rank"] > 0
            assert row["gateware_ms_at_125mhz"] == pytest.approx(
                row["cycles_per_step_rank"] / 125e3)
        else:
            assert "cycles_per_step_rank" not in row


def test_a_hardware_path_that_differs_from_the_golden_one_fails_the_run():
    """The check itself, on made-up per-rank results: the step named is the first whose
    digests differ, and ranks that disagree are caught too."""
    def result(path, digests):
        row = {"path": path, "task": "digits", "steps": 2, "digests": digests, "params": 1,
               "wall_seconds": 1.0, "step_seconds": 1.0, "backend": "golden"}
        if path != "fp32":
            row.update(hook_seconds=0.5, path_seconds=0.25, bytes_sent=10)
        return row

    same = [result("fp32", ["a", "b"]), result("lhc-golden", ["c", "d"]),
            result("lhc-udp", ["c", "d"])]
    ddp_hardware._summarise([same, copy.deepcopy(same)], 2)
    differs = same[:2] + [result("lhc-udp", ["c", "x"])]
    with pytest.raises(AssertionError, match="lhc-udp.*after step 2"):
        ddp_hardware._summarise([differs, copy.deepcopy(differs)], 2)
    with pytest.raises(AssertionError, match="ranks' parameters differ"):
        ddp_hardware._summarise([same, differs], 2)


def test_a_hardware_path_alone_runs_with_its_baselines(monkeypatch):
    """Asking for one hardware path also runs fp32 and its family's golden path, so that it
    is checked; an unknown path is refused before anything starts."""
    with pytest.raises(ValueError, match="unknown paths"):
        ddp_hardware.run(paths=("inceptionn-fpga",))
    with pytest.raises(ValueError, match="steps must be at least 1"):
        ddp_hardware.run(steps=0)
    seen = {}

    def fake_group(main, world, tasks, steps, paths, *args, **kwargs):
        seen["paths"] = paths
        raise RuntimeError("stop here")

    import host.ddp
    monkeypatch.setattr(host.ddp, "run_local_group", fake_group)
    with pytest.raises(RuntimeError, match="stop here"):
        ddp_hardware.run(quick=True, paths=("lhc-udp",))
    assert seen["paths"] == ("fp32", "lhc-golden", "lhc-udp")
