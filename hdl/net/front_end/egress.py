"""A service's output buffer: takes an engine's output packet whole, or drops it whole.

The LiteEth core needs a datagram's length at its first word, and an engine's output
length is known only at its last beat (a compressed packet's size depends on its data), so
each service stores its engine's output packets whole before sending them. The buffer
never stalls its engine: an output packet that does not fit (the transmit path has been
held up, by an ARP exchange say) is dropped whole and counted, and the engine, the other
services and the receive path keep running.

Packets leave as 32-bit words (a :class:`hdl.stream.width.Downsizer` inside) with their byte
length and a tag (where the reply goes) on every word. A packet can be sent more than once
(``replay``): the switch's results go to every worker of a job from one stored copy.
"""
from __future__ import annotations

from amaranth import Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from contract.header import LANES
from hdl.net.front_end.layouts import WORD_BYTES, WORDS_PER_BEAT, egress_word, last_beat_words
from hdl.stream.axis import DATA_BITS, axis_signature
from hdl.stream.posted_fifo import PostedWriteFIFO
from hdl.stream.width import Downsizer

__all__ = ["EgressEvents", "EgressBuffer"]

#: One strobe per engine output packet, at its last beat.
EgressEvents = data.StructLayout({
    "stored": 1,    # stored whole; it will be sent
    "full": 1,      # did not fit (beats or descriptor slots): dropped whole
})


class EgressBuffer(wiring.Component):
    """Store-and-forward packet buffer between an engine and the transmit path.

    Parameters
    ----------
    depth : int
        Beats of storage (a power of two, at most 2048 so that a packet's byte length
        fits the core's 16-bit ``length``).
    packets : int
        Stored packets waiting at most (descriptor queue depth).
    tag_shape : shape-like
        What the service tells the transmit path about each packet (sampled from ``tag``
        at the packet's first beat).

    Members
    -------
    i : In(axis_signature())
        The engine's output, always ready. ``keep`` counts whole 32-bit words (a lane is
        kept when its first byte is), as the engines produce them.
    tag : In(tag_shape)
    o : Out(stream.Signature(egress_word(tag_shape)))
        The stored packets, one word per clock, each with ``length`` (bytes: 4 x kept
        words) and ``tag``; an empty packet is one word with ``length`` 0.
    replay : In(1)
        Sampled as a packet's last word leaves: 1 sends the same packet again, 0 frees it.
    events : Out(EgressEvents)
    """

    def __init__(self, *, depth, packets=16, tag_shape):
        if not isinstance(depth, int) or not 2 <= depth <= 2048 or depth & (depth - 1):
            raise ValueError(f"EgressBuffer depth must be a power of two in 2..2048 beats, "
                             f"not {depth!r}")
        if not isinstance(packets, int) or packets < 1:
            raise ValueError(f"EgressBuffer must queue at least 1 packet, not {packets!r}")
        self.depth, self.packets, self._tag_shape = depth, packets, tag_shape
        self._descriptor = data.StructLayout({"tag": tag_shape, "words": unsigned(16)})
        super().__init__({
            "i": In(axis_signature()),
            "tag": In(tag_shape),
            "o": Out(stream.Signature(egress_word(tag_shape))),
            "replay": In(1),
            "events": Out(EgressEvents),
        })

    def elaborate(self, platform):
        m = Module()
        depth = self.depth
        abits = exact_log2(depth)
        i = self.i

        m.submodules.memory = memory = Memory(shape=DATA_BITS, depth=depth, init=[])
        write = memory.write_port()
        read = memory.read_port()
        m.submodules.queue = queue = PostedWriteFIFO(width=self._descriptor.size,
                                                     depth=self.packets)
        side = data.StructLayout({"length": unsigned(16), "tag": self._tag_shape})
        m.submodules.downsizer = downsizer = Downsizer(side)

        write_ptr = Signal(abits + 1)
        commit_ptr = Signal(abits + 1)
        free_ptr = Signal(abits + 1)     # start of the oldest packet still needed

        # -- write side -------------------------------------------------------------------
        first = Signal(init=1)
        dropping = Signal()
        words = Signal(16)
        tag = Signal(self._tag_shape)
        beat_words = Signal(range(LANES + 1))
        m.d.comb += beat_words.eq(sum(i.p.keep[WORD_BYTES * j] for j in range(LANES)))
        dropping_now = Signal()
        room = Signal()
        words_so_far = Signal(16)
        tag_now = Signal(self._tag_shape)
        m.d.comb += [
            i.ready.eq(1),
            dropping_now.eq(Mux(first, ~queue.w_rdy, dropping)),
            # full: the pointers `depth` apart (write_ptr - free_ptr never exceeds it), an
            # equality, not a subtraction and a compare
            room.eq((write_ptr[:abits] != free_ptr[:abits])
                    | (write_ptr[abits] == free_ptr[abits])),
            words_so_far.eq(Mux(first, 0, words)),
            tag_now.eq(Mux(first, self.tag, tag)),
            write.addr.eq(write_ptr[:abits]),
            write.data.eq(i.p.data),
        ]
        descriptor = Signal(self._descriptor)
        m.d.comb += [descriptor.tag.eq(tag_now), descriptor.words.eq(words_so_far + beat_words),
                     queue.w_data.eq(descriptor)]
        m.d.sync += self.events.eq(0)
        with m.If(i.valid):
            m.d.sync += first.eq(i.p.last)
            with m.If(first):
                m.d.sync += tag.eq(self.tag)
            stores = ~dropping_now & room
            with m.If(stores):
                m.d.comb += write.en.eq(1)
                m.d.sync += [write_ptr.eq(write_ptr + 1), words.eq(words_so_far + beat_words)]
            m.d.sync += dropping.eq(~stores)
            with m.If(i.p.last):
                m.d.sync += [self.events.stored.eq(stores), self.events.full.eq(~stores)]
                with m.If(stores):
                    m.d.comb += queue.w_en.eq(1)
                    m.d.sync += commit_ptr.eq(write_ptr + 1)
                with m.Else():
                    m.d.sync += write_ptr.eq(commit_ptr)

        # -- read side: the oldest packet's beats into the downsizer ----------------------
        head = data.View(self._descriptor, queue.r_data)
        active = Signal()
        read_ptr = Signal(abits + 1)
        remaining = Signal(abits + 2)
        head_beats = Signal(abits + 2)
        last_words = Signal(4)
        m.d.comb += [
            head_beats.eq(Mux(head.words == 0, 1, (head.words + (WORDS_PER_BEAT - 1)) >> 3)),
            last_words.eq(last_beat_words(head.words)),
        ]
        with m.If(~active & queue.r_rdy):
            m.d.sync += [active.eq(1), remaining.eq(head_beats)]

        ds_valid = Signal()
        load = Signal()
        m.d.comb += [
            load.eq(active & (remaining != 0) & (~ds_valid | downsizer.i.ready)),
            read.addr.eq(read_ptr[:abits]),
            read.en.eq(load),
            downsizer.i.valid.eq(ds_valid),
            downsizer.i.p.data.eq(read.data),
        ]
        with m.If(load):
            is_last = remaining == 1
            m.d.sync += [
                read_ptr.eq(read_ptr + 1),
                remaining.eq(remaining - 1),
                ds_valid.eq(1),
                downsizer.i.p.words.eq(Mux(is_last, last_words, WORDS_PER_BEAT)),
                downsizer.i.p.last.eq(is_last),
                downsizer.i.p.side.length.eq(head.words << 2),
                downsizer.i.p.side.tag.eq(head.tag),
            ]
        with m.Elif(downsizer.i.ready):
            m.d.sync += ds_valid.eq(0)

        o = self.o
        m.d.comb += [
            o.valid.eq(downsizer.o.valid),
            o.p.data.eq(downsizer.o.p.data),
            o.p.last.eq(downsizer.o.p.last),
            o.p.length.eq(downsizer.o.p.side.length),
            o.p.tag.eq(downsizer.o.p.side.tag),
            downsizer.o.ready.eq(o.ready),
        ]
        with m.If(o.valid & o.ready & o.p.last):
            with m.If(self.replay):
                m.d.sync += [read_ptr.eq(free_ptr), remaining.eq(head_beats)]
            with m.Else():
                m.d.comb += queue.r_en.eq(1)
                m.d.sync += [active.eq(0), free_ptr.eq(read_ptr)]
        return m
