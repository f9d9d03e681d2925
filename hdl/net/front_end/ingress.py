"""A service's input buffer: takes a datagram whole or drops it whole, never stalls.

The receive path cannot push back on the wire (the LiteEth core loses bytes if its output
is stalled), and whether a datagram is good is known only at its last beat (the FCS, the
UDP checksum, the worker-table check). So every service stores each datagram as it comes
and publishes it to its engine only at its last beat, if it was good; a datagram that
would not fit (decided at its first beat, from the length the core gives there) is not
stored at all. One engine's back-pressure therefore fills only its own buffer, and a full
buffer drops (and counts) only its own datagrams.
"""
from __future__ import annotations

import dataclasses
from amaranth import Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from contract.header import BEAT_BYTES
from hdl.net.front_end.layouts import (WORD_BYTES, ServiceBeat, UdpMeta, WideBeat, beats_for_length,
                             keep_for_words, last_beat_words)
from hdl.stream.axis import DATA_BITS
from hdl.stream.posted_fifo import PostedWriteFIFO

__all__ = ["IngressEvents", "IngressBuffer"]


def keep_for_bytes(length):
    """``keep`` of the last beat of a datagram of ``length`` bytes (an Amaranth value):
    its bytes in that beat, 32 for a whole beat, none for an empty datagram."""
    tail = length[:5]
    return Mux(length == 0, 0,
               Mux(tail == 0, (1 << BEAT_BYTES) - 1,
                   ((Const(1, BEAT_BYTES + 1) << tail) - 1)[:BEAT_BYTES]))

#: One strobe per datagram that is neither core-flagged (``error``) nor refused by a check
#: in front (``drop``), at its last beat: exactly one of these.
IngressEvents = data.StructLayout({
    "accepted": 1,     # stored whole; the engine will get it
    "full": 1,         # no room for it when it started: dropped whole
    "too_long": 1,     # longer than ``max_length`` bytes: dropped whole
    "mismatch": 1,     # more or fewer beats than its length says (never from a good core)
})


@dataclasses.dataclass(frozen=True)
class _Parts:
    """The buffer's memory ports, its descriptor queue and its pointers, which the write and
    read sides share."""
    m: Module
    abits: int
    write: object
    read: object
    queue: object
    descriptor: object
    descriptor_layout: data.StructLayout
    write_ptr: Signal
    commit_ptr: Signal
    free: Signal           # entries free (its own register: see elaborate)


class IngressBuffer(wiring.Component):
    """Store-and-forward datagram buffer with whole-datagram admission.

    A datagram is admitted at its first beat when its beats (``max(1, ceil(length / 32))``)
    fit in the free space, the descriptor queue has room and ``length <= max_length``; its
    beats are then written as they come and published (descriptor pushed) at its last
    beat unless ``error`` or ``drop`` is set there, in which case they are forgotten. The
    reader gets each published datagram as the engines' AXI-Stream beats, ``keep`` of the
    last beat from the length (whole 32-bit words), ``first`` on the first beat and the
    datagram's ``meta`` on every beat, one beat per clock. With ``byte_keep`` the last
    beat's ``keep`` marks the datagram's bytes exactly instead (the switch: it drops a
    datagram whose length is not a whole number of words, ``docs/network-contract.md``).

    Parameters
    ----------
    depth : int
        Beats of storage (a power of two); a datagram of ``32 * depth`` bytes fits when
        the buffer is empty.
    datagrams : int
        Published datagrams waiting at most (descriptor queue depth).
    max_length : int, optional
        Longest datagram taken, bytes; default what the buffer holds.
    byte_keep : bool
        ``keep`` of the last beat to the byte (default: whole 32-bit words).
    header_of_long : bool
        Take a datagram longer than ``max_length`` as its first beat alone, published with
        ``length`` 32 (and counted ``accepted``), instead of dropping it (``too_long``).
        The control service: such a request still has its key checked, and it is refused
        with an ``ERROR`` reply (its length is not ``32 + 8 * count``), as every other bad
        request is (``docs/network-contract.md``). Needs ``max_length >= 32``.

    Members
    -------
    i : In(stream.Signature(WideBeat))
        Always ready.
    o : Out(stream.Signature(ServiceBeat))
    events : Out(IngressEvents)
    again, release : In(1)
        ``hold`` only: strobes, each once per reading of a datagram, after its last beat
        has left (and before the next reading starts): ``again`` reads the same datagram
        once more from its first beat, ``release`` frees it (the next one follows).
    """

    #: Clocks from a datagram's last beat in (``i.valid & i.p.last``) to its event strobe.
    EVENT_LATENCY = 2

    def __init__(self, *, depth, datagrams=16, max_length=None, byte_keep=False,
                 header_of_long=False, hold=False):
        if not isinstance(depth, int) or depth < 2 or depth & (depth - 1):
            raise ValueError(f"IngressBuffer depth must be a power of two >= 2 beats, "
                             f"not {depth!r}")
        if not isinstance(datagrams, int) or datagrams < 1:
            raise ValueError(f"IngressBuffer must queue at least 1 datagram, not {datagrams!r}")
        capacity = depth * BEAT_BYTES
        if max_length is None:
            max_length = min(capacity, 0xFFFF)
        if not isinstance(max_length, int) or not 0 <= max_length <= min(capacity, 0xFFFF):
            raise ValueError(f"IngressBuffer max_length must be 0..{min(capacity, 0xFFFF)} "
                             f"bytes for depth {depth}, not {max_length!r}")
        if header_of_long and max_length < BEAT_BYTES:
            raise ValueError(f"IngressBuffer header_of_long needs max_length >= {BEAT_BYTES} "
                             f"bytes (a whole header), not {max_length!r}")
        self.depth, self.datagrams, self.max_length = depth, datagrams, max_length
        self.byte_keep, self.header_of_long = bool(byte_keep), bool(header_of_long)
        self.hold = bool(hold)
        members = {
            "i": In(stream.Signature(WideBeat)),
            "o": Out(stream.Signature(ServiceBeat)),
            "events": Out(IngressEvents),
        }
        if self.hold:
            members.update({"again": In(1), "release": In(1)})
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        depth = self.depth
        abits = exact_log2(depth)

        m.submodules.memory = memory = Memory(shape=DATA_BITS, depth=depth, init=[])
        write = memory.write_port()
        read = memory.read_port()
        # A published datagram's descriptor: its addressing, and its beats and last beat's
        # `keep`, worked out from its length on the write side, so that the read side loads
        # them from the queue as they are (no length arithmetic after the queue's read).
        descriptor_layout = data.StructLayout({
            "meta": UdpMeta, "beats": unsigned(abits + 2), "last_keep": unsigned(BEAT_BYTES)})
        m.submodules.queue = queue = PostedWriteFIFO(width=descriptor_layout.size,
                                                     depth=self.datagrams)
        descriptor = data.View(descriptor_layout, queue.w_data)

        # Pointers with one extra bit: full and empty differ.
        write_ptr = Signal(abits + 1)    # next entry to write
        commit_ptr = Signal(abits + 1)   # end of the last published datagram
        # Free entries, depth - (commit_ptr - read_ptr), kept in a register of its own (a
        # publish takes its datagram's beats, a load frees one): the admission below
        # compares a register with a register, no pointer arithmetic in front.
        free = Signal(abits + 2, init=depth)
        parts = _Parts(m=m, abits=abits, write=write, read=read, queue=queue,
                       descriptor=descriptor, descriptor_layout=descriptor_layout,
                       write_ptr=write_ptr, commit_ptr=commit_ptr, free=free)
        publish, limit = self._write_side(parts)
        self._read_side(parts, publish, limit)
        return m

    def _write_side(self, p):
        """Each datagram admitted at its first beat or not, its beats written, published at
        its last beat (or forgotten); returns the publish strobe and the entries it takes."""
        m, abits, i = p.m, p.abits, self.i
        write, queue, descriptor = p.write, p.queue, p.descriptor
        write_ptr, commit_ptr, free = p.write_ptr, p.commit_ptr, p.free
        # The input register: a beat, its datagram's length in beats, whether it is too
        # long, and where the beat stands against that length (within it, its last), so
        # that the decisions below start from registers, not from the dispatch's port
        # decoding in front nor from a count compared with the length (the input never
        # stalls, so this is one clock of latency and nothing else).
        m.d.comb += i.ready.eq(1)
        beat = Signal(WideBeat)
        beat_valid = Signal()
        need = Signal(abits + 2)
        too_long = Signal()
        last_keep_in = Signal(BEAT_BYTES)
        within = Signal()                # the beat is one its length promises ...
        final = Signal()                 # ... and the last of them
        # beats of the datagram before this one at the input, saturating (a datagram is
        # at most 2048 beats: 65535 bytes)
        index = Signal(12)
        m.d.sync += beat_valid.eq(i.valid)
        with m.If(i.valid):
            length = i.p.meta.length
            is_long = length > self.max_length
            beats = beats_for_length(length)
            keep = keep_for_bytes(length) if self.byte_keep else keep_for_words(
                last_beat_words((length + (WORD_BYTES - 1)) >> 2))
            if self.header_of_long:     # its header beat alone: a whole beat
                beats = Mux(is_long, 1, beats)
                keep = Mux(is_long, (1 << BEAT_BYTES) - 1, keep)
            m.d.sync += [beat.eq(i.p), too_long.eq(is_long), need.eq(beats),
                         last_keep_in.eq(keep),
                         within.eq(index < beats), final.eq(index + 1 == beats),
                         index.eq(Mux(i.p.last, 0, Mux(index == 2**len(index) - 1, index,
                                                       index + 1)))]

        first = Signal(init=1)
        admitted = Signal()              # admitted at its first beat (held for the rest)
        promised = Signal(abits + 2)     # beats its length says it has (held)
        long_held = Signal()             # it was too long (held)
        admit_now = Signal()
        fits = (need <= free) & queue.w_rdy
        m.d.comb += admit_now.eq(fits if self.header_of_long else ~too_long & fits)
        storing, limit, long = Signal(), Signal(abits + 2), Signal()
        m.d.comb += [
            storing.eq(Mux(first, admit_now, admitted)),
            limit.eq(Mux(first, need, promised)),
            long.eq(Mux(first, too_long, long_held)),
            write.addr.eq(write_ptr[:abits]),
            write.data.eq(beat.data),
            descriptor.meta.eq(beat.meta),
            descriptor.beats.eq(need),
            descriptor.last_keep.eq(last_keep_in),
        ]
        if self.header_of_long:
            with m.If(long):
                m.d.comb += descriptor.meta.length.eq(BEAT_BYTES)
        # A good datagram has exactly the beats its length says (the core's contract). One
        # that has more or fewer is never published (the reader reads by the length, so it
        # would take a stranger's beats): it is dropped and counted as `mismatch`. Beats
        # past its length are not written (`within`: an admitted datagram has all the
        # beats before them written).
        publish = Signal()
        m.d.sync += self.events.eq(0)
        with m.If(beat_valid):
            m.d.sync += first.eq(beat.last)
            with m.If(first):
                m.d.sync += [admitted.eq(admit_now), promised.eq(need), long_held.eq(too_long)]
            with m.If(storing & within):
                m.d.comb += write.en.eq(1)
                m.d.sync += write_ptr.eq(write_ptr + 1)
            with m.If(beat.last):
                good = ~beat.error & ~beat.drop
                exact = storing & final
                if self.header_of_long:
                    # its header beat is all it keeps (the rest goes unwritten)
                    exact = storing & (long | final)
                m.d.comb += publish.eq(exact & good)
                with m.If(publish):
                    m.d.comb += queue.w_en.eq(1)
                    # past the last beat written (a header_of_long datagram's last beat
                    # is not: only its header was)
                    m.d.sync += commit_ptr.eq(write_ptr + write.en)
                with m.Else():
                    m.d.sync += write_ptr.eq(commit_ptr)
                with m.If(good):
                    m.d.sync += [
                        self.events.accepted.eq(publish),
                        self.events.too_long.eq(0 if self.header_of_long else long),
                        self.events.full.eq(~storing if self.header_of_long
                                            else ~long & ~storing),
                        self.events.mismatch.eq(storing & ~exact),
                    ]

        return publish, limit

    def _read_side(self, p, publish, limit):
        """Published datagrams out, a beat a clock, through the RAM's output and a register;
        the free entries counted."""
        m, abits, o = p.m, p.abits, self.o
        read, queue, free = p.read, p.queue, p.free
        read_ptr = Signal(abits + 1)     # next entry to load into the output register
        active = Signal()                # a datagram is being read
        remaining = Signal(abits + 2)    # of its beats, not yet loaded
        meta = Signal(UdpMeta)
        last_keep = Signal(BEAT_BYTES)
        at_first = Signal()
        head = data.View(p.descriptor_layout, queue.r_data)
        # hold: the datagram read last waits for `again` or `release` (`waiting`), and its
        # beats are freed by the release, not as they are read
        waiting = Signal()
        start_ptr = Signal(abits + 1)
        held_beats = Signal(abits + 2)
        with m.If(~active & ~waiting & queue.r_rdy):
            m.d.comb += queue.r_en.eq(1)
            m.d.sync += [
                active.eq(1),
                meta.eq(head.meta),
                remaining.eq(head.beats),
                last_keep.eq(head.last_keep),
                at_first.eq(1),
                start_ptr.eq(read_ptr),
                held_beats.eq(head.beats),
            ]
        if self.hold:
            with m.If(self.again):
                m.d.sync += [waiting.eq(0), active.eq(1), read_ptr.eq(start_ptr),
                             remaining.eq(held_beats), at_first.eq(1)]
            with m.Elif(self.release):
                m.d.sync += waiting.eq(0)
        # Two stages: the block RAM's output (it holds while its read is not enabled), with
        # its beat's fields in registers beside it, then the output register, so that the
        # engine's input logic starts from a flip-flop, not from the block RAM's slow
        # clock-to-output.
        ram_beat = Signal(ServiceBeat)   # all but `data`, which is the RAM's output
        ram_valid = Signal()
        advance = Signal()               # the RAM's beat moves into the output register
        load = Signal()                  # the next beat is read out of the RAM
        m.d.comb += [
            advance.eq(ram_valid & (~o.valid | o.ready)),
            load.eq(active & (remaining != 0) & (~ram_valid | advance)),
            read.addr.eq(read_ptr[:abits]),
            read.en.eq(load),
        ]
        with m.If(advance):
            m.d.sync += [o.valid.eq(1), o.p.data.eq(read.data), o.p.last.eq(ram_beat.last),
                         o.p.first.eq(ram_beat.first), o.p.keep.eq(ram_beat.keep),
                         o.p.meta.eq(ram_beat.meta)]
        with m.Elif(o.ready):
            m.d.sync += o.valid.eq(0)
        # A publish takes `limit` entries, a load frees one (both may happen in a clock). The
        # load is counted a clock late (the admission sees one beat less free for a clock),
        # so that the engine's `ready` ends at a register, not in this arithmetic.
        loaded = Signal(abits + 2)
        if self.hold:
            m.d.sync += loaded.eq(Mux(self.release, held_beats, 0))
        else:
            m.d.sync += loaded.eq(load)
        freed = Signal(abits + 2)
        m.d.comb += freed.eq(free + loaded)
        m.d.sync += free.eq(Mux(publish, freed - limit, freed))
        with m.If(load):
            is_last = remaining == 1
            m.d.sync += [
                read_ptr.eq(read_ptr + 1),
                remaining.eq(remaining - 1),
                ram_valid.eq(1),
                ram_beat.last.eq(is_last),
                ram_beat.first.eq(at_first),
                ram_beat.keep.eq(Mux(is_last, last_keep, (1 << BEAT_BYTES) - 1)),
                ram_beat.meta.eq(meta),
                at_first.eq(0),
            ]
            with m.If(is_last):
                m.d.sync += [active.eq(0), waiting.eq(self.hold)]
        with m.Elif(advance):
            m.d.sync += ram_valid.eq(0)
