"""cocotb benches of :class:`hdl.crypto.siphash.SipHash24` on Verilator (the component's own
Verilog, ``i__*``, ``key__*`` and ``o__*`` ports; it is in no exported top yet).

One driver runs every clock: it presents the next word and the next key unless an idle
draw says wait (a presented item stays valid until taken), draws the output's ready, and
reads the handshakes once the clock's values have settled (``ReadOnly``), so each word,
key and tag is stamped with the clock it was taken in. The tags are compared with the
reference implementation's vectors and with :func:`host.golden.siphash.siphash24`; with
no gaps and no back-pressure the clocks too are checked, against
:func:`hdl.crypto.siphash.message_cycles`.

Launched from ``tests/hdl/crypto/test_siphash_verilator.py``; parameters through
:func:`sim.runner.test_params`: ``seed``, ``p_stall`` / ``p_key_stall`` (probability of an
idle clock before a word / a key), ``p_block`` (of a clock with the output not ready),
and for ``random_messages`` ``count`` and ``max_bytes``.
"""
from __future__ import annotations

import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, ReadOnly, RisingEdge

from hdl.crypto.siphash import WORD_LAYOUT, message_cycles, word_payloads
from host.golden.siphash import REFERENCE_KEY, REFERENCE_TAGS, reference_message, siphash24
from sim.runner import test_params

#: Clocks without a tag after which the bench gives up (a message of 300 bytes takes 82).
STALL_LIMIT = 20_000


async def start(dut):
    cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
    dut.i__valid.value = 0
    dut.key__valid.value = 0
    dut.o__ready.value = 0
    dut.rst.value = 1
    await ClockCycles(dut.clk, 3)
    dut.rst.value = 0
    await RisingEdge(dut.clk)


async def drive(dut, messages, keys, rng, *, p_stall=0.0, p_key_stall=0.0, p_block=0.0):
    """Hash ``messages`` under ``keys`` (bytes); return the tags and the clock (counted
    from the first one driven) each message's first word, key and tag were taken."""
    words = [(n, WORD_LAYOUT.const(word).as_value().value)
             for n, message in enumerate(messages)
             for word in word_payloads(message, filler=rng)]
    key_values = [int.from_bytes(key, "little") for key in keys]
    tags, tag_cycles, key_cycles, first_word_cycles = [], [], [], {}
    w = k = cycle = 0
    word_on = key_on = False
    idle = 0
    while len(tags) < len(messages):
        if not word_on and w < len(words) and rng.random() >= p_stall:
            word_on = True
            dut.i__payload.value = words[w][1]
        if not key_on and k < len(key_values) and rng.random() >= p_key_stall:
            key_on = True
            dut.key__payload.value = key_values[k]
        dut.i__valid.value = int(word_on)
        dut.key__valid.value = int(key_on)
        o_ready = rng.random() >= p_block
        dut.o__ready.value = int(o_ready)
        await ReadOnly()
        took_word = word_on and int(dut.i__ready.value)
        took_key = key_on and int(dut.key__ready.value)
        tag = int(dut.o__payload.value) if o_ready and int(dut.o__valid.value) else None
        await RisingEdge(dut.clk)
        if took_word:
            first_word_cycles.setdefault(words[w][0], cycle)
            w, word_on = w + 1, False
        if took_key:
            key_cycles.append(cycle)
            k, key_on = k + 1, False
        if tag is not None:
            tags.append(tag)
            tag_cycles.append(cycle)
            idle = 0
        idle += 1
        assert idle < STALL_LIMIT, f"no tag for {STALL_LIMIT} clocks ({len(tags)} so far)"
        cycle += 1
    return {"tags": tags, "tag_cycles": tag_cycles, "key_cycles": key_cycles,
            "first_word_cycles": [first_word_cycles[n] for n in range(len(messages))]}


def check_clocks(got, lengths):
    """Without gaps or back-pressure: a round every clock, ``message_cycles`` per message."""
    first = got["first_word_cycles"][0]
    busy = 0
    for n, length in enumerate(lengths):
        assert got["key_cycles"][n] == first + busy + 1, f"message {n}: key"
        busy += message_cycles(length)
        assert got["tag_cycles"][n] == first + busy + 1, \
            f"message {n} ({length} bytes): tag at clock {got['tag_cycles'][n]}, " \
            f"want {first + busy + 1}"


@cocotb.test()
async def reference_vectors(dut):
    """The reference implementation's 64 vectors, back to back."""
    params = test_params()
    rng = random.Random(params.get("seed", 1))
    await start(dut)
    lengths = list(range(64))
    got = await drive(dut, [reference_message(n) for n in lengths], [REFERENCE_KEY] * 64,
                      rng, p_stall=params.get("p_stall", 0.0),
                      p_key_stall=params.get("p_key_stall", 0.0),
                      p_block=params.get("p_block", 0.0))
    for n, (tag, want) in enumerate(zip(got["tags"], REFERENCE_TAGS)):
        assert tag == want, f"vector {n}: tag {tag:#018x}, want {want:#018x}"
    if not any(params.get(p, 0.0) for p in ("p_stall", "p_key_stall", "p_block")):
        check_clocks(got, lengths)
        dut._log.warning("64 vectors in %d clocks, %d by the formula",
                         got["tag_cycles"][-1] - got["first_word_cycles"][0] - 1,
                         sum(message_cycles(n) for n in lengths))


@cocotb.test()
async def random_messages(dut):
    """Random keys and lengths against the host implementation."""
    params = test_params()
    seed = params["seed"]
    rng = random.Random(seed)
    await start(dut)
    count, max_bytes = params.get("count", 100), params.get("max_bytes", 300)
    lengths = [rng.randrange(max_bytes + 1) for _ in range(count)]
    messages = [rng.randbytes(n) for n in lengths]
    keys = [rng.randbytes(16) for _ in range(count)]
    got = await drive(dut, messages, keys, rng, p_stall=params.get("p_stall", 0.3),
                      p_key_stall=params.get("p_key_stall", 0.3),
                      p_block=params.get("p_block", 0.3))
    for n, (tag, key, message) in enumerate(zip(got["tags"], keys, messages)):
        want = siphash24(key, message)
        assert tag == want, (f"message {n} ({len(message)} bytes, seed {seed}): "
                             f"tag {tag:#018x}, want {want:#018x}")
