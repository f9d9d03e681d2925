"""One direction of the NIC in the wire (``docs/protocol/network.md`` section 6): the frames
one port's MAC receives, classified, stored, and sent on to the other port's MAC, gradient
datagrams through the NIC path of the direction on the way.

:class:`WirePath` is store and forward: a frame is written to a ring of block RAM (the frame
store) as it leaves the MAC, and acted on once the :class:`~hdl.wire.classify.FrameClassifier`
beside the store has given its verdict (two cycles after the frame's last beat):

- ``PASS``: the stored frame goes out byte for byte;
- ``DROP_*``: forgotten, counted;
- ``FOR_BOARD`` (host side): the stored frame goes to the board's own service
  (:class:`~hdl.wire.service.BoardService`, on ``board``), which answers or counts it;
- ``GRADIENT``: the UDP payload (``payload_length`` bytes from byte
  :data:`~hdl.wire.classify.PAYLOAD_OFFSET`, completed with zero bytes to whole words and a
  whole header beat, as ``host.board.golden.nic_packet`` does) goes out on ``nic_in`` as the
  NIC engines' 256-bit beats, and the packet that comes back on ``nic_out`` (or the receive
  path's drop, ``nic_dropped``) decides, as ``host.board.wire_golden.GoldenWire._gradient``
  does. A packet whose header ``type`` the NIC path rewrote is the replacement (tx: the
  ``INC_F32`` packet, unless it is longer than the raw payload: ``incompressible``, the frame
  passes; rx: the ``RAW_F32`` packet); one it left alone passes the stored frame unchanged;
  one the receive path drops drops the frame (``drop_malformed``), and so does, without the
  NIC path, a receive-side payload shorter than a header. A replacement is re-framed as
  ``GoldenWire._reframe`` does: the stored frame's first 42 bytes with the IPv4 total length,
  header checksum and UDP length rewritten and the UDP checksum zero, then the packet, and
  nothing after it (no Ethernet padding: the MAC pads).

The NIC path is not inside: ``nic_in``, ``nic_out`` and ``nic_dropped`` go to one direction
of a :class:`hdl.nic.engine.NicEngine` (tx: ``tx_in``/``tx_out``; rx: ``rx_in``/``rx_out``
and ``rx_dropped``), so that the wire's top shares one engine, and its counters, between its
two paths. One packet is in the NIC path at a time: nothing else can tell whose a drop strobe
is, and the path waits for each packet's answer before the next.

Rate: a stored frame is read out at one 32-bit word a clock into an output FIFO that holds
a whole MTU frame (a 1514-byte frame starts 8 clocks after its last beat in); the MAC
drains it at 1 GbE, a word every two clocks at 62.5 MHz. A gradient datagram's payload first
goes to the NIC path at a word a clock, and its frame goes out once the answer is in, so
the NIC turn of one datagram overlaps the wire time of the one before: compressed and
decompressed MTU datagrams leave back to back at the output's line rate
(``test_decompressed_mtu_at_line_rate``). Back-to-back jumbo gradients that do not shrink
cost about two clocks a word against the wire's two, and the store takes up the difference
(measured, ``tests/hdl/wire/test_path.py``: a 1514-byte frame compressed with k=10 starts
392 clocks after its last beat and ends at 528).

A stored frame's words are free as soon as they are read for the last time: a frame that
goes out unchanged frees each word as it is read for the output, a re-framed datagram all
of its words once its header words (0-9) are read (the rest comes from the packet buffer);
a frame whose payload goes to the NIC path keeps its words until the answer is in, as it
may pass unchanged and be read again. So a jumbo frame that goes out at 1 GbE makes room
for the next as it leaves, and back-to-back jumbo frames at line rate pass in the default
store (``test_back_to_back_jumbos_at_line_rate``).

Frames that do not fit are dropped whole, never stalled: the MAC cannot wait. A frame is
stored when every one of its words found room in the store and a descriptor slot was free at
its last beat; otherwise its words are forgotten at that last beat (the next frame's first
beat may follow in the very next cycle) and it counts as ``drop_full``, the first of
``contract.counters.WIRE_DROP_CAUSES`` (a frame that no store holds is dropped by the wire,
whatever else it is).
"""
from amaranth import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from contract.counters import WIRE_COUNTERS
from contract.frames import IP_HEADER, MAX_BODY_BYTES, PAYLOAD_OFFSET, UDP_HEADER
from contract.header import BEAT_BYTES as NIC_BEAT_BYTES
from contract.header import HEADER_BYTES, LANES
from contract.network import DEFAULT_IP, DEFAULT_MAC, WIRE_GRADIENT_PORT
from hdl.header import HeaderLayout
from hdl.stream.axis import DATA_BITS, axis_signature
from hdl.stream.width import Upsizer
from hdl.wire.classify import (BEAT_BYTES, DIRECTIONS, FrameClass, FrameClassifier, MacBeat,
                               Verdict, be16, ones_sum16)
from hdl.wire.service import BoardWord

__all__ = ["WireEvents", "WirePath", "DEFAULT_STORE_BYTES", "DEFAULT_FRAMES",
           "DEFAULT_OUT_WORDS"]

#: One strobe per ``contract.counters.WIRE_COUNTERS`` counter, high for one cycle per frame
#: it counts; at most one frame per counter in a cycle, so a counter file adds 1 per strobe.
#: All but ``frames_out`` belong to the port the path's frames arrive on; ``frames_out`` is a
#: frame the path sent, so it counts on the other port.
WireEvents = data.StructLayout({name: unsigned(1) for name in WIRE_COUNTERS})

#: a 9014-byte jumbo frame (its FCS stripped) and a 1514-byte one, rounded to a power of two
DEFAULT_STORE_BYTES = 16384
#: Words the output FIFO holds: a whole 1514-byte frame (379 words) and then some, in block
#: RAM. The read side fills it at a word a clock and the MAC drains it at a word every two,
#: so an MTU frame leaves the read side in half its wire time, and the next datagram's turn
#: through the NIC path overlaps the wire time of the one before: decompressed MTU
#: datagrams go out back to back at line rate (with 8 words, 0.82 of it).
DEFAULT_OUT_WORDS = 512
#: Frames the store holds at most (descriptor slots), in block RAM (the descriptors are read
#: a cycle after asked). Minimum-size frames arrive one every 42 clocks at 1 GbE, and each
#: waits in a slot of its own while the frame ahead is busy: about 40 behind an MTU datagram
#: in the NIC path, 108 behind a jumbo frame going out (9038 bytes of wire time), more
#: behind a jumbo datagram that does not shrink. 16 slots dropped some of each
#: (``drop_full``); 128 none (``test_small_frames_behind_gradients_at_line_rate``,
#: ``test_jumbo_then_minimum_frames_at_line_rate``, ``sim/tb_wire.py``).
DEFAULT_FRAMES = 128
#: the smallest store: two 1514-byte frames (1518 with the FCS)
_MIN_STORE_BYTES = 2 * 1516

_WORD_BITS = 8 * BEAT_BYTES
#: the frame's words before the UDP payload's: the payload starts in the middle of word 10
_HEAD_WORDS = PAYLOAD_OFFSET // BEAT_BYTES
assert PAYLOAD_OFFSET % BEAT_BYTES == 2      # the 16-bit shifts below rely on it
_HEADER_WORDS = HEADER_BYTES // BEAT_BYTES   # a NIC packet's words at least: its header
_TYPE = HeaderLayout["type"]                 # where the packet type sits in payload word 0
assert _TYPE.offset + _TYPE.shape.width <= _WORD_BITS
#: words of the frame that a re-framing rewrites (frame bytes 16-17, 24-25, 38-39)
_TOTAL_WORD, _CHECKSUM_WORD, _UDP_LENGTH_WORD = 4, 6, 9


class _Op(enum.Enum, shape=3):
    """What the read stage does with a word read the cycle before."""
    NONE = 0
    PRIME = 1       # frame word 10: the first payload word's two bytes, kept
    NIC = 2         # a payload word: the kept bytes and two of this word, to the NIC path
    FRAME = 3       # a stored frame word, out as it is
    HEADER = 4      # a stored frame word of a re-framed datagram, lengths rewritten
    PACKET = 5      # a word of the re-framed packet, out of the packet buffer
    BOARD = 6       # a stored frame word, to the board's service


_Read = data.StructLayout({
    "op": _Op,
    "index": unsigned(4),        # HEADER: frame word; PACKET: lane of the packet buffer
                                 # beat; NIC: the word's place in its NIC beat, from 1
    "bytes": unsigned(3),        # NIC: payload bytes in the word (the rest are zero)
    "last": unsigned(1),         # the frame's (or the NIC packet's) last word
    "last_be": unsigned(BEAT_BYTES),
})

#: ``words``: the word's place in its 256-bit beat, from 1: on the beat's last word, the
#: words it keeps, carried with the packet (not looked up when the beat leaves, by which time
#: the frame may be another's)
_NicWord = data.StructLayout({"data": unsigned(_WORD_BITS), "last": unsigned(1),
                              "words": unsigned(4)})
_OutWord = data.StructLayout({"data": unsigned(_WORD_BITS), "last_be": unsigned(BEAT_BYTES),
                              "last": unsigned(1)})


def _last_be(length):
    """``last_be`` of a frame of ``length`` bytes: one-hot on its last byte."""
    return (Const(1, BEAT_BYTES) << (length[:2] - 1)[:2])[:BEAT_BYTES]


class WirePath(wiring.Component):
    """One direction of the NIC in the wire: classifier, frame store, NIC path in and out.

    Parameters
    ----------
    direction : str
        ``"tx"``: frames from the host (port 0) through the transmit path (compression);
        ``"rx"``: frames from the network (port 1) through the receive path.
    store_bytes : int
        Frame store size, a power of two, at least 4096 (two 1518-byte frames). The default
        holds a jumbo frame and a 1514-byte one at once, and back-to-back jumbo frames at
        line rate (one leaves as the next arrives); a frame bigger than the store is
        ``drop_full``.
    frames : int
        Frames the store holds at most (descriptor slots), at least 2; the default
        (:data:`DEFAULT_FRAMES`) takes minimum-size frames at line rate behind a jumbo
        datagram in the NIC path.
    out_words : int
        Words of the output FIFO, at least 8 (:data:`DEFAULT_OUT_WORDS`: an MTU frame,
        so that a datagram's NIC turn overlaps the wire time of the frame before).
    max_count : int
        The NIC engine's ``max_count`` (rx: sizes the buffer the decompressed packet waits
        in), 1..2048.
    mac, ip, gradient_port
        The classifier's (:class:`~hdl.wire.classify.FrameClassifier`).

    Members
    -------
    i : In(stream.Signature(MacBeat, always_ready=True))
        Frames from this direction's receiving MAC; never stalled.
    o : Out(stream.Signature(MacBeat))
        Frames to the other port's MAC: ``last_be`` one-hot on the last beat, ``error`` 0.
    nic_in : Out(axis_signature())
        NIC packets to the engine's path of this direction (``tx_in`` or ``rx_in``).
    nic_out : In(axis_signature())
        What the engine's path gives back (``tx_out`` or ``rx_out``); always ready.
    nic_dropped : In(1)
        rx: the engine's ``rx_dropped``. tx: tie to 0 (the transmit path drops nothing).
    events : Out(WireEvents)
        Counter strobes (:data:`WireEvents`: one per ``WIRE_COUNTERS`` name), registered.
        ``answered`` and ``drop_unanswered`` are the board's service's, never the path's.
    board : Out(stream.Signature(BoardWord, always_ready=True))
        tx only: frames for the board, a word a clock, each word with the frame's verdict;
        a frame starts only while ``board_free`` is high.
    board_free : In(1)
        tx only: the board's service can take a frame (``BoardService.free``).
    """

    def __init__(self, *, direction, store_bytes=DEFAULT_STORE_BYTES, frames=DEFAULT_FRAMES,
                 out_words=DEFAULT_OUT_WORDS, max_count=2048,
                 mac=DEFAULT_MAC, ip=DEFAULT_IP, gradient_port=WIRE_GRADIENT_PORT):
        if isinstance(store_bytes, bool) or not isinstance(store_bytes, int) \
                or store_bytes < _MIN_STORE_BYTES or store_bytes & (store_bytes - 1):
            raise ValueError(f"store_bytes must be a power of two of at least "
                             f"{_MIN_STORE_BYTES} (two 1518-byte frames), not {store_bytes!r}")
        if isinstance(frames, bool) or not isinstance(frames, int) or frames < 2:
            raise ValueError(f"frames must be an integer of at least 2, not {frames!r}")
        if isinstance(out_words, bool) or not isinstance(out_words, int) or out_words < 8:
            raise ValueError(f"out_words must be an integer of at least 8, not {out_words!r}")
        if isinstance(max_count, bool) or not isinstance(max_count, int) \
                or not 1 <= max_count <= 2048:
            raise ValueError(f"max_count must be an integer 1..2048, not {max_count!r}")
        # the classifier checks direction, mac, ip and gradient_port (built after the checks
        # above, so that a bad parameter leaves no classifier unused behind)
        self._classifier = FrameClassifier(direction=direction, mac=mac, ip=ip,
                                           gradient_port=gradient_port)
        self.direction, self.port = direction, DIRECTIONS[direction]
        self.store_bytes, self.frames, self.max_count = store_bytes, frames, max_count
        self.out_words = out_words
        # the longest packet that can replace a payload: tx, one no longer than the payload
        # of the longest frame the store takes; rx, the largest decompressed packet
        if direction == "tx":
            longest = min(MAX_BODY_BYTES, store_bytes) - PAYLOAD_OFFSET
        else:
            longest = HEADER_BYTES + 4 * max_count
        # the packet buffer holds it two bytes in (the UDP checksum's), and one more beat
        # for the carry out of its last
        self.packet_beats = -(-(longest + 2) // NIC_BEAT_BYTES) + 1
        super().__init__({
            "i": In(stream.Signature(MacBeat, always_ready=True)),
            "o": Out(stream.Signature(MacBeat)),
            "nic_in": Out(axis_signature()),
            "nic_out": In(axis_signature()),
            "nic_dropped": In(1),
            "events": Out(WireEvents),
            **({"board": Out(stream.Signature(BoardWord, always_ready=True)),
                "board_free": In(1)} if direction == "tx" else {}),
        })

    def elaborate(self, platform):
        m = Module()
        depth = self.store_bytes // BEAT_BYTES
        abits = exact_log2(depth)
        pointer = unsigned(abits + 1)      # a word address and a lap bit: full != empty
        Descriptor = data.StructLayout({"verdict": Verdict, "start": pointer, "end": pointer})
        events = self.events
        m.d.sync += events.eq(0)

        m.submodules.classifier = classifier = self._classifier
        wiring.connect(m, wiring.flipped(self.i), classifier.i)

        # -- write side: every beat into the store as it comes ----------------------------
        m.submodules.store = store = Memory(shape=_WORD_BITS, depth=depth, init=[])
        store_w = store.write_port()
        store_r = store.read_port()
        # (buffered: a block RAM, not 93-bit-wide LUT RAM)
        m.submodules.descriptors = descriptors = SyncFIFOBuffered(width=Descriptor.size,
                                                                  depth=self.frames)
        write_ptr = Signal(pointer)
        frame_start = Signal(pointer)
        free_ptr = Signal(pointer)         # the oldest word still needed
        lost = Signal()                    # a word of this frame found no room
        reserved = Signal(range(self.frames + 1))  # frames stored, not yet done with
        released = Signal()                # the read side is done with a frame
        used = Signal(pointer)
        room = Signal()
        i = self.i
        m.d.comb += [
            used.eq(write_ptr - free_ptr),
            room.eq(~used[abits]),         # (used never exceeds depth)
            store_w.addr.eq(write_ptr[:abits]),
            store_w.data.eq(i.p.data),
            store_w.en.eq(i.valid & room & ~lost),
        ]
        # The frame's fate on the write side, delayed to meet its verdict: the classifier
        # answers exactly two cycles after the last beat.
        Ended = data.StructLayout({"valid": 1, "stored": 1, "start": pointer, "end": pointer})
        ended = [Signal(Ended, name=f"ended{n}") for n in (1, 2)]
        stored = Signal()
        m.d.comb += stored.eq(room & ~lost & (reserved != self.frames))
        m.d.sync += [ended[0].valid.eq(i.valid & i.p.last), ended[1].eq(ended[0])]
        with m.If(i.valid):
            with m.If(i.p.last):
                m.d.sync += [events.frames_in.eq(1), lost.eq(0),
                             ended[0].stored.eq(stored), ended[0].start.eq(frame_start),
                             ended[0].end.eq(write_ptr + 1)]
                with m.If(stored):
                    m.d.sync += [write_ptr.eq(write_ptr + 1), frame_start.eq(write_ptr + 1)]
                with m.Else():
                    m.d.sync += write_ptr.eq(frame_start)   # its words forgotten
            with m.Elif(room & ~lost):
                m.d.sync += write_ptr.eq(write_ptr + 1)
            with m.Else():
                m.d.sync += lost.eq(1)
        m.d.sync += reserved.eq(reserved + (i.valid & i.p.last & stored) - released)

        new = Signal(Descriptor)
        m.d.comb += [new.verdict.eq(classifier.o.p), new.start.eq(ended[1].start),
                     new.end.eq(ended[1].end), descriptors.w_data.eq(new)]
        with m.If(classifier.o.valid):
            with m.If(ended[1].stored):
                m.d.comb += descriptors.w_en.eq(1)   # (a slot was reserved at the last beat)
            with m.Else():
                m.d.sync += events.drop_full.eq(1)

        # -- read side: one frame at a time --------------------------------------------------
        # Reads of the store and of the packet buffer take a cycle; each carries an _Op that
        # says what the next cycle does with the word. A read is issued only when the FIFO
        # its word goes to has room for it and for the one still in flight, so the read
        # stage never waits and nothing upstream of the FIFOs needs a ready.
        m.submodules.packet = packet = Memory(shape=DATA_BITS, depth=self.packet_beats, init=[])
        packet_w = packet.write_port()
        packet_r = packet.read_port()
        m.submodules.out_fifo = out_fifo = SyncFIFOBuffered(width=_OutWord.size,
                                                            depth=self.out_words)
        m.submodules.nic_fifo = nic_fifo = SyncFIFOBuffered(width=_NicWord.size, depth=8)
        out_room = Signal()
        nic_room = Signal()
        m.d.comb += [out_room.eq(out_fifo.level < out_fifo.depth - 1),
                     nic_room.eq(nic_fifo.level < nic_fifo.depth - 1)]

        frame = Signal(Descriptor)                 # the frame being dealt with
        verdict = frame.verdict
        frame_words = Signal(pointer)
        m.d.comb += frame_words.eq(frame.end - frame.start)
        issue = Signal(_Read)                      # this cycle's read (op NONE: none)
        reading = Signal(_Read)                    # last cycle's
        m.d.sync += reading.eq(issue)
        n = Signal(16)                             # reads issued in this phase
        # NIC packet words: the payload's, at least a header's
        payload_words = Signal(15)
        nic_words = Signal(15)
        m.d.comb += [payload_words.eq((verdict.payload_length + BEAT_BYTES - 1) >> 2),
                     nic_words.eq(Mux(payload_words < _HEADER_WORDS, _HEADER_WORDS,
                                      payload_words))]

        # what came back from the NIC path
        packet_bytes = Signal(16)                  # bytes of its packet (whole words)
        packet_type = Signal(_TYPE.shape)
        sent_type = Signal(_TYPE.shape)
        answered, dropped = Signal(), Signal()
        # the re-framed datagram's lengths and header checksum
        new_total, new_udp_length, new_checksum = Signal(16), Signal(16), Signal(16)
        m.d.comb += [new_total.eq(IP_HEADER + UDP_HEADER + packet_bytes),
                     new_udp_length.eq(UDP_HEADER + packet_bytes),
                     new_checksum.eq(~ones_sum16(verdict.ip_sum + new_total))]
        start_nic = Signal()                       # a packet is about to go to the NIC path
        emitted = Signal()                         # this frame went out

        with m.FSM():
            with m.State("IDLE"):
                with m.If(descriptors.r_rdy):
                    head = data.View(Descriptor, descriptors.r_data)
                    m.d.comb += descriptors.r_en.eq(1)
                    m.d.sync += [frame.eq(head), n.eq(0), emitted.eq(0)]
                    kind = head.verdict.kind
                    with m.If(kind == FrameClass.PASS):
                        m.d.sync += events.passed.eq(1)
                        m.next = "FRAME"
                    with m.Elif(kind == FrameClass.GRADIENT):
                        if self.direction == "rx":
                            # shorter than a header: no packet the receive path takes
                            with m.If(head.verdict.payload_length < HEADER_BYTES):
                                m.d.sync += events.drop_malformed.eq(1)
                                m.next = "DONE"
                            with m.Else():
                                m.d.comb += start_nic.eq(1)
                                m.next = "NIC"
                        else:
                            m.d.comb += start_nic.eq(1)
                            m.next = "NIC"
                    with m.Elif(kind == FrameClass.FOR_BOARD):
                        # (the classifier says so on the host side only)
                        m.next = "BOARD" if self.direction == "tx" else "DONE"
                    with m.Else():
                        for cls in FrameClass:
                            if cls.name.startswith("DROP_"):
                                with m.If(kind == cls):
                                    m.d.sync += getattr(events, cls.name.lower()).eq(1)
                        m.next = "DONE"

            with m.State("NIC"):
                # frame words 10 .. 10 + nic_words: each after the first completes a payload
                # word with the two bytes of the one before
                with m.If(nic_room):
                    at = Signal(18)        # the payload byte the word starts with
                    pl = verdict.payload_length
                    m.d.comb += [
                        at.eq((n - 1) << 2),
                        issue.op.eq(Mux(n == 0, _Op.PRIME, _Op.NIC)),
                        issue.index.eq(((n - 1) & (LANES - 1)) + 1),
                        issue.bytes.eq(Mux(pl >= at + BEAT_BYTES, BEAT_BYTES,
                                           Mux(pl > at, pl - at, 0))),
                        issue.last.eq(n == nic_words),
                        store_r.addr.eq(frame.start + _HEAD_WORDS + n),
                    ]
                    m.d.sync += n.eq(n + 1)
                    with m.If(n == nic_words):
                        m.next = "ANSWER"

            with m.State("ANSWER"):
                replace = Signal()
                with m.If(dropped):
                    m.d.sync += events.drop_malformed.eq(1)
                    m.next = "DONE"
                with m.Elif(answered):
                    rewritten = packet_type != sent_type
                    m.d.sync += n.eq(0)
                    if self.direction == "tx":
                        m.d.comb += replace.eq(rewritten & (packet_bytes <= verdict.payload_length))
                        with m.If(replace):
                            m.d.sync += events.compressed.eq(1)
                        with m.Elif(rewritten):
                            m.d.sync += events.incompressible.eq(1)
                    else:
                        m.d.comb += replace.eq(rewritten)
                        with m.If(replace):
                            m.d.sync += events.decompressed.eq(1)
                    with m.If(replace):
                        m.next = "REFRAME"
                    with m.Else():
                        with m.If(~rewritten):
                            m.d.sync += events.passed.eq(1)
                        m.next = "FRAME"

            with m.State("FRAME"):
                with m.If(out_room):
                    last = n == frame_words - 1
                    m.d.comb += [issue.op.eq(_Op.FRAME), issue.last.eq(last),
                                 issue.last_be.eq(_last_be(verdict.length)),
                                 store_r.addr.eq(frame.start + n)]
                    # the word is read for the last time (its data leaves the memory the
                    # next cycle, before a write that takes its place could land): free it
                    # now, so that the next frame can arrive while a jumbo goes out
                    m.d.sync += [n.eq(n + 1), free_ptr.eq(frame.start + n + 1)]
                    with m.If(last):
                        m.d.sync += emitted.eq(1)
                        m.next = "DONE"

            if self.direction == "tx":
                with m.State("BOARD"):
                    # The service takes every word once it took the first (it stores them
                    # as they come): wait for it to be free before the first only.
                    with m.If(self.board_free | (n != 0)):
                        last = n == frame_words - 1
                        m.d.comb += [issue.op.eq(_Op.BOARD), issue.last.eq(last),
                                     store_r.addr.eq(frame.start + n)]
                        m.d.sync += [n.eq(n + 1), free_ptr.eq(frame.start + n + 1)]
                        with m.If(last):
                            m.next = "DONE"

            with m.State("REFRAME"):
                # frame words 0-9, then the packet buffer's words: the packet two bytes in,
                # its last word holding its last two bytes (a packet is whole words)
                with m.If(out_room):
                    word = n - _HEAD_WORDS
                    last = word == (packet_bytes >> 2)
                    with m.If(n < _HEAD_WORDS):
                        m.d.comb += [issue.op.eq(_Op.HEADER), issue.index.eq(n),
                                     store_r.addr.eq(frame.start + n)]
                        # the rest comes from the packet buffer: after the last header word
                        # the store holds nothing of this frame that is still needed
                        with m.If(n == _HEAD_WORDS - 1):
                            m.d.sync += free_ptr.eq(frame.end)
                    with m.Else():
                        m.d.comb += [issue.op.eq(_Op.PACKET), issue.index.eq(word[:3]),
                                     issue.last.eq(last), issue.last_be.eq(0b0010),
                                     packet_r.addr.eq(word >> 3)]
                    m.d.sync += n.eq(n + 1)
                    with m.If((n >= _HEAD_WORDS) & last):
                        m.d.sync += emitted.eq(1)
                        m.next = "DONE"

            with m.State("DONE"):
                # the frame's words are free: its last read was issued the cycle before
                # (FRAME and REFRAME have freed them already; a dropped frame's go now).
                # Its descriptor slot is free only now: the slot count, not the words,
                # says how many frames are waiting
                m.d.comb += released.eq(1)
                m.d.sync += [free_ptr.eq(frame.end), events.frames_out.eq(emitted)]
                m.next = "IDLE"

        # -- the read stage ------------------------------------------------------------------
        kept = Signal(16)          # the last two bytes of the word before (frame bytes 42..)
        word = store_r.data
        lane = packet_r.data.word_select(reading.index[:3], _WORD_BITS)
        out_word = Signal(_OutWord)
        nic_word = Signal(_NicWord)
        joined = Signal(_WORD_BITS)
        m.d.comb += [
            joined.eq(Cat(kept, word[:16])),
            nic_word.last.eq(reading.last),
            nic_word.words.eq(reading.index),
            out_word.last.eq(reading.last),
            out_word.last_be.eq(reading.last_be),
            out_word.data.eq(Mux(reading.op == _Op.PACKET, lane, word)),
            out_fifo.w_data.eq(out_word),
            nic_fifo.w_data.eq(nic_word),
        ]
        for j in range(BEAT_BYTES):
            m.d.comb += nic_word.data[8 * j:8 * j + 8].eq(
                Mux(reading.bytes > j, joined[8 * j:8 * j + 8], 0))
        with m.Switch(reading.op):
            with m.Case(_Op.PRIME):
                m.d.sync += kept.eq(word[16:])
            with m.Case(_Op.NIC):
                m.d.comb += nic_fifo.w_en.eq(1)
                m.d.sync += kept.eq(word[16:])
            with m.Case(_Op.FRAME, _Op.PACKET):
                m.d.comb += out_fifo.w_en.eq(1)
            with m.Case(_Op.BOARD):
                if self.direction == "tx":
                    board = self.board
                    m.d.comb += [board.valid.eq(1), board.p.data.eq(word),
                                 board.p.last.eq(reading.last), board.p.verdict.eq(verdict)]
            with m.Case(_Op.HEADER):
                m.d.comb += out_fifo.w_en.eq(1)
                with m.Switch(reading.index):
                    with m.Case(_TOTAL_WORD):
                        m.d.comb += out_word.data[:16].eq(be16(new_total))
                    with m.Case(_CHECKSUM_WORD):
                        m.d.comb += out_word.data[:16].eq(be16(new_checksum))
                    with m.Case(_UDP_LENGTH_WORD):
                        m.d.comb += out_word.data[16:].eq(be16(new_udp_length))
        # the sent packet's type: payload word 0 is the NIC packet's first
        first_nic_word = Signal()
        with m.If(start_nic):
            m.d.sync += first_nic_word.eq(1)
        with m.Elif(nic_fifo.w_en):
            m.d.sync += first_nic_word.eq(0)
            with m.If(first_nic_word):
                m.d.sync += sent_type.eq(nic_word.data[_TYPE.offset:][:_TYPE.shape.width])

        o = self.o
        head_out = data.View(_OutWord, out_fifo.r_data)
        m.d.comb += [o.valid.eq(out_fifo.r_rdy), o.p.data.eq(head_out.data),
                     o.p.last_be.eq(Mux(head_out.last, head_out.last_be, 0)),
                     o.p.last.eq(head_out.last), o.p.error.eq(0),
                     out_fifo.r_en.eq(o.ready)]

        # -- to the NIC path: words eight to a beat, keep from the words each beat holds ---
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

        # -- from the NIC path: into the packet buffer two bytes in ------------------------
        nic_out = self.nic_out
        beat = Signal(range(self.packet_beats + 1))
        carry = Signal(16)         # the last two bytes of the beat before
        flush = Signal()           # the last beat's carry still to write
        first = Signal()
        kept_words = Signal(range(LANES + 1))
        m.d.comb += [nic_out.ready.eq(1),
                     kept_words.eq(sum(nic_out.p.keep[4 * j] for j in range(LANES))),
                     packet_w.addr.eq(beat),
                     packet_w.data.eq(Cat(carry, Mux(flush, 0, nic_out.p.data[:DATA_BITS - 16])))]
        with m.If(start_nic):
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
        return m
