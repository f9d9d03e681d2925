"""ECP5 board top of the self-test: clocks, the self-test (engines inside), LEDs, UART TX.

What ``make bitstream TOP=selftest`` builds (:mod:`hdl.board.network` is the network top),
for one entry of the boards table (:mod:`hdl.board.boards`) on its amaranth-boards
platform:

* the board's clocks and resets (:func:`hdl.board.clocking.board_clocks`): the engine
  clock (``sync`` domain) from the board oscillator, out of reset once the PLL has locked;
* :class:`hdl.selftest.top.SelfTest` holds the engines and their traffic; its status bits
  go to the LEDs named in the board entry and its report to the UART TX pin.
"""
from __future__ import annotations

from amaranth import Elaboratable, Module, Signal
from amaranth.lib.cdc import FFSynchronizer

from hdl.board.clocking import board_clocks
from hdl.board.pins import pin_buffers
from hdl.selftest.top import SelfTest

__all__ = ["BoardTop"]


class BoardTop(Elaboratable):
    """The whole design for one board.

    Parameters
    ----------
    board : hdl.board.boards.Board
    engines : tuple of str or None
        Engines to build; default ``board.engines_for("selftest")`` (what fits).
    engine_mhz : float or None
        Engine clock; default the board's for the self-test top.
    selftest_kwargs : dict
        Passed on to :class:`hdl.selftest.top.SelfTest` (engine parameters and so on).

    Attributes
    ----------
    selftest : SelfTest
    pll : hdl.board.clocking.EnginePLL
        Made at elaboration (it needs the platform's oscillator frequency).
    """

    def __init__(self, board, *, engines=None, engine_mhz=None, selftest_kwargs=None):
        self.board = board
        self.engines = tuple(board.engines_for("selftest") if engines is None else engines)
        self.engine_mhz = float(board.engine_clock_mhz("selftest") if engine_mhz is None
                                else engine_mhz)
        self.selftest_kwargs = dict(selftest_kwargs or {})
        self.pll = None
        self.selftest = None

    def elaborate(self, platform):
        m = Module()
        pin = pin_buffers(m, platform)
        self.pll = pll = board_clocks(m, platform, pin, engine_mhz=self.engine_mhz)

        # the self-test
        clk_hz = round(pll.dividers["f_out_mhz"] * 1e6)
        m.submodules.selftest = self.selftest = selftest = SelfTest(
            engines=self.engines, clk_hz=clk_hz, **self.selftest_kwargs)
        m.d.comb += pin(self.board.uart_tx, "o").o.eq(selftest.uart_tx)

        fault = self.board.fault_input
        if fault is not None:
            fault_pin = pin(f"{fault['name']}:0" if isinstance(fault, dict) else fault, "i")
            m.submodules.fault_sync = FFSynchronizer(fault_pin.i, selftest.inject_fault)

        status = Signal.like(selftest.status)
        m.d.comb += [status.eq(selftest.status), status.pll_unlocked.eq(~pll.locked)]
        for bit, spec in self.board.leds.items():
            m.d.comb += pin(spec, "o").o.eq(getattr(status, bit))
        return m
