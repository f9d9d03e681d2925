"""SipHash-2-4 over a stream of 64-bit words, one SipRound per clock.

``docs/protocol/network.md`` section 7 tags datagrams with SipHash-2-4 (Aumasson and
Bernstein, 2012). :class:`SipHash24` computes it as a datagram's words arrive: a message is
a packet of 64-bit words (byte 0 of the eight in bits 7..0, as the header beat's bytes),
the last word saying how many of its bytes belong to the message; the final block (the
0..7 remaining bytes and the length modulo 256 in its top byte) is formed here, so the
producer never needs the length in advance. The key of each message comes on a stream of
its own, one key per message, so that a key looked up from the header (a job's key) can
arrive after the first word; a fixed key (the control key) is that stream held valid.

Cycles (``c`` compression rounds, ``d`` finalization rounds; 2 and 4 for SipHash-2-4). A
message of ``n`` bytes is ``n // 8 + 1`` blocks (its whole words, then the final block:
a partial last word carries it, a whole last word is followed by a block of the length
alone), and the engine spends exactly one clock per SipRound on it::

    clocks per message   = c * (n // 8 + 1) + d              (2 * (n // 8) + 6 for 2-4)
    clocks per 8-byte word = c                               (2: a word every 2 clocks)
    input words          = max(1, ceil(n / 8))               (the empty message is one
                                                              word of 0 bytes)
    latency              = clocks per message + 1             (first word taken -> tag
                                                              valid, engine idle, key there)

Rounds never wait for each other: the next message's first block starts the clock after
the previous one's last finalization round, and a word is taken the same clock its
predecessor's last round runs, so with words and keys always there and the tag always
taken, the engine runs a round every clock. At 75 MHz that is 300 MB/s of message, 2.4
times the 125 MB/s of a 1 Gb/s port: a datagram's tag takes at most 42 % of the datagram's
time on the wire (a 32-byte datagram: 14 clocks, 187 ns, against 784 ns with its
Ethernet, IP and UDP overhead). A tag that is not taken holds the engine in its last
finalization round (nothing is lost); the word buffer and the key stream hold the rest.

One SipRound is combinational between the state registers (two 64-bit additions in
series on each path, carry chains on the ECP5), so the clock is what that allows.
"""
import enum

from amaranth import C, Cat, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["WORD_LAYOUT", "KEY_BITS", "TAG_BITS", "SipHash24", "sipround", "message_blocks",
           "message_words", "message_cycles", "word_payloads"]

#: One input word: up to 8 message bytes (byte 0 in bits 7..0) and, on the last word of a
#: message, how many of them belong to it (0..8; read on the last word only: every other
#: word is whole; 9..15 count as 8).
WORD_LAYOUT = data.StructLayout({"data": unsigned(64), "bytes": unsigned(4), "last": 1})
#: The key: its 16 bytes as a little-endian integer (byte 0 in bits 7..0), so ``k0`` is bits
#: 63..0 and ``k1`` bits 127..64, as the reference implementation reads a 16-byte key.
KEY_BITS = 128
#: The tag as an integer; its 8 bytes on the wire are its little-endian form.
TAG_BITS = 64

# "somepseudorandomlygeneratedbytes", XORed with the key to start v0..v3.
_INIT = (0x736F6D6570736575, 0x646F72616E646F6D, 0x6C7967656E657261, 0x7465646279746573)


def sipround(v0, v1, v2, v3):
    """One SipRound as Amaranth expressions (``network.md`` section 7's listing): the
    additions wrap modulo 2**64, the rotations are wiring."""
    v0 = (v0 + v1)[:64]
    v1 = v1.rotate_left(13) ^ v0
    v0 = v0.rotate_left(32)
    v2 = (v2 + v3)[:64]
    v3 = v3.rotate_left(16) ^ v2
    v0 = (v0 + v3)[:64]
    v3 = v3.rotate_left(21) ^ v0
    v2 = (v2 + v1)[:64]
    v1 = v1.rotate_left(17) ^ v2
    v2 = v2.rotate_left(32)
    return v0, v1, v2, v3


def message_blocks(n_bytes):
    """How many blocks SipHash compresses for a message of ``n_bytes``."""
    _check_length(n_bytes)
    return n_bytes // 8 + 1


def message_words(n_bytes):
    """How many input words carry a message of ``n_bytes`` (an empty one takes one)."""
    _check_length(n_bytes)
    return max(1, -(-n_bytes // 8))


def message_cycles(n_bytes, c=2, d=4):
    """Clocks :class:`SipHash24` spends on a message of ``n_bytes`` (one per SipRound)."""
    return c * message_blocks(n_bytes) + d


def word_payloads(message, *, filler=None):
    """A message as :data:`WORD_LAYOUT` payloads (dicts for ``ctx.set``), last one marked.

    ``filler`` (a ``random.Random``) fills the bytes past the message's end in its last
    word with random bytes, as a producer that does not clear them would; default zeros.
    """
    message = bytes(message)
    words = []
    count = message_words(len(message))
    for w in range(count):
        chunk = message[8 * w:8 * w + 8]
        pad = 8 - len(chunk)
        tail = bytes(filler.getrandbits(8) for _ in range(pad)) if filler else bytes(pad)
        last = w == count - 1
        words.append({"data": int.from_bytes(chunk + tail, "little"),
                      "bytes": len(chunk) if last else 8, "last": int(last)})
    return words


def _check_length(n_bytes):
    if not isinstance(n_bytes, int) or n_bytes < 0:
        raise ValueError(f"a message length is a non-negative integer, not {n_bytes!r}")


class _Phase(enum.Enum):
    BLOCK = 0       # rounds on the word in the buffer
    LENGTH = 1      # rounds on the length-only block after a whole last word
    FINAL = 2       # finalization rounds


class SipHash24(wiring.Component):
    """SipHash-2-4 tags of the messages on ``i``, one SipRound per clock.

    Parameters
    ----------
    compression_rounds : int
        SipRounds per block (``c``); 2 for SipHash-2-4.
    finalization_rounds : int
        SipRounds after the last block (``d``); 4 for SipHash-2-4. Other values give
        SipHash-``c``-``d`` (1 and 3: SipHash-1-3); the protocol uses 2 and 4.

    Ports
    -----
    key : In(stream.Signature(unsigned(128)))
        One key per message (:data:`KEY_BITS`), taken when the message's first round runs
        (in the clock after its first word is taken, at the earliest). Hold it valid for a
        fixed key.
    i : In(stream.Signature(WORD_LAYOUT))
        The messages' words; ``last`` ends a message and its ``bytes`` (0..8) says how many
        of its bytes are the message's. Bytes past them may hold anything.
    o : Out(stream.Signature(unsigned(64)))
        One tag per message, in order (registered).
    """

    def __init__(self, *, compression_rounds=2, finalization_rounds=4):
        for name, rounds in (("compression_rounds", compression_rounds),
                             ("finalization_rounds", finalization_rounds)):
            if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1:
                raise ValueError(f"{name} must be a positive integer, not {rounds!r}")
        self._c, self._d = compression_rounds, finalization_rounds
        super().__init__({
            "key": In(stream.Signature(unsigned(KEY_BITS))),
            "i": In(stream.Signature(WORD_LAYOUT)),
            "o": Out(stream.Signature(unsigned(TAG_BITS))),
        })

    @property
    def rounds(self):
        """``(c, d)``: compression and finalization rounds."""
        return self._c, self._d

    def elaborate(self, platform):
        m = Module()
        c, d = self._c, self._d

        v = [Signal(64, name=f"v{j}") for j in range(4)]
        phase = Signal(_Phase)
        rnd = Signal(range(max(c, d)))
        # Set while no round of the current message has run: its first round starts from
        # the key, not from the state left by the previous message.
        start = Signal(init=1)
        # Whole words of the message so far, modulo 32: with the last word's byte count,
        # the length modulo 256 (8 * words + bytes) with no adder.
        words = Signal(5)

        # A one-word buffer in front of the rounds: the word is needed at the first round
        # (v3 ^= m) and after the last (v0 ^= m), and it refills in the clock its last
        # round runs, so it costs no throughput.
        buf = Signal(WORD_LAYOUT)
        buf_valid = Signal()

        # -- the block of this clock ------------------------------------------------------
        whole = ~buf.last | buf.bytes[3]
        kept = buf.bytes[:3]
        # The final block of a partial last word: its bytes, then zeros, the length on top.
        partial = Cat(*[Mux(j < kept, buf.data.word_select(j, 8), 0) for j in range(7)],
                      kept, words)
        length_only = Cat(C(0, 59), words)      # after a whole last word (counted in words)
        block = Signal(64)
        m.d.comb += block.eq(Mux(phase == _Phase.LENGTH, length_only,
                                 Mux(whole, buf.data, partial)))

        # -- one SipRound -----------------------------------------------------------------
        k0, k1 = self.key.p[:64], self.key.p[64:]
        init = [k0 ^ _INIT[0], k1 ^ _INIT[1], k0 ^ _INIT[2], k1 ^ _INIT[3]]
        base = [Mux(start, init[j], v[j]) for j in range(4)]
        compressing = phase != _Phase.FINAL
        first_round = rnd == 0
        last_block_round = rnd == c - 1
        last_final_round = rnd == d - 1
        v3_in = base[3] ^ Mux(compressing & first_round, block, 0)
        v2_in = base[2] ^ Mux(~compressing & first_round, 0xFF, 0)
        r0, r1, r2, r3 = sipround(base[0], base[1], v2_in, v3_in)
        v0_out = r0 ^ Mux(compressing & last_block_round, block, 0)

        # -- when the round may run -------------------------------------------------------
        go = Signal()
        tag_free = ~self.o.valid | self.o.ready
        with m.Switch(phase):
            with m.Case(_Phase.BLOCK):
                m.d.comb += go.eq(buf_valid & (~start | self.key.valid))
            with m.Case(_Phase.LENGTH):
                m.d.comb += go.eq(1)
            with m.Case(_Phase.FINAL):
                # the last round writes the tag: it waits for the output register
                m.d.comb += go.eq(~last_final_round | tag_free)
        m.d.comb += self.key.ready.eq((phase == _Phase.BLOCK) & start & buf_valid)

        consumed = (phase == _Phase.BLOCK) & last_block_round & go
        m.d.comb += self.i.ready.eq(~buf_valid | consumed)
        with m.If(self.i.ready):
            # (the payload loads whether or not a word is there, like hdl/stream's buffers)
            m.d.sync += [buf.eq(self.i.p), buf_valid.eq(self.i.valid)]

        with m.If(self.o.ready):
            m.d.sync += self.o.valid.eq(0)

        with m.If(go):
            m.d.sync += [v[0].eq(v0_out), v[1].eq(r1), v[2].eq(r2), v[3].eq(r3),
                         start.eq(0), rnd.eq(rnd + 1)]
            with m.Switch(phase):
                with m.Case(_Phase.BLOCK):
                    with m.If(last_block_round):
                        m.d.sync += rnd.eq(0)
                        with m.If(whole):
                            m.d.sync += words.eq(words + 1)
                        with m.If(buf.last & whole):
                            m.d.sync += phase.eq(_Phase.LENGTH)
                        with m.Elif(buf.last):
                            m.d.sync += phase.eq(_Phase.FINAL)
                with m.Case(_Phase.LENGTH):
                    with m.If(last_block_round):
                        m.d.sync += [rnd.eq(0), phase.eq(_Phase.FINAL)]
                with m.Case(_Phase.FINAL):
                    with m.If(last_final_round):
                        m.d.sync += [rnd.eq(0), phase.eq(_Phase.BLOCK), start.eq(1),
                                     words.eq(0), self.o.valid.eq(1),
                                     self.o.p.eq(r0 ^ r1 ^ r2 ^ r3)]
        return m
