"""The board service's frame buffer, and what its parts share (``network.md`` section 6).

The board's service (:class:`hdl.wire.service.BoardService`) takes one frame for the board
at a time, whole, into :class:`RequestBuffer`, and steps through :class:`Step` once per frame:
the frame comes in, the responders say whether one of them answers, the ``CTRL`` responder
reads its registers into the buffer, and the reply goes out. Every part of the service
follows the one :class:`Step` register (its ``step`` member) and acts in the steps that are
its own; the responders read the request's fields off :class:`RequestBuffer`'s ``rx`` as
the words pass (:data:`RequestWord`: each word with its place in the frame).
"""
from amaranth import Module, Mux, Signal, unsigned
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hdl.wire.classify import BEAT_BYTES, Verdict

__all__ = ["BoardWord", "BUFFER_WORDS", "Step", "RequestWord", "BufferRead", "BufferWrite",
           "Peer", "IpRequest", "TransportWords", "RequestBuffer", "halves"]

#: One word of a frame for the board, with the classifier's verdict on the frame (the same
#: on every word of it).
BoardWord = data.StructLayout({
    "data": unsigned(8 * BEAT_BYTES),
    "last": unsigned(1),
    "verdict": Verdict,
})

#: The request buffer: 1024 bytes, more than the longest request answered (a ``CTRL``
#: request of 64 pairs: a 586-byte frame).
BUFFER_WORDS = 256


class Step(enum.Enum, shape=4):
    """Where the service is with the frame it holds (one register for every part of it).

    The values are the order in which the steps were first named in the service's single
    state machine that these parts replace (its netlist is the same)."""
    IDLE = 0                # free: a frame for the board may start
    RECEIVE = 1             # its words come in
    DECIDE = 2              # whole: the responders' fields are in; one answers, or none
    LENGTH = 3              # the reply's length and IPv4 header checksum
    PAIR_ADDRESS_LOW = 4    # CTRL: a pair's address, its two halves read in turn ...
    PAIR_ADDRESS_HIGH = 5
    PAIR_REGION = 6         # ... its region checked ...
    PAIR_READ = 7           # ... the register read ...
    PAIR_VALUE_LOW = 8      # ... and its value written over the request's, half by half
    PAIR_VALUE_HIGH = 9
    FETCH = 10              # a reply word read from the buffer ...
    SEND = 11               # ... and sent, with the reply's own fields in place


#: A word of the request as it comes in: its place in the frame (``index``; it saturates at
#: :data:`BUFFER_WORDS`) and its lanes.
RequestWord = data.StructLayout({
    "index": range(BUFFER_WORDS + 1),
    "data": unsigned(8 * BEAT_BYTES),
})

#: A read of the buffer, from the reader's side: ``data`` is the word at ``addr`` of the
#: clock before (block RAM).
BufferRead = wiring.Signature({
    "addr": Out(range(BUFFER_WORDS)),
    "data": In(8 * BEAT_BYTES),
})

#: A write into the buffer, from the writer's side: ``en`` one bit per 16-bit half.
BufferWrite = wiring.Signature({
    "addr": Out(range(BUFFER_WORDS)),
    "data": Out(8 * BEAT_BYTES),
    "en": Out(2),
})


#: Whom a reply goes to: the request's sender, its MAC and IPv4 address (each half of the
#: address as the lanes carry it: ``ip_high`` holds its first two bytes)
Peer = data.StructLayout({"mac": 48, "ip_high": 16, "ip_low": 16})

#: What the IP responders (echo, ``CTRL``) need of the request's Ethernet and IPv4 headers:
#: ``arp``, the frame is ARP (no IP responder's); ``for_board``, an IPv4 packet for the
#: board's address, whole in its frame, long enough for a UDP header (the golden model's
#: order: no IP answer otherwise); its ``protocol`` and ``total`` length; ``udp_ok``, the
#: classifier's (a UDP datagram whose length and checksum are right).
IpRequest = data.StructLayout({"arp": 1, "for_board": 1, "protocol": 8, "total": 16,
                               "udp_ok": 1})

#: An IP responder's part of its reply (after the IPv4 header, which the reply
#: multiplexer writes): ``port``, the upper half of word 8 (the UDP source port, or ICMP's
#: type and code), and ``words`` 9..11 (the request's own words follow unchanged).
TransportWords = data.StructLayout({"port": 16,
                                    "words": data.ArrayLayout(8 * BEAT_BYTES, 3)})


def halves(word):
    """A 32-bit word's two 16-bit halves as the lanes carry them (frame bytes 0-1, 2-3)."""
    return [word[:16], word[16:]]


class RequestBuffer(wiring.Component):
    """The frame for the board, stored whole (block RAM), and its words as they pass.

    Words past :data:`BUFFER_WORDS` are dropped (no request the service answers is that
    long; the frame is still taken to its end).

    Members
    -------
    i : In(stream.Signature(BoardWord, always_ready=True))
        The frame, a word a clock at most.
    rx : Out(stream.Signature(RequestWord, always_ready=True))
        Each word of ``i`` in the same clock, with its place in the frame.
    verdict : Out(Verdict)
        The classifier's verdict on the frame, from its first word on.
    read : In(BufferRead)
        The reader of the buffer (one at a time; the service's steps say whose turn).
    write : In(BufferWrite)
        Writes into the stored frame (the ``CTRL`` responder's values): while ``en`` is
        not zero they take the write port (no frame comes in then).
    """

    def __init__(self):
        super().__init__({
            "i": In(stream.Signature(BoardWord, always_ready=True)),
            "rx": Out(stream.Signature(RequestWord, always_ready=True)),
            "verdict": Out(Verdict),
            "read": In(BufferRead),
            "write": In(BufferWrite),
        })

    def elaborate(self, platform):
        m = Module()
        i, rx, write = self.i, self.rx, self.write
        m.submodules.buffer = buffer = Memory(shape=8 * BEAT_BYTES, depth=BUFFER_WORDS,
                                              init=[])
        buffer_w = buffer.write_port(granularity=16)
        buffer_r = buffer.read_port()

        word = Signal(range(BUFFER_WORDS + 1))     # the frame word arriving; saturates
        w = i.p.data
        m.d.comb += [buffer_w.addr.eq(word), buffer_w.data.eq(w),
                     rx.valid.eq(i.valid), rx.p.index.eq(word), rx.p.data.eq(w)]
        with m.If(i.valid):
            m.d.comb += buffer_w.en.eq(Mux(word < BUFFER_WORDS, 0b11, 0))
            m.d.sync += word.eq(Mux(i.p.last, 0, Mux(word < BUFFER_WORDS, word + 1, word)))
            with m.Switch(word):
                with m.Case(0):
                    m.d.sync += self.verdict.eq(i.p.verdict)
        with m.If(write.en != 0):
            m.d.comb += [buffer_w.addr.eq(write.addr), buffer_w.data.eq(write.data),
                         buffer_w.en.eq(write.en)]
        m.d.comb += [buffer_r.addr.eq(self.read.addr), self.read.data.eq(buffer_r.data)]
        return m
