"""INCEPTIONN golden model throughput, against NumPy's float16 conversion.

Realistic gradients (seeded): 2^24 values (2^20 with ``--quick``), mostly N(0, 1e-3), with
0.1 % of larger values N(0, 0.05) and 0.01 % outliers N(0, 4) (many of them raw).

Every speed is MB/s of fp32 values (4 bytes each; input bytes when encoding, output bytes
when decoding) and a ratio against the baseline measured in the same run on the same
values: ``x.astype(np.float16)`` for encoding, ``h.astype(np.float32)`` for decoding (the
cheapest lossy 2x "compression" NumPy offers). Each time is the best of a few repeats.
The decoded tensor is checked bit for bit against ``quantize`` before anything is reported.
"""
from __future__ import annotations


import numpy as np

from . import best_time

from ..golden import inceptionn as inc

K = inc.K_DEFAULT
SEED = 20180601


def gradients(n, seed=SEED):
    """``n`` float32 gradient-like values (see the module docstring)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, 1e-3, n).astype(np.float32)
    larger = rng.choice(n, max(1, n // 1000), replace=False)
    x[larger] = rng.normal(0.0, 0.05, larger.size)
    outliers = rng.choice(n, max(1, n // 10000), replace=False)
    x[outliers] = rng.normal(0.0, 4.0, outliers.size)
    return x


def run(quick: bool) -> dict:
    n = 1 << 20 if quick else 1 << 24
    repeats = 3
    x = gradients(n)
    fp32_megabytes = 4 * n / 1e6

    t_half, half = best_time(lambda: x.astype(np.float16), repeats)
    t_unhalf, _ = best_time(lambda: half.astype(np.float32), repeats)
    t_pack, packets = best_time(
        lambda: inc.tensor_to_packets(x, K, compress=True, packet_values=inc.MAX_COUNT), repeats)
    t_unpack, decoded = best_time(lambda: inc.packets_to_tensor(packets, n), repeats)
    t_encode, stream = best_time(lambda: inc.encode(x, K), repeats)
    t_decode, _ = best_time(lambda: inc.decode(stream, n, K), repeats)
    t_quantize, quantized = best_time(lambda: inc.quantize(x, K), repeats)
    if not np.array_equal(decoded.view(np.uint32), quantized.view(np.uint32)):
        raise AssertionError("packets_to_tensor(tensor_to_packets(x)) != quantize(x)")

    payload = sum(len(p.payload) for p in packets)
    wire = sum(len(p.to_bytes()) for p in packets)
    tags = np.bincount(inc.classify(x, K), minlength=4)

    rows = [
        # name, seconds, baseline name, baseline seconds
        ("encode + pack (tensor_to_packets)", t_pack, "astype(float16)", t_half),
        ("unpack + decode (packets_to_tensor)", t_unpack, "float16 -> float32", t_unhalf),
        ("encode, one stream", t_encode, "astype(float16)", t_half),
        ("decode, one stream", t_decode, "float16 -> float32", t_unhalf),
        ("quantize (no bitstream)", t_quantize, "astype(float16)", t_half),
        ("baseline: astype(float16)", t_half, "astype(float16)", t_half),
        ("baseline: float16 -> float32", t_unhalf, "float16 -> float32", t_unhalf),
    ]
    print(f"INCEPTIONN golden model, k={K}, {n:,} values ({n / (1 << 20):g} Mi), "
          f"best of {repeats}")
    print(f"{'operation':38s} {'time s':>8s} {'MB/s':>9s} {'vs baseline':>12s}  baseline")
    results = {"values": n, "k": K, "repeats": repeats, "seed": SEED, "operations": {}}
    for name, seconds, base_name, base_seconds in rows:
        throughput = fp32_megabytes / seconds
        ratio = base_seconds / seconds
        print(f"{name:38s} {seconds:8.3f} {throughput:9.1f} {ratio:11.3f}x  {base_name}")
        results["operations"][name] = {"seconds": seconds, "mb_per_s": throughput,
                                       "ratio_vs_baseline": ratio, "baseline": base_name}
    print(f"compression: payload {4 * n:,} -> {payload:,} B = {4 * n / payload:.2f}x "
          f"({8 * payload / n:.2f} bits/value); with packet headers {4 * n / wire:.2f}x; "
          f"float16 is 2x")
    shares = 100.0 * tags / n
    print("classes: " + "  ".join(f"{t:02b}: {c:,} ({s:.2f}%)"
                                  for t, (c, s) in enumerate(zip(tags.tolist(), shares))))
    results.update({
        "packets": len(packets),
        "payload_bytes": payload,
        "wire_bytes": wire,
        "compression_ratio_payload": 4 * n / payload,
        "compression_ratio_wire": 4 * n / wire,
        "bits_per_value": 8 * payload / n,
        "class_histogram": {f"{t:02b}": int(c) for t, c in enumerate(tags)},
        "class_percent": {f"{t:02b}": float(s) for t, s in enumerate(shares)},
    })
    return results
