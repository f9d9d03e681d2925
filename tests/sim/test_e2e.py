"""The end-to-end simulation at small size: every path, the golden and UDP backends (and
Verilator, marked cocotb), plus the CLI."""
import json

import pytest

from host.cli import main
from sim.e2e import run


@pytest.mark.parametrize("backend", [
    "golden",
    "udp",
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
    wire = report["wire"]
    assert wire["bit_exact"] and wire["network_link_bytes"] < wire["host_link_bytes"]
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


def test_cli_sim_over_udp_with_faults_is_identical_and_counts_resends(tmp_path, capsys):
    assert main(["sim", "--backend", "golden", "--size", "small", "--workers", "3",
                 "--steps", "1", "--seed", "4", "--out", str(tmp_path / "golden")]) == 0
    assert main(["sim", "--backend", "udp", "--fault-rate", "0.1", "--fault-seed", "2",
                 "--size", "small", "--workers", "3", "--steps", "1", "--seed", "4",
                 "--out", str(tmp_path / "udp")]) == 0
    out = capsys.readouterr().out
    assert "wire faults (seed 2)" in out and "bit-exact" in out
    golden = json.loads((tmp_path / "golden" / "report.json").read_text())
    udp = json.loads((tmp_path / "udp" / "report.json").read_text())
    assert udp["backend_options"] == {"fault_rate": 0.1, "fault_seed": 2}
    # the same training: identical losses and LHC statistics, bit for bit
    for path in ("inceptionn", "lhc"):
        assert udp[path]["loss_after"] == golden[path]["loss_after"]
        assert udp[path]["network"]["wire_faults"]["lost"] > 0
    assert udp["inceptionn"]["max_error"] == golden["inceptionn"]["max_error"]
    assert udp["lhc"]["per_step"][0]["peeled"] == golden["lhc"]["per_step"][0]["peeled"]
    resends = sum(s["resends"] for p in ("inceptionn", "lhc")
                  for name, s in udp[p]["network"].items() if name != "wire_faults")
    assert resends > 0


def test_cli_sim_rejects_bad_options(tmp_path, capsys):
    assert main(["sim", "--backend", "golden", "--workers", "1", "--out", str(tmp_path)]) == 2
    assert "workers" in capsys.readouterr().err
    assert main(["sim", "--backend", "golden", "--fault-rate", "0.1",
                 "--out", str(tmp_path)]) == 2
    assert "--backend udp" in capsys.readouterr().err
    assert main(["sim", "--backend", "verilator", "--board-backend", "verilator",
                 "--out", str(tmp_path)]) == 2
    assert "--board-backend" in capsys.readouterr().err


def test_wire_path_alone_reports_bytes_and_retransmissions(tmp_path, capsys):
    assert main(["sim", "--backend", "golden", "--size", "small", "--workers", "4",
                 "--path", "wire", "--wire-steps", "2", "--wire-fault-rate", "0.2",
                 "--wire-fault-seed", "3", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "ring through NICs in the wire" in out and "bit-exact vs the golden ring on all " \
        "hosts: yes" in out and "INCEPTIONN ring all-reduce" not in out
    report = json.loads((tmp_path / "report.json").read_text())
    assert set(report) & {"inceptionn", "lhc", "wire"} == {"wire"}
    wire = report["wire"]
    assert wire["steps"] == 2 and wire["bit_exact"] and wire["ratio"] > 1
    assert wire["totals"]["tx_resends"] > 0 and wire["faults"]["lost"] > 0
    for line in ("bytes on host links", "bytes on network links", "host / network",
                 "retransmissions"):
        assert line in out


def test_wire_path_bad_options(tmp_path, capsys):
    for args, message in [(["--wire-steps", "0"], "wire_steps"),
                          (["--wire-fault-rate", "1.5"], "fault probability"),
                          (["-k", "16"], "k")]:
        assert main(["sim", "--backend", "golden", "--size", "small", "--path", "wire",
                     *args, "--out", str(tmp_path)]) == 2
        assert message in capsys.readouterr().err
