"""Section 7's authenticated control around the control service: tags checked and written.

``docs/protocol/network.md`` section 7: every ``CTRL`` request carries, in header bytes
24..31, a SipHash-2-4 tag under the board's 128-bit control key over the whole datagram
with those bytes zero; the reply carries one over the reply. A request with a wrong tag
is dropped before anything else looks at it (``drop_bad_tag``): nothing it asks for
happens and nothing is sent back.

:class:`CtrlAuth` stands between the request's input buffer and the service's state
machine and between that machine and the reply's output buffer, with one request's worth
of scratch memory (:data:`SCRATCH_BEATS` beats of 256 bits) and one
:class:`hdl.crypto.siphash.SipHash24`, used in turn::

    RECEIVE  the request's beats into the scratch memory (a datagram shorter than a header
             has no tag to check: it goes on, and the service drops it as section 4 says)
    CHECK    its words through SipHash, header word 3 (bytes 24..31) as zero; the tag
             compared with the one it carried: wrong -> dropped (``bad_tag``, ``no_reply``)
    SERVE    its beats to the service; the reply's beats, as they come, into the same
             memory (reply beat k is written when request beat k is taken or later, so no
             request beat is overwritten before it is read), or the service's ``no_reply``
    SIGN     the reply's words through SipHash, bytes 24..31 as zero
    EMIT     the reply out of the memory, the tag in bytes 24..31 of its header beat

A whole reply is in the memory before its first beat leaves, so the tag goes into the
header with no reply buffer of its own, and a reply the output buffer drops whole takes
its tag with it (no queue of tags to get out of step).

Cycles, for a request of ``n`` bytes (``w = ceil(n / 8)`` SipHash words, ``b = ceil(n /
32)`` beats): ``b`` to receive, ``2 w + 6`` to check plus one memory read per beat, then
the service, then the same again to sign the reply and ``2 b`` to emit: at most about 330
clocks (4.4 us at 75 MHz) for the longest request (544 bytes), which takes 4.7 us on a
1 Gb/s wire; the service takes one request at a time (:class:`~hdl.net.front_end.reply.
OneInFlight`) and the input buffer holds the next ones meanwhile.
"""
from __future__ import annotations

from amaranth import Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from contract.header import BEAT_BYTES, HEADER_BYTES
from contract.network import (CTRL_AUTH_KEY_BYTES, CTRL_MAX_PAIRS, CTRL_TAG_BYTES,
                              CTRL_TAG_OFFSET)
from hdl.crypto.siphash import SipHash24
from hdl.net.front_end.layouts import ServiceBeat
from hdl.stream.axis import DATA_BITS, axis_signature

__all__ = ["CTRL_MAX_LENGTH", "SCRATCH_BEATS", "CtrlAuthEvents", "CtrlAuth", "check_auth_key"]

#: The longest request (and reply): a header and 64 pairs.
CTRL_MAX_LENGTH = HEADER_BYTES + 8 * CTRL_MAX_PAIRS
#: Beats of scratch memory: the longest request's, rounded up to a power of two.
SCRATCH_BEATS = 1 << (-(-CTRL_MAX_LENGTH // BEAT_BYTES) - 1).bit_length()
_WORDS_PER_BEAT = DATA_BITS // 64
_TAG_WORD = CTRL_TAG_OFFSET // 8          # header word 3: the tag, hashed as zero
assert CTRL_TAG_OFFSET % 8 == 0 and CTRL_TAG_BYTES == 8

CtrlAuthEvents = data.StructLayout({
    "bad_tag": 1,       # a request with a wrong tag: dropped whole, no reply
})


def check_auth_key(key):
    """``key`` as 16 ``bytes`` if it is section 7's 128-bit control key, else ValueError
    (the key itself is never in the message)."""
    if isinstance(key, (bytes, bytearray)) and len(key) == CTRL_AUTH_KEY_BYTES:
        return bytes(key)
    raise ValueError(f"section 7's control key is {CTRL_AUTH_KEY_BYTES} bytes")


class CtrlAuth(wiring.Component):
    """Checks each ``CTRL`` request's tag before the service sees it; tags each reply.

    Parameters
    ----------
    key : bytes
        The 128-bit control key (16 bytes, byte 0 first), a constant of the bitstream.

    Members
    -------
    i : In(stream.Signature(ServiceBeat))
        Requests, from the input buffer (whole; ``meta.length`` is the datagram's length).
    o : Out(axis_signature())
        Tagged replies.
    service_i : Out(stream.Signature(ServiceBeat))
        Requests whose tag is right (and those too short to carry one), to the service.
    service_o : In(axis_signature())
        The service's reply to the request it was given (always taken).
    service_no_reply : In(1)
        The service ends the request it was given without a reply.
    events : Out(CtrlAuthEvents)
    no_reply : Out(1)
        A request ends here without a reply (its tag was wrong): a strobe.
    """

    def __init__(self, *, key):
        self._key = check_auth_key(key)
        super().__init__({
            "i": In(stream.Signature(ServiceBeat)),
            "o": Out(axis_signature()),
            "service_i": Out(stream.Signature(ServiceBeat)),
            "service_o": In(axis_signature()),
            "service_no_reply": In(1),
            "events": Out(CtrlAuthEvents),
            "no_reply": Out(1),
        })

    def __repr__(self):
        return "CtrlAuth(key=<secret>)"      # the key never goes into logs

    def elaborate(self, platform):
        m = Module()
        i, o = self.i, self.o
        m.submodules.scratch = scratch = Memory(shape=DATA_BITS, depth=SCRATCH_BEATS, init=[])
        write = scratch.write_port()
        read = scratch.read_port()
        m.submodules.siphash = siphash = SipHash24()
        m.d.comb += [siphash.key.valid.eq(1),
                     siphash.key.p.eq(int.from_bytes(self._key, "little"))]

        index_bits = len(write.addr)
        meta = Signal.like(i.p.meta)
        beats = Signal(index_bits + 1)          # of the request, then of the reply
        last_keep = Signal(BEAT_BYTES)          # of the request's, then the reply's, last beat
        carried = Signal(64)                    # the tag the request carried
        tag = Signal(64)                        # the reply's tag
        beat = Signal(DATA_BITS)                # a beat read out of the scratch memory
        position = Signal(index_bits + 1)       # the beat being served or emitted
        # hashing: the message's length in bytes and the word being fed
        length = Signal(range(CTRL_MAX_LENGTH + 1))
        word = Signal(range(SCRATCH_BEATS * _WORDS_PER_BEAT))
        signing = Signal()                      # hashing the reply (else the request)
        # serving: the reply's last beat is in, or the service said none is coming
        answered = Signal()
        silent = Signal()
        reply_beats = Signal(index_bits + 1)

        m.d.comb += read.addr.eq(position)
        m.d.sync += [self.events.eq(0), self.no_reply.eq(0)]

        # -- hashing: scratch beats [0, ceil(length / 8) words), word 3 as zero -----------
        last_word = self._feed(m, siphash, beat, length, word)
        # -- serving: the reply's beats into the memory, in order, as they come ------------
        serving = Signal()
        reply_position = Signal(index_bits + 1)
        reply_keep = Signal(BEAT_BYTES)
        reply_length = self._collect_reply(m, write, serving, reply_position, reply_beats,
                                           reply_keep, answered, silent)
        start_serving = [serving.eq(1), answered.eq(0), silent.eq(0), reply_position.eq(0),
                         position.eq(0)]

        # the beat served or emitted: the last of `beats`, whole but for the last
        is_last = position == beats - 1
        keep = Mux(is_last, last_keep, (1 << BEAT_BYTES) - 1)

        with m.FSM():
            with m.State("RECEIVE"):
                m.d.comb += [i.ready.eq(1), write.addr.eq(position), write.data.eq(i.p.data),
                             write.en.eq(i.valid)]
                with m.If(i.valid):
                    m.d.sync += position.eq(position + 1)
                    with m.If(i.p.first):
                        m.d.sync += [meta.eq(i.p.meta),
                                     carried.eq(i.p.data.word_select(_TAG_WORD, 64))]
                    with m.If(i.p.last):
                        m.d.sync += [beats.eq(position + 1), last_keep.eq(i.p.keep),
                                     length.eq(i.p.meta.length), word.eq(0), signing.eq(0),
                                     position.eq(0)]
                        with m.If(i.p.meta.length < HEADER_BYTES):
                            # nothing to check: the service drops it (section 4's order)
                            m.d.sync += start_serving
                            m.next = "SERVE_READ"
                        with m.Else():
                            m.next = "HASH_READ"
            with m.State("HASH_READ"):
                m.d.comb += read.en.eq(1)
                m.next = "HASH_LATCH"
            with m.State("HASH_LATCH"):
                m.d.sync += beat.eq(read.data)
                m.next = "HASH_WORD"
            with m.State("HASH_WORD"):
                m.d.comb += siphash.i.valid.eq(1)
                with m.If(siphash.i.ready):
                    m.d.sync += word.eq(word + 1)
                    with m.If(last_word):
                        m.next = "HASH_TAG"
                    with m.Elif(word[:2] == _WORDS_PER_BEAT - 1):
                        m.d.sync += position.eq(position + 1)
                        m.next = "HASH_READ"
            with m.State("HASH_TAG"):
                m.d.comb += siphash.o.ready.eq(1)
                with m.If(siphash.o.valid):
                    m.d.sync += position.eq(0)
                    with m.If(signing):
                        m.d.sync += tag.eq(siphash.o.p)
                        m.next = "EMIT_READ"
                    with m.Elif(siphash.o.p == carried):
                        m.d.sync += start_serving
                        m.next = "SERVE_READ"
                    with m.Else():
                        m.d.sync += [self.events.bad_tag.eq(1), self.no_reply.eq(1)]
                        m.next = "RECEIVE"
            with m.State("SERVE_READ"):
                m.d.comb += read.en.eq(1)
                m.next = "SERVE_LATCH"
            with m.State("SERVE_LATCH"):
                m.d.sync += beat.eq(read.data)
                m.next = "SERVE_OFFER"
            with m.State("SERVE_OFFER"):
                m.d.comb += [
                    self.service_i.valid.eq(1),
                    self.service_i.p.data.eq(beat),
                    self.service_i.p.first.eq(position == 0),
                    self.service_i.p.last.eq(is_last),
                    self.service_i.p.keep.eq(keep),
                    self.service_i.p.meta.eq(meta),
                ]
                with m.If(self.service_i.ready):
                    m.d.sync += position.eq(position + 1)
                    with m.If(is_last):
                        m.next = "SERVE_END"
                    with m.Else():
                        m.next = "SERVE_READ"
            with m.State("SERVE_END"):
                with m.If(answered):
                    m.d.sync += [beats.eq(reply_beats), last_keep.eq(reply_keep),
                                 length.eq(reply_length), word.eq(0), signing.eq(1),
                                 position.eq(0), serving.eq(0)]
                    m.next = "HASH_READ"
                with m.Elif(silent):
                    m.d.sync += [serving.eq(0), position.eq(0)]
                    m.next = "RECEIVE"
            with m.State("EMIT_READ"):
                m.d.comb += read.en.eq(1)
                m.next = "EMIT_LATCH"
            with m.State("EMIT_LATCH"):
                # the header beat leaves with the reply's tag in bytes 24..31
                with m.If(position == 0):
                    m.d.sync += beat.eq(Cat(read.data[:64 * _TAG_WORD], tag,
                                            read.data[64 * (_TAG_WORD + 1):]))
                with m.Else():
                    m.d.sync += beat.eq(read.data)
                m.next = "EMIT_OFFER"
            with m.State("EMIT_OFFER"):
                m.d.comb += [o.valid.eq(1), o.p.data.eq(beat), o.p.last.eq(is_last),
                             o.p.keep.eq(keep)]
                with m.If(o.ready):
                    m.d.sync += position.eq(position + 1)
                    with m.If(is_last):
                        m.d.sync += position.eq(0)
                        m.next = "RECEIVE"
                    with m.Else():
                        m.next = "EMIT_READ"
        return m

    @staticmethod
    def _feed(m, siphash, beat, length, word):
        """SipHash's input: word ``word`` of the message of ``length`` bytes whose beat is
        in ``beat`` (header word 3, the tag's place, as zero); returns "it is the last"."""
        words = Mux(length == 0, 1, (length + 7) >> 3)
        last_word = word == words - 1
        remaining = length - (word << 3)       # bytes of the message from this word on
        word_data = beat.word_select(word[:2], 64)
        m.d.comb += [
            siphash.i.p.data.eq(Mux(word == _TAG_WORD, 0, word_data)),
            siphash.i.p.bytes.eq(Mux(last_word, remaining[:4], 8)),
            siphash.i.p.last.eq(last_word),
        ]
        return last_word

    def _collect_reply(self, m, write, serving, reply_position, reply_beats, reply_keep,
                       answered, silent):
        """While ``serving``: the service's reply beats into the scratch memory as they
        come (``answered`` at the last), or its ``no_reply`` (``silent``); returns the
        reply's length in bytes."""
        # The reply's length: its beats and its last beat's `keep` (whole 32-bit words)
        reply_bytes = Signal(range(BEAT_BYTES + 1))
        for w in range(1, BEAT_BYTES // 4 + 1):
            with m.If(reply_keep[4 * w - 1]):
                m.d.comb += reply_bytes.eq(4 * w)
        reply_length = ((reply_beats - 1) << 5) + reply_bytes

        m.d.comb += self.service_o.ready.eq(serving)
        with m.If(serving):
            m.d.comb += [write.addr.eq(reply_position), write.data.eq(self.service_o.p.data),
                         write.en.eq(self.service_o.valid)]
            with m.If(self.service_o.valid):
                m.d.sync += reply_position.eq(reply_position + 1)
                with m.If(self.service_o.p.last):
                    m.d.sync += [reply_beats.eq(reply_position + 1),
                                 reply_keep.eq(self.service_o.p.keep), answered.eq(1)]
            with m.If(self.service_no_reply):
                m.d.sync += silent.eq(1)
        return reply_length
