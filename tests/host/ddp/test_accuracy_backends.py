"""``gradwire accuracy --backend verilator|udp`` (host/ddp/accuracy.py, host/commands/accuracy.py):
a quick run of the experiment's digits model through the gateware gives the golden run's
numbers exactly, and the report says which backend computed every row and how many packets
went through the hardware.

Two ranks and a few steps each (the 4-rank runs are in tests/host/ddp/test_hardware.py):
the golden run directly, the hardware runs through the command line, the udp one with the
virtual board that the command starts in a process of its own.
"""
from __future__ import annotations

import json

import pytest

pytest.importorskip("torch", reason="PyTorch is not installed (the 'ddp' extra)")
pytest.importorskip("sklearn", reason="scikit-learn is not installed (the 'ddp' extra)")

from host.ddp import accuracy  # noqa: E402
from host.cli import main  # noqa: E402

STEPS = 3
CODECS = ("fp32", "inceptionn-k10", "lhc")
SETTINGS = dict(world_size=2, tasks=("digits",), codecs=CODECS, digits_steps=STEPS,
                ncf_steps=STEPS, eval_every=STEPS)


@pytest.fixture(scope="module")
def golden():
    return accuracy.run_experiment(accuracy.Settings.quick(**SETTINGS))


@pytest.fixture(scope="module", params=["verilator", "udp"])
def hardware(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"accuracy-{request.param}")
    code = main(["accuracy", "--quick", "--backend", request.param, "--world-size", "2",
                 "--tasks", "digits", "--codecs", *CODECS, "--steps", str(STEPS),
                 "--out", str(out)])
    assert code == 0
    return request.param, json.loads((out / "accuracy.json").read_text()), \
        (out / "accuracy.md").read_text()


def test_the_hardware_rows_are_the_golden_rows_bit_for_bit(golden, hardware):
    backend, results, _ = hardware
    assert results["settings"]["backend"] == backend
    assert [(r["task"], r["codec"]) for r in results["runs"]] == \
        [(r["task"], r["codec"]) for r in golden["runs"]]
    for mine, gold in zip(results["runs"], golden["runs"]):
        # Every loss of every step, and the final metric and test loss: the same floats.
        assert mine["train_loss"] == gold["train_loss"], mine["codec"]
        assert mine["evals"] == [list(e) for e in gold["evals"]], mine["codec"]
        assert mine["bytes_per_step"] == gold["bytes_per_step"] or mine["codec"] != "lhc"
        assert mine["replicas_identical"]


def test_the_report_says_who_computed_each_row_and_what_went_through_it(hardware):
    backend, results, table = hardware
    rows = {r["codec"]: r for r in results["runs"]}
    assert rows["fp32"]["backend"] == "gloo" and "hardware" not in rows["fp32"]
    for codec in ("inceptionn-k10",):
        assert rows[codec]["backend"].startswith(backend)
        hw = rows[codec]["hardware"]
        assert hw["packets_in"] == hw["packets_out"] > 0
        assert rows[codec]["hardware_packets_per_step_rank"] == hw["packets_in"] / STEPS / 2
        assert rows[codec]["path_seconds_per_step"] > 0
    if backend == "udp":
        assert rows["lhc"]["backend"].startswith("udp (switch of 127.0.0.1")
        assert rows["lhc"]["hardware"]["packets_out"] > 0
        assert results["board"]["virtual"]
        received, sent = results["board"]["datagrams_in_out"]
        assert received >= sum(r["hardware"]["packets_in"] for r in results["runs"]
                               if "hardware" in r)
    else:
        assert rows["lhc"]["backend"] == "golden" and "hardware" not in rows["lhc"]
    assert "| computed by | packets through the hardware /step/rank |" in table
    assert f"| digits | inceptionn-k10 | {rows['inceptionn-k10']['backend']} |" in table


def test_the_training_processes_run_on_pinned_code_paths(golden, monkeypatch):
    """The SIMD code paths that make the figures the same on every x86-64 machine: set while
    the processes start (unless the caller set them), restored afterwards, recorded."""
    import os

    names = sorted(accuracy.PINNED_ENVIRONMENT)
    if not any(name in os.environ for name in names):
        assert golden["environment"] == accuracy.PINNED_ENVIRONMENT
    for name in names:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(names[0], "mine")
    with accuracy._pinned_environment() as environment:
        assert environment == {names[0]: "mine",
                               names[1]: accuracy.PINNED_ENVIRONMENT[names[1]]}
        assert {name: os.environ[name] for name in names} == environment
    assert os.environ[names[0]] == "mine" and names[1] not in os.environ


def test_command_line_errors(capsys, monkeypatch):
    monkeypatch.delenv("GRADWIRE_BOARD", raising=False)
    monkeypatch.delenv("GRADWIRE_KEY", raising=False)
    assert main(["accuracy", "--board", "127.0.0.1", "--quick"]) != 0
    assert "--board and --key are for --backend udp" in capsys.readouterr().err
    assert main(["accuracy", "--backend", "udp", "--board", "127.0.0.1", "--quick"]) != 0
    assert "give its control key" in capsys.readouterr().err
    assert main(["accuracy", "--backend", "udp", "--board", "127.0.0.1", "--key", "xyz"]) != 0
    assert "hex digits" in capsys.readouterr().err
    with pytest.raises(ValueError, match="backend must be one of"):
        accuracy.run_experiment(accuracy.Settings.quick(backend="fpga"))
