"""The shape of the tree: one-way imports, one register contract, no dangling references.

- ``contract`` (header, counters, register maps, top ports) imports none of the project's
  packages; ``hdl`` and ``host`` import only ``contract``; ``sim`` (simulation, benches,
  end to end) imports all three. ``host`` reaches the simulator only through the named
  seams ``host.driver.backends.BACKENDS``, ``host.bench.SECTIONS`` and
  ``host.commands.sim.E2E_MODULE`` (module names imported when used), never by an import
  statement, so the packages have no cycle.
- ``contract``, ``hdl``, ``host`` and ``sim`` never import ``tests``: stimulus the benches
  and the tests share lives in ``sim/`` (``sim/frames.py``, ``sim/wire_stimulus.py``).
- The gateware's rooms import downwards: the LiteEth core never imports the front end, nor
  either of them a top; the two board tops share clocks and pins, not each other.
- No register address is written as a number outside ``contract/registers.py``.
- The gateware composes components through their signatures: flat port names (the
  ``*_s_axis_t*`` and ``ctrl_*`` of the exported tops) exist only in ``hdl/export.py`` and
  the helpers it uses, and no component reads another's submodules back
  (``m.submodules.x.y``) or subclasses an engine to reach them.
- No function in ``hdl/`` is longer than :data:`MAX_FUNCTION_LINES`: a god function is
  split into components or into parts that hand each other records of their signals.
- Every file a docstring, comment or document names exists.
"""
import ast
import re
import textwrap
from pathlib import Path

from contract.registers import (
    REGISTER_MAPS,
    CounterBlock,
    RegisterArray,
    markdown_table,
)

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("contract", "hdl", "host", "sim")
#: package -> the project packages it may import
ALLOWED = {"contract": set(), "hdl": {"contract"}, "host": {"contract"},
           "sim": {"contract", "hdl", "host"}}


def python_files(*packages):
    for package in packages:
        yield from sorted((REPO / package).rglob("*.py"))


def imported_packages(path):
    """Top-level project packages named by every import statement in ``path`` (also those
    inside functions), with the line of each."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = path.relative_to(REPO).parts[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:      # relative: within its own package
                continue
            names = [node.module or ""]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top in PACKAGES and top != package:
                yield top, node.lineno


def import_graph():
    graph = {package: {} for package in PACKAGES}
    for path in python_files(*PACKAGES):
        package = path.relative_to(REPO).parts[0]
        for target, line in imported_packages(path):
            graph[package].setdefault(target, f"{path.relative_to(REPO)}:{line}")
    return graph


def find_cycle(graph):
    """A list of packages forming a cycle, or None."""
    state = {}

    def visit(node, trail):
        state[node] = "open"
        for nxt in graph[node]:
            if state.get(nxt) == "open":
                return trail[trail.index(nxt):] + [nxt] if nxt in trail else [node, nxt]
            if nxt not in state:
                cycle = visit(nxt, trail + [nxt])
                if cycle:
                    return cycle
        state[node] = "done"
        return None

    for node in graph:
        if node not in state:
            cycle = visit(node, [node])
            if cycle:
                return cycle
    return None


def test_find_cycle_finds_a_cycle():
    assert find_cycle({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": 1}, "b": {}, "c": {"a": 1}}) is None


def test_packages_import_one_way():
    graph = import_graph()
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle) + ": " + ", ".join(
        graph[a][b] for a, b in zip(cycle, cycle[1:]))
    for package, targets in graph.items():
        extra = set(targets) - ALLOWED[package]
        assert not extra, {t: targets[t] for t in extra}



def imported_modules(path, root=REPO):
    """Absolute names of the modules ``path``'s import statements name (relative imports
    resolved against its package, ``path`` being under ``root``), with the line of each."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = list(path.relative_to(root).parts[:-1])
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            yield module, node.lineno
            for alias in node.names:      # ``from host import board``
                yield f"{module}.{alias.name}", node.lineno


def imports_of_the_tests(path, root=REPO):
    """``(module, line)`` of every import statement in ``path`` that names ``tests`` or a
    module in it (relative imports resolved: ``from ..tests import x`` counts)."""
    return [(module, line) for module, line in imported_modules(path, root)
            if module == "tests" or module.startswith("tests.")]


def test_no_package_imports_the_tests():
    """The tests import the code, never the other way: ``sim`` takes its stimulus from
    ``sim/``, not from a test module (an import inside a function counts too)."""
    found = [f"{path.relative_to(REPO)}:{line} imports {module}"
             for path in python_files(*PACKAGES) for module, line in imports_of_the_tests(path)]
    assert not found, found


def test_tests_import_check_catches_an_import_of_the_tests(tmp_path):
    bad = tmp_path / "sim" / "bad.py"
    bad.parent.mkdir()
    bad.write_text("import tests.helpers\nfrom tests.hdl.wire import frames\n"
                   "def cases():\n    from tests import helpers\n    return helpers\n"
                   "from sim.frames import frame\nimport testsuite\nfrom . import tests\n")
    found = imports_of_the_tests(bad, tmp_path)
    assert sorted({line for _, line in found}) == [1, 2, 4], found


def module_graph(root=REPO, packages=PACKAGES):
    """``{module: {module it imports: line}}`` over the project's files (imports inside
    functions too); an import of a name resolves to the deepest module that holds it, and a
    module's own packages (whose ``__init__`` runs first anyway) are left out."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def resolve(name):
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for module, path in modules.items():
        edges = graph.setdefault(module, {})
        for name, line in imported_modules(path, root):
            target = resolve(name)
            if target and target != module and not module.startswith(target + "."):
                edges.setdefault(target, line)
    return graph


def test_modules_import_without_cycles():
    """No two modules import each other, however indirectly: each tool and each room can be
    read from the bottom up (``hdl.board.build`` and ``hdl.board.program`` share
    ``hdl.board.boards`` instead of importing each other)."""
    graph = module_graph()
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle) + ": " + ", ".join(
        f"{a} line {graph[a][b]}" for a, b in zip(cycle, cycle[1:]))


def test_module_cycle_check_catches_a_cycle(tmp_path):
    (tmp_path / "hdl" / "board").mkdir(parents=True)
    for init in ("hdl/__init__.py", "hdl/board/__init__.py"):
        (tmp_path / init).write_text("")
    (tmp_path / "hdl/board/build.py").write_text(
        "def main():\n    from hdl.board.program import build_folder\n")
    (tmp_path / "hdl/board/program.py").write_text("from hdl.board.build import REPO\n")
    (tmp_path / "hdl/board/boards.py").write_text("from . import build\n")
    cycle = find_cycle(module_graph(tmp_path, ("hdl",)))
    assert cycle and {"hdl.board.build", "hdl.board.program"} <= set(cycle), cycle


def test_the_driver_never_imports_the_board():
    """``host.board`` (a board behind sockets) builds on ``host.driver`` (its transport);
    the driver reaches a virtual board only through ``host.driver.backends``' names."""
    found = [f"{path.relative_to(REPO)}:{line} imports {module}"
             for path in sorted((REPO / "host" / "driver").rglob("*.py"))
             for module, line in imported_modules(path)
             if module == "host.board" or module.startswith("host.board.")]
    assert not found, found

#: (folder or file, the modules it must not import): the network path's rooms import
#: downwards only (core <- front end <- top <- board tops), and the two board tops share
#: their clocks, resets and pins through ``hdl.board.clocking`` and ``hdl.board.pins``,
#: never each other. The stream blocks every engine uses (``hdl/stream``: the arbiter, the
#: width converters, the buffers) import no engine; the wire takes them from there, not
#: sideways from the network front end.
LAYERS = (
    ("hdl/net", "hdl.board"),
    ("hdl/net/core", "hdl.net.front_end"),
    ("hdl/net/core", "hdl.net.top"),
    ("hdl/net/front_end", "hdl.net.top"),
    ("hdl/board/network.py", "hdl.board.top"),
    ("hdl/board/top.py", "hdl.board.network"),
    ("hdl/wire", "hdl.net.front_end"),
    *(("hdl/stream", f"hdl.{room}") for room in ("net", "nic", "switch", "wire", "selftest",
                                                 "board")),
)


def test_the_gateware_rooms_import_downwards():
    found = []
    for where, forbidden in LAYERS:
        root = REPO / where
        paths = sorted(root.rglob("*.py")) if root.is_dir() else [root]
        found += [f"{path.relative_to(REPO)}:{line} imports {module}"
                  for path in paths for module, line in imported_modules(path)
                  if module == forbidden or module.startswith(forbidden + ".")]
    assert not found, found



# -- function length ---------------------------------------------------------------------------

#: The longest a function in ``hdl/`` may be, in lines from its ``def`` to its last line
#: (docstring and comments included).
MAX_FUNCTION_LINES = 150


def long_functions(root, limit=MAX_FUNCTION_LINES):
    """``path:line name (lines)`` of every function (methods and nested ones too) in the
    Python files under ``root`` that is longer than ``limit`` lines, longest first."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append((lines, f"{path.relative_to(root.parent)}:{node.lineno} "
                                         f"{node.name} ({lines} lines)"))
    return [where for _, where in sorted(found, reverse=True)]


def test_no_gateware_function_is_longer_than_the_limit():
    """Each ``elaborate`` (and every other function of the gateware) reads on a screen or
    two: a longer one is split into components or into parts that take and return records
    of their signals (``hdl/switch/aggregator.py``, ``hdl/wire/path.py``)."""
    found = long_functions(REPO / "hdl")
    assert not found, f"functions over {MAX_FUNCTION_LINES} lines: {found}"


def test_long_function_check_catches_a_long_function(tmp_path):
    root = tmp_path / "hdl"
    (root / "wire").mkdir(parents=True)
    lines = lambda n, indent: "\n".join(f"{indent}x{k} = {k}" for k in range(n))
    (root / "wire" / "god.py").write_text(
        f"class God:\n    def elaborate(self, platform):\n{lines(149, ' ' * 8)}\n"
        f"        return x0\n\n"                                  # 151 lines: too long
        f"def fits():\n{lines(148, ' ' * 4)}\n    return x0\n\n"    # 150: fine
        f"def outer():\n    def inner():\n{lines(149, ' ' * 8)}\n"
        f"        return x0\n    return inner\n")                  # both too long
    found = long_functions(root)
    assert {f.split()[1] for f in found} == {"outer", "elaborate", "inner"}, found
    assert found[0].startswith("hdl/wire/god.py:") and found[0].endswith("outer (153 lines)")
    assert "hdl/wire/god.py:2 elaborate (151 lines)" in found, found


# -- the gateware's seams ----------------------------------------------------------------------

#: The only files that may name flat ports: the flattener and its AXI-Stream helpers.
FLATTENERS = {"hdl/export.py", "hdl/stream/axis.py"}
_FLAT_NAME = re.compile(r"^(\w*_)?[sm]_axis_t(data|keep|last|valid|ready)$|^ctrl_(addr|re|rdata|wdata|we)$")
_FLAT_HELPERS = {"flat_axis_members", "connect_flat_axis"}


def seam_violations(path, relative):
    """Flat port names and flat helpers outside the flattener, and submodules read back."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if relative not in FLATTENERS:
            if isinstance(node, ast.Attribute) and _FLAT_NAME.match(node.attr):
                yield f"{relative}:{node.lineno}: flat port {node.attr}"
            elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and _FLAT_NAME.match(node.value)):
                yield f"{relative}:{node.lineno}: flat port name {node.value!r}"
            elif isinstance(node, ast.Name) and node.id in _FLAT_HELPERS:
                yield f"{relative}:{node.lineno}: {node.id}"
        if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)
                and isinstance(node.value, ast.Attribute) and node.value.attr == "submodules"):
            yield f"{relative}:{node.lineno}: reads submodule {node.attr} back"
        # (and by name: m.submodules[f"{name}_ingress"].events)
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Subscript)
                and isinstance(node.value.value, ast.Attribute)
                and node.value.value.attr == "submodules"):
            yield f"{relative}:{node.lineno}: reads submodule {ast.unparse(node.value.slice)} back"


def test_gateware_composes_through_signatures_and_flattens_only_at_export():
    found = [violation for path in python_files("hdl")
             for violation in seam_violations(path, path.relative_to(REPO).as_posix())]
    assert not found, found


def test_seam_check_catches_flat_names_and_tapped_submodules(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("m.d.comb += nic.tx_s_axis_tvalid.eq(1)\nx = m.submodules.rx.events\n"
                   "port = getattr(top, 'ctrl_rdata')\nconnect_flat_axis(m, top, 's', i)\n"
                   "m.submodules.rx = rx\nm.d.comb += nic.tx_in.valid.eq(1)\n"
                   "y = m.submodules[f'{name}_ingress'].events\nm.submodules['tx'] = tx\n")
    found = sorted(seam_violations(bad, "hdl/bad.py"), key=lambda f: int(f.split(":")[1]))
    assert [f.split(": ", 1)[1].split()[0] for f in found] == [
        "flat", "reads", "flat", "connect_flat_axis", "reads"], found
    assert not [f for f in seam_violations(bad, "hdl/export.py") if "flat" in f]


# -- register addresses --------------------------------------------------------------------

def register_addresses():
    """Every base and address the maps declare (the numbers that must not be repeated)."""
    numbers = set()
    for register_map in REGISTER_MAPS.values():
        for entry in register_map:
            if isinstance(entry, (RegisterArray, CounterBlock)):
                numbers.add(entry.base)
            else:
                numbers.add(entry.address)
    return numbers - {0}


_CALLS = {"read", "write", "read_register"}
#: receivers of ``read``/``write`` calls that are files or sockets, not register ports
_NOT_PORTS = re.compile(r"^(f|fh|file|\w+_file|stream|sock|socket|conn|buf|handle|pipe)$")
_HEX = re.compile(r"\b0[xX][0-9a-fA-F]+\b")


def literal_addresses(path, numbers):
    """``(line, text)`` of register addresses written as numbers in ``path``: an integer
    literal as the address of a register read or write or as ``ctrl_addr``'s value, or a
    hex literal equal to an address of the maps."""
    source = path.read_text()
    tree = ast.parse(source, filename=str(path))
    found = []

    def literal(node):
        return isinstance(node, ast.Constant) and type(node.value) is int

    def receiver(call):
        value = call.func.value
        return value.attr if isinstance(value, ast.Attribute) else getattr(value, "id", "")

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name = node.func.attr
            if (name in _CALLS and node.args and literal(node.args[0])
                    and not _NOT_PORTS.match(receiver(node))):
                found.append((node.lineno, ast.unparse(node)))
            if (name == "eq" and isinstance(node.func.value, ast.Attribute)
                    and node.func.value.attr == "ctrl_addr" and node.args
                    and literal(node.args[0])):
                found.append((node.lineno, ast.unparse(node)))
        # (0 is every bench's idle value of the port at reset)
        if isinstance(node, ast.Assign) and literal(node.value) and node.value.value != 0:
            for target in node.targets:
                text = ast.unparse(target)
                if text.endswith("ctrl_addr.value"):
                    found.append((node.lineno, ast.unparse(node)))
    for number, line in enumerate(source.splitlines(), 1):
        for match in _HEX.finditer(line):
            if int(match.group(), 16) in numbers:
                found.append((number, line.strip()))
    return sorted(found)


def test_literal_address_check_catches_literals(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("port.read(256)\ntransport.write(0x1FF, 1)\ndut.ctrl_addr.value = 3\n"
                   "m.d.comb += self.ctrl_addr.eq(5)\nBASE = 0x100\nok.read(address)\n"
                   "f.read(6)\ndut.ctrl_addr.value = 0\n")
    assert [line for line, _ in literal_addresses(bad, register_addresses())] == \
        [1, 2, 2, 3, 4, 5]


def test_no_register_address_outside_the_contract():
    numbers = register_addresses()
    assert {0x100, 0x1FF} <= numbers
    own = REPO / "contract" / "registers.py"
    found = {}
    for path in list(python_files(*PACKAGES, "tests")):
        if path == own or path == Path(__file__).resolve():
            continue
        hits = literal_addresses(path, numbers)
        if hits:
            found[str(path.relative_to(REPO))] = hits
    assert not found, found


def test_documented_register_tables_are_the_contract():
    tables = (REPO / "docs" / "registers.md").read_text()
    for name, register_map in REGISTER_MAPS.items():
        assert markdown_table(register_map) in tables, (
            f"docs/registers.md's {name} register table differs from contract.registers: "
            f"paste the output of `python -m contract.registers`")


# -- references ----------------------------------------------------------------------------

_REFERENCE = re.compile(
    r"(?<![\w./-])((?:\.\./)?(?:shared|docs|notes|hdl|host|sim|tests|constraints|contract)"
    r"/[\w./-]*\w\.(?:md|py|toml|yml|yaml|v|png|json))")
#: outputs that exist only after a run
_GENERATED = ("build/",)


def referenced_files():
    texts = [p for p in REPO.rglob("*") if p.is_file()
             and p.suffix in (".py", ".md", ".toml", ".yml", ".yaml")
             and not {".venv", ".git", "build", "__pycache__"} & set(p.relative_to(REPO).parts)]
    texts += [REPO / "Makefile", REPO / ".ci" / "run"]
    this = Path(__file__).resolve()     # its examples name missing files on purpose
    for path in (p for p in texts if p.resolve() != this):
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for match in _REFERENCE.finditer(line):
                yield path, number, match.group(1)


def resolve(reference):
    """The file a reference names, or None for one outside the repository (``../shared/``
    is not in a clone: the protocol is ``docs/protocol/``)."""
    if reference.startswith("../"):
        return None
    return REPO / reference


def test_reference_pattern():
    line = "see ``notes/agg-contract.md`` and ../shared/spec/network.md, hdl/nic/engine.py."
    assert [m.group(1) for m in _REFERENCE.finditer(line)] == \
        ["notes/agg-contract.md", "../shared/spec/network.md", "hdl/nic/engine.py"]


def test_every_referenced_file_exists():
    references = list(referenced_files())
    assert any(reference.startswith("docs/protocol/") for _, _, reference in references)
    missing = [f"{path.relative_to(REPO)}:{number}: {reference}"
               for path, number, reference in references
               if not reference.startswith(_GENERATED)
               and (resolve(reference) is None or not resolve(reference).exists())]
    assert not missing, "\n".join(missing)


def test_every_package_has_a_row_in_the_architecture_map():
    """docs/architecture.md "Which file holds what" names every package folder of the code
    (a folder with an ``__init__.py`` under contract/, hdl/, host/ and sim/)."""
    text = (REPO / "docs" / "architecture.md").read_text()
    table = text.split("## Which file holds what", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("`")[1] for line in table.splitlines() if line.startswith("| `")}
    packages = {f"{init.parent.relative_to(REPO).as_posix()}/"
                for top in ("contract", "hdl", "host", "sim")
                for init in (REPO / top).rglob("__init__.py")}
    assert packages - rows == set(), "add a row to docs/architecture.md for each"
