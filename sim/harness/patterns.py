"""Seeded input-gap and output-back-pressure patterns, and the options of one exchange.

Both Verilator transports apply the same patterns: the cocotb bridge (``sim/bridge.py``)
through cocotbext-axi's pause hooks and the compiled harness (``sim/harness/harness.cpp``)
in its C++ clock loop. This module is the definition; the C++ side reimplements
:func:`splitmix64` and :meth:`PausePattern.paused` and ``tests/sim/harness/test_harness.py`` checks
that both give the same sequence.

A pattern is counter-based: whether the port pauses in the cycle after the exchange's
``c``-th clock edge is a pure function of ``(seed, side, c)``, so nothing depends on the
order in which simulator callbacks run, and a pattern can be evaluated anywhere without
replaying it. With ``burst = b`` the decision is drawn once per run of ``b`` cycles
(gaps and stalls come in bursts, as behind a DMA engine or a congested link).

The exchange options (keyword arguments of ``Transport.exchange``):

``seed`` (int, default 0)
    Seeds both patterns.
``pause_in`` / ``pause_out`` (float in [0, 1], default 0)
    Probability that the input source inserts a gap / the output sink holds ``tready`` low
    (1.0: always: the sink never takes a beat).
``burst_in`` / ``burst_out`` (int >= 1, default 1)
    Cycles per pause decision.
``idle`` (int >= 1, default 64)
    The exchange ends once every input beat was taken and the design has been quiet this
    many cycles: no handshake on the stream and no output beat waiting.
``max_cycles`` (int >= 1, default 10,000,000)
    Cycle budget: an exchange still running after it fails with a clear error.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MASK64", "splitmix64", "PausePattern", "ExchangeOptions", "IN", "OUT"]

MASK64 = (1 << 64) - 1
#: ``side`` of the input (source) and output (sink) pattern of a stream
IN, OUT = 1, 2


def splitmix64(x: int) -> int:
    """One output of SplitMix64 (Steele, Lea and Flood) for state ``x``: a 64-bit mixer
    with a full-period increment; the reference for the C++ ``splitmix64``."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def _threshold(probability: float) -> int:
    # Paused when the top 32 bits of the hash are below this: exact for 0 and 1.
    return min(1 << 32, round(probability * (1 << 32)))


@dataclass(frozen=True)
class PausePattern:
    """Whether one side of one stream pauses, cycle by cycle.

    Parameters
    ----------
    seed : int
        The exchange's seed (any integer; taken modulo 2^64).
    side : int
        :data:`IN` or :data:`OUT`.
    probability : float
        Fraction of pause decisions that pause, in [0, 1].
    burst : int
        Cycles per decision.
    """
    seed: int
    side: int
    probability: float
    burst: int = 1

    @property
    def key(self) -> int:
        return splitmix64(((self.seed & MASK64) * 4 + self.side) & MASK64)

    @property
    def threshold(self) -> int:
        return _threshold(self.probability)

    def paused(self, cycle: int) -> bool:
        """Pause in the cycle after the exchange's ``cycle``-th clock edge (``cycle >= 1``);
        before the first edge nothing pauses."""
        if cycle < 1 or self.threshold == 0:
            return False
        return (splitmix64(self.key ^ splitmix64((cycle - 1) // self.burst)) >> 32) < self.threshold

    def sequence(self, n: int) -> bytes:
        """``paused(1) .. paused(n)`` as bytes of 0/1 (what the C++ side is checked against)."""
        return bytes(self.paused(c) for c in range(1, n + 1))


@dataclass(frozen=True)
class ExchangeOptions:
    """The validated options of one exchange (see the module docstring)."""
    seed: int = 0
    pause_in: float = 0.0
    pause_out: float = 0.0
    burst_in: int = 1
    burst_out: int = 1
    idle: int = 64
    max_cycles: int = 10_000_000

    @classmethod
    def from_dict(cls, options: dict) -> "ExchangeOptions":
        """Check ``options`` (the keyword arguments of an exchange); raise ``ValueError`` on
        an unknown name or a value out of range."""
        unknown = set(options) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown exchange option(s) {', '.join(sorted(unknown))}; "
                             f"known: {', '.join(cls.__dataclass_fields__)}")
        o = cls(**options)
        if not isinstance(o.seed, int) or isinstance(o.seed, bool):
            raise ValueError(f"seed must be an integer, not {o.seed!r}")
        for name in ("pause_in", "pause_out"):
            value = getattr(o, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], not {value!r}")
        for name, top in (("burst_in", 1 << 32), ("burst_out", 1 << 32), ("idle", 1 << 32),
                          ("max_cycles", 1 << 62)):
            value = getattr(o, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < top:
                raise ValueError(f"{name} must be an integer in 1..{top - 1}, not {value!r}")
        return o

    def pattern(self, side: int) -> PausePattern:
        if side == IN:
            return PausePattern(self.seed, IN, float(self.pause_in), self.burst_in)
        return PausePattern(self.seed, OUT, float(self.pause_out), self.burst_out)
