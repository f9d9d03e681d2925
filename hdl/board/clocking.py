"""The boards' clocks: the ECP5 PLL and the reset tree that both board tops use.

:func:`pll_dividers` computes ``EHXPLLL`` dividers like Trellis ``ecppll``;
:class:`EnginePLL` makes the engine clock (CLKOP) and, for the network top, LiteEth's
(CLKOS) from the board oscillator; :func:`board_clocks` puts them and the reset tree on a
board top: each domain leaves reset on its own clock once the PLL has locked and the board's
reset button, if any, is released, so the engines start only on a stable clock.
"""
from __future__ import annotations

from amaranth import (ClockDomain, ClockSignal, Const, Elaboratable, Instance, Module,
                      ResetSignal, Signal)
from amaranth.lib.cdc import ResetSynchronizer

__all__ = ["PFD_MHZ", "VCO_MHZ", "OUT_MHZ", "pll_dividers", "EnginePLL", "ehxplll",
           "board_clocks"]

# EHXPLLL limits (Lattice TN1263, as used by Trellis ecppll), MHz.
PFD_MHZ = (3.125, 400.0)
VCO_MHZ = (400.0, 800.0)
OUT_MHZ = (10.0, 400.0)


def pll_dividers(f_in_mhz, f_out_mhz, *, vco_divisible_by=None):
    """EHXPLLL dividers for ``f_out`` from ``f_in`` with CLKOP as the feedback path.

    Returns ``dict(clki_div, clkfb_div, clkop_div, f_out_mhz, f_vco_mhz)``: the exact or
    closest reachable frequency, then the VCO closest to 600 MHz (mid-range). With
    ``vco_divisible_by`` (MHz) only VCO frequencies that it divides by an integer 1..128
    are taken (a second output, CLKOS, divides the same VCO). Raises ``ValueError`` when
    the output is out of the PLL's range.
    """
    if not OUT_MHZ[0] <= f_out_mhz <= OUT_MHZ[1]:
        raise ValueError(f"The ECP5 PLL cannot make {f_out_mhz} MHz "
                         f"(CLKOP range {OUT_MHZ[0]}..{OUT_MHZ[1]} MHz)")
    best = None
    for clki_div in range(1, 129):
        f_pfd = f_in_mhz / clki_div
        if not PFD_MHZ[0] <= f_pfd <= PFD_MHZ[1]:
            continue
        for clkfb_div in range(1, 81):
            f_out = f_pfd * clkfb_div
            for clkop_div in range(1, 129):
                f_vco = f_out * clkop_div
                if not VCO_MHZ[0] <= f_vco <= VCO_MHZ[1]:
                    continue
                if vco_divisible_by is not None:
                    os_div = f_vco / vco_divisible_by
                    if abs(os_div - round(os_div)) > 1e-9 or not 1 <= round(os_div) <= 128:
                        continue
                key = (round(abs(f_out - f_out_mhz), 9), round(abs(f_vco - 600), 6))
                if best is None or key < best[0]:
                    best = (key, dict(clki_div=clki_div, clkfb_div=clkfb_div,
                                      clkop_div=clkop_div, f_out_mhz=f_out, f_vco_mhz=f_vco))
    if best is None:
        raise ValueError(f"No EHXPLLL setting makes {f_out_mhz} MHz from {f_in_mhz} MHz")
    return best[1]


class EnginePLL(Elaboratable):
    """An ``EHXPLLL`` that turns ``clk_in`` into ``clk_out`` (CLKOP, also the feedback) and,
    with ``f_os_mhz``, into ``clk_os`` (CLKOS).

    CLKOS divides the same VCO, so ``f_os_mhz`` must divide it exactly, and must not cost
    CLKOP its frequency.

    Attributes
    ----------
    clk_in : Signal, in
    clk_out : Signal, out
    clk_os : Signal, out, or None without ``f_os_mhz``
    locked : Signal, out
    dividers : dict
        What :func:`pll_dividers` chose (``f_out_mhz`` is the real output frequency; with
        CLKOS also ``clkos_div`` and ``f_os_mhz``).
    """

    def __init__(self, *, f_in_mhz, f_out_mhz, f_os_mhz=None):
        self.f_in_mhz = f_in_mhz
        if f_os_mhz is None:
            self.dividers = pll_dividers(f_in_mhz, f_out_mhz)
        else:
            self.dividers = _dividers_with_clkos(f_in_mhz, f_out_mhz, f_os_mhz)
        self.clk_in = Signal()
        # kept through synthesis so that the LPF clock constraint finds this net by name
        self.clk_out = Signal(attrs={"keep": 1})
        if f_os_mhz is None:
            self.clk_os = None
        else:
            self.clk_os = Signal(attrs={"keep": 1})
        self.locked = Signal()

    def elaborate(self, platform):
        m = Module()
        m.submodules.pll = ehxplll(self.dividers, f_in_mhz=self.f_in_mhz, clk_in=self.clk_in,
                                   clk_out=self.clk_out, clk_os=self.clk_os, locked=self.locked)
        return m


def _dividers_with_clkos(f_in_mhz, f_out_mhz, f_os_mhz):
    """:func:`pll_dividers` for CLKOP ``f_out_mhz`` with a VCO that CLKOS divides into
    ``f_os_mhz``; raises ``ValueError`` when no VCO makes both at CLKOP's own frequency."""
    alone = pll_dividers(f_in_mhz, f_out_mhz)
    try:
        d = dict(pll_dividers(f_in_mhz, f_out_mhz, vco_divisible_by=f_os_mhz))
    except ValueError:
        d = None
    # CLKOS must not cost CLKOP its frequency: the VCO has to make both
    if d is None or abs(d["f_out_mhz"] - alone["f_out_mhz"]) > 1e-9:
        raise ValueError(f"{f_os_mhz} MHz is not a VCO that makes {alone['f_out_mhz']:g} "
                         f"MHz divided by an integer 1..128")
    clkos_div = d["f_vco_mhz"] / f_os_mhz
    d["clkos_div"] = round(clkos_div)
    d["f_os_mhz"] = d["f_vco_mhz"] / d["clkos_div"]
    return d


def ehxplll(dividers, *, f_in_mhz, clk_in, clk_out, locked, clk_os=None):
    """The ``EHXPLLL`` instance of ``dividers`` (:func:`pll_dividers`'s choice).

    CLKOP drives ``clk_out`` and is the feedback; with ``clk_os``, CLKOS is enabled too
    (``dividers["clkos_div"]``, ``dividers["f_os_mhz"]``: the same VCO divided again).
    """
    d = dividers
    clkos = clk_os is not None
    # One parameter list, in one order, for both uses (the netlist's text, and with it
    # nextpnr's placement, depends on the order).
    params = dict(
        p_PLLRST_ENA="DISABLED", p_INTFB_WAKE="DISABLED", p_STDBY_ENABLE="DISABLED",
        p_DPHASE_SOURCE="DISABLED",
        p_OUTDIVIDER_MUXA="DIVA", p_OUTDIVIDER_MUXB="DIVB",
        p_OUTDIVIDER_MUXC="DIVC", p_OUTDIVIDER_MUXD="DIVD",
        p_CLKI_DIV=d["clki_div"],
        p_CLKOP_ENABLE="ENABLED", p_CLKOP_DIV=d["clkop_div"],
        # ecppll's choice: half an output period of VCO cycles (Lattice's 180 degrees)
        p_CLKOP_CPHASE=d["clkop_div"] // 2, p_CLKOP_FPHASE=0,
    )
    if clkos:
        params.update(p_CLKOS_ENABLE="ENABLED", p_CLKOS_DIV=d["clkos_div"],
                      p_CLKOS_CPHASE=d["clkos_div"] // 2, p_CLKOS_FPHASE=0)
    params.update(p_FEEDBK_PATH="CLKOP", p_CLKFB_DIV=d["clkfb_div"],
                  i_RST=Const(0), i_STDBY=Const(0), i_CLKI=clk_in, o_CLKOP=clk_out)
    if clkos:
        params.update(o_CLKOS=clk_os)
    params.update(i_CLKFB=clk_out,
                  i_PHASESEL0=Const(0), i_PHASESEL1=Const(0), i_PHASEDIR=Const(1),
                  i_PHASESTEP=Const(1), i_PHASELOADREG=Const(1), i_PLLWAKESYNC=Const(0),
                  i_ENCLKOP=Const(0))
    if clkos:
        params.update(i_ENCLKOS=Const(0))
    params.update(o_LOCK=locked,
                  a_FREQUENCY_PIN_CLKI=f"{f_in_mhz:g}",
                  a_FREQUENCY_PIN_CLKOP=f"{d['f_out_mhz']:g}")
    if clkos:
        params.update(a_FREQUENCY_PIN_CLKOS=f"{d['f_os_mhz']:g}")
    params.update(a_ICP_CURRENT="12", a_LPF_RESISTOR="8",
                  a_MFG_ENABLE_FILTEROPAMP="1", a_MFG_GMCREF_SEL="2")
    return Instance("EHXPLLL", **params)


def board_clocks(m, platform, pin, *, engine_mhz, eth_mhz=None):
    """The clocks and resets of a board top, on ``m``; returns its :class:`EnginePLL`
    (submodule ``pll``, fed by the board oscillator).

    The ``sync`` domain (the engines) runs on CLKOP at ``engine_mhz``; with ``eth_mhz``, the
    ``eth_board`` domain (LiteEth) runs on CLKOS. Each leaves reset on its own clock once the
    PLL has locked and the board's reset button (``pin``: :func:`hdl.board.pins.pin_buffers`),
    if any, is released.
    """
    f_in_mhz = platform.default_clk_frequency / 1e6
    clk_in = pin(f"{platform.default_clk}:0", "i")
    m.submodules.pll = pll = EnginePLL(f_in_mhz=f_in_mhz, f_out_mhz=engine_mhz,
                                       f_os_mhz=eth_mhz)
    m.d.comb += pll.clk_in.eq(clk_in.i)
    platform.add_clock_constraint(pll.clk_out, pll.dividers["f_out_mhz"] * 1e6)
    if eth_mhz is not None:
        platform.add_clock_constraint(pll.clk_os, pll.dividers["f_os_mhz"] * 1e6)

    # The engines' reset is synchronised in a domain of its own on the same clock, then
    # spread over a global clock network (DCCA): it reaches every register of the design, a
    # fan-out that ordinary routing cannot deliver within one 8 ns cycle.
    m.domains.sync = ClockDomain("sync")
    m.domains.reset_source = ClockDomain("reset_source")
    clocks = [ClockSignal("sync").eq(pll.clk_out), ClockSignal("reset_source").eq(pll.clk_out)]
    if eth_mhz is not None:
        m.domains.eth_board = ClockDomain("eth_board")
        clocks.append(ClockSignal("eth_board").eq(pll.clk_os))
    m.d.comb += clocks
    async_reset = ~pll.locked
    if platform.default_rst is not None:
        async_reset = async_reset | pin(f"{platform.default_rst}:0", "i").i
    m.submodules.reset_sync = ResetSynchronizer(async_reset, domain="reset_source")
    m.submodules.reset_buffer = Instance("DCCA", i_CLKI=ResetSignal("reset_source"),
                                         i_CE=Const(1), o_CLKO=ResetSignal("sync"))
    if eth_mhz is not None:
        m.submodules.eth_reset_sync = ResetSynchronizer(async_reset, domain="eth_board")
    return pll
