"""The output side of one direction of the NIC in the wire (:class:`hdl.wire.path.WirePath`):
the re-framer and the output FIFO.

:class:`Reframer` makes the words a frame leaves with, from the path's reads
(:data:`~hdl.wire.store.StoreRead`): a stored frame's words as they are (``FRAME``), or a
replaced datagram re-framed as ``GoldenWire._reframe`` does: the stored frame's first 42
bytes with the IPv4 total length, header checksum and UDP length rewritten (``HEADER``), then
the packet buffer's words (``PACKET``: the UDP checksum, zero, and the packet, which the NIC
turn wrote two bytes in), and nothing after it (no Ethernet padding: the MAC pads). The IPv4
header checksum is worked out from the classifier's sum of the header's other words
(``Verdict.ip_sum``), with no second pass over the header.

:class:`OutputFifo` holds the words for the other port's MAC, which drains it at line rate
while the reads fill it at a word a clock.
"""
from amaranth import Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from contract.frames import IP_HEADER, UDP_HEADER
from hdl.stream.axis import DATA_BITS
from hdl.wire.classify import BEAT_BYTES, MacBeat, be16, ones_sum16
from hdl.wire.store import WORD_BITS, ReadOp, StoreRead

__all__ = ["OutWord", "Reframer", "OutputFifo"]

#: A word on its way out: ``last_be`` on the frame's last word (one-hot on its last byte)
OutWord = data.StructLayout({"data": unsigned(WORD_BITS), "last_be": unsigned(BEAT_BYTES),
                             "last": unsigned(1)})
#: words of the frame that a re-framing rewrites (frame bytes 16-17, 24-25, 38-39)
_TOTAL_WORD, _CHECKSUM_WORD, _UDP_LENGTH_WORD = 4, 6, 9


class Reframer(wiring.Component):
    """Frame words out as they are, or a replaced datagram's header rewritten and its
    packet.

    Members
    -------
    reading : In(StoreRead)
        The read stage's word: ``FRAME``, ``HEADER`` and ``PACKET`` are the re-framer's.
    word : In(32)
        The store's word read.
    packet : In(DATA_BITS)
        The packet buffer's beat read (``PACKET``: ``reading.index`` is the lane).
    packet_bytes : In(16)
        Bytes of the replacement packet (whole words).
    ip_sum : In(16)
        The frame's ``Verdict.ip_sum``.
    o : Out(stream.Signature(OutWord, always_ready=True))
        The words out (the path reads only while the output FIFO has room).
    """

    def __init__(self):
        super().__init__({
            "reading": In(StoreRead),
            "word": In(WORD_BITS),
            "packet": In(DATA_BITS),
            "packet_bytes": In(16),
            "ip_sum": In(16),
            "o": Out(stream.Signature(OutWord, always_ready=True)),
        })

    def elaborate(self, platform):
        m = Module()
        reading, word, o = self.reading, self.word, self.o
        # the re-framed datagram's lengths and header checksum
        new_total, new_udp_length, new_checksum = Signal(16), Signal(16), Signal(16)
        m.d.comb += [new_total.eq(IP_HEADER + UDP_HEADER + self.packet_bytes),
                     new_udp_length.eq(UDP_HEADER + self.packet_bytes),
                     new_checksum.eq(~ones_sum16(self.ip_sum + new_total))]
        lane = self.packet.word_select(reading.index[:3], WORD_BITS)
        out_word = Signal(OutWord)
        m.d.comb += [
            out_word.last.eq(reading.last),
            out_word.last_be.eq(reading.last_be),
            out_word.data.eq(Mux(reading.op == ReadOp.PACKET, lane, word)),
            o.p.eq(out_word),
        ]
        with m.Switch(reading.op):
            with m.Case(ReadOp.FRAME, ReadOp.PACKET):
                m.d.comb += o.valid.eq(1)
            with m.Case(ReadOp.HEADER):
                m.d.comb += o.valid.eq(1)
                with m.Switch(reading.index):
                    with m.Case(_TOTAL_WORD):
                        m.d.comb += out_word.data[:16].eq(be16(new_total))
                    with m.Case(_CHECKSUM_WORD):
                        m.d.comb += out_word.data[:16].eq(be16(new_checksum))
                    with m.Case(_UDP_LENGTH_WORD):
                        m.d.comb += out_word.data[16:].eq(be16(new_udp_length))
        return m


class OutputFifo(wiring.Component):
    """The words out, in block RAM, to the other port's MAC.

    Parameters
    ----------
    depth : int
        Words it holds.

    Members
    -------
    i : In(stream.Signature(OutWord, always_ready=True))
        Words in: written only while ``room`` (the caller makes sure).
    room : Out(1)
        Room for a word and the one in flight.
    o : Out(stream.Signature(MacBeat))
        Frames to the MAC: ``last_be`` one-hot on the last beat, ``error`` 0.
    """

    def __init__(self, *, depth):
        self.depth = depth
        super().__init__({
            "i": In(stream.Signature(OutWord, always_ready=True)),
            "room": Out(1),
            "o": Out(stream.Signature(MacBeat)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.fifo = fifo = SyncFIFOBuffered(width=OutWord.size, depth=self.depth)
        m.d.comb += [self.room.eq(fifo.level < fifo.depth - 1),
                     fifo.w_data.eq(self.i.p), fifo.w_en.eq(self.i.valid)]
        o = self.o
        head_out = data.View(OutWord, fifo.r_data)
        m.d.comb += [o.valid.eq(fifo.r_rdy), o.p.data.eq(head_out.data),
                     o.p.last_be.eq(Mux(head_out.last, head_out.last_be, 0)),
                     o.p.last.eq(head_out.last), o.p.error.eq(0),
                     fifo.r_en.eq(o.ready)]
        return m
