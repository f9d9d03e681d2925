"""Stream payloads of the network front end, between the LiteEth core and the engines.

The receive side carries datagrams from the core (32-bit words, :data:`RxBeat` of
:mod:`hdl.net.core.eth_core`) widened to the engines' 256-bit beats (:data:`WideBeat`), through a
service's input buffer (:data:`ServiceBeat`, the engine's AXI-Stream beat with the datagram's
addressing beside it). The transmit side carries an engine's output packet out of its output
buffer as 32-bit words (:data:`EgressWord`), addressed into the core's :data:`TxBeat`.

Every datagram's ``meta`` (:data:`hdl.net.core.eth_core.UdpMeta`) is constant from its first beat
to its last.
"""
from __future__ import annotations

from amaranth import unsigned
from amaranth.lib import data

from contract.header import BEAT_BYTES, LANES
from hdl.net.core.eth_core import DATA_WIDTH, RxBeat, TxBeat, UdpMeta
from hdl.stream.axis import DATA_BITS
from hdl.stream.width import WORD_BITS, WORD_BYTES, WORDS_PER_BEAT, wide_beat, word_beat

__all__ = ["WORD_BYTES", "WORDS_PER_BEAT", "RxBeat", "TxBeat", "UdpMeta", "WideBeat",
           "ServiceBeat", "ReplyTag", "egress_word", "beats_for_length", "last_beat_words",
           "keep_for_words"]

# (the shared upsizer's words are the core's: hdl.stream.width)
assert WORD_BITS == DATA_WIDTH and word_beat(UdpMeta) == RxBeat
assert WORDS_PER_BEAT == LANES and WORDS_PER_BEAT * WORD_BYTES == BEAT_BYTES

#: A received datagram widened to 256-bit beats (bytes past the datagram's end are zero).
#: ``error`` on the last beat: the core flagged the datagram (already counted by a core
#: event); ``drop`` on the last beat: a front-end check refused it (counted by that check).
WideBeat = wide_beat(UdpMeta)

#: A stored datagram on its way into an engine: the AXI-Stream beat (``keep`` whole 32-bit
#: words on the last beat, from the datagram's length), ``first`` on its first beat, and
#: the datagram's addressing (the sender) on every beat.
ServiceBeat = data.StructLayout({
    "data": unsigned(DATA_BITS),
    "keep": unsigned(BEAT_BYTES),
    "last": unsigned(1),
    "first": unsigned(1),
    "meta": UdpMeta,
})

#: Where a reply goes: the requester's IP address and port, from the service's port.
ReplyTag = data.StructLayout({
    "ip_address": 32,
    "src_port": 16,      # the service's own port (the request's destination port)
    "dst_port": 16,      # the requester's port (the request's source port)
})


def egress_word(tag_shape):
    """One 32-bit word of a packet read out of an output buffer: the packet's byte
    ``length`` (whole words) and its ``tag`` on every word."""
    return data.StructLayout({
        "data": unsigned(DATA_WIDTH),
        "last": unsigned(1),
        "length": unsigned(16),
        "tag": tag_shape,
    })


def beats_for_length(length):
    """256-bit beats a datagram of ``length`` bytes takes (an Amaranth expression or int):
    ``ceil(length / 32)``, at least 1 (an empty datagram is one beat with no kept byte)."""
    if isinstance(length, int):
        return max(1, -(-length // BEAT_BYTES))
    from amaranth import Mux
    full = (length + (BEAT_BYTES - 1)) >> 5
    return Mux(length == 0, 1, full)


def last_beat_words(words):
    """32-bit words in the last beat of a packet of ``words`` words (an Amaranth value):
    1..8, or 0 for an empty packet."""
    from amaranth import Mux
    return Mux(words[:3] == 0, Mux(words == 0, 0, WORDS_PER_BEAT), words[:3])


def keep_for_words(words):
    """``tkeep`` of a beat holding ``words`` 32-bit words (an Amaranth value, 0..8)."""
    from amaranth import Const, Mux
    keep = Const(0, BEAT_BYTES)
    for w in range(1, WORDS_PER_BEAT + 1):
        keep = Mux(words == w, Const((1 << (WORD_BYTES * w)) - 1, BEAT_BYTES), keep)
    return keep
