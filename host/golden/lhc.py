"""Golden model of Lossless Homomorphic Compression (the in-network all-reduce path).

Implements ``docs/protocol/lhc-sketch.md`` in vectorised NumPy. Every worker

1. sends a non-zero **index bitmap** (merged by the switch with bitwise OR) together with
   its **exponent** (merged with signed MAX)                                   -- phase A,
2. quantises its tensor with the common SwitchML scale and sends a **count sketch** of the
   int32 values (merged with wrap-around ADD)                                  -- phase B,
3. **peels** the summed sketch, using the cell counts it recomputes from the merged bitmap,
   and sends the exact int32 values of the elements peeling could not recover in one dense
   ADD round                                                                   -- phase C
   (skipped when everything peeled),

and so ends with the exact int32 sum of the quantised tensors, dequantised. The result is
therefore bit for bit ``dequantize(wrap32(sum_w quantize(x_w, f)), f)`` whatever happens
during peeling.

Dense or sketch, per tensor (``path``). After phase A every worker holds the merged index,
so it knows exactly what the sketch would cost before anything else is sent; with
``path="auto"`` it sends the tensor as a dense ``AGG_ADD_I32`` all-reduce of its quantised
values instead (SwitchML's integer sum through the same aggregator, the same scale ``f``,
so the same result bits) when that is cheaper. The rule (:func:`choose_path`), in payload
bytes per worker, with ``N`` elements, ``r`` sketch rows and ``u`` the elements peeling will
leave::

    sketch  iff  4 * r * B + 4 * u  <  4 * N          (ties and empty tensors go dense)

The index (``N / 8`` bytes) is already paid on both sides, so it is left out. ``u`` is
exact, not an expectation: peeling's choices depend only on the cell counts, which every
worker recomputes from the merged index, never on the values, so the elements that will
need the fallback round are known after phase A (:func:`peel_schedule`). Every input to the
rule (``N``, ``r``, ``u``) is derived from the switch's OR result, hence the same on every
worker. ``u`` is computed only when it can change the answer (``4 r B < 4 N <= 4 r B + 4
|U|``). The result is bit for bit the same on either path; only the bytes differ, and
``path="auto"`` sends at most the index phase (1 bit per value) more than a dense
all-reduce. ``path="sketch"`` (the default) and ``path="dense"`` force one path; a forced
dense all-reduce sends no index: its phase A is one word per worker (whether it holds a
non-zero, OR-merged, with the exponent MAX-merged in the header), then the dense round.

Public entry point: :func:`allreduce`. The building blocks (:func:`worker_exponent`,
:func:`scale`, :func:`quantize`, :func:`dequantize`, :func:`encode_index`,
:func:`aggregate_index`, :func:`rows_for`, :func:`encode_sketch`, :func:`aggregate_sketch`,
:func:`count_map`, :func:`peel`, :func:`decode`) can be used alone, and :class:`LhcWorker`
runs one worker's side of the protocol phase by phase, for drivers that carry the phases
over a real (or simulated) network (``host/switchml/network.py``).

Points the spec fixes that are easy to get wrong (all deterministic, shared by every worker):

- **The index marks ``x != 0``, not ``q != 0``** (``docs/protocol/lhc-sketch.md`` section 3,
  step 1): ``q`` needs the scale, which needs ``e_max``, which the switch only delivers at
  the end of phase A, the phase that carries the bitmap. So the bitmap is built from the
  float values (``-0.0`` counts as zero). Elements that quantise to 0 sit in ``U`` with
  value 0 and peel like any other.
- **All zero** (section 2): ``f = 1`` when the merged bitmap is empty (then every value of
  every worker is ±0; every worker can tell from the bitmap alone).
- **The exponent clamp** (section 2): ``float32((2**31 - 1) / (n * 2**e_max))`` is ``inf``
  when ``e_max`` is very small (all magnitudes below about ``2**-96``, e.g. only denormals).
  Then the scale is computed with the smallest exponent for which it is finite
  (:func:`scale_exponent_floor`) instead of ``e_max``: still bounded in int32, just coarser.
- **Refused values** (section 2): ``e_w`` ranges over -126..128; 128 (a magnitude of at
  least ``2**127``) does not fit the header's signed exponent byte, and NaN and Inf have no
  integer form: all three are refused with a clear ValueError, never sent.
- **Row count.** ``r = max(r_min, math.ceil(max_column / load))`` evaluated in Python
  floating point (so ``ceil(7 / 0.7) == 11``: 0.7 is not exact in binary).
- **Rounds** counts the peeling rounds that peeled at least one element (the final round
  that finds nothing is not counted).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Sequence

import numpy as np

from .murmur3 import murmur3_32_u32

__all__ = [
    "B", "N_HASHES", "DEFAULT_LOAD", "MAX_WORKERS", "MAX_TREE_WORKERS", "EXPONENT_ZERO",
    "INT32_MAX",
    "as_gradient", "worker_exponent", "aggregate_exponent", "scale", "scale_exponent_floor",
    "scale_steps_down",
    "quantize", "dequantize", "n_blocks", "encode_index", "decode_index", "aggregate_index",
    "column_counts", "rows_for", "block_hashes", "SketchGeometry", "encode_sketch",
    "aggregate_sketch", "count_map", "PeelResult", "peel", "peel_schedule", "decode",
    "LhcPlan", "make_plan", "choose_path", "PATHS", "LhcStats", "LhcWorker", "allreduce",
    "wrap_int32",
]

#: Columns of the sketch: a tensor is cut into blocks of B elements.
B = 1024
#: Hash functions (cells per element).
N_HASHES = 3
DEFAULT_LOAD = 0.7
#: The switch's worker bitmap is 32 bits wide.
MAX_WORKERS = 32
#: Workers whose exact int32 sum the scale leaves room for: every worker of a tree of
#: aggregators (``docs/protocol/aggregator-protocol.md`` section 4), two levels of 32. The
#: scale divides the int32 range by the number of workers in the *sum*, which in a tree is
#: the whole tree's, not one aggregator's (at most :data:`MAX_WORKERS`).
MAX_TREE_WORKERS = MAX_WORKERS * MAX_WORKERS
#: ``e_w`` of an all-zero (or all-denormal) tensor: biased exponent 0 minus 126.
EXPONENT_ZERO = -126
INT32_MAX = 2**31 - 1
_WORDS_PER_BLOCK = B // 32
#: How a tensor may travel: the sketch, a dense int32 all-reduce, or the cheaper of the two
#: chosen after the index phase (:func:`choose_path`).
PATHS = ("sketch", "dense", "auto")


# ---------------------------------------------------------------------------------------
# helpers

def wrap_int32(values) -> np.ndarray:
    """Integers reduced modulo 2**32 into int32 (two's complement wrap-around)."""
    values = np.asarray(values, dtype=np.int64)
    return (values & 0xFFFFFFFF).astype(np.uint32).view(np.int32)


def as_gradient(tensor, *, name: str = "tensor") -> np.ndarray:
    """``tensor`` as a flat float32 array, or ValueError if it holds NaN or ±Inf.

    Integer and other floating dtypes are converted with ``float32(x)`` first (the spec's
    quantiser starts from ``float32(x)``); a value that overflows float32 becomes Inf and is
    rejected like one.
    """
    array = np.asarray(tensor)
    if array.dtype.kind not in "biuf":
        raise TypeError(f"{name}: expected real numbers, got dtype {array.dtype}")
    if array.dtype != np.float32:
        with np.errstate(over="ignore"):
            array = array.astype(np.float32)
    flat = np.ascontiguousarray(array).reshape(-1)
    # lhc-sketch.md section 2: NaN and Inf are refused with a clear error, never sent
    bad = (flat.view(np.uint32) & np.uint32(0x7F800000)) == np.uint32(0x7F800000)
    if bad.any():
        where = np.flatnonzero(bad)
        raise ValueError(f"{name} holds {where.size} non-finite value(s) (NaN or ±Inf after "
                         f"conversion to float32), first at flat index {where[0]}: "
                         f"{flat[where[0]]!r}; gradients must be finite")
    return flat


# ---------------------------------------------------------------------------------------
# quantisation (spec section 2)

def worker_exponent(tensor) -> int:
    """``e_w = biased_exponent(max |x_w|) - 126``: every ``|x_w|`` is below ``2**e_w``.

    -126 for an all-zero (or empty, or all-denormal) tensor. Raises ValueError for NaN/Inf
    and for a magnitude of at least ``2**127`` (``e_w = 128`` does not fit the signed
    exponent byte of the packet header).
    """
    return _exponent_of(as_gradient(tensor))


def _exponent_of(flat: np.ndarray) -> int:
    if flat.size == 0:
        return EXPONENT_ZERO
    magnitude_bits = int((flat.view(np.uint32) & np.uint32(0x7FFFFFFF)).max())
    exponent = (magnitude_bits >> 23) - 126
    if exponent > 127:      # lhc-sketch.md section 2: abs(x) >= 2^127 is refused
        raise ValueError(f"max |x| = {np.uint32(magnitude_bits).view(np.float32)!r} is at "
                         f"least 2**127: its exponent {exponent} does not fit the signed "
                         f"exponent byte")
    return exponent


def aggregate_exponent(exponents: Sequence[int]) -> int:
    """The switch's merge of the exponent byte: signed MAX."""
    return max(int(e) for e in exponents)


def _unclamped_scale(exponent: int, n_workers: int) -> np.float32:
    with np.errstate(over="ignore"):
        # (2**31-1)/(n*2**e) is rounded to float64 and then to float32. That double rounding
        # equals the correctly rounded float32 for every n in 1..1024 (2**31-1 is prime, so the
        # quotient's binary expansion never has the 28 equal bits a wrong tie would need);
        # tests/host/golden/test_lhc.py checks it against exact rational rounding.
        return np.array((2**31 - 1) / (n_workers * 2.0**exponent)).astype(np.float32)[()]


@functools.lru_cache(maxsize=None)
def scale_steps_down(n_workers: int) -> int:
    """Float32 steps (ulps) the scale for ``n_workers`` lies below the rounded formula
    ``float32((2**31-1) / (n * 2**e))``: 0 for every ``n`` whose rounded formula already
    leaves room for the sum, which is every ``n`` up to 255 (one aggregator's 32 among
    them); 1 to 4 for some larger counts (a tree's), where the formula rounds up so far
    that a worker's value just below ``2**e_max``, rounded half away from zero, would reach
    ``2**31 / n`` and ``n`` of them would wrap int32 (``n = 256``: the formula gives
    ``2**23 / 2**e`` exactly, and the largest value below ``2**e`` quantises to ``2**23``).

    The steps do not depend on ``e``: a power of two only shifts the scale's exponent, and
    the worst value (the largest float32 below ``2**e``) shifts with it; a clamped scale
    (tensors of denormals) only meets smaller values."""
    _check_workers(n_workers)
    f = _unclamped_scale(0, n_workers)
    top = np.nextafter(np.float32(1.0), np.float32(0.0))     # |x| < 2**e_max, at e = 0
    steps = 0
    while n_workers * float(_round_half_away_from_zero(np.array([top * f]))[0]) > INT32_MAX:
        f = np.nextafter(f, np.float32(0.0))
        steps += 1
    return steps


@functools.lru_cache(maxsize=None)
def scale_exponent_floor(n_workers: int) -> int:
    """Smallest exponent for which ``float32((2**31-1) / (n * 2**e))`` is finite: the clamp
    of ``docs/protocol/lhc-sketch.md`` section 2 for tensors of denormals only."""
    _check_workers(n_workers)
    exponent = -128
    while not np.isfinite(_unclamped_scale(exponent, n_workers)):
        exponent += 1
    return exponent


def scale(e_max: int, n_workers: int, *, all_zero: bool = False) -> np.float32:
    """The common SwitchML scale ``f = float32((2**31 - 1) / (n * 2**e_max))``, stepped
    down :func:`scale_steps_down` float32 ulps where that rounding leaves no room for
    ``n`` workers' sum (never for ``n <= 255``).

    Parameters
    ----------
    e_max : int
        Aggregated (MAX) exponent, -128..127.
    n_workers : int
        Number of workers ``n`` in the sum (1..:data:`MAX_TREE_WORKERS`): in a tree of
        aggregators, every worker of the tree, not those of one aggregator.
    all_zero : bool
        Every value of every worker is zero (the merged index is empty): ``f = 1``.

    Notes
    -----
    When ``e_max < scale_exponent_floor(n)`` the formula overflows float32; the scale then
    uses the floor exponent instead (see the module docstring).

    ``n`` is checked here: the scale divides the int32 range between the workers of the
    sum, so a count beyond :data:`MAX_TREE_WORKERS` is a ValueError that says so.
    """
    _check_workers(n_workers)
    if isinstance(e_max, bool) or int(e_max) != e_max or not -128 <= e_max <= 127:
        raise ValueError(f"exponent {e_max!r} is not a signed 8-bit integer")
    if all_zero:
        return np.float32(1.0)
    f = _unclamped_scale(max(int(e_max), scale_exponent_floor(n_workers)), n_workers)
    for _ in range(scale_steps_down(n_workers)):
        f = np.nextafter(f, np.float32(0.0))
    return f


def _round_half_away_from_zero(y: np.ndarray) -> np.ndarray:
    # In float64, y + copysign(0.5, y) is exact for every float32 y with |y| < 2**31 (and for
    # |y| < 0.5 it stays below 1), so truncating it rounds half away from zero exactly; doing
    # the same in float32 would turn 0.49999997 into 1.
    y64 = y.astype(np.float64)
    half = np.copysign(0.5, y64)
    y64 += half
    return np.trunc(y64, out=y64)


def quantize(tensor, f) -> np.ndarray:
    """``q = int32(round_half_away_from_zero(float32(x) * f))`` with the product in float32.

    Raises OverflowError if a rounded product falls outside int32 (impossible with the
    scale of :func:`scale` for this tensor's workers; possible with an arbitrary ``f``).
    """
    return _quantize_flat(as_gradient(tensor), f)


def _quantize_flat(flat: np.ndarray, f) -> np.ndarray:
    f = np.float32(f)
    if not (np.isfinite(f) and f > 0):
        raise ValueError(f"scale {f!r} must be finite and positive")
    product = flat * f                       # float32 * float32 -> float32, correctly rounded
    rounded = _round_half_away_from_zero(product)
    peak = max(rounded.max(), -rounded.min()) if rounded.size else 0.0
    if peak > INT32_MAX:
        raise OverflowError(f"x * f reaches {peak:.0f}, outside int32: "
                            f"the scale {f!r} is too large for this tensor")
    return rounded.astype(np.int32)


def dequantize(q, f) -> np.ndarray:
    """``float32(q) / f`` in float32."""
    q = np.asarray(q)
    if q.dtype.kind not in "iu":
        raise TypeError(f"quantised values must be integers, got dtype {q.dtype}")
    return q.astype(np.float32) / np.float32(f)


# ---------------------------------------------------------------------------------------
# index bitmap (spec section 3.1)

def n_blocks(n_elements: int) -> int:
    """``G``: number of B-element blocks after zero padding."""
    return -(-int(n_elements) // B)


def encode_index(tensor) -> np.ndarray:
    """Non-zero bitmap, LSB first (element 32m+j is bit j of word m), as uint32 words.

    The tensor is zero padded to a multiple of B elements, so there are ``32 * G`` words.
    A bit is set where the value is non-zero (``-0.0`` is zero). Works on float tensors
    (what a worker sends, see the module docstring) and on integer ones (e.g. ``q``).
    """
    flat = np.asarray(tensor).reshape(-1)
    if flat.dtype.kind == "f":
        flat = as_gradient(flat)
    return _index_of_mask(flat != 0)


def _index_of_mask(mask: np.ndarray) -> np.ndarray:
    padded = np.zeros(n_blocks(mask.size) * B, dtype=bool)
    padded[:mask.size] = mask
    return np.packbits(padded, bitorder="little").view("<u4").astype(np.uint32)


def decode_index(words, n_elements: int | None = None) -> np.ndarray:
    """Ascending element numbers of the set bits of an index bitmap (int64).

    With ``n_elements``, raises ValueError if a bit is set beyond the tensor's end.
    """
    words = np.ascontiguousarray(words, dtype=np.uint32)
    bits = np.unpackbits(words.astype("<u4").view(np.uint8), bitorder="little")
    elements = np.flatnonzero(bits)
    if n_elements is not None and elements.size and elements[-1] >= n_elements:
        raise ValueError(f"index bit {elements[-1]} set beyond the tensor's {n_elements} "
                         f"elements")
    return elements


def aggregate_index(bitmaps: Sequence) -> np.ndarray:
    """The switch's merge of index bitmaps: bitwise OR."""
    bitmaps = [np.asarray(b, dtype=np.uint32) for b in bitmaps]
    _check_same_length(bitmaps, "index bitmaps")
    return np.bitwise_or.reduce(np.stack(bitmaps), axis=0)


def column_counts(elements) -> np.ndarray:
    """``|U ∩ column t|`` for t in 0..B-1, from the ascending element numbers of U."""
    return np.bincount(np.asarray(elements) & (B - 1), minlength=B)


def _rows(max_column: int, load: float, r_min: int) -> int:
    _check_load(load, r_min)
    return max(int(r_min), math.ceil(int(max_column) / load))


def rows_for(index_words, *, load: float = DEFAULT_LOAD, r_min: int = 1) -> int:
    """``r = max(r_min, ceil(max_t |U ∩ column t| / load))`` from the merged bitmap."""
    counts = column_counts(decode_index(index_words))
    return _rows(int(counts.max()), load, r_min)


# ---------------------------------------------------------------------------------------
# the sketch (spec sections 1, 3.3, 4)

@functools.lru_cache(maxsize=8)
def _block_hashes_cached(blocks: int) -> np.ndarray:
    hashes = np.stack([murmur3_32_u32(np.arange(blocks, dtype=np.uint32), j)
                       for j in range(N_HASHES)])
    hashes.setflags(write=False)
    return hashes


def block_hashes(blocks: int) -> np.ndarray:
    """``h_j(b)`` for j in 0..2 and b in 0..blocks-1: uint32 array of shape (3, blocks)."""
    if blocks < 0 or blocks > 2**32:
        raise ValueError(f"block count {blocks} out of range")
    return _block_hashes_cached(int(blocks))


class SketchGeometry:
    """Where each element goes: ``row_j(b) = h_j(b) mod r``, ``sign_j(b)`` from bit 31.

    Parameters
    ----------
    blocks : int
        Number of blocks ``G``.
    rows : int
        Sketch rows ``r`` (>= 1).
    """

    def __init__(self, blocks: int, rows: int):
        if int(rows) != rows or rows < 1:
            raise ValueError(f"the sketch needs at least one row, got {rows!r}")
        self.blocks = int(blocks)
        self.rows = int(rows)
        hashes = block_hashes(self.blocks)
        if self.cells > 2**31 - 1:
            raise ValueError(f"{rows} rows x {B} cells do not fit int32 cell numbers")
        # int32 cell numbers and int8 signs: peeling is memory bound
        self.block_rows = (hashes % np.uint32(self.rows)).astype(np.int32)      # (3, G)
        self.block_signs = np.where(hashes >> np.uint32(31), -1, 1).astype(np.int8)

    @property
    def cells(self) -> int:
        return self.rows * B

    def locate(self, elements) -> tuple[np.ndarray, np.ndarray]:
        """``(cells, signs)``: int32 cells (row*B + t) and int8 signs, shape (3, len)."""
        elements = np.asarray(elements, dtype=np.int64)
        if elements.size and (elements.min() < 0 or elements.max() >= self.blocks * B):
            raise ValueError(f"element numbers must lie in 0..{self.blocks * B - 1}")
        block = elements >> 10
        column = (elements & (B - 1)).astype(np.int32)
        cells = self.block_rows[:, block]
        cells *= np.int32(B)
        cells += column
        return cells, self.block_signs[:, block]


def encode_sketch(q, rows: int) -> np.ndarray:
    """Count sketch ``Y[row_j(b)*B + t] += sign_j(b) * q[i]`` in int32 with wrap-around.

    Parameters
    ----------
    q : array_like of int32
        One worker's quantised tensor (any length; padding is zero).
    rows : int
        Sketch rows ``r``.

    Returns
    -------
    numpy.ndarray of int32, ``rows * B`` cells, row-major.
    """
    q = np.asarray(q).reshape(-1)
    if q.dtype != np.int32:
        raise TypeError(f"quantised values must be int32, got dtype {q.dtype}")
    geometry = SketchGeometry(n_blocks(q.size), rows)
    elements = np.flatnonzero(q)
    cells, signs = geometry.locate(elements)
    sums = np.zeros(geometry.cells, dtype=np.int64)
    # int64 accumulation is exact (at most 3*G terms of |q| < 2**31 per cell); wrapping at
    # the end equals wrapping after every addition.
    np.add.at(sums, cells.reshape(-1), (signs * q[elements].astype(np.int64)).reshape(-1))
    return wrap_int32(sums)


def aggregate_sketch(sketches: Sequence) -> np.ndarray:
    """The switch's merge of int32 vectors: wrap-around ADD."""
    sketches = [np.asarray(s) for s in sketches]
    _check_same_length(sketches, "sketches")
    total = np.zeros(sketches[0].shape, dtype=np.int64)
    for s in sketches:
        total += s.astype(np.int64)
    return wrap_int32(total)


def count_map(elements, rows: int, blocks: int) -> np.ndarray:
    """``C[c]`` = number of (i in U, j) whose j-th cell is c (int64, ``rows * B`` cells)."""
    geometry = SketchGeometry(blocks, rows)
    cells, _ = geometry.locate(elements)
    return np.bincount(cells.reshape(-1), minlength=geometry.cells)


@dataclasses.dataclass(frozen=True)
class PeelResult:
    """Outcome of peeling. ``values[k]`` and ``peeled[k]`` refer to ``elements[k]``."""
    elements: np.ndarray   # ascending element numbers of U (int64)
    values: np.ndarray     # int32 sums of the peeled elements (0 where not peeled)
    peeled: np.ndarray     # bool
    rounds: int            # rounds that peeled at least one element

    @property
    def unpeeled(self) -> np.ndarray:
        """Ascending element numbers left for the exact fallback round."""
        return self.elements[~self.peeled]


def peel(sketch, elements, rows: int, blocks: int) -> PeelResult:
    """Deterministic synchronous peeling of a summed sketch (spec section 4).

    Each round takes a snapshot of the counts; every unpeeled element picks its first cell
    (j = 0, 1, 2) whose snapshot count is 1; all picks are then removed. The spec walks the
    picks in ascending element order, removing one before reading the next; this does them
    all at once, which is the same: a cell with snapshot count 1 is touched by exactly one
    (element, j) of the remaining elements, so no other pick of the round changes its value.

    Parameters
    ----------
    sketch : array_like of int32
        The summed sketch ``Y`` (``rows * B`` cells).
    elements : array_like of int
        Ascending element numbers of the union U.
    rows, blocks : int
        Sketch rows ``r`` and tensor blocks ``G``.
    """
    geometry = SketchGeometry(blocks, rows)
    sketch = np.asarray(sketch).reshape(-1)
    if sketch.size != geometry.cells:
        raise ValueError(f"sketch has {sketch.size} cells, expected {rows} x {B}")
    elements = np.asarray(elements, dtype=np.int64)
    if elements.size and np.any(np.diff(elements) <= 0):
        raise ValueError("union elements must be strictly ascending")
    cells, signs = geometry.locate(elements)
    counts = np.bincount(cells.reshape(-1), minlength=geometry.cells)
    # Congruent to the true residual modulo 2**32. Never wrapped: it moves by less than
    # 2**31 per removal and a cell sees at most 3*|U| removals, far inside int64.
    residual = sketch.astype(np.int64)
    values = np.zeros(elements.size, dtype=np.int32)
    peeled = np.zeros(elements.size, dtype=bool)
    pending = np.arange(elements.size)
    rounds = 0
    while pending.size:
        # snapshot of the counts, one row per hash (row-wise: faster than a (3, p) gather)
        one0, one1, one2 = (counts[cells[j]] == 1 for j in range(N_HASHES))
        picked = one0 | one1 | one2
        sel = np.flatnonzero(picked)
        if not sel.size:
            break
        # first j whose cell has count 1
        j = np.where(one0[sel], 0, np.where(one1[sel], 1, 2))
        cell = cells[j, sel]
        value = wrap_int32(signs[j, sel] * residual[cell])
        values[pending[sel]] = value
        peeled[pending[sel]] = True
        all_cells = cells[:, sel].reshape(-1)
        np.subtract.at(residual, all_cells,
                       (signs[:, sel] * value.astype(np.int64)).reshape(-1))
        np.subtract.at(counts, all_cells, 1)
        keep = ~picked
        pending, cells, signs = pending[keep], cells[:, keep], signs[:, keep]
        rounds += 1
    return PeelResult(elements=elements, values=values, peeled=peeled, rounds=rounds)


def peel_schedule(elements, rows: int, blocks: int) -> tuple[np.ndarray, int]:
    """Which elements of U peeling will recover, from U alone: ``(peeled, rounds)``.

    Peeling (:func:`peel`) decides every pick from the cell counts, which depend only on U
    and the hashes, never on the sketch's values; so the outcome is known as soon as the
    merged index is, before any sketch is sent. This is :func:`peel`'s loop without the
    values: ``peeled`` (bool, per element of ``elements``) and ``rounds`` are exactly
    ``peel(...).peeled`` and ``peel(...).rounds`` for every sketch of that geometry.
    """
    geometry = SketchGeometry(blocks, rows)
    elements = np.asarray(elements, dtype=np.int64)
    cells, _ = geometry.locate(elements)
    counts = np.bincount(cells.reshape(-1), minlength=geometry.cells)
    peeled = np.zeros(elements.size, dtype=bool)
    pending = np.arange(elements.size)
    rounds = 0
    while pending.size:
        picked = (counts[cells[0]] == 1) | (counts[cells[1]] == 1) | (counts[cells[2]] == 1)
        sel = np.flatnonzero(picked)
        if not sel.size:
            break
        peeled[pending[sel]] = True
        np.subtract.at(counts, cells[:, sel].reshape(-1), 1)
        keep = ~picked
        pending, cells = pending[keep], cells[:, keep]
        rounds += 1
    return peeled, rounds


def decode(peeling: PeelResult, fallback_sums, n_elements: int) -> np.ndarray:
    """The exact int32 sum: peeled values, fallback sums for the unpeeled, 0 outside U.

    ``fallback_sums`` are the switch-summed exact values of ``peeling.unpeeled`` (ascending).
    """
    fallback_sums = np.asarray(fallback_sums).reshape(-1)
    unpeeled = ~peeling.peeled
    if fallback_sums.size != int(unpeeled.sum()):
        raise ValueError(f"{fallback_sums.size} fallback values for "
                         f"{int(unpeeled.sum())} unpeeled elements")
    out = np.zeros(n_elements, dtype=np.int32)
    values = peeling.values.copy()
    values[unpeeled] = wrap_int32(fallback_sums)
    if peeling.elements.size and peeling.elements[-1] >= n_elements:
        raise ValueError("union elements beyond the tensor's end")
    out[peeling.elements] = values
    return out


# ---------------------------------------------------------------------------------------
# the protocol, one worker at a time

@dataclasses.dataclass(frozen=True)
class LhcPlan:
    """What every worker derives identically from the merged index and exponent.

    ``path`` is the path the tensor takes ("sketch" or "dense"), ``requested_path`` what the
    caller asked for ("sketch", "dense" or "auto"). A forced dense plan has no index:
    ``elements``, ``rows`` and ``max_column`` are then None.
    """
    n_workers: int
    n_elements: int
    blocks: int
    exponent: int           # e_max
    scale: np.float32       # f
    rows: int | None        # r (what the sketch needs, also when the tensor goes dense)
    load: float
    r_min: int
    elements: np.ndarray | None   # ascending element numbers of U
    max_column: int | None
    path: str = "sketch"
    requested_path: str = "sketch"
    #: elements peeling will leave (:func:`peel_schedule`), where the choice needed it
    predicted_unpeeled: int | None = None


def make_plan(union_words, e_max: int, n_workers: int, n_elements: int, *,
              load: float = DEFAULT_LOAD, r_min: int = 1, path: str = "sketch") -> LhcPlan:
    """Derive ``U``, ``r``, ``f`` and the path from the switch's phase-A result.

    ``union_words`` is the merged index bitmap, or for ``path="dense"`` (no index sent) the
    one OR-merged word that is non-zero when any worker holds a non-zero value.
    """
    _check_workers(n_workers)
    _check_load(load, r_min)
    _check_path(path)
    blocks = n_blocks(n_elements)
    union_words = np.asarray(union_words, dtype=np.uint32).reshape(-1)
    if path == "dense":
        if union_words.size != 1:
            raise ValueError(f"a forced dense all-reduce merges one word in phase A, not "
                             f"{union_words.size}")
        return LhcPlan(n_workers=n_workers, n_elements=int(n_elements), blocks=blocks,
                       exponent=int(e_max),
                       scale=scale(e_max, n_workers, all_zero=not union_words[0]),
                       rows=None, load=float(load), r_min=int(r_min), elements=None,
                       max_column=None, path="dense", requested_path="dense")
    if union_words.size != blocks * _WORDS_PER_BLOCK:
        raise ValueError(f"merged index has {union_words.size} words, expected "
                         f"{blocks * _WORDS_PER_BLOCK} for {n_elements} elements")
    elements = decode_index(union_words, n_elements)
    max_column = int(column_counts(elements).max()) if elements.size else 0
    plan = LhcPlan(n_workers=n_workers, n_elements=int(n_elements), blocks=blocks,
                   exponent=int(e_max),
                   scale=scale(e_max, n_workers, all_zero=elements.size == 0),
                   rows=_rows(max_column, load, r_min), load=float(load), r_min=int(r_min),
                   elements=elements, max_column=max_column, requested_path=path)
    if path == "auto":
        chosen, unpeeled = choose_path(plan)
        plan = dataclasses.replace(plan, path=chosen, predicted_unpeeled=unpeeled)
    return plan


def choose_path(plan: LhcPlan) -> tuple[str, int | None]:
    """The break-even rule: ``("sketch" | "dense", predicted unpeeled or None)``.

    Sketch iff ``4 r B + 4 u < 4 N`` payload bytes per worker (module docstring), with
    ``u`` the exact number of elements peeling will leave (:func:`peel_schedule`), computed
    only when the two bounds ``4 r B`` and ``4 r B + 4 |U|`` fall on either side of
    ``4 N``. Deterministic: every input comes from the merged index.
    """
    if plan.elements is None or plan.rows is None:
        raise ValueError("the choice needs the merged index (a forced dense plan has none)")
    sketch_words, n = plan.rows * B, plan.n_elements
    if sketch_words >= n:
        return "dense", None
    if sketch_words + plan.elements.size < n:
        return "sketch", None
    peeled, _ = peel_schedule(plan.elements, plan.rows, plan.blocks)
    unpeeled = int(peeled.size - np.count_nonzero(peeled))
    return ("sketch" if sketch_words + unpeeled < n else "dense"), unpeeled


@dataclasses.dataclass(frozen=True)
class LhcStats:
    """What one all-reduce did. Byte counts are per worker, payload only (no headers, no
    padding to packets), against ``dense_bytes`` for a dense int32 all-reduce.

    Readable as attributes or as a mapping (``stats["rows"]``); :meth:`as_dict` for JSON.

    On the dense path ``sketch_bytes``, ``fallback_bytes``, ``peeled``, ``unpeeled`` and
    ``rounds`` are 0 and ``dense_round_bytes`` is ``4 * elements``; ``rows`` and ``cells``
    say what the sketch would have needed (None after a forced dense all-reduce, which has
    no index: its ``index_bytes`` is the one word of its phase A, and ``union_nnz`` and
    ``max_column`` are None too).
    """
    workers: int
    elements: int
    blocks: int
    exponent: int
    scale: float
    rows: int
    load: float
    r_min: int
    union_nnz: int
    max_column: int
    cells: int
    peeled: int
    unpeeled: int
    rounds: int
    index_bytes: int
    sketch_bytes: int
    fallback_bytes: int
    total_bytes: int
    dense_bytes: int
    #: "sketch" or "dense": how the tensor travelled; "sketch", "dense" or "auto": asked for
    path: str = "sketch"
    requested_path: str = "sketch"
    #: payload of the dense int32 round (4 bytes per value) when the tensor went dense
    dense_round_bytes: int = 0
    #: elements peeling would leave, as the path choice computed them (None: not needed)
    predicted_unpeeled: int | None = None

    @property
    def compression(self) -> float:
        """``dense_bytes / total_bytes`` (how many times fewer bytes than dense int32)."""
        return self.dense_bytes / self.total_bytes if self.total_bytes else float("inf")

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["compression"] = self.compression
        return d

    def __getitem__(self, key):
        return self.as_dict()[key]

    def keys(self):
        return self.as_dict().keys()


class LhcWorker:
    """One worker's side of the protocol, phase by phase.

    Usage (what :func:`allreduce` and the packet driver do)::

        w = LhcWorker(x, n_workers, path="auto")
        merged, e_max = switch_or(w.phase_a_words), switch_max(w.exponent)      # phase A
        if w.plan_phase(merged, e_max) == "dense":
            result, stats = w.finish(switch_add(w.dense_phase(merged, e_max)))  # dense round
        else:
            sketch_sum = switch_add(w.sketch_phase(merged, e_max))             # phase B
            fallback_sum = switch_add(w.fallback_phase(sketch_sum))            # phase C
            result, stats = w.finish(fallback_sum)                             # (maybe empty)

    With the default ``path="sketch"`` the plan always says "sketch" (``plan_phase`` may be
    skipped: ``sketch_phase`` makes the plan itself). ``plan`` / ``peeling`` arguments let a
    driver that simulates many workers in one process compute the identical per-worker
    derivations once.
    """

    def __init__(self, tensor, n_workers: int, *, load: float = DEFAULT_LOAD, r_min: int = 1,
                 name: str = "tensor", path: str = "sketch"):
        _check_workers(n_workers)
        _check_load(load, r_min)
        self.path = _check_path(path)
        self.shape = np.shape(tensor)
        self.values = as_gradient(tensor, name=name)
        self.n_workers = int(n_workers)
        self.load = float(load)
        self.r_min = int(r_min)
        try:
            self.exponent = _exponent_of(self.values)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
        self.index_words = _index_of_mask(self.values != 0)
        self.plan: LhcPlan | None = None
        self.q: np.ndarray | None = None
        self.peeling: PeelResult | None = None

    @property
    def n_elements(self) -> int:
        return self.values.size

    @property
    def phase_a_words(self) -> np.ndarray:
        """What this worker OR-merges in phase A: its index bitmap, or for a forced dense
        all-reduce one word, 1 if it holds a non-zero value (else 0)."""
        if self.path == "dense":
            return np.array([int(self.index_words.any())], dtype=np.uint32)
        return self.index_words

    def plan_phase(self, merged_words, e_max: int, plan: LhcPlan | None = None) -> str:
        """After phase A: derive the plan (union, rows, scale, path); return its path."""
        if plan is None:
            plan = make_plan(merged_words, e_max, self.n_workers, self.n_elements,
                             load=self.load, r_min=self.r_min, path=self.path)
        elif plan.requested_path != self.path:
            raise ValueError(f"a plan for path {plan.requested_path!r} given to a worker of "
                             f"path {self.path!r}")
        # Every non-zero this worker holds must be in the merged phase-A result, or its
        # values would go where nobody decodes them: this catches a switch that lost bits
        # of the OR.
        mine = self.phase_a_words
        merged = np.asarray(merged_words, dtype=np.uint32).reshape(-1)
        if merged.size != mine.size:
            raise ValueError(f"the merged phase-A result has {merged.size} words, this "
                             f"worker sent {mine.size}")
        if np.any(mine & ~merged):
            raise RuntimeError("the merged index misses elements this worker sent: the "
                               "switch's OR result is wrong")
        self.plan = plan
        return plan.path

    def _quantize(self, plan):
        self.q = _quantize_flat(self.values, plan.scale)
        # The scale keeps n * max|q| within int32, so the exact sum never wraps.
        peak = max(int(self.q.max()), -int(self.q.min())) if self.q.size else 0
        if self.n_workers * peak > INT32_MAX:
            raise AssertionError("quantised values exceed the int32 budget of n workers")

    def sketch_phase(self, union_words, e_max: int, plan: LhcPlan | None = None) -> np.ndarray:
        """After phase A: quantise with the common scale; return this worker's int32 sketch."""
        self.plan_phase(union_words, e_max, plan)
        if self.plan.path != "sketch":
            raise RuntimeError("the plan chose the dense path for this tensor: call "
                               "dense_phase()")
        self._quantize(self.plan)
        return encode_sketch(self.q, self.plan.rows)

    def dense_phase(self, merged_words, e_max: int, plan: LhcPlan | None = None) -> np.ndarray:
        """After phase A, on the dense path: this worker's quantised values (int32, all N),
        for one dense ``AGG_ADD_I32`` round."""
        self.plan_phase(merged_words, e_max, plan)
        if self.plan.path != "dense":
            raise RuntimeError("the plan chose the sketch path for this tensor: call "
                               "sketch_phase()")
        self._quantize(self.plan)
        return self.q

    def fallback_phase(self, sketch_sum, peeling: PeelResult | None = None) -> np.ndarray:
        """After phase B: peel; return this worker's exact int32 values of the unpeeled."""
        plan = self._need(self.plan, "sketch_phase")
        if plan.path != "sketch" or self.q is None:
            raise RuntimeError("call sketch_phase() first (fallback belongs to the sketch path)")
        if peeling is None:
            peeling = peel(sketch_sum, plan.elements, plan.rows, plan.blocks)
        self.peeling = peeling
        return self.q[peeling.unpeeled]

    def finish(self, summed) -> tuple[np.ndarray, LhcStats]:
        """After the last round: the float32 result (input shape) and the statistics.

        ``summed`` is the switch's sum of the fallback values (sketch path) or of the whole
        quantised tensors (dense path).
        """
        plan = self._need(self.plan, "sketch_phase")
        if plan.path == "dense":
            if self.q is None:
                raise RuntimeError("call dense_phase() first")
            exact = wrap_int32(np.asarray(summed).reshape(-1))
            if exact.size != self.n_elements:
                raise ValueError(f"{exact.size} summed values for {self.n_elements} elements")
            peeled = unpeeled = rounds = 0
            sketch_bytes = fallback_bytes = 0
            dense_round_bytes = 4 * self.n_elements
        else:
            peeling = self._need(self.peeling, "fallback_phase")
            exact = decode(peeling, summed, self.n_elements)
            peeled = int(peeling.peeled.sum())
            unpeeled = int((~peeling.peeled).sum())
            rounds = peeling.rounds
            sketch_bytes = 4 * plan.rows * B
            fallback_bytes = 4 * unpeeled
            dense_round_bytes = 0
        result = dequantize(exact, plan.scale).reshape(self.shape)
        index_bytes = 4 if plan.requested_path == "dense" else plan.blocks * B // 8
        stats = LhcStats(
            workers=self.n_workers, elements=self.n_elements, blocks=plan.blocks,
            exponent=plan.exponent, scale=float(plan.scale), rows=plan.rows, load=plan.load,
            r_min=plan.r_min,
            union_nnz=None if plan.elements is None else int(plan.elements.size),
            max_column=plan.max_column,
            cells=None if plan.rows is None else plan.rows * B, peeled=peeled,
            unpeeled=unpeeled, rounds=rounds, index_bytes=index_bytes,
            sketch_bytes=sketch_bytes, fallback_bytes=fallback_bytes,
            total_bytes=index_bytes + sketch_bytes + fallback_bytes + dense_round_bytes,
            dense_bytes=4 * self.n_elements, path=plan.path,
            requested_path=plan.requested_path, dense_round_bytes=dense_round_bytes,
            predicted_unpeeled=plan.predicted_unpeeled)
        return result, stats

    @staticmethod
    def _need(value, step):
        if value is None:
            raise RuntimeError(f"call {step}() first")
        return value


def allreduce(tensors, *, load: float = DEFAULT_LOAD, r_min: int = 1, path: str = "sketch"):
    """Sum the workers' tensors through the lossless homomorphic sketch (or densely).

    Parameters
    ----------
    tensors : sequence of array_like
        One float32 tensor per worker (1..1024 workers: the sum is what one aggregator,
        or a tree of them, gives), all the same shape, any length.
    load : float
        Target non-zeros per sketch cell (``r = ceil(max column / load)``), default 0.7.
    r_min : int
        Minimum number of sketch rows.
    path : {"sketch", "dense", "auto"}
        ``"sketch"`` (default): index, sketch and fallback rounds. ``"dense"``: one
        exponent round and a dense int32 round, no index. ``"auto"``: the index round, then
        whichever of sketch + fallback or the dense round sends fewer bytes
        (:func:`choose_path`). The result is the same bits on every path.

    Returns
    -------
    result : numpy.ndarray of float32
        ``dequantize(sum_w quantize(x_w, f), f)`` bit for bit, in the input shape.
    stats : LhcStats
        path, rows, load, union size, peeled / unpeeled, rounds, bytes per worker per phase.

    Raises
    ------
    ValueError
        No tensor or more than 1024, shapes differ, NaN/Inf, a magnitude >= 2**127, bad
        ``load`` / ``r_min`` / ``path``.
    """
    tensors = list(tensors)
    _check_workers(len(tensors))
    _check_path(path)
    shapes = {np.shape(t) for t in tensors}
    if len(shapes) != 1:
        raise ValueError(f"all workers' tensors must have the same shape, got {sorted(shapes)}")
    n = len(tensors)
    workers = [LhcWorker(t, n, load=load, r_min=r_min, name=f"worker {w}'s tensor", path=path)
               for w, t in enumerate(tensors)]
    merged = aggregate_index([w.phase_a_words for w in workers])
    e_max = aggregate_exponent([w.exponent for w in workers])
    plan = make_plan(merged, e_max, n, workers[0].n_elements, load=load, r_min=r_min,
                     path=path)
    if plan.path == "dense":
        total = aggregate_sketch([w.dense_phase(merged, e_max, plan) for w in workers])
        return workers[0].finish(total)
    sketch_sum = aggregate_sketch([w.sketch_phase(merged, e_max, plan) for w in workers])
    peeling = peel(sketch_sum, plan.elements, plan.rows, plan.blocks)
    fallback_sum = aggregate_sketch([w.fallback_phase(sketch_sum, peeling) for w in workers])
    return workers[0].finish(fallback_sum)


# ---------------------------------------------------------------------------------------
# argument checks

def _check_workers(n_workers):
    """``n_workers`` is the number of workers in the sum (the scale's ``n``): beyond
    :data:`MAX_TREE_WORKERS` the int32 budget per worker, ``(2**31 - 1) / n``, is left
    without room for that many."""
    if isinstance(n_workers, bool) or int(n_workers) != n_workers \
            or not 1 <= n_workers <= MAX_TREE_WORKERS:
        raise ValueError(f"number of workers must be 1..{MAX_TREE_WORKERS}, got "
                         f"{n_workers!r}: the integer scale leaves room in int32 for the sum "
                         f"over at most {MAX_TREE_WORKERS} workers (every worker of a tree of "
                         f"aggregators, {MAX_WORKERS} x {MAX_WORKERS})")


def _check_load(load, r_min):
    if isinstance(load, bool) or not isinstance(load, (int, float, np.integer, np.floating)) \
            or not (math.isfinite(load) and load > 0):
        raise ValueError(f"load must be a finite positive number, got {load!r}")
    if isinstance(r_min, bool) or int(r_min) != r_min or r_min < 1:
        raise ValueError(f"r_min must be an integer >= 1, got {r_min!r}")


def _check_path(path):
    if path not in PATHS:
        raise ValueError(f"path must be one of {', '.join(map(repr, PATHS))}, not {path!r}")
    return path


def _check_same_length(vectors, what):
    if not vectors:
        raise ValueError(f"no {what} to aggregate")
    sizes = {v.shape for v in vectors}
    if len(sizes) != 1:
        raise ValueError(f"{what} differ in shape: {sorted(sizes)}")
