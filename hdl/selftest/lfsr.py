"""Leap-forward Galois LFSRs: many fresh pseudo-random bits per clock for self-test traffic.

A Galois LFSR step is linear over GF(2), so ``steps`` single-bit steps are one ``width x
width`` bit matrix. :class:`LFSR` computes that matrix at elaboration time and applies it in
one clock: every state bit becomes the XOR of the few state bits the matrix selects. With
``steps == width`` each advance yields ``width`` bits that no earlier output contained.

The generator only advances on its ``advance`` strobe, never on its own: the self-test
relies on that to replay the exact same sequence in a checker that consumes beats at a
different time than the source emitted them (same seed, same number of advances, same
values, whatever the stalls in between).

:func:`lfsr_step` and :func:`lfsr_advance` are the bit-serial software reference.
"""
from amaranth import Cat, Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["MAXIMAL_TAPS", "galois_mask", "lfsr_step", "lfsr_advance", "LFSR"]

#: Taps of maximal-length polynomials (Xilinx XAPP052, table 3): the exponents of
#: x^t in the feedback polynomial besides x^0; the period of a width-n LFSR is 2^n - 1.
MAXIMAL_TAPS = {
    8: (8, 6, 5, 4),
    16: (16, 15, 13, 4),
    24: (24, 23, 22, 17),
    31: (31, 28),
    32: (32, 22, 2, 1),
    48: (48, 47, 21, 20),
    64: (64, 63, 61, 60),
}


def galois_mask(width):
    """The XOR mask of a right-shifting Galois LFSR of ``width`` bits (maximal length)."""
    if width not in MAXIMAL_TAPS:
        raise ValueError(f"No maximal-length polynomial is tabulated for an LFSR of width "
                         f"{width!r}; choose one of {sorted(MAXIMAL_TAPS)}")
    mask = 0
    for tap in MAXIMAL_TAPS[width]:
        mask |= 1 << (tap - 1)
    return mask


def lfsr_step(state, width):
    """One bit-serial step of the right-shifting Galois LFSR (the reference)."""
    out = state & 1
    state >>= 1
    if out:
        state ^= galois_mask(width)
    return state


def lfsr_advance(state, width, steps):
    """``steps`` single-bit steps of :func:`lfsr_step`: what one hardware advance does."""
    for _ in range(steps):
        state = lfsr_step(state, width)
    return state


def _leap_matrix(width, steps):
    """For every next-state bit, the set of current-state bits whose XOR it is."""
    # The step is linear, so the image of basis vector j tells which output bits state bit
    # j feeds; transposing that gives each output bit's inputs.
    sources = [[] for _ in range(width)]
    for j in range(width):
        image = lfsr_advance(1 << j, width, steps)
        for i in range(width):
            if image >> i & 1:
                sources[i].append(j)
    return sources


class LFSR(wiring.Component):
    """A maximal-length Galois LFSR that takes ``steps`` steps whenever ``advance`` is high.

    Parameters
    ----------
    width : int
        State width in bits; must have a tabulated maximal polynomial (:data:`MAXIMAL_TAPS`).
    seed : int
        Reset state, ``1 .. 2**width - 1`` (the all-zero state never leaves itself).
    steps : int
        Single-bit steps per advance, ``1 ..``; default ``width`` (all-new bits each time).

    Attributes
    ----------
    advance : In(1)
        Take ``steps`` steps at the next clock edge.
    value : Out(width)
        The current state (registered; changes only after an ``advance``).
    """

    def __init__(self, *, width=32, seed=1, steps=None):
        galois_mask(width)   # checks the width
        steps = width if steps is None else steps
        if not isinstance(steps, int) or steps < 1:
            raise ValueError(f"LFSR steps per advance must be a positive integer, not {steps!r}")
        if not isinstance(seed, int) or not 0 < seed < (1 << width):
            raise ValueError(f"LFSR seed must be in 1..{(1 << width) - 1} for width {width}, "
                             f"not {seed!r} (zero is a fixed point)")
        self.width, self.seed, self.steps = width, seed, steps
        super().__init__({
            "advance": In(1),
            "value": Out(width, init=seed),
        })

    def elaborate(self, platform):
        m = Module()
        state = self.value
        with m.If(self.advance):
            for i, sources in enumerate(_leap_matrix(self.width, self.steps)):
                m.d.sync += state[i].eq(Cat(state[j] for j in sources).xor())
        return m
