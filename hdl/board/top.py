"""ECP5 board top: PLL, reset synchroniser, the self-test (engines inside), LEDs, UART TX.

Board choices live in ``constraints/boards.toml`` (:func:`load_boards`); this module turns
one entry into a design for its amaranth-boards platform:

* :class:`EnginePLL` makes the engine clock (``sync`` domain) from the board oscillator with
  an ``EHXPLLL`` (dividers computed here, :func:`pll_dividers`, like Trellis ``ecppll``);
* the board reset button (if any) and PLL lock reset the ``sync`` domain through a reset
  synchroniser, so the engines start only on a stable clock;
* :class:`hdl.selftest.top.SelfTest` holds the engines and their traffic; its status bits go to
  the LEDs named in the board entry and its report to the UART TX pin.
"""
from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import tomllib
from amaranth import (
    ClockDomain,
    ClockSignal,
    Const,
    Elaboratable,
    Instance,
    Module,
    ResetSignal,
    Signal,
)
from amaranth.build import Attrs, Pins, Resource
from amaranth.lib import io
from amaranth.lib.cdc import FFSynchronizer, ResetSynchronizer

from hdl.selftest.top import ENGINES, SelfTest, SelfTestStatus

__all__ = ["BOARDS_FILE", "TOPS", "Board", "load_boards", "pll_dividers", "EnginePLL", "ehxplll",
           "pin_buffers", "BoardTop"]

BOARDS_FILE = Path(__file__).resolve().parents[2] / "constraints" / "boards.toml"


@dataclasses.dataclass(frozen=True)
class Board:
    """One entry of ``constraints/boards.toml`` (see the comments there)."""
    name: str
    platform: str
    part: str
    #: top ("network", "selftest") -> the engines it builds by default (what fits)
    engines: dict
    #: top ("network", "selftest") -> default engine clock, MHz
    engine_mhz: dict
    uart_tx: str
    leds: dict
    fault_input: object = None
    network_leds: dict = dataclasses.field(default_factory=dict)
    preferences: str = ""
    notes: str = ""
    #: the nextpnr seed `make bitstream` uses
    seed: int = 1
    #: openFPGALoader's names: ``board`` and optionally ``cable`` (``make program``)
    program: dict = dataclasses.field(default_factory=dict)

    @property
    def tops(self) -> tuple:
        """The tops this board builds (those ``engine_mhz`` gives a clock), in
        :data:`TOPS` order."""
        return tuple(top for top in TOPS if top in self.engine_mhz)

    @property
    def default_top(self) -> str:
        """What ``make bitstream`` builds when no ``TOP`` is given: the first of
        :attr:`tops` (the network top wherever it fits)."""
        return self.tops[0]

    def engines_for(self, top) -> tuple:
        """The engines ``top`` builds by default on this board (what fits beside it)."""
        self.engine_clock_mhz(top)              # the one error for a top the board lacks
        return self.engines[top]

    def engine_clock_mhz(self, top):
        """The default engine clock of ``top`` (``"network"`` or ``"selftest"``), MHz.

        Raises
        ------
        ValueError
            The board does not build ``top`` (its ``notes`` say why).
        """
        try:
            return self.engine_mhz[top]
        except KeyError:
            raise ValueError(f"board {self.name!r} does not build the {top!r} top (it builds "
                             f"{', '.join(self.tops)}): {self.notes}") from None

    def platform_class(self):
        module, cls = self.platform.split(":")
        return getattr(importlib.import_module(module), cls)

    def make_platform(self):
        """A fresh platform instance with the board's added pins."""
        platform = self.platform_class()()
        if platform.device != self.part:
            raise ValueError(f"Board {self.name!r}: {self.platform} is a {platform.device}, "
                             f"but boards.toml says {self.part}")
        if isinstance(self.fault_input, dict):
            spec = self.fault_input
            conn_name, conn_number = spec["connector"].split(":")
            platform.add_resources([
                Resource(spec["name"], 0,
                         Pins(spec["pin"], dir="i", conn=(conn_name, int(conn_number))),
                         Attrs(**spec.get("attrs", {}))),
            ])
        return platform


def load_boards(path=BOARDS_FILE) -> dict[str, Board]:
    """Read the board table; raises ``ValueError`` naming the board and key on a bad entry."""
    with open(path, "rb") as f:
        table = tomllib.load(f)
    boards = {}
    for name, entry in table.items():
        entry = dict(entry)
        try:
            board = Board(
                name=name,
                platform=entry.pop("platform"),
                part=entry.pop("part"),
                engine_mhz=_engine_clocks(entry.pop("engine_mhz")),
                engines=entry.pop("engines"),
                uart_tx=entry.pop("uart_tx"),
                leds=dict(entry.pop("leds", {})),
                fault_input=entry.pop("fault_input", None),
                network_leds=dict(entry.pop("network_leds", {})),
                preferences=entry.pop("preferences", ""),
                notes=entry.pop("notes", ""),
                seed=entry.pop("seed", 1),
                program=dict(entry.pop("program", {})),
            )
        except KeyError as e:
            raise ValueError(f"{path}: board {name!r} lacks the key {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path}: board {name!r}: {e}") from None
        if type(board.seed) is not int or board.seed < 0:
            raise ValueError(f"{path}: board {name!r}: seed must be a non-negative integer, "
                             f"not {board.seed!r}")
        if set(board.program) - {"board", "cable"} or \
                not all(isinstance(v, str) and v for v in board.program.values()):
            raise ValueError(f"{path}: board {name!r}: program takes board and cable names "
                             f"(strings), not {board.program!r}")
        if entry:
            raise ValueError(f"{path}: board {name!r} has unknown keys {sorted(entry)}")
        try:
            board = dataclasses.replace(
                board, engines=_engines_per_top(board.engines, board.engine_mhz))
        except ValueError as e:
            raise ValueError(f"{path}: board {name!r}: {e}") from None
        bad_engines = set().union(*board.engines.values()) - set(ENGINES)
        bad_leds = set(board.leds) - set(SelfTestStatus.members)
        from hdl.board.network import NetworkStatus
        bad_leds |= set(board.network_leds) - set(NetworkStatus.members)
        if bad_engines or bad_leds:
            raise ValueError(f"{path}: board {name!r}: unknown engines {sorted(bad_engines)} "
                             f"or status bits {sorted(bad_leds)}")
        boards[name] = board
    return boards


#: The board tops: ``make bitstream TOP=...``.
TOPS = ("network", "selftest")


def _engines_per_top(engines, clocks):
    """boards.toml's ``engines`` -> ``{top: (engine, ...)}`` for every top the board builds:
    one list for all of them, or a table that gives each its own."""
    if isinstance(engines, list):
        engines = {top: engines for top in clocks}
    if not isinstance(engines, dict) or set(engines) != set(clocks) or not all(
            isinstance(v, list) and v and all(isinstance(e, str) for e in v)
            for v in engines.values()):
        raise ValueError(f"engines must be a list of engines, or a table with one for each "
                         f"top the board builds ({', '.join(clocks)}), not {engines!r}")
    return {top: tuple(engines[top]) for top in clocks}


def _engine_clocks(table):
    """boards.toml's ``engine_mhz`` -> ``{top: MHz}``: a positive clock for each top the
    board builds (one or more of :data:`TOPS`; a top left out does not fit the board)."""
    if not isinstance(table, dict) or not table or set(table) - set(TOPS) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
            for v in table.values()):
        raise ValueError(f"engine_mhz must give each top the board builds (of {TOPS}) a "
                         f"clock in MHz ({{ network = 75, selftest = 75 }}), not {table!r}")
    return {top: float(mhz) for top, mhz in table.items()}


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
    """An ``EHXPLLL`` that turns ``clk_in`` into ``clk_out`` (CLKOP, also the feedback).

    Attributes
    ----------
    clk_in : Signal, in
    clk_out : Signal, out
    locked : Signal, out
    dividers : dict
        What :func:`pll_dividers` chose (``f_out_mhz`` is the real output frequency).
    """

    def __init__(self, *, f_in_mhz, f_out_mhz):
        self.f_in_mhz = f_in_mhz
        self.dividers = pll_dividers(f_in_mhz, f_out_mhz)
        self.clk_in = Signal()
        # kept through synthesis so that the LPF clock constraint finds this net by name
        self.clk_out = Signal(attrs={"keep": 1})
        self.locked = Signal()

    def elaborate(self, platform):
        m = Module()
        m.submodules.pll = ehxplll(self.dividers, f_in_mhz=self.f_in_mhz, clk_in=self.clk_in,
                                   clk_out=self.clk_out, locked=self.locked)
        return m


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


def _pin_spec(spec):
    """``"rgb_led:0.g"`` -> ``("rgb_led", 0, "g")``; ``"led:3"`` -> ``("led", 3, None)``."""
    resource, _, rest = spec.partition(":")
    number, _, sub = rest.partition(".")
    return resource, int(number), (sub or None)


def pin_buffers(m, platform):
    """``pin(spec, direction)``: an ``io.Buffer`` (submodule ``pin_<resource><n>[_<sub>]``
    of ``m``) for the board pin ``"resource:number[.subsignal]"``.

    A resource is requested once, even if several specs use its subsignals (unused
    subsignals stay unbuffered: LEDs off via pull-up).
    """
    requested = {}

    def pin(spec, direction):
        resource, number, sub = _pin_spec(spec)
        if (resource, number) not in requested:
            requested[resource, number] = platform.request(resource, number, dir="-")
        port = requested[resource, number]
        port = getattr(port, sub) if sub else port
        name = f"{resource}{number}" + (f"_{sub}" if sub else "")
        m.submodules[f"pin_{name}"] = buffer = io.Buffer(direction, port)
        return buffer

    return pin


class BoardTop(Elaboratable):
    """The whole design for one board.

    Parameters
    ----------
    board : Board
    engines : tuple of str or None
        Engines to build; default ``board.engines_for("selftest")`` (what fits).
    engine_mhz : float or None
        Engine clock; default the board's for the self-test top.
    selftest_kwargs : dict
        Passed on to :class:`hdl.selftest.top.SelfTest` (engine parameters and so on).

    Attributes
    ----------
    selftest : SelfTest
    pll : EnginePLL
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

        # clock and reset
        f_in_mhz = platform.default_clk_frequency / 1e6
        clk_in = pin(f"{platform.default_clk}:0", "i")
        m.submodules.pll = self.pll = pll = EnginePLL(f_in_mhz=f_in_mhz,
                                                      f_out_mhz=self.engine_mhz)
        m.d.comb += pll.clk_in.eq(clk_in.i)
        platform.add_clock_constraint(pll.clk_out, pll.dividers["f_out_mhz"] * 1e6)

        # The reset is synchronised in a domain of its own on the same clock, then spread
        # over a global clock network (DCCA): it reaches every register of the design, a
        # fan-out that ordinary routing cannot deliver within one 8 ns cycle.
        m.domains.sync = ClockDomain("sync")
        m.domains.reset_source = ClockDomain("reset_source")
        m.d.comb += [ClockSignal("sync").eq(pll.clk_out),
                     ClockSignal("reset_source").eq(pll.clk_out)]
        async_reset = ~pll.locked
        if platform.default_rst is not None:
            async_reset = async_reset | pin(f"{platform.default_rst}:0", "i").i
        m.submodules.reset_sync = ResetSynchronizer(async_reset, domain="reset_source")
        m.submodules.reset_buffer = Instance("DCCA", i_CLKI=ResetSignal("reset_source"),
                                             i_CE=Const(1), o_CLKO=ResetSignal("sync"))

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
