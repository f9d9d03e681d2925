"""``make verilog``: write the Verilog of every exported top into a folder.

The engines are typed components (streams, a :class:`~hdl.ctrl_port.RegisterPort`, status
members). Their exported tops show them behind flat ports instead, named the AXI way
(``tx_s_axis_tdata``, ``ctrl_addr``, ...), because ``cocotbext-axi``, the compiled harness
and checks outside the project bind to those names. :class:`FlatTop` is the one place that
flattens, driven by ``contract/tops.py``'s port table; nothing inside the gateware uses
flat names.

:data:`TOPS` maps a top module name to its :class:`Export`. A top that instantiates other
Verilog (the network and wire tops: a generated LiteEth core) lists it in ``verilog_sources``;
those files are copied beside its own.
"""
from __future__ import annotations

import dataclasses
import importlib
import sys
from pathlib import Path

from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from contract.tops import TOP_PORTS, TopPorts
from hdl.ctrl_port import RegisterPort
from hdl.stream.axis import axis_signature, connect_flat_axis, flat_axis_members

__all__ = ["Export", "TOPS", "FlatTop", "export_verilog", "make_top"]

#: Prefix of the flat register port: ``ctrl_addr``, ``ctrl_re``, ...
REGISTER_PREFIX = "ctrl"


@dataclasses.dataclass(frozen=True)
class Export:
    """How one top is exported.

    Attributes
    ----------
    factory : str
        ``"module:Component"`` of the typed component (imported when the top is made).
    streams : dict, optional
        ``{contract stream name: (input member, output member)}``: which of the component's
        streams are the port groups of ``contract.tops.TOP_PORTS``; its register port is
        ``ctrl``. ``None``: the component's own ports are the top's (the network top).
    """
    factory: str
    streams: dict | None = None


TOPS = {
    "nic_top": Export("hdl.nic.engine:NicEngine",
                      {"tx": ("tx_in", "tx_out"), "rx": ("rx_in", "rx_out")}),
    "switch_top": Export("hdl.switch.aggregator:Aggregator", {"agg": ("i", "o")}),
    "network_top": Export("hdl.net.top:NetworkTop"),
    "wire_top": Export("hdl.wire.top:WireTop"),
}


class FlatTop(wiring.Component):
    """A typed engine behind flat ports: each stream of ``ports`` as ``{prefix}_t*`` and the
    register port as ``ctrl_*``.

    Members of the engine that are outputs and not in the table (status for other tops,
    such as ``rx_dropped`` or ``drained``) are left out; an input left out is an error,
    since it would be tied to zero silently.

    Parameters
    ----------
    engine : wiring.Component
    ports : contract.tops.TopPorts
        Port groups and register port of the exported top.
    streams : dict
        ``{stream name: (input member, output member)}`` of ``engine``, for every stream of
        ``ports``.
    """

    def __init__(self, engine, ports, streams):
        if not isinstance(ports, TopPorts):
            raise TypeError(f"ports must be a contract.tops.TopPorts, not {ports!r}")
        if set(streams) != set(ports.streams):
            raise ValueError(f"streams {sorted(streams)} must name the port table's "
                             f"{sorted(ports.streams)}")
        engine_members = engine.signature.members
        self._links = []     # (flat prefix, engine member, sink)
        members = {}
        for name, (sink, source) in ports.streams.items():
            for member, prefix, flow in ((streams[name][0], sink, In),
                                         (streams[name][1], source, Out)):
                want = flow(axis_signature())
                if engine_members.get(member) != want:
                    raise ValueError(f"{type(engine).__name__}.{member} must be {want!r}, "
                                     f"not {engine_members.get(member)!r}")
                members.update(flat_axis_members(prefix, sink=flow is In))
                self._links.append((prefix, member, flow is In))
        register = In(RegisterPort(writable=ports.writable))
        if engine_members.get("ctrl") != register:
            raise ValueError(f"{type(engine).__name__}.ctrl must be {register!r}, not "
                             f"{engine_members.get('ctrl')!r}")
        for name, member in register.signature.members.items():   # as the engine sees it
            members[f"{REGISTER_PREFIX}_{name}"] = member
        exported = {member for _, member, _ in self._links} | {"ctrl"}
        dropped_inputs = [name for name, member in engine_members.items()
                          if name not in exported and member.flow == In]
        if dropped_inputs:
            raise ValueError(f"inputs {dropped_inputs} of {type(engine).__name__} have no "
                             f"exported port")
        self.engine = engine
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.engine = engine = self.engine
        for prefix, member, sink in self._links:
            connect_flat_axis(m, self, prefix, getattr(engine, member), sink=sink)
        for name, member in engine.ctrl.signature.members.items():
            flat = getattr(self, f"{REGISTER_PREFIX}_{name}")
            inner = getattr(engine.ctrl, name)
            m.d.comb += inner.eq(flat) if member.flow == In else flat.eq(inner)
        return m


def export_verilog(component, name: str) -> str:
    """Verilog text of an Amaranth component, with top module ``name`` (no source
    locations, so the text depends only on the design)."""
    from amaranth.back import verilog
    return verilog.convert(component, name=name, emit_src=False)


def make_top(name, **params):
    """The Amaranth component of exported top ``name`` (its component's default parameters
    unless given)."""
    try:
        export = TOPS[name]
    except KeyError:
        raise ValueError(f"no exported top {name!r}; the tops are {', '.join(TOPS)}") from None
    module, factory = export.factory.split(":")
    component = getattr(importlib.import_module(module), factory)(**params)
    if export.streams is None:
        return component
    return FlatTop(component, TOP_PORTS[name], export.streams)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0] if argv else "build/verilog")
    out.mkdir(parents=True, exist_ok=True)
    for name in TOPS:
        path = out / f"{name}.v"
        top = make_top(name)
        path.write_text(export_verilog(top, name))
        print(f"wrote {path}")
        for source in getattr(top, "verilog_sources", ()):
            copy = out / Path(source).name
            copy.write_text(Path(source).read_text())
            print(f"wrote {copy} (instantiated by {name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
