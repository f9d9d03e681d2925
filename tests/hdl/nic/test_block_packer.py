# amaranth: UnusedElaboratable=no
"""The block packer: eight encoded lanes into the golden model's blocks."""

import numpy as np
import pytest

from hdl.nic.block_packer import BlockPacker
from hdl.nic.layouts import TAG_BYTES
from host.golden.inceptionn import codes, encode
from sim.nic_stimulus import gradient_words, nasty_words, random_words, raw_words

LANES = 8

from tests.amaranth_sim import run_stream

# -- block packer ----------------------------------------------------------------------------

def encoded_beats(words, k):
    """EncodedBeat payloads for the packer, from golden codes."""
    tags, code_words = codes(words, k)
    beats = []
    for b in range(0, words.size, LANES):
        n = min(LANES, words.size - b)
        lanes = []
        for j in range(LANES):
            t = int(tags[b + j]) if j < n else 0
            c = int(code_words[b + j]) if j < n else 0
            lanes.append({"tag": t, "payload": c, "width": TAG_BYTES[t]})
        beats.append({"lanes": lanes, "raw": 0, "empty": 0, "keep": 0, "last": 0})
    return beats


@pytest.mark.parametrize("seed", [1, 2])
def test_block_packer_blocks_match_golden(seed):
    rng = np.random.default_rng(seed)
    k = 10
    words = np.concatenate([gradient_words(rng, 200, 1e-3), raw_words(rng, 40),
                            np.zeros(24, dtype=np.uint32), nasty_words(k), random_words(rng, 5)])
    beats = encoded_beats(words, k)
    raw_word = [int(w) for w in random_words(rng, 8)]
    beats.insert(3, {"lanes": [{"tag": 3, "payload": w, "width": 4} for w in raw_word],
                     "raw": 1, "empty": 0, "keep": 0xFFF, "last": 1})
    dut = BlockPacker()
    got = run_stream(dut, beats, lambda ctx, b: ctx.set(dut.i.p, b),
                     lambda p: (int(p.bits), int(p.width), int(p.raw), int(p.keep), int(p.last)),
                     len(beats), seed=seed)
    values = [words[b:b + LANES] for b in range(0, words.size, LANES)]
    values.insert(3, None)
    for i, ((bits, width, raw, keep, last), v) in enumerate(zip(got, values)):
        if v is None:
            assert (raw, keep, last, width) == (1, 0xFFF, 1, 32)
            assert bits & ((1 << 256) - 1) == sum(w << 32 * j for j, w in enumerate(raw_word))
            continue
        want = encode(v, k)   # one block, padded to 32 bits
        block = bits.to_bytes(34, "little")[:width]
        assert want[:width] == block and not any(want[width:]), f"block {i}"
        assert len(want) == -(-width // 4) * 4
        assert bits >> (8 * width) == 0, "bits above the block width must be zero"
