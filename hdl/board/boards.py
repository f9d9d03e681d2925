"""The boards table: ``constraints/boards.toml`` read into one :class:`Board` per board.

Each entry names the board's amaranth-boards platform and part, the tops it builds
(:data:`TOPS`) with their engines and default clocks, the LEDs and UART pin each top
drives, and how ``make program`` reaches it. :func:`load_boards` checks every entry.
"""
from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import tomllib
from amaranth.build import Attrs, Pins, Resource

from hdl.selftest.top import ENGINES, SelfTestStatus

__all__ = ["BOARDS_FILE", "BITSTREAM_ROOT", "TOPS", "Board", "load_boards", "build_folder"]

REPO = Path(__file__).resolve().parents[2]
BOARDS_FILE = REPO / "constraints" / "boards.toml"
#: where ``make bitstream`` writes its builds and ``make program`` takes them from
BITSTREAM_ROOT = REPO / "build" / "bitstream"


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
        """The default engine clock of ``top`` (one of :data:`TOPS`), MHz.

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


#: The board tops: ``make bitstream TOP=...``: the engines served on the network
#: (:mod:`hdl.board.network`), with their self-test (:mod:`hdl.board.top`), the NIC in the
#: wire on a two-port board (:mod:`hdl.board.wire`).
TOPS = ("network", "selftest", "wire")


def build_folder(board, top="network", engine="all", root=BITSTREAM_ROOT):
    """Where ``make bitstream`` with these options puts its output (``hdl.board.build``) and
    ``make program`` finds it (``hdl.board.program``)."""
    suffix = ("" if top == "network" else f"-{top}") + \
        ("" if engine == "all" else f"-{engine}")
    return Path(root) / f"{board}{suffix}"


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
