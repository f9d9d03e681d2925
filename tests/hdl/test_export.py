"""``make verilog``'s exported tops: the flat port names the benches, the compiled harness
and checks outside the project bind to, exactly as ``contract/tops.py`` says."""
import re

import pytest
from amaranth import Module, Shape
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from contract.registers import ADDRESS_BITS, DATA_BITS
from contract.tops import TOP_PORTS, TopPorts
from hdl.ctrl_port import RegisterPort
from hdl.export import TOPS, FlatTop, export_verilog, make_top
from hdl.stream.axis import DATA_BITS as BEAT_BITS
from hdl.stream.axis import axis_signature

SMALL = {"nic_top": {"max_count": 64},
         "switch_top": {"slots": 4, "lanes": 8, "max_workers": 4, "jobs": 2}}


def expected_ports(ports: TopPorts):
    """``[(name, direction, width)]`` of an exported top, in order, from the port table."""
    beat = [("tdata", BEAT_BITS), ("tkeep", BEAT_BITS // 8), ("tlast", 1), ("tvalid", 1)]
    expected = []
    for sink, source in ports.streams.values():
        expected += [(f"{sink}_{n}", "input", w) for n, w in beat] + [(f"{sink}_tready", "output", 1)]
        expected += [(f"{source}_{n}", "output", w) for n, w in beat] + [(f"{source}_tready", "input", 1)]
    expected += [("ctrl_addr", "input", ADDRESS_BITS), ("ctrl_re", "input", 1),
                 ("ctrl_rdata", "output", DATA_BITS)]
    if ports.writable:
        expected += [("ctrl_wdata", "input", DATA_BITS), ("ctrl_we", "input", 1)]
    return expected


def verilog_ports(text, name):
    """``[(name, direction, width)]`` of module ``name``'s ports, in their order, with the
    clock and reset left out."""
    header = re.search(rf"^module {name}\((.*?)\);", text, re.S | re.M)
    body = text[header.end():text.index("endmodule", header.end())]
    declared = {port: (direction, int(msb) + 1 if msb else 1)
                for direction, msb, port in re.findall(
                    r"^\s*(input|output)\s+(?:\[(\d+):0\]\s+)?(\w+);", body, re.M)}
    return [(port, *declared[port]) for port in (p.strip() for p in header.group(1).split(","))
            if port not in ("clk", "rst")]


@pytest.mark.parametrize("name", sorted(TOP_PORTS))
def test_exported_ports_are_the_port_tables(name):
    """The component's flat signature, in order, and the Verilog module's ports (Amaranth
    orders a module's ports its own way)."""
    assert name in TOPS
    top = make_top(name, **SMALL[name])
    members = [(path[0], "input" if member.flow == In else "output", Shape.cast(member.shape).width)
               for path, member in top.signature.members.flatten()]
    assert members == expected_ports(TOP_PORTS[name])
    assert sorted(verilog_ports(export_verilog(top, name), name)) == sorted(
        expected_ports(TOP_PORTS[name]))


def test_the_port_list_check_sees_a_renamed_port():
    text = export_verilog(make_top("switch_top", **SMALL["switch_top"]), "switch_top")
    renamed = text.replace("ctrl_we", "ctrl_write_enable")
    assert sorted(verilog_ports(renamed, "switch_top")) != sorted(
        expected_ports(TOP_PORTS["switch_top"]))


class _Engine(wiring.Component):
    """A stand-in engine: one stream, a register port, and members to leave out."""

    def __init__(self, *, register=RegisterPort(), extra=None):
        super().__init__({"i": In(axis_signature()), "o": Out(axis_signature()),
                          "ctrl": In(register), **(extra or {})})

    def elaborate(self, platform):
        m = Module()
        wiring.connect(m, wiring.flipped(self.i), wiring.flipped(self.o))
        m.d.sync += self.ctrl.rdata.eq(self.ctrl.addr)
        return m


PORTS = TopPorts({"agg": ("s_axis", "m_axis")}, registers=None, writable=True)


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_flat_top_leaves_out_status_outputs():
    top = FlatTop(_Engine(extra={"drained": Out(1)}), PORTS, {"agg": ("i", "o")})
    names = [path[0] for path, _ in top.signature.members.flatten()]
    assert "drained" not in names and "ctrl_we" in names


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
@pytest.mark.parametrize("engine,streams,match", [
    ({"extra": {"enable": In(1)}}, {"agg": ("i", "o")}, r"inputs \['enable'\]"),
    ({"register": RegisterPort(writable=False)}, {"agg": ("i", "o")}, "ctrl must be"),
    ({}, {"agg": ("o", "i")}, r"_Engine\.o must be"),
    ({}, {"tx": ("i", "o")}, "must name the port table"),
])
def test_flat_top_refuses_what_it_cannot_export(engine, streams, match):
    with pytest.raises(ValueError, match=match):
        FlatTop(_Engine(**engine), PORTS, streams)


def test_make_top_names_the_tops_it_knows():
    with pytest.raises(ValueError, match="nic_top, switch_top, network_top"):
        make_top("nic")
