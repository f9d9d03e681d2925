"""A gradient datagram's turn through the NIC path, for one direction of the NIC in the wire
(:class:`hdl.wire.path.WirePath`).

:class:`NicTurn` takes the datagram's UDP payload as the path reads it out of the frame
store (:data:`~hdl.wire.store.ReadOp` ``PRIME`` and ``NIC``: the payload starts in the
middle of frame word 10, so each payload word is two bytes of one stored word and two of the
next), completed with zero bytes to whole words and a whole header beat, as
``host.board.golden.nic_packet`` does, and sends it to the NIC engine's path as 256-bit
beats (an :class:`~hdl.stream.width.Upsizer`). What comes back is written into the packet
buffer two bytes in (where the re-framed datagram's payload starts in its word), and its
length, its header ``type`` against the one sent (rewritten: a replacement) and the receive
path's drop are the turn's answer (:data:`NicAnswer`).

One packet is in the NIC path at a time: nothing else can tell whose a drop strobe is.
"""
from amaranth import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from contract.header import BEAT_BYTES as NIC_BEAT_BYTES
from contract.header import LANES
from hdl.header import HeaderLayout
from hdl.stream.axis import DATA_BITS, axis_signature
from hdl.stream.width import Upsizer
from hdl.wire.classify import BEAT_BYTES
from hdl.wire.store import WORD_BITS, ReadOp, StoreRead

__all__ = ["NicAnswer", "NicTurn"]

_TYPE = HeaderLayout["type"]                 # where the packet type sits in payload word 0
assert _TYPE.offset + _TYPE.shape.width <= WORD_BITS

#: ``words``: the word's place in its 256-bit beat, from 1: on the beat's last word, the
#: words it keeps, carried with the packet (not looked up when the beat leaves, by which time
#: the frame may be another's)
_NicWord = data.StructLayout({"data": unsigned(WORD_BITS), "last": unsigned(1),
                              "words": unsigned(4)})

#: What came back from the NIC path for the packet sent: ``answered``, its packet is in the
#: packet buffer, ``bytes`` long (whole words), its header ``rewritten`` (another ``type``
#: than the one sent: a replacement); or ``dropped`` by the receive path.
NicAnswer = data.StructLayout({"answered": 1, "dropped": 1, "bytes": 16, "rewritten": 1})


class NicTurn(wiring.Component):
    """A payload to the NIC path and its answer back, into the packet buffer.

    Parameters
    ----------
    packet_beats : int
        Beats of the packet buffer: the longest packet that can replace a payload, two bytes
        in, and a beat more for the carry out of its last.

    Members
    -------
    reading : In(StoreRead)
        The read stage's word: ``PRIME`` and ``NIC`` are this turn's.
    word : In(32)
        The store's word read.
    start : In(1)
        A packet is about to go to the NIC path: what came back before is forgotten.
    room : Out(1)
        The payload FIFO has room for a word and the one in flight.
    nic_in : Out(axis_signature())
        NIC packets to the engine's path (``tx_in`` or ``rx_in``).
    nic_out : In(axis_signature())
        What the engine's path gives back; always ready.
    nic_dropped : In(1)
        rx: the engine's ``rx_dropped``; tx: 0.
    answer : Out(NicAnswer)
    packet_addr : In(range(packet_beats))
        A beat of the packet buffer to read ...
    packet_data : Out(DATA_BITS)
        ... and that beat, a clock later.
    """

    def __init__(self, *, packet_beats):
        self.packet_beats = packet_beats
        super().__init__({
            "reading": In(StoreRead),
            "word": In(WORD_BITS),
            "start": In(1),
            "room": Out(1),
            "nic_in": Out(axis_signature()),
            "nic_out": In(axis_signature()),
            "nic_dropped": In(1),
            "answer": Out(NicAnswer),
            "packet_addr": In(range(packet_beats)),
            "packet_data": Out(DATA_BITS),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.packet = packet = Memory(shape=DATA_BITS, depth=self.packet_beats, init=[])
        packet_w = packet.write_port()
        packet_r = packet.read_port()
        m.d.comb += [packet_r.addr.eq(self.packet_addr), self.packet_data.eq(packet_r.data)]
        # (a read is issued only when the FIFO has room for its word and the one in flight)
        m.submodules.nic_fifo = nic_fifo = SyncFIFOBuffered(width=_NicWord.size, depth=8)
        m.d.comb += self.room.eq(nic_fifo.level < nic_fifo.depth - 1)
        packet_bytes = Signal(16)                  # bytes of its packet (whole words)
        packet_type = Signal(_TYPE.shape)
        sent_type = Signal(_TYPE.shape)
        m.d.comb += [self.answer.bytes.eq(packet_bytes),
                     self.answer.rewritten.eq(packet_type != sent_type)]
        self._payload(m, nic_fifo, sent_type)
        self._to_nic(m, nic_fifo)
        self._from_nic(m, packet_w, packet_bytes, packet_type)
        return m

    def _payload(self, m, nic_fifo, sent_type):
        """Payload words into the FIFO: each the two kept bytes of the word before and two
        of this one, bytes past the payload zero; the type of the packet sent."""
        reading, word = self.reading, self.word
        kept = Signal(16)          # the last two bytes of the word before (frame bytes 42..)
        nic_word = Signal(_NicWord)
        joined = Signal(WORD_BITS)
        m.d.comb += [
            joined.eq(Cat(kept, word[:16])),
            nic_word.last.eq(reading.last),
            nic_word.words.eq(reading.index),
            nic_fifo.w_data.eq(nic_word),
        ]
        for j in range(BEAT_BYTES):
            m.d.comb += nic_word.data[8 * j:8 * j + 8].eq(
                Mux(reading.bytes > j, joined[8 * j:8 * j + 8], 0))
        with m.Switch(reading.op):
            with m.Case(ReadOp.PRIME):
                m.d.sync += kept.eq(word[16:])
            with m.Case(ReadOp.NIC):
                m.d.comb += nic_fifo.w_en.eq(1)
                m.d.sync += kept.eq(word[16:])
        # the sent packet's type: payload word 0 is the NIC packet's first
        first_nic_word = Signal()
        with m.If(self.start):
            m.d.sync += first_nic_word.eq(1)
        with m.Elif(nic_fifo.w_en):
            m.d.sync += first_nic_word.eq(0)
            with m.If(first_nic_word):
                m.d.sync += sent_type.eq(nic_word.data[_TYPE.offset:][:_TYPE.shape.width])

    def _to_nic(self, m, nic_fifo):
        """To the NIC path: words eight to a beat, ``keep`` from the words each beat holds."""
        m.submodules.upsizer = upsizer = Upsizer(unsigned(4))
        head_nic = data.View(_NicWord, nic_fifo.r_data)
        m.d.comb += [upsizer.i.valid.eq(nic_fifo.r_rdy), upsizer.i.p.data.eq(head_nic.data),
                     upsizer.i.p.last.eq(head_nic.last), upsizer.i.p.last_be.eq(0b1000),
                     # (meta leaves with a beat's last word: there, its word count)
                     upsizer.i.p.meta.eq(head_nic.words),
                     nic_fifo.r_en.eq(upsizer.i.ready)]
        beat_words = Signal(4)     # kept words of the beat, 1..8
        m.d.comb += beat_words.eq(upsizer.o.p.meta)
        nic_in = self.nic_in
        m.d.comb += [nic_in.valid.eq(upsizer.o.valid), nic_in.p.data.eq(upsizer.o.p.data),
                     nic_in.p.last.eq(upsizer.o.p.last), upsizer.o.ready.eq(nic_in.ready)]
        m.d.comb += nic_in.p.keep.eq((Const(1, NIC_BEAT_BYTES + 1) << (beat_words * 4)) - 1)

    def _from_nic(self, m, packet_w, packet_bytes, packet_type):
        """From the NIC path: into the packet buffer two bytes in; the answer."""
        nic_out = self.nic_out
        answered, dropped = Signal(), Signal()
        m.d.comb += [self.answer.answered.eq(answered), self.answer.dropped.eq(dropped)]
        beat = Signal(range(self.packet_beats + 1))
        carry = Signal(16)         # the last two bytes of the beat before
        flush = Signal()           # the last beat's carry still to write
        first = Signal()
        kept_words = Signal(range(LANES + 1))
        m.d.comb += [nic_out.ready.eq(1),
                     kept_words.eq(sum(nic_out.p.keep[4 * j] for j in range(LANES))),
                     packet_w.addr.eq(beat),
                     packet_w.data.eq(Cat(carry, Mux(flush, 0, nic_out.p.data[:DATA_BITS - 16])))]
        with m.If(self.start):
            m.d.sync += [beat.eq(0), carry.eq(0), flush.eq(0), first.eq(1), packet_bytes.eq(0),
                         answered.eq(0), dropped.eq(0)]
        with m.Elif(nic_out.valid):
            m.d.comb += packet_w.en.eq(beat < self.packet_beats)
            m.d.sync += [beat.eq(beat + 1), carry.eq(nic_out.p.data[DATA_BITS - 16:]),
                         packet_bytes.eq(packet_bytes + kept_words * 4), first.eq(0),
                         flush.eq(nic_out.p.last)]
            with m.If(first):
                m.d.sync += packet_type.eq(nic_out.p.data[_TYPE.offset:][:_TYPE.shape.width])
        with m.Elif(flush):
            m.d.comb += packet_w.en.eq(beat < self.packet_beats)
            m.d.sync += [flush.eq(0), answered.eq(1)]
        with m.If(self.nic_dropped):
            m.d.sync += dropped.eq(1)
