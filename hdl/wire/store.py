"""The frame store of one direction of the NIC in the wire (:class:`hdl.wire.path.WirePath`),
and the reads its frames leave by.

:class:`FrameStore` writes every beat a port's MAC receives into a ring of block RAM as it
comes, and once the :class:`~hdl.wire.classify.FrameClassifier` beside it has given its
verdict (two cycles after the frame's last beat) hands the frame on as a :data:`Descriptor`
(where its words are, and the verdict). Frames that do not fit are dropped whole, never
stalled: the MAC cannot wait. A frame is stored when every one of its words found room and a
descriptor slot was free at its last beat; otherwise its words are forgotten at that last
beat (the next frame's first beat may follow in the very next cycle) and it counts as
``drop_full``. The path's reader frees the words (``free_ptr``: the oldest word it still
needs) and the slots (``released``: it is done with a frame).

The reader reads the store (and the packet buffer of a re-framed datagram) a word a clock;
each read carries a :data:`StoreRead`, which says what the next clock does with its word
(:class:`ReadOp`): the parts of the path behind the reads act on it.
"""
from amaranth import Module, Signal, unsigned
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from hdl.wire.classify import BEAT_BYTES, MacBeat, Verdict

__all__ = ["WORD_BITS", "ReadOp", "StoreRead", "pointer_shape", "descriptor_layout",
           "StoreEvents", "FrameStore"]

WORD_BITS = 8 * BEAT_BYTES


class ReadOp(enum.Enum, shape=3):
    """What the read stage does with a word read the cycle before."""
    NONE = 0
    PRIME = 1       # frame word 10: the first payload word's two bytes, kept
    NIC = 2         # a payload word: the kept bytes and two of this word, to the NIC path
    FRAME = 3       # a stored frame word, out as it is
    HEADER = 4      # a stored frame word of a re-framed datagram, lengths rewritten
    PACKET = 5      # a word of the re-framed packet, out of the packet buffer
    BOARD = 6       # a stored frame word, to the board's service


#: A read issued in one clock, acted on the next (the memories answer a clock later).
StoreRead = data.StructLayout({
    "op": ReadOp,
    "index": unsigned(4),        # HEADER: frame word; PACKET: lane of the packet buffer
                                 # beat; NIC: the word's place in its NIC beat, from 1
    "bytes": unsigned(3),        # NIC: payload bytes in the word (the rest are zero)
    "last": unsigned(1),         # the frame's (or the NIC packet's) last word
    "last_be": unsigned(BEAT_BYTES),
})


def pointer_shape(store_bytes):
    """A word address of a store of ``store_bytes`` and a lap bit: full differs from
    empty."""
    return unsigned(exact_log2(store_bytes // BEAT_BYTES) + 1)


def descriptor_layout(store_bytes):
    """A stored frame: its verdict, its first word and the word after its last."""
    pointer = pointer_shape(store_bytes)
    return data.StructLayout({"verdict": Verdict, "start": pointer, "end": pointer})


#: the store's counter strobes (``WIRE_COUNTERS`` names): high in the clock a frame's last
#: beat comes (``frames_in``) or its verdict finds it dropped (``drop_full``)
StoreEvents = data.StructLayout({"frames_in": 1, "drop_full": 1})


class FrameStore(wiring.Component):
    """Every frame of one port, stored as it comes, handed on with its verdict.

    Parameters
    ----------
    store_bytes : int
        Bytes of the store, a power of two.
    frames : int
        Frames it holds at most (descriptor slots, in block RAM).

    Members
    -------
    i : In(stream.Signature(MacBeat, always_ready=True))
        Frames from the port's MAC; never stalled.
    verdict : In(stream.Signature(Verdict, always_ready=True))
        The classifier's verdict on each frame, two cycles after its last beat.
    frames : Out(stream.Signature(descriptor_layout(store_bytes)))
        The stored frames, in order (a descriptor FIFO's head: its payload is valid with
        ``valid``).
    read_addr : In(range(store_bytes // 4))
        The word the reader reads ...
    read_data : Out(32)
        ... and that word, a clock later.
    free_ptr : In(pointer_shape(store_bytes))
        The oldest word the reader still needs: words before it may be written.
    released : In(1)
        The reader is done with a frame: its descriptor slot is free.
    events : Out(StoreEvents)
    """

    def __init__(self, *, store_bytes, frames):
        self.store_bytes, self.frames_max = store_bytes, frames
        self.depth = store_bytes // BEAT_BYTES
        pointer = pointer_shape(store_bytes)
        super().__init__({
            "i": In(stream.Signature(MacBeat, always_ready=True)),
            "verdict": In(stream.Signature(Verdict, always_ready=True)),
            "frames": Out(stream.Signature(descriptor_layout(store_bytes))),
            "read_addr": In(exact_log2(self.depth)),
            "read_data": Out(WORD_BITS),
            "free_ptr": In(pointer),
            "released": In(1),
            "events": Out(StoreEvents),
        })

    def elaborate(self, platform):
        m = Module()
        depth = self.depth
        abits = exact_log2(depth)
        pointer = pointer_shape(self.store_bytes)
        Descriptor = descriptor_layout(self.store_bytes)
        events = self.events

        m.submodules.store = store = Memory(shape=WORD_BITS, depth=depth, init=[])
        store_w = store.write_port()
        store_r = store.read_port()
        m.d.comb += [store_r.addr.eq(self.read_addr), self.read_data.eq(store_r.data)]
        # (buffered: a block RAM, not 93-bit-wide LUT RAM)
        m.submodules.descriptors = descriptors = SyncFIFOBuffered(width=Descriptor.size,
                                                                  depth=self.frames_max)
        m.d.comb += [self.frames.valid.eq(descriptors.r_rdy),
                     self.frames.p.eq(descriptors.r_data),
                     descriptors.r_en.eq(self.frames.ready)]
        write_ptr = Signal(pointer)
        frame_start = Signal(pointer)
        free_ptr = self.free_ptr          # the oldest word still needed
        lost = Signal()                    # a word of this frame found no room
        reserved = Signal(range(self.frames_max + 1))  # frames stored, not yet done with
        released = self.released           # the read side is done with a frame
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
        m.d.comb += stored.eq(room & ~lost & (reserved != self.frames_max))
        m.d.sync += [ended[0].valid.eq(i.valid & i.p.last), ended[1].eq(ended[0])]
        with m.If(i.valid):
            with m.If(i.p.last):
                m.d.comb += events.frames_in.eq(1)
                m.d.sync += [lost.eq(0),
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
        m.d.comb += [new.verdict.eq(self.verdict.p), new.start.eq(ended[1].start),
                     new.end.eq(ended[1].end), descriptors.w_data.eq(new)]
        with m.If(self.verdict.valid):
            with m.If(ended[1].stored):
                m.d.comb += descriptors.w_en.eq(1)   # (a slot was reserved at the last beat)
            with m.Else():
                m.d.comb += events.drop_full.eq(1)
        return m
