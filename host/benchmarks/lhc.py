"""Lossless Homomorphic Compression golden model: throughput, wire bytes, peeling.

Four workers, each with a sparse gradient of 2^24 values (2^20 with ``--quick``) at 1 % and
10 % density (independent uniformly random positions per worker, N(0, 1e-2) values,
seeded), so the union U is about 3.9 % and 34 % dense.

Per worker and per run:

- **encode**: validate + exponent + index bitmap, then (after the merged index) quantise
  and count-sketch encode;
- **decode**: union from the merged bitmap + rows + scale (``make_plan``), count map and
  peeling, then merge of the fallback values and dequantisation;
- **allreduce**: the whole golden ``allreduce`` for the four workers (including the local
  stand-ins for the switch's OR / ADD).

Every time is the best of a few repeats, reported as MB/s of one worker's fp32 values
(4 bytes each) and as a ratio against the baseline measured in the same run on the same
data: ``np.add.reduce`` over the four workers' stacked float32 tensors (a plain dense local sum;
ratio = baseline time / time, so below 1 means slower than it). A second baseline, the
dense wrap-around int32 sum of the four quantised tensors, is reported too. The golden
result is checked bit for bit against the dequantised int64 sum before anything is
reported. Bytes on the wire are per worker: payload (index + sketch + fallback) and with
packet headers at P = 64 lanes, against 4 bytes per value for a dense int32 all-reduce.
"""
from __future__ import annotations


import numpy as np

from . import best_time

from ..golden import lhc

SEED = 20240211
WORKERS = 4
DENSITIES = (0.01, 0.10)
LANES = 64


def sparse_gradients(n, density, workers=WORKERS, seed=SEED):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(workers):
        x = np.zeros(n, dtype=np.float32)
        nz = rng.choice(n, int(round(density * n)), replace=False)
        x[nz] = rng.normal(0.0, 1e-2, nz.size)
        out.append(x)
    return out


def _encode(tensors):
    workers = [lhc.LhcWorker(x, len(tensors)) for x in tensors]
    union = lhc.aggregate_index([w.index_words for w in workers])
    e_max = lhc.aggregate_exponent([w.exponent for w in workers])
    plan = lhc.make_plan(union, e_max, len(tensors), tensors[0].size)
    sketches = [w.sketch_phase(union, e_max, plan) for w in workers]
    return workers, union, e_max, sketches


def _time_encode_phases(tensors, plan, union, e_max, repeats):
    """Encode time of one worker (mean over workers of the best of ``repeats``)."""
    total = 0.0
    for x in tensors:
        def one():
            w = lhc.LhcWorker(x, len(tensors))
            w.sketch_phase(union, e_max, plan)
        total += best_time(one, repeats)[0]
    return total / len(tensors)


def _one_case(n, density, repeats):
    tensors = sparse_gradients(n, density)
    megabytes = 4 * n / 1e6

    stacked = np.stack(tensors)
    t_float_sum, _ = best_time(lambda: np.add.reduce(stacked, axis=0), repeats)
    workers, union, e_max, sketches = _encode(tensors)
    plan = workers[0].plan
    quantized = [w.q for w in workers]
    stacked_q = np.stack(quantized)
    t_int_sum, _ = best_time(lambda: np.add.reduce(stacked_q, axis=0), repeats)   # wraps

    t_encode = _time_encode_phases(tensors, plan, union, e_max, repeats)
    sketch_sum = lhc.aggregate_sketch(sketches)
    decoder = workers[0]

    def decode():
        p = lhc.make_plan(union, e_max, WORKERS, n)
        peeling = lhc.peel(sketch_sum, p.elements, p.rows, p.blocks)
        fallback = lhc.aggregate_sketch([w.q[peeling.unpeeled] for w in workers])
        decoder.fallback_phase(sketch_sum, peeling)
        return decoder.finish(fallback)

    t_decode, (decoded, _) = best_time(decode, repeats)
    t_allreduce, (result, stats) = best_time(lambda: lhc.allreduce(tensors), repeats)

    exact = np.zeros(n, dtype=np.int64)
    for q in quantized:
        exact += q
    if np.abs(exact).max() > lhc.INT32_MAX:
        raise AssertionError("quantised sum left int32")
    expect = lhc.dequantize(exact.astype(np.int32), plan.scale)
    for got in (result, decoded):
        if not np.array_equal(got.view(np.uint32), expect.view(np.uint32)):
            raise AssertionError("golden allreduce is not the exact dequantised sum")

    chunks = {"index": -(-stats.index_bytes // (4 * LANES)),
              "sketch": -(-stats.sketch_bytes // (4 * LANES)),
              "fallback": -(-stats.fallback_bytes // (4 * LANES))}
    wire_with_headers = sum(chunks.values()) * (32 + 4 * LANES)
    ops = {
        "encode (per worker)": t_encode,
        "decode (per worker)": t_decode,
        "allreduce (4 workers, golden)": t_allreduce,
        "baseline: np.add.reduce float32 x4": t_float_sum,
        "baseline: int32 sum of quantised x4": t_int_sum,
    }
    return {
        "values": n, "density": density, "workers": WORKERS, "repeats": repeats,
        "union_density": stats.union_nnz / n,
        "operations": {name: {"seconds": s, "mb_per_s": megabytes / s,
                              "ratio_vs_float_sum": t_float_sum / s,
                              "ratio_vs_int32_sum": t_int_sum / s}
                       for name, s in ops.items()},
        "rows": stats.rows, "load": stats.load, "union_nnz": stats.union_nnz,
        "max_column": stats.max_column, "peeled": stats.peeled, "unpeeled": stats.unpeeled,
        "rounds": stats.rounds,
        "bytes_per_worker": {"index": stats.index_bytes, "sketch": stats.sketch_bytes,
                             "fallback": stats.fallback_bytes, "total": stats.total_bytes,
                             "with_headers_p64": wire_with_headers,
                             "dense_int32": stats.dense_bytes},
        "compression_vs_dense_int32": stats.dense_bytes / stats.total_bytes,
        "compression_with_headers_p64": stats.dense_bytes / wire_with_headers,
    }


def run(quick: bool) -> dict:
    n = 1 << 20 if quick else 1 << 24
    repeats = 3 if quick else 2
    results = {"seed": SEED, "cases": {}}
    print(f"LHC golden model: {WORKERS} workers x {n:,} values ({n / (1 << 20):g} Mi), "
          f"load {lhc.DEFAULT_LOAD}, best of {repeats}")
    for density in DENSITIES:
        case = _one_case(n, density, repeats)
        results["cases"][f"{density:g}"] = case
        print(f"\ndensity {density:.0%} per worker, union {case['union_density']:.1%}: "
              f"r = {case['rows']} rows, max column {case['max_column']}, "
              f"peeled {case['peeled']:,} / {case['union_nnz']:,}, "
              f"unpeeled {case['unpeeled']:,}, {case['rounds']} rounds")
        print(f"{'operation':38s} {'time s':>8s} {'MB/s':>9s} {'vs f32 sum':>11s} "
              f"{'vs i32 sum':>11s}")
        for name, op in case["operations"].items():
            print(f"{name:38s} {op['seconds']:8.3f} {op['mb_per_s']:9.1f} "
                  f"{op['ratio_vs_float_sum']:10.3f}x {op['ratio_vs_int32_sum']:10.3f}x")
        b = case["bytes_per_worker"]
        print(f"bytes per worker: index {b['index']:,} + sketch {b['sketch']:,} + fallback "
              f"{b['fallback']:,} = {b['total']:,} vs dense int32 {b['dense_int32']:,} "
              f"-> {case['compression_vs_dense_int32']:.2f}x smaller "
              f"({case['compression_with_headers_p64']:.2f}x with P={LANES} packet headers)")
    return results
