"""Yosys-only synthesis of the LiteEth core on a board's real RGMII pins (no place and route).

Checks that the core's ECP5 cells resolve (no black box left), that the pins reach the
board's pads, and reports the cells used. A UDP echo sits behind the core so that nothing
is optimised away. Run: ``python -m hdl.board.eth_synth [--board ecpix5]`` (about a minute
or two); prints the Yosys statistics and writes them to ``build/net-synth/<board>/``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from amaranth import ClockDomain, Elaboratable, Module
from amaranth.lib import wiring

from hdl.net.core.echo import UdpEcho
from hdl.net.core.eth_core import LiteEthCore, rgmii_ports
from hdl.net.core.liteeth import generate, load_network_config
from hdl.replica import KEEP_REPLICAS

REPO = Path(__file__).resolve().parents[3]


class EchoBoardTop(Elaboratable):
    """Core + echo on the board's RGMII resource; sys from the board's default clock."""

    def __init__(self, core):
        self._core = core

    def elaborate(self, platform):
        m = Module()
        m.domains.sync = sync = ClockDomain()
        m.d.comb += sync.clk.eq(platform.request(platform.default_clk, dir="i").i)
        config = self._core.config
        name, number = config.resource
        pins = rgmii_ports(platform.request(name, number, dir="-"), config.pins)
        m.submodules.eth = eth = LiteEthCore(self._core, domain="sync", rgmii=pins)
        m.submodules.echo = echo = UdpEcho(depth=2048)
        wiring.connect(m, eth.rx, echo.rx)
        wiring.connect(m, echo.tx, eth.tx)
        return m


def main(argv=None) -> int:
    from hdl.board.boards import load_boards
    from hdl.board.tools.build import tool_environment

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--board", default="ecpix5", choices=sorted(load_boards()))
    args = parser.parse_args(argv)
    board = load_boards()[args.board]
    core = generate(load_network_config(args.board))
    out = REPO / "build" / "net-synth" / args.board
    out.mkdir(parents=True, exist_ok=True)
    os.environ.update(tool_environment())
    env = dict(os.environ)
    platform = board.make_platform()
    plan = platform.build(EchoBoardTop(core), name="eth_echo", build_dir=str(out),
                          do_build=False, emit_src=False, script_after_read=KEEP_REPLICAS)
    plan.extract(str(out))
    started = time.monotonic()
    subprocess.run([env["YOSYS"], "-q", "-l", "yosys.log", "eth_echo.ys"], cwd=out,
                   env=env, check=True)
    seconds = time.monotonic() - started
    log = (out / "yosys.log").read_text()
    stats = log[log.rindex("=== eth_echo ==="):] if "=== eth_echo ===" in log else log[-4000:]
    # A module nobody defines stops Yosys with an error (check=True above); the ECP5 I/O
    # cells stay as cells for nextpnr. Anything else left as a black box is a problem.
    cells = {name: int(count) for count, name in
             re.findall(r"^\s+(\d+)\s+(\w+)$", stats, re.M)}
    known = {"IDDRX1F", "ODDRX1F", "DELAYG", "TRELLIS_IO", "TRELLIS_FF", "TRELLIS_DPR16X4",
             "DP16KD", "LUT4", "CCU2C", "L6MUX21", "PFUMX", "MULT18X18D", "ALU54B"}
    # Cell types are upper case in the statistics; wires, ports, module names are not.
    blackboxes = sorted(name for name in cells if name.isupper() and name not in known)
    summary = {"board": args.board, "yosys_seconds": round(seconds, 1),
               "cells": {k: v for k, v in cells.items() if k in known},
               "unresolved": blackboxes}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(stats)
    print(json.dumps(summary, indent=2))
    return 0 if not blackboxes else 1


if __name__ == "__main__":
    sys.exit(main())
