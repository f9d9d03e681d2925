"""Every endpoint's slack from nextpnr's SDF (``python -m hdl.board.slack``): a hand-made SDF
whose answer is known, and a real place-and-route of a small design whose worst path must be
nextpnr's own critical path."""
import os
import subprocess

import pytest

from hdl.board.build import TOOLS, parse_nextpnr_log, tool_environment
from hdl.board.slack import analyse, block_of, constrained_periods, main, parse_sdf, path_to

# Two clocks: a.r -> LUT -> b.r in clock A (1.0 + 2.0 + 0.5 + 3.0 + setup 0.2 = 6.7 ns), a
# path from a.r into clock B's flip-flop (not checked), a LUT RAM read in clock B.
_SDF = r"""(DELAYFILE (SDFVERSION "3.0") (TIMESCALE 1ps)
  (CELL (CELLTYPE "top") (INSTANCE )
    (DELAY (ABSOLUTE
      (INTERCONNECT \$gbuf\$clka/CLKO blk\.a\.r_TRELLIS_FF_Q/CLK (0:0:0) (0:0:0))
      (INTERCONNECT \$gbuf\$clka/CLKO blk\.b\.r_TRELLIS_FF_Q/CLK (0:0:0) (0:0:0))
      (INTERCONNECT \$gbuf\$clkb/CLKO blk\.c\.r_TRELLIS_FF_Q/CLK (0:0:0) (0:0:0))
      (INTERCONNECT \$gbuf\$clkb/CLKO mem\.ram/WCK (0:0:0) (0:0:0))
      (INTERCONNECT blk\.a\.r_TRELLIS_FF_Q/Q blk\.b\.lut/A (1000:1500:2000) (900:1000:1100))
      (INTERCONNECT blk\.a\.r_TRELLIS_FF_Q/Q blk\.c\.r_TRELLIS_FF_Q/DI (9000:9000:9000) (0:0:0))
      (INTERCONNECT blk\.b\.lut/F blk\.b\.r_TRELLIS_FF_Q/DI (3000:3000:3000) (1:1:1))
      (INTERCONNECT blk\.c\.r_TRELLIS_FF_Q/Q mem\.ram/RAD0 (100:100:100) (100:100:100))
      (INTERCONNECT mem\.ram/DO0 blk\.c\.r_TRELLIS_FF_Q/M (100:100:100) (100:100:100))
    ))
  )
  (CELL (CELLTYPE "TRELLIS_FF") (INSTANCE blk\.a\.r_TRELLIS_FF_Q)
    (DELAY (ABSOLUTE (IOPATH CLK Q (400:500:1000) (400:500:1000)))))
  (CELL (CELLTYPE "TRELLIS_COMB") (INSTANCE blk\.b\.lut)
    (DELAY (ABSOLUTE (IOPATH A F (300:400:500) (300:400:450)))))
  (CELL (CELLTYPE "TRELLIS_FF") (INSTANCE blk\.b\.r_TRELLIS_FF_Q)
    (DELAY (ABSOLUTE (IOPATH CLK Q (400:500:600) (400:500:600))))
    (TIMINGCHECK (SETUPHOLD (posedge DI) (posedge CLK) (100:150:200) (0:0:0))))
  (CELL (CELLTYPE "TRELLIS_FF") (INSTANCE blk\.c\.r_TRELLIS_FF_Q)
    (DELAY (ABSOLUTE (IOPATH CLK Q (400:500:600) (400:500:600))))
    (TIMINGCHECK (SETUPHOLD (posedge DI) (posedge CLK) (0:0:0) (0:0:0))
                 (SETUPHOLD (posedge M) (posedge CLK) (0:0:0) (0:0:0))))
  (CELL (CELLTYPE "TRELLIS_COMB") (INSTANCE mem\.ram)
    (DELAY (ABSOLUTE (IOPATH RAD0 DO0 (700:700:700) (700:700:700)))))
)
"""


def test_slack_of_every_endpoint_per_clock_and_no_cross_clock_check():
    timing = parse_sdf(_SDF)
    periods = {"$gbuf$clka": 6000.0, "$gbuf$clkb": 2000.0}
    endpoints, predecessor, loops = analyse(timing, periods)
    assert loops == 0
    by_pin = {e.pin: e for e in endpoints}
    # clock A: max of every triple, setup included: 6000 - (1000 + 2000 + 500 + 3000 + 200)
    b = by_pin["blk.b.r_TRELLIS_FF_Q/DI"]
    assert (b.clock, b.slack, b.start) == ("$gbuf$clka", -700.0, "blk.a.r_TRELLIS_FF_Q/CLK")
    assert [p for p, _ in path_to(predecessor, b.pin, b.clock)] == [
        "blk.a.r_TRELLIS_FF_Q/CLK", "blk.a.r_TRELLIS_FF_Q/Q", "blk.b.lut/A", "blk.b.lut/F",
        "blk.b.r_TRELLIS_FF_Q/DI"]
    # clock B: c.r -> LUT RAM read -> c.r (600 + 100 + 700 + 100); a.r's 9 ns wire into
    # c.r/DI is a crossing, not a path of either clock
    assert by_pin["blk.c.r_TRELLIS_FF_Q/M"].slack == 2000.0 - 1500.0
    assert "blk.c.r_TRELLIS_FF_Q/DI" not in by_pin
    assert endpoints[0] is b           # worst first
    assert block_of(b.pin, 2) == "blk.b" and block_of(b.pin, 5) == "blk.b.r"


def test_constrained_periods_from_the_log():
    log = ("Info: constraining clock net 'pll.clk_out' to 125.00 MHz\n"
           "Info: constraining clock net 'pll.clk_os' to 62.50 MHz\n")
    assert constrained_periods(log) == {"pll.clk_out": 8000.0, "pll.clk_os": 16000.0}


def test_missing_sdf_is_a_clear_error(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    assert "--sdf" in capsys.readouterr().err


_DESIGN = """
module top(input clk, input a, input b, output reg q);
  reg [15:0] x, y, z;
  always @(posedge clk) begin x <= {x[14:0], a}; y <= {y[14:0], b}; z <= x + y; q <= ^z; end
endmodule
"""


@pytest.mark.slow
def test_worst_path_is_nextpnrs_critical_path(tmp_path, capsys):
    tools = {var: os.environ[var] for var in TOOLS if os.environ.get(var)}
    tools.update(tool_environment())
    (tmp_path / "t.v").write_text(_DESIGN)
    subprocess.run([tools["YOSYS"], "-q", "-p", "synth_ecp5 -top top -json t.json", "t.v"],
                   cwd=tmp_path, check=True)
    run = subprocess.run([tools["NEXTPNR_ECP5"], "--85k", "--package", "CABGA554", "--json",
                          "t.json", "--sdf", "gradwire.sdf", "--freq", "400", "--seed", "1",
                          "--lpf-allow-unconstrained", "--timing-allow-fail"],
                         cwd=tmp_path, capture_output=True, text=True, check=True)
    (tmp_path / "gradwire.tim").write_text(run.stderr)
    nextpnr_mhz = next(iter(parse_nextpnr_log(run.stderr).values()))["achieved_mhz"]
    timing = parse_sdf((tmp_path / "gradwire.sdf").read_text())
    clock = "$gbuf$clk$TRELLIS_IO_IN"
    endpoints, _, _ = analyse(timing, {clock: 2500.0})
    worst_ps = 2500.0 - endpoints[0].slack
    # nextpnr prints its Fmax to 0.01 MHz
    assert abs(1e6 / worst_ps - nextpnr_mhz) < 0.006, (worst_ps, nextpnr_mhz)
    assert main([str(tmp_path)]) == 2            # no period known for its clock
    assert "--clock" in capsys.readouterr().err
    assert main([str(tmp_path), "--clock", "clk=400", "--paths", "1"]) == 0
    assert "failing" in capsys.readouterr().out
