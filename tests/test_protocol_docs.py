"""The protocol pages (``docs/protocol/``) agree with ``contract/`` and the golden models.

The pages state in prose and tables what the code declares in ``contract/``; these tests
read the pages' tables and compare them with the code, so that neither drifts alone:

- every table whose header names a contract tuple (``| index | `contract.counters.X` | ... |``)
  lists that tuple's names in order, with their indices; every counter tuple of the register
  maps is listed on some page;
- every ``| value | meaning | contract |`` (or ``code``) table gives the named constant's
  value on each row;
- ``packet-header.md``'s header, type and flag tables are ``HEADER_FIELDS``, ``PacketType``
  and ``Flags``;
- ``network.md``'s service and ``CTRL`` tables are ``contract.network``'s ports and offsets;
- the worked examples are what the golden models compute.
"""
import ast
import importlib
import re
from pathlib import Path

import numpy as np
import pytest

from contract import counters
from contract.header import HEADER_FIELDS, Flags, PacketType
from contract.network import (
    CTRL_COUNT_OFFSET,
    CTRL_KEY_BYTES,
    CTRL_KEY_OFFSET,
    CTRL_OP_OFFSET,
    CTRL_SEQ_OFFSET,
    CTRL_TYPE,
    CtrlOp,
    Service,
    service_ports,
)

REPO = Path(__file__).resolve().parents[1]
PROTOCOL = REPO / "docs" / "protocol"
PAGES = ("README.md", "packet-header.md", "inceptionn-format.md", "lhc-sketch.md",
         "aggregator-protocol.md", "network.md")


# -- reading tables ------------------------------------------------------------------------

def split_row(line):
    """The cells of one Markdown table row; ``|`` inside backticks or escaped as ``\\|``
    belongs to its cell."""
    cells, cell, code = [], [], False
    i = 0
    body = line.strip()
    if body.startswith("|"):
        body = body[1:]
    while i < len(body):
        char = body[i]
        if char == "\\" and body[i + 1:i + 2] == "|":
            cell.append("|")
            i += 2
            continue
        if char == "`":
            code = not code
        if char == "|" and not code:
            cells.append("".join(cell).strip())
            cell = []
        else:
            cell.append(char)
        i += 1
    if "".join(cell).strip():
        cells.append("".join(cell).strip())
    return cells


def tables(text):
    """``[(header cells, [row cells, ...]), ...]`` of every Markdown table in ``text``."""
    found, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        if (lines[i].lstrip().startswith("|") and i + 1 < len(lines)
                and re.fullmatch(r"\s*\|(\s*:?-+:?\s*\|)+\s*", lines[i + 1])):
            header = split_row(lines[i])
            rows = []
            i += 2
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                rows.append(split_row(lines[i]))
                i += 1
            found.append((header, rows))
        else:
            i += 1
    return found


def page(name):
    return (PROTOCOL / name).read_text()


def table_with(name, header):
    """The rows of the one table of page ``name`` whose header row is ``header``."""
    matches = [rows for cells, rows in tables(page(name)) if cells == list(header)]
    assert len(matches) == 1, f"{name}: {len(matches)} tables with the header {header}"
    return matches[0]


def code(cell):
    """A cell's text without its backticks."""
    return cell.strip().strip("`").strip()


def resolve(dotted):
    """The object a dotted name like ``contract.header.MAGIC`` names."""
    module, _, attribute = dotted.rpartition(".")
    return getattr(importlib.import_module(module), attribute)


def all_tables():
    for name in PAGES:
        for header, rows in tables(page(name)):
            yield name, header, rows


# -- the reader itself ---------------------------------------------------------------------

def test_table_reader():
    text = ("x\n\n| a | b |\n|---|---|\n| `s << 7 \\| P8` | `x | y` |\n| 1 | 2 |\n\n"
            "| c |\n|:--|\n| 3 |\n")
    assert tables(text) == [(["a", "b"], [["`s << 7 | P8`", "`x | y`"], ["1", "2"]]),
                            (["c"], [["3"]])]


def test_every_page_exists_and_the_index_names_them():
    index = page("README.md")
    for name in PAGES[1:]:
        assert (PROTOCOL / name).is_file()
        assert f"]({name})" in index, f"docs/protocol/README.md does not link {name}"


# -- tables named after a contract tuple ---------------------------------------------------

_TUPLE_HEADER = re.compile(r"`((?:contract|host)\.[\w.]+)`")


def named_tuple_tables():
    for name, header, rows in all_tables():
        if len(header) >= 2 and header[0] == "index":
            match = _TUPLE_HEADER.fullmatch(header[1])
            if match:
                yield name, match.group(1), rows


def test_tables_named_after_a_contract_tuple_list_it_in_order():
    seen = set()
    for name, dotted, rows in named_tuple_tables():
        expected = [getattr(item, "name", item) for item in resolve(dotted)]
        listed = [code(row[1]) for row in rows]
        assert listed == expected, (
            f"docs/protocol/{name}: the table of {dotted} lists {listed}, the contract "
            f"{expected}")
        assert [int(row[0]) for row in rows] == list(range(len(expected))), (
            f"docs/protocol/{name}: the indices of {dotted} are not 0..{len(expected) - 1}")
        seen.add(dotted)
    # every counter block of the register maps is on some page
    assert {f"contract.counters.{n}" for n in ("NIC_TX_COUNTERS", "NIC_RX_COUNTERS",
                                               "AGG_COUNTERS", "NET_COUNTERS",
                                               "WIRE_COUNTERS")} <= seen, seen
    assert "contract.network.NETWORK_REGIONS" in seen


def test_every_counter_tuple_is_covered():
    """The drop-cause tuples are parts of the counter tuples the pages list."""
    assert set(f"drop_{c}" for c in counters.AGG_DROP_CAUSES) <= set(counters.AGG_COUNTERS)
    assert set(counters.NET_CORE_DROPS) <= set(counters.NET_COUNTERS)
    assert set(f"drop_{c}" for c in counters.WIRE_DROP_CAUSES) <= set(counters.WIRE_COUNTERS)


# -- value tables --------------------------------------------------------------------------

def value_rows():
    for name, header, rows in all_tables():
        if header in (["value", "meaning", "contract"], ["value", "meaning", "code"]):
            for row in rows:
                yield name, row


def agrees(text, value):
    if isinstance(value, str):
        return text == value
    if isinstance(value, float):
        return float(text) == value
    try:
        return int(text, 0) == value
    except ValueError:
        return False


def test_value_tables_give_the_contract_values():
    rows = list(value_rows())
    assert len(rows) > 20
    wrong = []
    for name, row in rows:
        text, dotted = code(row[0]), code(row[2])
        value = resolve(dotted)
        if not agrees(text, value):
            wrong.append(f"docs/protocol/{name}: {dotted} is {value!r}, the page says {text}")
    assert not wrong, "\n".join(wrong)


# -- the packet header ---------------------------------------------------------------------

def test_header_table_is_header_fields():
    rows = table_with("packet-header.md", ("offset", "size", "field", "kind", "meaning"))
    listed = [(int(r[0]), int(r[1]), code(r[2]), r[3]) for r in rows]
    expected = [(f.offset, f.size, f.name,
                 "reserved" if f.name.startswith("reserved") else
                 "signed" if f.signed else "unsigned") for f in HEADER_FIELDS]
    assert listed == expected


def test_type_table_is_packet_type():
    rows = table_with("packet-header.md", ("value", "type", "payload", "specified in"))
    assert [(int(r[0]), code(r[1])) for r in rows] == [(t.value, t.name) for t in PacketType]


def test_flag_table_is_flags():
    rows = table_with("packet-header.md", ("bit", "flag", "meaning"))
    flags = [f for f in Flags if f.value]
    assert [(1 << int(r[0]), code(r[1])) for r in rows] == [(f.value, f.name) for f in flags]


# -- the network ---------------------------------------------------------------------------

def test_service_table_is_the_service_ports():
    rows = table_with("network.md", ("UDP port", "service", "contract",
                                     "what a datagram carries", "what comes back"))
    ports = service_ports()
    assert {Service(code(r[2])): int(r[0]) for r in rows} == ports
    assert [Service(code(r[2])) for r in rows] == sorted(ports, key=ports.get)


def test_ctrl_table_is_the_ctrl_offsets():
    rows = table_with("network.md", ("offset", "size", "field", "meaning"))
    fields = {code(r[2]): (int(r[0]), int(r[1]), r[3]) for r in rows}
    assert fields["op"][:2] == (CTRL_OP_OFFSET, 1)
    assert fields["count"][:2] == (CTRL_COUNT_OFFSET, 4)
    assert fields["seq"][:2] == (CTRL_SEQ_OFFSET, 4)
    assert fields["key"][:2] == (CTRL_KEY_OFFSET, CTRL_KEY_BYTES)
    assert fields["type"][2] == f"`{CTRL_TYPE}`"
    # the fields CTRL shares with every packet sit where the header has them
    header = {f.name: (f.offset, f.size) for f in HEADER_FIELDS}
    for shared in ("magic", "version", "type", "flags", "count", "seq"):
        assert fields[shared][:2] == header[shared], shared
    ops = table_with("network.md", ("value", "`op`"))
    assert [(int(r[0]), code(r[1])) for r in ops] == [(o.value, o.name) for o in CtrlOp]


# -- worked examples -----------------------------------------------------------------------

def test_inceptionn_example_is_the_golden_encoding():
    from host.golden import inceptionn
    text = page("inceptionn-format.md")
    match = re.search(r"`k = (\d+)`: the three values ([-\d.]+), ([-\d.]+) and ([-\d.]+) "
                      r"make one block.*?its bytes are `([0-9a-f ]+)`", text, re.S)
    assert match, "inceptionn-format.md section 3's worked example is not where it was"
    k, values = int(match.group(1)), [float(v) for v in match.group(2, 3, 4)]
    encoded = inceptionn.encode(np.array(values, dtype=np.float32), k)
    assert encoded.hex(" ") == match.group(5)


def test_murmur3_check_values_are_the_golden_hash():
    from host.golden.murmur3 import murmur3_32
    checks = re.findall(r"`h_(\d)\((\d+)\) = (0x[0-9a-f]{8})`", page("lhc-sketch.md"))
    assert len(checks) == 4
    for seed, block, value in checks:
        assert murmur3_32(int(block).to_bytes(4, "little"), int(seed)) == int(value, 16)
