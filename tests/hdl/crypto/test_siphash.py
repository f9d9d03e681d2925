# amaranth: UnusedElaboratable=no
"""SipHash-2-4 in gateware (``hdl/crypto/siphash.py``) in the Amaranth simulator: bit-exact
against ``host/golden/siphash.py`` on the reference vectors and on random keys and
lengths, under random input gaps, key gaps and output back-pressure; and its clocks,
counted cycle by cycle against :func:`hdl.crypto.siphash.message_cycles`.

(The same vectors on Verilator: ``tests/hdl/crypto/test_siphash_verilator.py``.)
"""
import random
import secrets

import pytest

from hdl.crypto.siphash import SipHash24, message_cycles, message_words, word_payloads
from host.golden.siphash import (
    REFERENCE_KEY,
    REFERENCE_TAGS,
    check_tag,
    reference_message,
    siphash,
    tag_datagram,
)
from tests.amaranth_sim import run


def simulate(dut, messages, keys, *, seed, p_stall=0.0, p_key_stall=0.0, p_block=0.0,
             timeout_cycles=200_000):
    """Send ``messages`` (bytes) with ``keys`` (16 bytes each) into ``dut`` from one
    testbench that counts clocks.

    Each clock the input and the key stream present their next item unless an idle draw
    (``p_stall``, ``p_key_stall``) says wait (once presented, an item stays valid until
    taken), and the output is not ready with probability ``p_block``.

    Returns
    -------
    dict
        ``tags`` (ints, in order); ``word_cycles`` (per message, the clock each word was
        taken); ``key_cycles`` and ``tag_cycles`` (per message, the clock its key was
        taken and its tag taken); clocks count from 0, the first clock of the simulation.
    """
    rng = random.Random(seed)
    c, d = dut.rounds
    words = [(n, word) for n, message in enumerate(messages)
             for word in word_payloads(message, filler=rng)]
    key_values = [int.from_bytes(key, "little") for key in keys]
    result = {"tags": [], "word_cycles": [[] for _ in messages], "key_cycles": [],
              "tag_cycles": []}

    async def bench(ctx):
        w = k = 0
        word_on = key_on = False
        for cycle in range(timeout_cycles):
            if not word_on and w < len(words) and rng.random() >= p_stall:
                word_on = True
                ctx.set(dut.i.p, words[w][1])
            if not key_on and k < len(key_values) and rng.random() >= p_key_stall:
                key_on = True
                ctx.set(dut.key.p, key_values[k])
            ctx.set(dut.i.valid, word_on)
            ctx.set(dut.key.valid, key_on)
            ctx.set(dut.o.ready, rng.random() >= p_block)
            _, _, i_ready, key_ready, o_valid, o_ready, tag = await ctx.tick().sample(
                dut.i.ready, dut.key.ready, dut.o.valid, dut.o.ready, dut.o.p)
            if word_on and i_ready:
                result["word_cycles"][words[w][0]].append(cycle)
                w, word_on = w + 1, False
            if key_on and key_ready:
                result["key_cycles"].append(cycle)
                k, key_on = k + 1, False
            if o_valid and o_ready:
                result["tags"].append(int(tag))
                result["tag_cycles"].append(cycle)
                if len(result["tags"]) == len(messages):
                    return
        raise AssertionError(f"no progress after {timeout_cycles} clocks: "
                             f"{len(result['tags'])} of {len(messages)} tags")

    run(dut, bench)
    assert result["key_cycles"] == sorted(result["key_cycles"])
    assert [len(taken) for taken in result["word_cycles"]] == \
        [message_words(len(message)) for message in messages]
    # c and d are the rounds of the dut: the reference is SipHash-c-d
    assert len(result["tags"]) == len(messages)
    result["want"] = [siphash(key, message, c, d) for key, message in zip(keys, messages)]
    return result


def fresh_seed(label):
    seed = secrets.randbits(32)
    print(f"{label}: seed {seed} (rerun it by putting it in place of fresh_seed)")
    return seed


@pytest.mark.parametrize("p_stall,p_key_stall,p_block", [(0.0, 0.0, 0.0), (0.3, 0.5, 0.3),
                                                         (0.0, 0.0, 0.8)])
def test_reference_vectors(p_stall, p_key_stall, p_block):
    """The 64 vectors of the reference implementation, back to back."""
    messages = [reference_message(n) for n in range(64)]
    got = simulate(SipHash24(), messages, [REFERENCE_KEY] * 64, seed=48, p_stall=p_stall,
                   p_key_stall=p_key_stall, p_block=p_block)
    assert [hex(t) for t in got["tags"]] == [hex(t) for t in REFERENCE_TAGS]


@pytest.mark.parametrize("rounds", [(2, 4), (1, 3)])
def test_random_keys_and_lengths(rounds):
    """Random keys and lengths 0..300 bytes, random gaps and back-pressure, against the
    host implementation (SipHash-1-3 too: the round counts are parameters)."""
    seed = fresh_seed(f"SipHash-{rounds[0]}-{rounds[1]}")
    rng = random.Random(seed)
    count = 60
    lengths = [rng.choice([rng.randrange(301), rng.randrange(17), 8 * rng.randrange(38)])
               for _ in range(count)]
    messages = [rng.randbytes(n) for n in lengths]
    keys = [rng.randbytes(16) for _ in range(count)]
    got = simulate(SipHash24(compression_rounds=rounds[0], finalization_rounds=rounds[1]),
                   messages, keys, seed=seed, p_stall=0.3, p_key_stall=0.3, p_block=0.3)
    for n, (tag, want) in enumerate(zip(got["tags"], got["want"])):
        assert tag == want, (f"message {n} ({lengths[n]} bytes): tag {tag:#018x}, "
                             f"want {want:#018x} (seed {seed})")


@pytest.mark.parametrize("rounds", [(2, 4), (1, 3)])
def test_cycles_back_to_back(rounds):
    """With words, keys and tag readiness always there, the engine runs one round per
    clock: each message takes exactly ``c * (n // 8 + 1) + d`` clocks, words are taken one
    every ``c`` clocks, and the tags follow each other by exactly those clocks."""
    c, d = rounds
    lengths = [0, 1, 7, 8, 9, 15, 16, 63, 64, 100, 256, 300]
    rng = random.Random(3)
    messages = [rng.randbytes(n) for n in lengths]
    keys = [rng.randbytes(16) for _ in lengths]
    got = simulate(SipHash24(compression_rounds=c, finalization_rounds=d), messages, keys,
                   seed=3)
    assert got["tags"] == got["want"]
    first = got["word_cycles"][0][0]
    assert first == 0, "the first word is taken in the first clock"
    busy = 0
    for n, length in enumerate(lengths):
        # the message's first round (which takes its key) runs the clock after the last
        # round of the message before, or after the clock its first word was taken
        start = first + busy + 1
        assert got["key_cycles"][n] == start, f"message {n} ({length} bytes)"
        # its first word waited in the buffer; each next one is taken in the clock the
        # last round of the word before it runs: one word every c clocks
        taken = got["word_cycles"][n]
        assert taken[0] < start
        assert taken[1:] == [start + j * c - 1 for j in range(1, len(taken))], taken
        busy += message_cycles(length, c, d)
        # the tag is registered by the clock edge after the last round
        assert got["tag_cycles"][n] == first + busy + 1, f"message {n} ({length} bytes)"
    total = got["tag_cycles"][-1] - first - 1
    assert total == sum(message_cycles(n, c, d) for n in lengths)
    print(f"SipHash-{c}-{d}: {len(lengths)} messages, {sum(lengths)} bytes, {total} clocks, "
          f"not one idle")


def test_latency_of_one_message():
    """A message alone: tag valid ``message_cycles + 1`` clocks after its first word."""
    for length in (0, 8, 31, 32, 200):
        got = simulate(SipHash24(), [bytes(length)], [bytes(16)], seed=1)
        assert got["tags"] == got["want"]
        latency = got["tag_cycles"][0] - got["word_cycles"][0][0]
        assert latency == message_cycles(length) + 1 == 2 * (length // 8) + 7, length


def test_a_late_key_holds_the_first_word():
    """The key may come after the message's words (looked up from the header): the
    first round waits for it, and nothing is lost."""
    messages = [bytes(range(40)), b"", bytes(9)]
    keys = [bytes(range(16)), bytes(16), bytes(range(16, 32))]
    got = simulate(SipHash24(), messages, keys, seed=9, p_key_stall=0.97)
    assert got["tags"] == got["want"]


def test_a_tag_not_taken_stalls_the_engine_without_loss():
    rng = random.Random(11)
    messages = [rng.randbytes(rng.randrange(40)) for _ in range(12)]
    keys = [rng.randbytes(16) for _ in messages]
    got = simulate(SipHash24(), messages, keys, seed=11, p_block=0.97)
    assert got["tags"] == got["want"]


def test_datagram_tags_with_the_fourth_word_zeroed():
    """Section 7's tag of a datagram: header bytes 24..31 are the fourth 64-bit word, so a
    checker feeds that word as zero and compares the tag with the bytes it replaced."""
    rng = random.Random(24)
    keys = [rng.randbytes(16) for _ in range(8)]
    datagrams = [tag_datagram(key, rng.randbytes(32 + rng.randrange(100))) for key in keys]
    zeroed = [d[:24] + bytes(8) + d[32:] for d in datagrams]
    got = simulate(SipHash24(), zeroed, keys, seed=24, p_stall=0.2, p_block=0.2)
    for key, datagram, tag in zip(keys, datagrams, got["tags"]):
        assert check_tag(key, datagram)
        assert tag.to_bytes(8, "little") == datagram[24:32]


def test_the_word_and_message_counts():
    assert [message_cycles(n) for n in (0, 7, 8, 15, 16, 1500)] == [6, 6, 8, 8, 10, 380]
    assert [message_words(n) for n in (0, 1, 8, 9, 16)] == [1, 1, 1, 2, 2]
    assert word_payloads(b"") == [{"data": 0, "bytes": 0, "last": 1}]
    assert word_payloads(bytes(range(9)))[0]["bytes"] == 8
    with pytest.raises(ValueError, match="non-negative integer, not -1"):
        message_cycles(-1)


@pytest.mark.parametrize("kwargs,message", [
    ({"compression_rounds": 0}, "compression_rounds must be a positive integer, not 0"),
    ({"finalization_rounds": 2.5}, "finalization_rounds must be a positive integer, not 2.5"),
    ({"compression_rounds": True}, "compression_rounds must be a positive integer, not True"),
])
def test_parameters_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SipHash24(**kwargs)
