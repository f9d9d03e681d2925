"""The ``gradwire`` command line.

Each sub-command lives in its own module under ``host/commands/`` with two functions:
``add_arguments(parser)`` and ``run(args) -> int``; :data:`COMMANDS` lists them.
"""
from __future__ import annotations

import argparse
import importlib
import sys

__all__ = ["main", "COMMANDS"]

#: sub-command name -> (module under host.commands, one-line help)
COMMANDS = {
    "compress": ("codec", "compress a .npy float32 tensor with the INCEPTIONN codec"),
    "decompress": ("codec", "decompress a .gwz file back into a .npy tensor"),
    "info": ("codec", "describe a .gwz compressed file"),
    "sim": ("sim", "run the whole system end to end (golden models or Verilated gateware)"),
    "accuracy": ("accuracy", "train with the compressed DDP gradient hooks and compare with fp32"),
    "board": ("board", "talk to a board over UDP (status, ping, configure-job, compress, "
                       "decompress), or serve a virtual one"),
}


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


def build_parser():
    parser = argparse.ArgumentParser(
        prog="gradwire",
        description="Gradient compression for the NIC (INCEPTIONN) and in-network "
                    "aggregation (lossless homomorphic sketches), in gateware and software.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in COMMANDS.items():
        mod = importlib.import_module(f"host.commands.{module}")
        p = sub.add_parser(name, help=help_text, description=help_text)
        add = getattr(mod, f"add_{name}_arguments", None) or getattr(mod, "add_arguments")
        add(p)
        p.set_defaults(_run=getattr(mod, f"run_{name}", None) or getattr(mod, "run"))
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except CliError as exc:
        print(f"gradwire {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    # Run the module's canonical copy, so that `CliError` raised by the commands (imported
    # from host.cli) is the class caught above and not a second copy living in __main__.
    from host.cli import main as _main
    sys.exit(_main())
