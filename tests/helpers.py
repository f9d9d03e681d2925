"""Helpers the tests share: a fresh random generator (its seed printed, so a failure can be
replayed), the raw bits of fp32 values, and a ``gradwire board serve`` process."""
from __future__ import annotations

import secrets
from pathlib import Path

import numpy as np

from host.board.process import start_module

__all__ = ["REPO", "fresh_rng", "bits", "serve_board"]

REPO = Path(__file__).resolve().parents[1]


def fresh_rng():
    """A generator from a fresh seed; the seed is printed (pytest shows it on failure)."""
    seed = secrets.randbits(32)
    print(f"seed {seed}")
    return np.random.default_rng(seed)


def bits(a):
    """The raw bits of fp32 values (for bit-exact comparisons)."""
    return np.asarray(a, np.float32).view(np.uint32)


def serve_board(*args, timeout=60.0):
    """A ``gradwire board serve ARGS`` process and the lines it printed up to its ``ready``
    line (:func:`host.board.process.start_module`: killed, with what it printed, when no
    ``ready`` comes within ``timeout`` s)."""
    return start_module(["host.cli", "board", "serve", *args], timeout=timeout, cwd=REPO)
