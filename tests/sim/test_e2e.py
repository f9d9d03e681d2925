"""The end-to-end simulation at small size: both paths, both backends, plus the CLI."""
import json

import pytest

from host.cli import main
from sim.e2e import run


@pytest.mark.parametrize("backend", [
    "golden",
    pytest.param("verilator", marks=pytest.mark.cocotb),
])
def test_end_to_end_small(backend, tmp_path):
    report = run(workers=3, k=8, steps=1, seed=5, backend=backend, out_dir=tmp_path,
                 size="small")
    assert report["ok"], report
    assert report["inceptionn"]["bit_identical_on_all_workers"]
    assert report["inceptionn"]["within_error_bound"]
    assert report["inceptionn"]["compression_ratio"] > 1
    assert report["lhc"]["exact"]
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["ok"] and "RESULT" in (tmp_path / "report.txt").read_text()
    if backend == "verilator":
        for path in ("inceptionn", "lhc"):
            compared = report[path]["compared_with_golden"]
            assert compared["packets"] > 0 and compared["registers"] > 0
        for engine in ("nic_tx", "nic_rx", "switch_agg"):
            assert report["engines"][engine]["busy_cycles"] > 0


def test_cli_sim_golden(tmp_path, capsys):
    assert main(["sim", "--backend", "golden", "--size", "small", "--workers", "2",
                 "--steps", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "bit-exact" in out and (tmp_path / "report.json").exists()


def test_cli_sim_rejects_bad_options(tmp_path, capsys):
    assert main(["sim", "--backend", "golden", "--workers", "1", "--out", str(tmp_path)]) == 2
    assert "workers" in capsys.readouterr().err
