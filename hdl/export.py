"""``make verilog``: write the Verilog of every exported top into a folder.

:data:`TOPS` maps a top module name to a zero-argument factory of its Amaranth component.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

#: top module name -> "module:factory" (imported lazily)
TOPS = {
    "nic_top": "hdl.nic.top:NicTop",
    "switch_top": "hdl.switch.top:SwitchTop",
}


def make_top(name):
    module, factory = TOPS[name].split(":")
    return getattr(importlib.import_module(module), factory)()


def main(argv=None) -> int:
    from sim.runner import export_verilog
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0] if argv else "build/verilog")
    out.mkdir(parents=True, exist_ok=True)
    if not TOPS:
        print("make verilog: no exported tops are built yet (NIC and switch tops come with "
              "their issues)", file=sys.stderr)
        return 1
    for name in TOPS:
        path = out / f"{name}.v"
        path.write_text(export_verilog(make_top(name), name))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
