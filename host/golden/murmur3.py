"""MurmurHash3_x86_32: a scalar reference for any key and a vectorised form for 4-byte keys.

The Lossless Homomorphic Compression sketch (``docs/protocol/lhc-sketch.md`` section 1) hashes
block numbers with ``MurmurHash3_x86_32(key = b as 4 little-endian bytes, seed = j)``.
:func:`murmur3_32_u32` computes that for a whole array of block numbers at once in uint32
NumPy arithmetic (which wraps modulo 2**32 exactly like the C code); :func:`murmur3_32` is
a plain, byte-by-byte transcription of Austin Appleby's ``MurmurHash3_x86_32`` for any key,
used to cross-check the vectorised form.
"""
from __future__ import annotations

import numpy as np

__all__ = ["murmur3_32", "murmur3_32_u32"]

_MASK = 0xFFFFFFFF
_C1 = 0xCC9E2D51
_C2 = 0x1B873593


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK


def _fmix32(h: int) -> int:
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _MASK
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _MASK
    h ^= h >> 16
    return h


def murmur3_32(key: bytes, seed: int = 0) -> int:
    """``MurmurHash3_x86_32(key, len(key), seed)`` as an unsigned 32-bit integer.

    Parameters
    ----------
    key : bytes-like
        The bytes to hash (any length).
    seed : int
        32-bit seed.
    """
    key = bytes(key)
    if not 0 <= seed <= _MASK:
        raise ValueError(f"seed {seed} is not an unsigned 32-bit integer")
    h = seed
    n_blocks = len(key) // 4
    for i in range(n_blocks):
        k = int.from_bytes(key[4 * i:4 * i + 4], "little")
        k = (k * _C1) & _MASK
        k = _rotl32(k, 15)
        k = (k * _C2) & _MASK
        h ^= k
        h = _rotl32(h, 13)
        h = (h * 5 + 0xE6546B64) & _MASK
    tail = key[4 * n_blocks:]
    k = 0
    # The C code's switch falls through from case 3 to case 1.
    if len(tail) >= 3:
        k ^= tail[2] << 16
    if len(tail) >= 2:
        k ^= tail[1] << 8
    if len(tail) >= 1:
        k ^= tail[0]
        k = (k * _C1) & _MASK
        k = _rotl32(k, 15)
        k = (k * _C2) & _MASK
        h ^= k
    h ^= len(key) & _MASK
    return _fmix32(h)


def _rotl32_array(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def murmur3_32_u32(keys, seed: int = 0) -> np.ndarray:
    """MurmurHash3_x86_32 of each key taken as 4 little-endian bytes, vectorised.

    Parameters
    ----------
    keys : array_like of integers
        Values in ``0 .. 2**32 - 1`` (e.g. block numbers).
    seed : int
        32-bit seed.

    Returns
    -------
    numpy.ndarray of uint32, same shape as ``keys``.
    """
    keys = np.asarray(keys)
    if keys.dtype.kind not in "ui":
        raise TypeError(f"keys must be integers, got dtype {keys.dtype}")
    if keys.size and (keys.min() < 0 or keys.max() > _MASK):
        raise ValueError("keys must lie in 0 .. 2**32 - 1")
    if not 0 <= seed <= _MASK:
        raise ValueError(f"seed {seed} is not an unsigned 32-bit integer")
    # uint32 array arithmetic wraps modulo 2**32, as the C code does.
    k = keys.astype(np.uint32)
    k *= np.uint32(_C1)
    k = _rotl32_array(k, 15)
    k *= np.uint32(_C2)
    h = k ^ np.uint32(seed)
    h = _rotl32_array(h, 13)
    h = h * np.uint32(5) + np.uint32(0xE6546B64)
    h ^= np.uint32(4)            # key length in bytes
    h ^= h >> np.uint32(16)
    h *= np.uint32(0x85EBCA6B)
    h ^= h >> np.uint32(13)
    h *= np.uint32(0xC2B2AE35)
    h ^= h >> np.uint32(16)
    return h
