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

The parts: the :class:`~hdl.wire.classify.FrameClassifier`, the frame store
(:class:`~hdl.wire.store.FrameStore`), the NIC turn (:class:`~hdl.wire.nic_turn.NicTurn`:
the payload out to the NIC path and its answer into the packet buffer), the re-framer
(:class:`~hdl.wire.reframe.Reframer`) and the output FIFO
(:class:`~hdl.wire.reframe.OutputFifo`). :class:`WirePath` reads the stored frames one at a
time: its reader decides what each frame needs and reads its words (and a replacement's
packet) a word a clock, each read telling the parts what the next clock does with its word
(:class:`~hdl.wire.store.ReadOp`).

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
import dataclasses

from amaranth import Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from contract.counters import WIRE_COUNTERS
from contract.frames import MAX_BODY_BYTES, PAYLOAD_OFFSET
from contract.header import BEAT_BYTES as NIC_BEAT_BYTES
from contract.header import HEADER_BYTES, LANES
from contract.network import DEFAULT_IP, DEFAULT_MAC, WIRE_GRADIENT_PORT
from hdl.stream.axis import axis_signature
from hdl.wire.classify import BEAT_BYTES, DIRECTIONS, FrameClass, FrameClassifier, MacBeat
from hdl.wire.nic_turn import NicTurn
from hdl.wire.reframe import OutputFifo, Reframer
from hdl.wire.request import BoardWord
from hdl.wire.store import (FrameStore, ReadOp, StoreRead, descriptor_layout,
                            pointer_shape)

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

#: the frame's words before the UDP payload's: the payload starts in the middle of word 10
_HEAD_WORDS = PAYLOAD_OFFSET // BEAT_BYTES
assert PAYLOAD_OFFSET % BEAT_BYTES == 2      # the 16-bit shifts of the NIC turn rely on it
_HEADER_WORDS = HEADER_BYTES // BEAT_BYTES   # a NIC packet's words at least: its header


def _last_be(length):
    """``last_be`` of a frame of ``length`` bytes: one-hot on its last byte."""
    return (Const(1, BEAT_BYTES) << (length[:2] - 1)[:2])[:BEAT_BYTES]


@dataclasses.dataclass(frozen=True)
class _Reader:
    """The reader's state, and the parts it drives (the store, the NIC turn, the re-framer's
    output FIFO)."""
    events: Signal         # the path's counter strobes (WireEvents), registered
    frame: Signal          # the frame being dealt with (a descriptor)
    frame_words: Signal
    issue: Signal          # this cycle's read (op NONE: none)
    n: Signal              # reads issued in this phase
    nic_words: Signal      # NIC packet words: the payload's, at least a header's
    start_nic: Signal      # a packet is about to go to the NIC path
    emitted: Signal        # this frame went out
    free_ptr: Signal       # the oldest store word still needed
    store: object
    nic: object
    out: object




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
        m.submodules.classifier = classifier = self._classifier
        m.submodules.store = store = FrameStore(store_bytes=self.store_bytes, frames=self.frames)
        for sink in (classifier.i, store.i):      # (never stalled: both take every beat)
            wiring.connect(m, wiring.flipped(self.i), sink)
        wiring.connect(m, classifier.o, store.verdict)
        m.submodules.nic = nic = NicTurn(packet_beats=self.packet_beats)
        wiring.connect(m, wiring.flipped(self.nic_out), nic.nic_out)
        wiring.connect(m, nic.nic_in, wiring.flipped(self.nic_in))
        m.submodules.reframer = reframer = Reframer()
        m.submodules.out = out = OutputFifo(depth=self.out_words)
        wiring.connect(m, reframer.o, out.i)
        wiring.connect(m, out.o, wiring.flipped(self.o))

        reader = self._reader(m, store, nic, out)
        # the read stage: last cycle's read, acted on by the part it is for
        reading = Signal(StoreRead)
        m.d.sync += reading.eq(reader.issue)
        m.d.comb += [nic.reading.eq(reading), nic.word.eq(store.read_data),
                     nic.start.eq(reader.start_nic), nic.nic_dropped.eq(self.nic_dropped),
                     reframer.reading.eq(reading), reframer.word.eq(store.read_data),
                     reframer.packet.eq(nic.packet_data),
                     reframer.packet_bytes.eq(nic.answer.bytes),
                     reframer.ip_sum.eq(reader.frame.verdict.ip_sum)]
        if self.direction == "tx":
            board = self.board
            with m.Switch(reading.op):
                with m.Case(ReadOp.BOARD):
                    m.d.comb += [board.valid.eq(1), board.p.data.eq(store.read_data),
                                 board.p.last.eq(reading.last),
                                 board.p.verdict.eq(reader.frame.verdict)]
        # (the store's strobes registered with the reader's)
        m.d.sync += [self.events.frames_in.eq(store.events.frames_in),
                     self.events.drop_full.eq(store.events.drop_full)]
        return m

    def _reader(self, m, store, nic, out):
        """The read side, one stored frame at a time: what the frame needs, and its reads.

        Reads of the store and of the packet buffer take a cycle; each carries a
        :data:`~hdl.wire.store.StoreRead` that says what the next cycle does with the word.
        A read is issued only when the FIFO its word goes to has room for it and for the one
        still in flight, so the read stage never waits and nothing upstream of the FIFOs
        needs a ready."""
        Descriptor = descriptor_layout(self.store_bytes)
        events = self.events
        m.d.sync += events.eq(0)
        free_ptr = Signal(pointer_shape(self.store_bytes))
        m.d.comb += store.free_ptr.eq(free_ptr)
        frame = Signal(Descriptor)                 # the frame being dealt with
        verdict = frame.verdict
        frame_words = Signal(pointer_shape(self.store_bytes))
        m.d.comb += frame_words.eq(frame.end - frame.start)
        issue = Signal(StoreRead)                  # this cycle's read (op NONE: none)
        n = Signal(16)                             # reads issued in this phase
        # NIC packet words: the payload's, at least a header's
        payload_words = Signal(15)
        nic_words = Signal(15)
        m.d.comb += [payload_words.eq((verdict.payload_length + BEAT_BYTES - 1) >> 2),
                     nic_words.eq(Mux(payload_words < _HEADER_WORDS, _HEADER_WORDS,
                                      payload_words))]
        start_nic = Signal()                       # a packet is about to go to the NIC path
        emitted = Signal()                         # this frame went out
        reader = _Reader(events=events, frame=frame, frame_words=frame_words, issue=issue, n=n,
                         nic_words=nic_words, start_nic=start_nic, emitted=emitted,
                         free_ptr=free_ptr, store=store, nic=nic, out=out)
        with m.FSM():
            with m.State("IDLE"):
                self._take(m, reader)
            with m.State("NIC"):
                self._payload(m, reader)
            with m.State("ANSWER"):
                self._answer(m, reader)
            with m.State("FRAME"):
                self._frame(m, reader)
            if self.direction == "tx":
                with m.State("BOARD"):
                    self._board(m, reader)
            with m.State("REFRAME"):
                self._reframe(m, reader)
            with m.State("DONE"):
                # the frame's words are free: its last read was issued the cycle before
                # (FRAME and REFRAME have freed them already; a dropped frame's go now).
                # Its descriptor slot is free only now: the slot count, not the words,
                # says how many frames are waiting
                m.d.comb += store.released.eq(1)
                m.d.sync += [free_ptr.eq(frame.end), events.frames_out.eq(emitted)]
                m.next = "IDLE"
        return reader

    def _take(self, m, r):
        """The next stored frame, and what it needs: by its verdict."""
        events, frames = r.events, r.store.frames
        with m.If(frames.valid):
            head = frames.p
            m.d.comb += frames.ready.eq(1)
            m.d.sync += [r.frame.eq(head), r.n.eq(0), r.emitted.eq(0)]
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
                        m.d.comb += r.start_nic.eq(1)
                        m.next = "NIC"
                else:
                    m.d.comb += r.start_nic.eq(1)
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

    def _payload(self, m, r):
        """Frame words 10 .. 10 + nic_words to the NIC turn: each after the first completes a
        payload word with the two bytes of the one before."""
        n, issue = r.n, r.issue
        with m.If(r.nic.room):
            at = Signal(18)        # the payload byte the word starts with
            pl = r.frame.verdict.payload_length
            m.d.comb += [
                at.eq((n - 1) << 2),
                issue.op.eq(Mux(n == 0, ReadOp.PRIME, ReadOp.NIC)),
                issue.index.eq(((n - 1) & (LANES - 1)) + 1),
                issue.bytes.eq(Mux(pl >= at + BEAT_BYTES, BEAT_BYTES,
                                   Mux(pl > at, pl - at, 0))),
                issue.last.eq(n == r.nic_words),
                r.store.read_addr.eq(r.frame.start + _HEAD_WORDS + n),
            ]
            m.d.sync += n.eq(n + 1)
            with m.If(n == r.nic_words):
                m.next = "ANSWER"

    def _answer(self, m, r):
        """The NIC path's answer decides: a replacement is re-framed, a packet it left alone
        passes the stored frame, a drop drops it."""
        events, answer, verdict = r.events, r.nic.answer, r.frame.verdict
        replace = Signal()
        with m.If(answer.dropped):
            m.d.sync += events.drop_malformed.eq(1)
            m.next = "DONE"
        with m.Elif(answer.answered):
            rewritten = answer.rewritten
            m.d.sync += r.n.eq(0)
            if self.direction == "tx":
                m.d.comb += replace.eq(rewritten & (answer.bytes <= verdict.payload_length))
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

    def _frame(self, m, r):
        """The stored frame out, word for word."""
        n, issue, frame = r.n, r.issue, r.frame
        with m.If(r.out.room):
            last = n == r.frame_words - 1
            m.d.comb += [issue.op.eq(ReadOp.FRAME), issue.last.eq(last),
                         issue.last_be.eq(_last_be(frame.verdict.length)),
                         r.store.read_addr.eq(frame.start + n)]
            # the word is read for the last time (its data leaves the memory the next
            # cycle, before a write that takes its place could land): free it now, so that
            # the next frame can arrive while a jumbo goes out
            m.d.sync += [n.eq(n + 1), r.free_ptr.eq(frame.start + n + 1)]
            with m.If(last):
                m.d.sync += r.emitted.eq(1)
                m.next = "DONE"

    def _board(self, m, r):
        """The stored frame to the board's service (host side)."""
        n, issue, frame = r.n, r.issue, r.frame
        # The service takes every word once it took the first (it stores them as they
        # come): wait for it to be free before the first only.
        with m.If(self.board_free | (n != 0)):
            last = n == r.frame_words - 1
            m.d.comb += [issue.op.eq(ReadOp.BOARD), issue.last.eq(last),
                         r.store.read_addr.eq(frame.start + n)]
            m.d.sync += [n.eq(n + 1), r.free_ptr.eq(frame.start + n + 1)]
            with m.If(last):
                m.next = "DONE"

    def _reframe(self, m, r):
        """Frame words 0-9, then the packet buffer's words: the packet two bytes in, its last
        word holding its last two bytes (a packet is whole words)."""
        n, issue, frame = r.n, r.issue, r.frame
        with m.If(r.out.room):
            word = n - _HEAD_WORDS
            last = word == (r.nic.answer.bytes >> 2)
            with m.If(n < _HEAD_WORDS):
                m.d.comb += [issue.op.eq(ReadOp.HEADER), issue.index.eq(n),
                             r.store.read_addr.eq(frame.start + n)]
                # the rest comes from the packet buffer: after the last header word the
                # store holds nothing of this frame that is still needed
                with m.If(n == _HEAD_WORDS - 1):
                    m.d.sync += r.free_ptr.eq(frame.end)
            with m.Else():
                m.d.comb += [issue.op.eq(ReadOp.PACKET), issue.index.eq(word[:3]),
                             issue.last.eq(last), issue.last_be.eq(0b0010),
                             r.nic.packet_addr.eq(word >> 3)]
            m.d.sync += n.eq(n + 1)
            with m.If((n >= _HEAD_WORDS) & last):
                m.d.sync += r.emitted.eq(1)
                m.next = "DONE"
