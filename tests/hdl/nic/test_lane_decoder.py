# amaranth: UnusedElaboratable=no
"""The lane decoder against the golden model (exhaustively over the 8-bit codes), and
encoder + decoder idempotence."""

import numpy as np
import pytest

from hdl.nic.lane_decoder import LaneDecoder
from host.golden.inceptionn import codes, decode
from sim.nic_stimulus import nasty_words, random_words

LANES = 8

from sim.nic_stimulus import stream_bytes
from tests.amaranth_sim import comb_eval

# -- lane decoder ----------------------------------------------------------------------------

def decoder_cases(k, rng):
    """(tag, code) pairs: every 8-bit code, a spread of 16-bit codes (each leading-one
    position with several low patterns, both signs), random raw words, tag 00."""
    cases = [(1, c) for c in range(256)]
    p16 = {0, 1, 0x7FFF} | {(1 << lead) | low for lead in range(15)
                            for low in (0, (1 << lead) - 1, int(rng.integers(0, 1 << 15)) & ((1 << lead) - 1))}
    cases += [(2, (s << 15) | p) for p in sorted(p16) for s in (0, 1)]
    cases += [(3, int(w)) for w in random_words(rng, 40)] + [(3, int(w)) for w in nasty_words(k)]
    cases += [(0, 0)] * 8
    return cases


@pytest.mark.parametrize("k", [1, 2, 7, 8, 10, 15])
def test_lane_decoder_matches_golden(k):
    rng = np.random.default_rng(100 + k)
    cases = decoder_cases(k, rng)
    cases += [(0, 0)] * (-len(cases) % LANES)
    tags = np.array([t for t, _ in cases], dtype=np.uint8)
    code_words = np.array([c for _, c in cases], dtype=np.uint32)
    want = decode(stream_bytes(tags, code_words), len(cases), k).view(np.uint32)
    dut = LaneDecoder()

    def apply(ctx, case):
        ctx.set(dut.tag, case[0])
        ctx.set(dut.payload, case[1])
        ctx.set(dut.k, k)

    got = comb_eval(dut, cases, apply, lambda ctx: ctx.get(dut.value))
    for (tag, code), g, w in zip(cases, got, want):
        assert g == int(w), f"k={k} tag {tag} code {code:#x}: got {g:#010x}, golden {int(w):#010x}"


def test_lane_encoder_decoder_idempotent():
    """Decoding then encoding again gives the same codes (the spec's idempotence)."""
    k = 9
    rng = np.random.default_rng(5)
    words = np.concatenate([nasty_words(k), random_words(rng, 200)])
    tags, code_words = codes(words, k)
    dec = LaneDecoder()

    def apply(ctx, case):
        ctx.set(dec.tag, int(case[0]))
        ctx.set(dec.payload, int(case[1]))
        ctx.set(dec.k, k)

    decoded = comb_eval(dec, list(zip(tags, code_words)), apply, lambda ctx: ctx.get(dec.value))
    tags2, codes2 = codes(np.array(decoded, dtype=np.uint32), k)
    keep = tags != 0   # tag 00 decodes to +0.0, which encodes to tag 00 again
    assert np.array_equal(tags2, tags) and np.array_equal(codes2[keep], code_words[keep])
