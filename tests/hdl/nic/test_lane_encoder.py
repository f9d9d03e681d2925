# amaranth: UnusedElaboratable=no
"""The lane encoder against the golden model, over every class boundary and every k."""

import numpy as np
import pytest

from hdl.nic.lane_encoder import LaneEncoder
from hdl.nic.layouts import TAG_BYTES
from host.golden.inceptionn import codes
from sim.nic_stimulus import gradient_words, nasty_words, random_words

LANES = 8

from tests.amaranth_sim import comb_eval

# -- lane encoder ----------------------------------------------------------------------------

@pytest.mark.parametrize("k", range(1, 16))
def test_lane_encoder_matches_golden(k):
    rng = np.random.default_rng(k)
    words = np.concatenate([nasty_words(k), random_words(rng, 300),
                            gradient_words(rng, 300, scale=2.0 ** -k)])
    want_tags, want_codes = codes(words, k)
    dut = LaneEncoder()

    def apply(ctx, word):
        ctx.set(dut.value, int(word))
        ctx.set(dut.k, k)

    got = comb_eval(dut, words, apply, lambda ctx: (ctx.get(dut.code.tag),
                                                    ctx.get(dut.code.payload),
                                                    ctx.get(dut.code.width)))
    for word, tag, code, (g_tag, g_payload, g_width) in zip(words, want_tags, want_codes, got):
        assert (g_tag, g_payload, g_width) == (tag, code, TAG_BYTES[int(tag)]), \
            f"k={k} word {int(word):#010x}: got tag {g_tag} payload {g_payload:#x} width " \
            f"{g_width}, golden tag {tag} code {int(code):#x}"
    # every class occurs, so the comparison covers all four branches
    assert set(int(t) for t in want_tags) == ({0, 1, 3} if k <= 7 else {0, 1, 2, 3})
