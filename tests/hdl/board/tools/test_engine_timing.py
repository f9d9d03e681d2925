"""The engine-alone timing harness (``python -m hdl.board.engine_timing``): every engine input is
fed from the shift register and every output reaches the pins (the build itself is slow and
run by hand; its numbers are in docs/measurements.md)."""
import random

import pytest
from amaranth import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from hdl.board.engine_timing import ENGINES, EngineHarness, _arguments


class _Adder(wiring.Component):
    a: In(3)
    b: In(2)
    total: Out(4)

    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.total.eq(self.a + self.b)
        return m


def _parity(value):
    return bin(value).count("1") & 1


def test_harness_feeds_every_input_and_observes_every_output():
    dut = EngineHarness(_Adder())
    rng = random.Random(3)
    fed = [rng.getrandbits(2) for _ in range(40)]
    seen = []

    async def bench(ctx):
        for pair in fed:
            ctx.set(dut.din, pair)
            *_, dout = await ctx.tick().sample(dut.dout)
            seen.append(dout)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    # The 5-bit shift register holds the last pairs (newest in the low bits); the sum is
    # captured a clock later and its two halves' parities a clock after that.
    feed = 0
    expected = []
    captured = 0
    for pair in fed:
        expected.append((_parity(captured & 0b11) | (_parity(captured >> 2) << 1)))
        captured = (feed & 0b111) + ((feed >> 3) & 0b11)
        feed = ((feed << 2) | pair) & 0b11111
    # `seen[i]` is sampled after clock i: dout registered from `captured` one clock before.
    assert seen[3:] == expected[2:-1]
    assert len(set(seen)) > 1


def test_harness_checks_its_argument():
    with pytest.raises(TypeError, match="wiring.Component"):
        EngineHarness(Signal(4))


def test_engine_names():
    assert sorted(ENGINES) == ["aggregator", "compressor", "decompressor", "front_end",
                               "result_seal", "siphash"]
    # every entry builds the component the harness wraps
    front_end = ENGINES["front_end"]()
    assert isinstance(front_end, wiring.Component) and "switch_ctrl" in front_end.signature.members
    assert all(isinstance(ENGINES[name](), wiring.Component)
               for name in ("result_seal", "siphash"))
    args = _arguments(["decompressor", "--seed", "2"])
    assert (args.engine, args.seed, args.router, args.freq) == ("decompressor", 2, "router1",
                                                                (125.0,))
    # `make bench-timing`: every engine at both clocks
    args = _arguments(["all", "--freq", "125,156.25"])
    assert (args.engine, args.freq) == ("all", (125.0, 156.25))
    for bad in (["gpu"], ["all", "--freq", "fast"], ["all", "--freq", "0"],
                ["all", "--freq", "125,-1"]):
        with pytest.raises(SystemExit):
            _arguments(bad)
