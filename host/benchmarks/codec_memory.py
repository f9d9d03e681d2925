"""Peak memory of ``gradwire compress | decompress | info``, as a ratio to the tensor's size.

Each command runs as a child process on a tensor of ``n`` float32 values (``4n`` bytes, the
size of the decoded array); its peak resident set (``VmHWM``, which the child reads from
``/proc/self/status`` as it exits) minus the baseline measured the same way in the same run
(a child that imports the CLI and builds its parser: the interpreter, NumPy and every
command module, about 43 MiB) is reported as a ratio to ``4n``. Goal: at most 2x for every
command, size and workload.

Workloads (``k = 10``, packets of 2048 values), written in chunks (seeded):

- **gradients**: like ``host.benchmarks.inceptionn.gradients`` (mostly N(0, 1e-3), 6.9x
  compression);
- **all_raw**: every value ``abs >= 1``, Inf or NaN: every lane raw, the largest file
  (1.06x the tensor) and the slowest decode.

Sizes: 2^24 values (64 MiB) by default, 2^20 with ``--quick``; ``--large`` adds 2^27
(512 MiB): about 2-3 minutes more on a 2-core machine (the all-raw decompress alone about
a minute under load) and 1.7 GB of temporary files. Before anything is reported, the
decompressed tensor is checked bit for bit against ``quantize`` of the input and the class
histograms of ``compress`` and ``info`` against each other. Wall-clock seconds are shown
for information only.
"""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from . import inceptionn as inceptionn_bench
from ..golden import inceptionn as inc

COMMANDS = ("compress", "decompress", "info")
WORKLOADS = ("gradients", "all_raw")
GOAL = 2.0
K = inc.K_DEFAULT
SEED = 20181021
#: Values generated, written and checked at a time.
_CHUNK = 1 << 22
_BASELINE = "from host.cli import build_parser; build_parser()"


def _workload_chunk(name, first, n):
    """Values ``first .. first + n`` of a workload (float32)."""
    if name == "gradients":
        return inceptionn_bench.gradients(n, seed=[SEED, first])
    rng = np.random.default_rng([SEED, first])
    sign = rng.integers(0, 2, n, dtype=np.uint32) << 31
    exponent = rng.integers(127, 256, n, dtype=np.uint32) << 23   # 255: Inf and NaNs
    mantissa = rng.integers(0, 1 << 23, n, dtype=np.uint32)
    return (sign | exponent | mantissa).view(np.float32)


def _write_input(path, name, n):
    array = np.lib.format.open_memmap(path, mode="w+", dtype="<f4", shape=(n,))
    for first in range(0, n, _CHUNK):
        array[first:first + _CHUNK] = _workload_chunk(name, first, min(_CHUNK, n - first))
    array.flush()
    del array


def _check_output(input_path, output_path, n):
    x = np.load(input_path, mmap_mode="r")
    y = np.load(output_path, mmap_mode="r")
    if y.shape != (n,) or y.dtype != np.float32:
        raise AssertionError(f"decompressed {y.shape} {y.dtype}, expected ({n},) float32")
    for first in range(0, n, _CHUNK):
        expected = inc.quantize(np.asarray(x[first:first + _CHUNK]), K).view(np.uint32)
        if not np.array_equal(np.asarray(y[first:first + _CHUNK]).view(np.uint32), expected):
            raise AssertionError(f"decompressed values {first}.. differ from quantize")


#: Run by each measured child: the code given, then write the child's own peak resident set
#: (``VmHWM``, KiB) to the file named by ``argv[1]``. ``ru_maxrss`` would not do: Linux
#: carries the parent's peak into a child's across ``fork``/``vfork`` + ``exec``.
_LAUNCHER = """
import runpy, sys
report, code, sys.argv = sys.argv[1], sys.argv[2], sys.argv[3:]
try:
    if code == "-m":
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    else:
        exec(code)
finally:
    with open("/proc/self/status") as status:
        peak = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
    with open(report, "w") as out:
        out.write(peak)
"""


def peak_of_child(code, argv=()):
    """``(peak resident bytes, seconds, stdout)`` of a child Python process running
    ``code`` (``"-m"``: the module ``argv[0]`` as ``__main__``, with ``argv`` as its
    ``sys.argv``)."""
    with tempfile.TemporaryDirectory() as tmp:
        report, out, err = (Path(tmp) / name for name in ("peak", "out", "err"))
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            start = time.perf_counter()
            status = subprocess.run([sys.executable, "-c", _LAUNCHER, str(report), code,
                                     *map(str, argv)], stdout=stdout, stderr=stderr,
                                    stdin=subprocess.DEVNULL).returncode
            seconds = time.perf_counter() - start
        if status:
            raise RuntimeError(f"{code} {' '.join(map(str, argv))} failed ({status}): "
                               f"{err.read_text(errors='replace')}")
        return int(report.read_text()) * 1024, seconds, out.read_text()


def _classes(text):
    match = re.search(r"classes\s+(.*)", text)
    return match.group(1) if match else None


def _measure(tmp, name, n, baseline):
    source, packed, restored = tmp / f"{name}.npy", tmp / f"{name}.gwz", tmp / f"{name}.out.npy"
    _write_input(source, name, n)
    results, texts = {}, {}
    for command, args in (("compress", [source, packed]), ("decompress", [packed, restored]),
                          ("info", [packed])):
        peak, seconds, texts[command] = peak_of_child("-m", ["host.cli", command, *args])
        results[command] = {"peak_bytes": peak, "seconds": seconds,
                            "ratio_to_tensor": (peak - baseline) / (4 * n)}
    _check_output(source, restored, n)
    if _classes(texts["compress"]) != _classes(texts["info"]) or not _classes(texts["info"]):
        raise AssertionError("compress and info report different class histograms")
    results["gwz_bytes"] = packed.stat().st_size
    for path in (source, packed, restored):
        path.unlink()
    return results


def run(quick: bool, large: bool = False) -> dict:
    sizes = [20] if quick else [24]
    if large:
        sizes.append(27)
    with tempfile.TemporaryDirectory(prefix="gradwire-codec-memory-") as tmp:
        tmp = Path(tmp)
        baseline, _, _ = peak_of_child(_BASELINE)
        results = {"baseline_peak_bytes": baseline, "goal_ratio": GOAL, "k": K,
                   "packet_values": inc.MAX_COUNT, "sizes": {}}
        print(f"peak resident memory of each command (child process) minus the baseline "
              f"({baseline / 2 ** 20:.1f} MiB: interpreter, NumPy, CLI imports), as a ratio "
              f"to the tensor (4 bytes per value); goal <= {GOAL:g}x")
        print(f"{'values':>9} {'workload':<10}" + "".join(f"{c:>12}" for c in COMMANDS)
              + "   peak MiB (c/d/i)   seconds (c/d/i)")
        worst = 0.0
        for log2 in sizes:
            n = 1 << log2
            per_size = results["sizes"][f"2^{log2}"] = {"values": n}
            for name in WORKLOADS:
                r = per_size[name] = _measure(tmp, name, n, baseline)
                ratios = [r[c]["ratio_to_tensor"] for c in COMMANDS]
                worst = max(worst, *ratios)
                print(f"{'2^' + str(log2):>9} {name:<10}"
                      + "".join(f"{x:>11.3f}x" for x in ratios)
                      + "   " + "/".join(f"{r[c]['peak_bytes'] / 2 ** 20:.1f}" for c in COMMANDS)
                      + "   " + "/".join(f"{r[c]['seconds']:.1f}" for c in COMMANDS),
                      flush=True)
    results["worst_ratio"] = worst
    results["goal_met"] = worst <= GOAL
    print(f"worst {worst:.3f}x: goal <= {GOAL:g}x {'met' if worst <= GOAL else 'NOT MET'}"
          + ("" if large else " (2^27 values: python -m host.bench --only codec_memory "
                              "--large)"))
    return results
