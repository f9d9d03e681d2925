"""Every failing endpoint of a routed build, from nextpnr's SDF.

::

    python -m hdl.board.slack BUILD_DIR [--clock NAME=MHZ ...] [--depth N] [--paths K]

nextpnr prints the worst path of each clock only; closing timing on a full chip needs all
of them: which blocks own the failing endpoints, by how much they fail, and through which
cells. A build made with ``python -m hdl.board.build --sdf`` leaves ``gradwire.sdf`` (the
routed cell and wire delays); this module reads it, propagates arrival times from every
clocked start point (a flip-flop's or block RAM's clock-to-output arc) to every setup check
of the same clock, and prints the failing endpoints per block (the first ``--depth`` parts of
the cell's hierarchical name), then the ``--paths`` worst paths cell by cell.

Clocks are named by the cell that drives their flip-flops' clock pins (nextpnr's global
buffer, ``$gbuf$<net>...``); ``--clock`` gives a period by a substring of that name, and
the periods nextpnr was given (the ``constraining clock net`` lines of ``gradwire.tim``)
are the default. Paths between two clocks are not checked (the design crosses clocks only
through synchronisers and asynchronous FIFOs, as nextpnr's own report assumes).

The delays are the maximum of each SDF triple, as nextpnr's own analysis uses (checked on a
small design: the worst path equals nextpnr's critical path to the picosecond).
"""
from __future__ import annotations

import argparse
import collections
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Timing", "parse_sdf", "analyse", "main"]

_CLOCK_PINS = frozenset({"CLK", "CLKA", "CLKB", "WCK", "CLKI"})
_TOKEN = re.compile(r'\(|\)|"[^"]*"|(?:\\.|[^\s()"])+')


@dataclass
class Timing:
    """A routed design's delays (ps): ``arcs[pin] = [(next_pin, delay), ...]`` for wires
    and cells' combinational arcs, ``launch[pin] = [(output_pin, delay), ...]`` for the
    clock-to-output arcs of clock pins, ``setup[pin] = [(clock_pin, setup), ...]``."""
    arcs: dict = field(default_factory=lambda: collections.defaultdict(list))
    launch: dict = field(default_factory=lambda: collections.defaultdict(list))
    setup: dict = field(default_factory=lambda: collections.defaultdict(list))
    wire_driver: dict = field(default_factory=dict)   # sink pin -> driving pin


def _unescape(name):
    return re.sub(r"\\(.)", r"\1", name)


def _delay(triple):
    """Max of an SDF ``(min:typ:max)`` triple (or of a single value)."""
    return max(float(v) for v in triple.strip("()").split(":") if v)


def parse_sdf(text):
    """A :class:`Timing` from the text of an SDF file nextpnr wrote."""
    timing = Timing()
    tokens = _TOKEN.findall(text)
    instance = ""
    k = 0
    n = len(tokens)

    def triple(at):
        # "(" value ")" -> the value's text, and the index after it
        assert tokens[at] == "(", tokens[at:at + 3]
        if tokens[at + 1] == ")":
            return "0", at + 2
        return tokens[at + 1], at + 3

    def pin(name):
        return f"{instance}/{name}" if instance else name

    while k < n:
        t = tokens[k]
        if t == "INSTANCE":
            if tokens[k + 1] == ")":
                instance = ""
                k += 2
            else:
                instance = _unescape(tokens[k + 1])
                k += 3
            continue
        if t == "INTERCONNECT":
            src, dst = _unescape(tokens[k + 1]), _unescape(tokens[k + 2])
            rise, at = triple(k + 3)
            fall, at = triple(at)
            timing.arcs[src].append((dst, max(_delay(rise), _delay(fall))))
            timing.wire_driver[dst] = src
            k = at
            continue
        if t == "IOPATH":
            a, b = tokens[k + 1], tokens[k + 2]
            rise, at = triple(k + 3)
            fall, at = triple(at)
            delay = max(_delay(rise), _delay(fall))
            if a in _CLOCK_PINS:
                timing.launch[pin(a)].append((pin(b), delay))
            else:
                timing.arcs[pin(a)].append((pin(b), delay))
            k = at
            continue
        if t in ("SETUPHOLD", "SETUP"):
            # (SETUPHOLD (posedge D) (posedge CLK) (setup) (hold))
            assert tokens[k + 1] == "(", tokens[k:k + 8]
            if tokens[k + 2] in ("posedge", "negedge"):
                data_pin, at = tokens[k + 3], k + 5
            else:
                data_pin, at = tokens[k + 2], k + 4
            assert tokens[at] == "(", tokens[k:k + 12]
            if tokens[at + 1] in ("posedge", "negedge"):
                clock_pin, at = tokens[at + 2], at + 4
            else:
                clock_pin, at = tokens[at + 1], at + 3
            value, at = triple(at)
            timing.setup[pin(data_pin)].append((pin(clock_pin), _delay(value)))
            k = at
            continue
        k += 1
    return timing


def _clock_of(timing, clock_pin):
    """The clock of a clock pin: the cell driving its wire (a global buffer), by name."""
    driver = timing.wire_driver.get(clock_pin, clock_pin)
    return driver.rsplit("/", 1)[0]


def _topological(timing):
    """Pins in an order where every arc goes forward (Kahn's algorithm); combinational
    loops (none in a good design) are left out and reported."""
    indegree = collections.Counter()
    for src, sinks in timing.arcs.items():
        for dst, _ in sinks:
            indegree[dst] += 1
    pins = set(timing.arcs) | set(indegree)
    ready = collections.deque(p for p in pins if indegree[p] == 0)
    order = []
    while ready:
        p = ready.popleft()
        order.append(p)
        for dst, _ in timing.arcs.get(p, ()):
            indegree[dst] -= 1
            if indegree[dst] == 0:
                ready.append(dst)
    return order, len(pins) - len(order)


@dataclass
class Endpoint:
    pin: str
    clock: str
    slack: float          # ps
    arrival: float        # ps, with the setup time
    start: str


def analyse(timing, periods):
    """Setup slack of every endpoint whose clock has a period (``{clock: ps}``).

    Returns ``(endpoints, predecessor, loops)``: endpoints worst first, and for every pin on
    a path ``predecessor[(pin, clock)] = (previous pin, arrival at pin)`` to trace paths
    back with :func:`path_to`.
    """
    arrival = {}          # (pin, clock) -> ps
    predecessor = {}
    for clock_pin, outputs in timing.launch.items():
        clock = _clock_of(timing, clock_pin)
        if clock not in periods:
            continue
        for out, delay in outputs:
            if delay > arrival.get((out, clock), -1.0):
                arrival[(out, clock)] = delay
                predecessor[(out, clock)] = (clock_pin, delay)
    order, loops = _topological(timing)
    by_pin = collections.defaultdict(list)
    for (p, clock), t in arrival.items():
        by_pin[p].append(clock)
    for p in order:
        clocks = by_pin.get(p)
        if not clocks:
            continue
        for dst, delay in timing.arcs.get(p, ()):
            for clock in clocks:
                t = arrival[(p, clock)] + delay
                key = (dst, clock)
                if t > arrival.get(key, -1.0):
                    if key not in arrival:
                        by_pin[dst].append(clock)
                    arrival[key] = t
                    predecessor[key] = (p, t)
    endpoints = []
    for data_pin, checks in timing.setup.items():
        for clock_pin, setup in checks:
            clock = _clock_of(timing, clock_pin)
            t = arrival.get((data_pin, clock))
            if t is None or clock not in periods:
                continue
            start = path_to(predecessor, data_pin, clock)[0][0]
            endpoints.append(Endpoint(data_pin, clock, periods[clock] - t - setup,
                                      t + setup, start))
    endpoints.sort(key=lambda e: e.slack)
    return endpoints, predecessor, loops


def path_to(predecessor, pin, clock):
    """``[(pin, arrival), ...]`` from the start point (a clock pin, arrival 0) to ``pin``."""
    path = []
    while (pin, clock) in predecessor:
        previous, t = predecessor[(pin, clock)]
        path.append((pin, t))
        pin = previous
    path.append((pin, 0.0))
    return path[::-1]


def constrained_periods(tim_text):
    """``{net: ps}`` from nextpnr's ``constraining clock net 'NET' to F MHz`` lines."""
    return {net: 1e6 / float(mhz) for net, mhz in
            re.findall(r"constraining clock net '([^']+)' to ([0-9.]+) MHz", tim_text)}


def block_of(pin, depth):
    """The first ``depth`` parts of a pin's cell name (``a.b.c_TRELLIS_FF_Q`` -> ``a.b``)."""
    cell = pin.rsplit("/", 1)[0]
    parts = cell.split(".")
    if len(parts) <= depth:
        # the last part is the cell's own name: keep its signal name only
        parts = parts[:-1] + [re.split(r"_TRELLIS|_LUT4|_CCU2C|_DPR16|_DP16|\$", parts[-1])[0]]
    return ".".join(parts[:depth])


def _match_periods(clocks, named):
    """Period per clock: the ``named`` entry whose name, or its last dotted part (the
    constraint names ``pll.clk_out``, the buffer is ``$gbuf$clk_out``), is a substring of
    the clock's; the longest such name wins."""
    periods = {}
    for clock in clocks:
        hits = [(len(part), ps) for name, ps in named.items()
                for part in {name, name.rsplit(".", 1)[-1]} if part in clock]
        if hits:
            periods[clock] = max(hits)[1]
    return periods


def report(endpoints, predecessor, *, depth=3, paths=5, out=None):
    """Print the endpoints' summary per clock and block, and the worst paths, to ``out``
    (default ``sys.stdout``)."""
    out = sys.stdout if out is None else out
    failing = [e for e in endpoints if e.slack < 0]
    print(f"{len(endpoints)} endpoints checked, {len(failing)} failing", file=out)
    per_clock = collections.defaultdict(list)
    for e in endpoints:
        per_clock[e.clock].append(e)
    for clock, es in per_clock.items():
        worst = es[0].slack
        n = sum(e.slack < 0 for e in es)
        print(f"  clock {clock}: {len(es)} endpoints, {n} failing, worst slack "
              f"{worst / 1000:+.3f} ns", file=out)
    blocks = collections.defaultdict(list)
    for e in failing:
        blocks[block_of(e.pin, depth)].append(e.slack)
    if blocks:
        print(f"\nfailing endpoints by block (depth {depth}): count, worst, total "
              "negative slack", file=out)
        for name, slacks in sorted(blocks.items(), key=lambda kv: sum(kv[1])):
            print(f"  {len(slacks):6d} {min(slacks) / 1000:+8.3f} ns {sum(slacks) / 1000:+10.1f} "
                  f"ns  {name}", file=out)
        starts = collections.Counter(block_of(e.start, depth) for e in failing)
        print("\nfailing endpoints by the block their path starts in", file=out)
        for name, count in starts.most_common(25):
            print(f"  {count:6d}  {name}", file=out)
    shown = set()
    for e in failing:
        if len(shown) >= paths:
            break
        key = block_of(e.pin, depth + 1)
        if key in shown:
            continue          # one path per block, so the list is not one bus's bits
        shown.add(key)
        print(f"\nslack {e.slack / 1000:+.3f} ns at {e.pin} ({e.clock}):", file=out)
        for p, t in path_to(predecessor, e.pin, e.clock):
            print(f"  {t / 1000:7.3f}  {p}", file=out)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m hdl.board.slack", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("build_dir", type=Path)
    p.add_argument("--name", default="gradwire", help="the build's file name (gradwire)")
    p.add_argument("--clock", action="append", default=[], metavar="NAME=MHZ",
                   help="a clock's frequency, by a substring of its buffer's name "
                        "(default: the constraints in <name>.tim)")
    p.add_argument("--depth", type=int, default=3, help="hierarchy levels per block (3)")
    p.add_argument("--paths", type=int, default=5, help="worst paths to print (5)")
    args = p.parse_args(argv)
    sdf = args.build_dir / f"{args.name}.sdf"
    if not sdf.exists():
        print(f"{sdf}: no SDF (build with `python -m hdl.board.build --sdf`)", file=sys.stderr)
        return 2
    named = {}
    tim = args.build_dir / f"{args.name}.tim"
    if tim.exists():
        named.update(constrained_periods(tim.read_text()))
    for item in args.clock:
        name, _, mhz = item.partition("=")
        try:
            named[name] = 1e6 / float(mhz)
        except ValueError:
            print(f"--clock {item!r}: expected NAME=MHZ", file=sys.stderr)
            return 2
    timing = parse_sdf(sdf.read_text())
    clocks = {_clock_of(timing, c) for c in timing.launch}
    periods = _match_periods(clocks, named)
    if not periods:
        print(f"no clock period known for {sorted(clocks)}: give --clock NAME=MHZ",
              file=sys.stderr)
        return 2
    endpoints, predecessor, loops = analyse(timing, periods)
    if loops:
        print(f"warning: {loops} pins on combinational loops left out", file=sys.stderr)
    report(endpoints, predecessor, depth=args.depth, paths=args.paths)
    return 0


if __name__ == "__main__":
    sys.exit(main())
