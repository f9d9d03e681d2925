"""``make verilog``: write the Verilog of every exported top into a folder.

:data:`TOPS` maps a top module name to a zero-argument factory of its Amaranth component.
A top that instantiates other Verilog (the network top: the generated LiteEth core) lists
it in ``verilog_sources``; those files are copied beside its own.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

#: top module name -> "module:factory" (imported lazily)
TOPS = {
    "nic_top": "hdl.nic.top:NicTop",
    "switch_top": "hdl.switch.top:SwitchTop",
    "network_top": "hdl.net.top:NetworkTop",
}


def export_verilog(component, name: str) -> str:
    """Verilog text of an Amaranth component, with top module ``name`` (no source
    locations, so the text depends only on the design)."""
    from amaranth.back import verilog
    return verilog.convert(component, name=name, emit_src=False)


def make_top(name, **params):
    """The Amaranth component of top ``name`` (its default parameters unless given)."""
    module, factory = TOPS[name].split(":")
    return getattr(importlib.import_module(module), factory)(**params)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0] if argv else "build/verilog")
    out.mkdir(parents=True, exist_ok=True)
    if not TOPS:
        print("make verilog: no exported tops are built yet (NIC and switch tops come with "
              "their issues)", file=sys.stderr)
        return 1
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
