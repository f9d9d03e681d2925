"""Width conversion between 32-bit words and the engines' 256-bit beats.

:class:`Upsizer` packs a packet's words eight to a beat (byte 0 in bits 7..0 of lane 0, as
the engines expect), zeroing the bytes past its end; :class:`Downsizer` unpacks beats into
words again. Both take and give one word per clock. The network front end widens the
LiteEth core's datagrams and narrows the engines' replies with them; the wire widens the
gradient payloads it hands to the NIC engines.
"""
from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from contract.header import BEAT_BYTES, LANES
from hdl.stream.axis import DATA_BITS

__all__ = ["WORD_BITS", "WORD_BYTES", "WORDS_PER_BEAT", "word_beat", "wide_beat", "Upsizer",
           "Downsizer", "downsizer_beat", "mask_last_word"]

#: A word: one lane of a beat (the LiteEth core's data width)
WORD_BITS = DATA_BITS // LANES
WORD_BYTES = WORD_BITS // 8
WORDS_PER_BEAT = LANES
assert WORDS_PER_BEAT * WORD_BYTES == BEAT_BYTES


def word_beat(meta_shape):
    """One 32-bit word of a packet: ``last_be`` one-hot on the last byte of its last word,
    ``error`` (the packet is bad, on its last word), and ``meta`` (shape ``meta_shape``):
    what the packet carries beside its bytes (the front end: its datagram's addressing)."""
    return data.StructLayout({
        "data": unsigned(WORD_BITS),
        "last_be": unsigned(WORD_BYTES),
        "last": unsigned(1),
        "error": unsigned(1),
        "meta": meta_shape,
    })


def wide_beat(meta_shape):
    """A packet widened to 256-bit beats (bytes past its end zero): ``error`` and ``meta``
    from the last word of the beat, and ``drop`` (0 here; a check behind the upsizer may set
    it on a last beat)."""
    return data.StructLayout({
        "data": unsigned(DATA_BITS),
        "last": unsigned(1),
        "error": unsigned(1),
        "drop": unsigned(1),
        "meta": meta_shape,
    })


def mask_last_word(word, last_be):
    """``word`` with the bytes after the one ``last_be`` marks set to zero (``last_be`` is
    one-hot on the last kept byte; zero keeps no byte, for an empty datagram)."""
    # Byte i is kept when the marker is at byte i or above: a running OR from the top.
    bits = []
    running = Const(0, 1)
    for i in reversed(range(WORD_BYTES)):
        running = running | last_be[i]
        bits.append(running)
    mask = Cat(*[Mux(bit, Const(0xFF, 8), Const(0, 8)) for bit in reversed(bits)])
    return word & mask


class Upsizer(wiring.Component):
    """32-bit packet words -> 256-bit beats, one input word per clock.

    A beat leaves when eight words have come or the packet's last word has; lanes after
    the last word and bytes after the last byte (``last_be``) are zero. ``error`` and
    ``meta`` travel with the last word of each beat; ``drop`` is always 0 here.

    Parameters
    ----------
    meta_shape : shape-like
        What travels beside the words (:func:`word_beat`'s ``meta``).

    Members
    -------
    i : In(stream.Signature(word_beat(meta_shape)))
    o : Out(stream.Signature(wide_beat(meta_shape)))
    """

    def __init__(self, meta_shape):
        super().__init__({
            "i": In(stream.Signature(word_beat(meta_shape))),
            "o": Out(stream.Signature(wide_beat(meta_shape))),
        })

    def elaborate(self, platform):
        m = Module()
        i, o = self.i, self.o
        # Lanes 0..6 wait in registers; lane 7's word always completes the beat.
        lanes = [Signal(WORD_BITS, name=f"lane{j}") for j in range(WORDS_PER_BEAT - 1)]
        index = Signal(range(WORDS_PER_BEAT))

        word = Signal(WORD_BITS)
        completes = Signal()
        m.d.comb += [
            word.eq(Mux(i.p.last, mask_last_word(i.p.data, i.p.last_be), i.p.data)),
            completes.eq(i.p.last | (index == WORDS_PER_BEAT - 1)),
            # A word that completes a beat needs the output register; others only a lane.
            i.ready.eq(~completes | ~o.valid | o.ready),
        ]
        with m.If(o.valid & o.ready):
            m.d.sync += o.valid.eq(0)
        with m.If(i.valid & i.ready):
            with m.If(completes):
                # Lanes before `index` are filled, the current word goes to lane `index`,
                # the rest are zero.
                out_lanes = [Mux(index == j, word, Mux(index > j, lanes[j], 0))
                             for j in range(WORDS_PER_BEAT - 1)]
                out_lanes.append(Mux(index == WORDS_PER_BEAT - 1, word, 0))
                m.d.sync += [
                    o.valid.eq(1),
                    o.p.data.eq(Cat(*out_lanes)),
                    o.p.last.eq(i.p.last),
                    o.p.error.eq(i.p.error),
                    o.p.drop.eq(0),
                    o.p.meta.eq(i.p.meta),
                    index.eq(0),
                ]
            with m.Else():
                with m.Switch(index):
                    for j in range(WORDS_PER_BEAT - 1):
                        with m.Case(j):
                            m.d.sync += lanes[j].eq(word)
                m.d.sync += index.eq(index + 1)
        return m


def downsizer_beat(side_shape):
    """Input beat of a :class:`Downsizer`: 256 bits, how many words of it are kept (0..8;
    a 0-word beat still gives one word, all zero, for an empty packet), ``last`` and a
    side payload repeated on every word."""
    return data.StructLayout({
        "data": unsigned(DATA_BITS),
        "words": unsigned(4),
        "last": unsigned(1),
        "side": side_shape,
    })


def downsizer_word(side_shape):
    return data.StructLayout({
        "data": unsigned(WORD_BITS),
        "last": unsigned(1),
        "side": side_shape,
    })


class Downsizer(wiring.Component):
    """256-bit beats -> 32-bit words (lane 0 first), one word per clock.

    A beat's kept words leave in order; ``last`` is set on the last word of a beat that has
    ``last``. The next beat is taken in the clock its predecessor's last word leaves.

    Parameters
    ----------
    side_shape : shape-like
        The side payload (packet length, addressing) copied onto every word.

    Members
    -------
    i : In(stream.Signature(downsizer_beat(side_shape)))
    o : Out(stream.Signature(downsizer_word(side_shape)))
    """

    def __init__(self, side_shape):
        self._side = side_shape
        super().__init__({
            "i": In(stream.Signature(downsizer_beat(side_shape))),
            "o": Out(stream.Signature(downsizer_word(side_shape))),
        })

    def elaborate(self, platform):
        m = Module()
        i, o = self.i, self.o
        # The beat shifts down a word at a time (the word on `o` is always its lowest), and
        # whether that word is the beat's last is a register of its own: `last` and `ready`
        # leave this block one gate from a flip-flop, not through a word counter's compare.
        data_left = Signal(DATA_BITS)
        words_after = Signal(range(WORDS_PER_BEAT))   # kept words behind the one on `o`
        end = Signal()                                # the word on `o` is the beat's last
        last = Signal()
        side = Signal(self._side)
        m.d.comb += [
            o.p.data.eq(data_left[:WORD_BITS]),
            o.p.last.eq(last & end),
            o.p.side.eq(side),
            i.ready.eq(~o.valid | (o.ready & end)),
        ]
        with m.If(o.valid & o.ready & ~end):
            m.d.sync += [data_left.eq(data_left >> WORD_BITS),
                         words_after.eq(words_after - 1),
                         end.eq(words_after == 1)]
        with m.If(i.ready):
            m.d.sync += o.valid.eq(i.valid)
            with m.If(i.valid):
                m.d.sync += [data_left.eq(i.p.data), last.eq(i.p.last), side.eq(i.p.side),
                             words_after.eq(Mux(i.p.words > 1, i.p.words - 1, 0)),
                             end.eq(i.p.words <= 1)]
        return m
