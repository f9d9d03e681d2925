"""Replicated registers survive synthesis as separate flip-flops."""
import re
import subprocess
import sys
from pathlib import Path

import pytest
from amaranth import Cat, Elaboratable, Module, Signal
from amaranth.back import rtlil, verilog

from hdl.board.build import TOOLS
from hdl.replica import KEEP_REPLICAS, replica, replicas

YOSYS = Path(sys.executable).parent / TOOLS["YOSYS"]
COPIES, WIDTH = 4, 4


class CopiesOfOneRegister(Elaboratable):
    """``COPIES`` registers loaded with the same value, each driving its own loads."""

    def __init__(self, keep):
        self.keep = keep
        self.value = Signal(WIDTH)
        self.enable = Signal()
        self.masks = Signal(COPIES * WIDTH)
        self.o = Signal(COPIES * WIDTH)

    def elaborate(self, platform):
        m = Module()
        if self.keep:
            copies = replicas(COPIES, WIDTH, name="copy")
        else:
            copies = [Signal(WIDTH, name=f"copy{i}") for i in range(COPIES)]
        for copy in copies:
            with m.If(self.enable):
                m.d.sync += copy.eq(self.value)
        m.d.comb += self.o.eq(Cat(copy & self.masks[WIDTH * i:WIDTH * (i + 1)]
                                  for i, copy in enumerate(copies)))
        return m

    def ports(self):
        return [self.value, self.enable, self.masks, self.o]


def synthesized_flip_flops(tmp_path, design, language):
    if language == "rtlil":
        (tmp_path / "top.il").write_text(rtlil.convert(design, name="top", ports=design.ports()))
        read = "read_rtlil top.il"
    else:
        (tmp_path / "top.v").write_text(verilog.convert(design, name="top",
                                                        ports=design.ports()))
        read = "read_verilog top.v"
    script = f"{read}\n{KEEP_REPLICAS}\nsynth_ecp5 -top top\ntee -o stat.txt stat\n"
    (tmp_path / "synth.ys").write_text(script)
    subprocess.run([str(YOSYS), "-q", "synth.ys"], cwd=tmp_path, check=True)
    found = re.search(r"^\s*(\d+)\s+TRELLIS_FF\s*$", (tmp_path / "stat.txt").read_text(), re.M)
    return int(found.group(1)) if found else 0


@pytest.mark.parametrize("language", ["rtlil", "verilog"])
def test_replicas_stay_apart_through_synthesis(tmp_path, language):
    """Without the attribute Yosys merges the copies into one register (the control)."""
    merged = synthesized_flip_flops(tmp_path, CopiesOfOneRegister(keep=False), language)
    kept = synthesized_flip_flops(tmp_path, CopiesOfOneRegister(keep=True), language)
    assert merged == WIDTH
    assert kept == COPIES * WIDTH


def test_replica_checks_its_parameters():
    with pytest.raises(TypeError, match="count must be a positive integer"):
        replicas(0, 4, name="x")
    with pytest.raises(TypeError, match="name must be a non-empty string"):
        replica(4, name="")
    assert [r.name for r in replicas(2, 3, name="ptr_copy")] == ["ptr_copy0", "ptr_copy1"]
