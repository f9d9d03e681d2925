"""Unpacker: cut one INCEPTIONN block per clock out of a compressed packet's bitstream.

The receive path's front end hands this component the beats of every packet it does not
drop, each marked ``bypass`` (passed through) or not (an ``INC_F32`` packet: header beat,
then bitstream beats). For an ``INC_F32`` packet it emits the rewritten header
(``type = RAW_F32``), then one item per block, each the 34 bytes starting at the block
(tag vector in bits 0..15), then the packet's verdict.

How a block is found
--------------------
Every field of the bitstream is a whole number of bytes, so blocks start on byte
boundaries. The unread part of the bitstream sits in a circular window of four 256-bit
slots: input words are written into fixed slots and never move, so no wide shifter sits on
the window, and positions (the block pointer ``ptr`` among them) are absolute byte indices
modulo 128. ``win_bytes`` counts the valid bytes from the start of the oldest slot still in
use; a slot ``ptr`` has passed leaves the window one clock later, and a new word enters
whenever a slot is free. The input beat is written into the free slot every clock, taken or
not, so the window registers' enables come from registers.

The only recurrence is the pointer advance, and it is kept to one multiplexer:

* :class:`~hdl.nic.block_ends.BlockEnds` computes, before a word enters, where a block
  starting at each of its bytes would end; the window keeps these ``ends`` beside the data,
  made absolute with the slot's position as they are written;
* every clock, ``fits[q]`` records whether the block at byte ``q`` is all in the window
  (from registers: ``ends[q]`` against the bytes available from its slot on). It is one
  clock old when used; data only ever arrives, so an old "fits" is still true;
* ``ptr`` selects ``(fits, end)`` at its position; if the block fits and the output has
  room, ``ptr`` becomes the end.

For the last block of a packet, lanes past ``count`` carry nothing whatever their tag bits,
so it may be shorter than ``ends`` says; it still fires on the fast path (the real block is
no longer), and the packet's verdict uses ``last_ends`` (the masked end, rounded up to a
whole 32-bit word), also computed by :class:`~hdl.nic.block_ends.BlockEnds` and selected at
``ptr`` off the loop.

Blocks the fast path cannot fire yet (``fits`` lags a clock for blocks reaching into a word
that just entered) are caught by a five-clock *probe*: it reads the tag vector at ``ptr``
a clock after ``ptr`` moved (through a delayed copy, so no copy of ``ptr`` hangs on the
loop), registers it, then its exact (masked, for the last block) end, then compares that
with ``win_bytes`` and fires from that register (the end made absolute). The probe restarts
whenever ``ptr`` moves, and it also decides truncation (the input has ended and the block at
``ptr`` is not all there). A block thus leaves every clock while the input keeps up, and
34-byte blocks are limited by the input word rate (16 per 17 clocks); per packet there is
one idle clock, after the header, while the first word enters.

Output side
-----------
Items go through two registers: stage A holds a block's start (or a raw beat), stage B
rotates the block out of the window, a clock after it fired (its bytes are still there).
Neither is on the pointer loop, and neither waits for the output: both load on every clock
(only stage A's ``valid`` depends on whether a block fired), and a
:class:`~hdl.stream.credit_buffer.CreditBuffer` after them holds the items the output's consumer
has not taken yet. An item is only started when its ``space`` flag, a register, says it will
fit, so the consumer's ``ready`` reaches no decision here. The input side is decoupled the
same way: a two-entry FIFO after the block-ends stage takes the window's ``ready``.

End of packet (``docs/nic-contract.md``)
------------------------------------------
The block count is ``ceil(count / 8)``. The packet is

* **truncated** if the input ends (``tlast`` in the window) before a block is complete;
* **over-long** if any 32-bit word follows the last block's padded end (in the window
  already, or arriving before ``tlast``);
* good otherwise.

The verdict travels with the data as ``end``: ``COMMIT`` on the last block of a good packet
(or a data-less item, if ``tlast`` comes later), ``REWIND`` on the item at which a bad one
is detected (the output
buffer then discards everything written since the last commit). Bypassed beats all carry
``COMMIT`` (cut-through).
"""
import dataclasses

from amaranth import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from contract.header import BEAT_BYTES, LANES, PacketType
from hdl.header import HeaderLayout
from hdl.nic.block_ends import (
    END_BITS,
    PAIR_BYTES,
    BeatWithEnds,
    BlockEnds,
    UnpackRequest,
    block_end,
    block_payload_bytes,
)
from hdl.nic.layouts import BLOCK_BITS
from hdl.replica import replica, replicas
from hdl.stream.axis import DATA_BITS
from hdl.stream.credit_buffer import CreditBuffer
from hdl.stream.packet_buffer import End

__all__ = ["End", "UnpackRequest", "UnpackedItem", "RxUnpackEvents", "block_payload_bytes",
           "PAIR_BYTES", "Unpacker"]

WINDOW_WORDS = 4
WINDOW_BYTES = WINDOW_WORDS * BEAT_BYTES
TAG_MASK_ALL = (1 << 2 * LANES) - 1
#: A block end no window position reaches (relative to any slot): the initial block ends of
#: the input FIFO, which the window may read before any beat has been written.
NEVER_FITS = (1 << END_BITS) - 1
#: Positions per group of the pointer loop's multiplexer (each with its own select copy).
LOOP_GROUP_BYTES = 16


#: One output item: a raw beat (header, bypassed beat) or a block (``bits`` = the 34 bytes
#: from the block's first byte, tags of lanes past ``count`` cleared), or neither
#: (``write`` clear: only an end verdict).
UnpackedItem = data.StructLayout({
    "bits": unsigned(BLOCK_BITS),
    "raw": unsigned(1),
    "write": unsigned(1),
    "keep": unsigned(BEAT_BYTES),   # tkeep of the output beat this item becomes
    "last": unsigned(1),
    "end": End,
    "k": unsigned(4),
})

#: Fields an item carries unchanged from stage A to the output.
_ITEM_FIELDS = ("raw", "write", "keep", "last", "end", "k")

#: Stage A of the output: an item whose block is still to be read out of the window.
_PendingItem = data.StructLayout({
    "beat": unsigned(DATA_BITS),    # a raw item's data
    "start": unsigned(7),           # a block's first byte (absolute window position)
    "tag_mask": unsigned(2 * LANES),
    **{name: UnpackedItem[name].shape for name in _ITEM_FIELDS},
})

#: Receive counters decided here (strobes).
RxUnpackEvents = data.StructLayout({
    "decompressed": unsigned(1),
    "drop_truncated": unsigned(1),
    "drop_overlong": unsigned(1),
})

#: The input FIFO's wide fields (LUT RAM): they only go into the window.
_WideFields = data.StructLayout({name: BeatWithEnds[name].shape
                                 for name in ("data", "ends", "fits", "last_ends")})

#: The input FIFO's control fields (flip-flops): what the decisions read, the header's
#: ``k`` and ``count % 8`` among them.
_ControlFields = data.StructLayout({
    **{name: BeatWithEnds[name].shape
       for name in ("keep", "last", "bypass", "bytes", "empty", "blocks", "one_block")},
    "k": HeaderLayout["k"].shape,
    "count_low": unsigned(3),
})


# -- the parts the stages of Unpacker.elaborate hand each other -------------------------------
# (plain records of the signals a stage makes; the signals, their names and the order they
# are made in are the stages' own, so the netlist is the same however they are grouped)

@dataclasses.dataclass(frozen=True)
class _Context:
    """The module, the phases' enum (defined in ``elaborate``: its qualified name is in the
    netlist) and the most blocks of a packet."""
    Phase: type
    m: Module
    max_blocks: int


@dataclasses.dataclass(frozen=True)
class _InputBeat:
    """The window's input beat (after the block-ends stage and its two-entry FIFO), the
    header's ``k`` and low count bits, and the input's ready."""
    beat: object
    beat_valid: object
    in_ready: object
    header_k: object
    header_count_low: object


@dataclasses.dataclass(frozen=True)
class _Window:
    """The window of input words and its state: slots, the block pointer, ends, tags, the
    blocks left and the phase."""
    block_fired: object
    blocks_left: object
    ended: object
    ends: object
    fits: object
    full: object
    good_end: object
    in_blocks: object
    is_last_block: object
    k: object
    last_end_ptr: object
    last_ends: object
    last_keep: object
    last_tag_mask: object
    phase: object
    ptr: object
    ptr_slot: object
    read_slot: object
    tags_ptr: object
    two_left: object
    win_bytes: object
    window: object
    write_slot: object
    write_slot_onehot: object


@dataclasses.dataclass(frozen=True)
class _Output:
    """The output stages: how to emit an item or a verdict, the room they have, the pending
    item, the packet's verdict and events."""
    emit: object
    emit_verdict: object
    events: object
    in_bytes: object
    pending: object
    pending_valid: object
    space: object
    verdict: object


@dataclasses.dataclass(frozen=True)
class _Bookkeeping:
    """The window's bookkeeping: words taken and dropped, the bytes next, slot arithmetic
    (``relative``, ``absolute``)."""
    absolute: object
    drop: object
    relative: object
    room: object
    take_word: object
    win_bytes_next: object
    write_slot_next: object


@dataclasses.dataclass(frozen=True)
class _Pointer:
    """The block pointer's loop: the slot it reads from and the end it has selected."""
    from_ptr_slot: object
    move_ptr: object
    selected_end: object
    selected_fits: object
    selected_last_end: object


@dataclasses.dataclass(frozen=True)
class _Probe:
    """The probe of a block the fast path cannot fire yet: its end, whether it fits, its tags;
    and ``fire``, the block cut this clock."""
    fire: object
    next_ptr: object
    probe_checked: object
    probe_end: object
    probe_end_absolute: object
    probe_end_valid: object
    probe_final: object
    probe_fits: object
    probe_length: object
    probe_slot: object
    probe_start: object
    probe_tags: object
    probe_tags_valid: object
    tags_at_ptr: object


def shift_right_bytes(m, value, amount, width, name):
    """``width`` bits of ``value >> (8 * amount)``, as a logarithmic byte shifter (one 2:1
    mux level per bit of ``amount``; a balanced tree, unlike a 32-way case mux). Shifting
    ``Cat(v, v)`` rotates ``v``."""
    level = value
    for bit in reversed(range(len(amount))):
        # After this level, the shifts still to come total at most 8 * (2^bit - 1) bits.
        nxt = Signal(min(len(value), width + 8 * ((1 << bit) - 1)), name=f"{name}_b{bit}")
        m.d.comb += nxt.eq(Mux(amount[bit], level >> (8 << bit), level))
        level = nxt
    out = Signal(width, name=name)
    m.d.comb += out.eq(level)
    return out


def mux_tree(m, values, select, width, name):
    """``values[select]`` as a balanced tree of 2:1 muxes, ``select``'s low bit first (the
    high bits, often the slowest to arrive, pick among the last few)."""
    level = list(values)
    level += [level[-1]] * ((1 << len(select)) - len(level))
    for i in range(len(select)):
        level = [Mux(select[i], b, a) for a, b in zip(level[0::2], level[1::2])]
    out = Signal(width, name=name)
    m.d.comb += out.eq(level[0])
    return out


def keep_for_lanes(lanes):
    return (1 << (4 * lanes)) - 1


class Unpacker(wiring.Component):
    """Extract one block per clock from compressed packets; pass bypassed beats through.

    Parameters
    ----------
    max_count : int
        Largest ``count`` the front end lets through (sizes the block counter).

    Ports
    -----
    i : In(stream.Signature(UnpackRequest))
    o : Out(stream.Signature(UnpackedItem))
    events : Out(RxUnpackEvents)
        One-cycle strobes when a packet's verdict is reached.
    """

    def __init__(self, *, max_count=2048):
        if not isinstance(max_count, int) or isinstance(max_count, bool) or max_count < 1:
            raise TypeError(f"max_count must be a positive integer, not {max_count!r}")
        self._max_count = max_count
        super().__init__({
            "i": In(stream.Signature(UnpackRequest)),
            "o": Out(stream.Signature(UnpackedItem)),
            "events": Out(RxUnpackEvents),
        })

    def elaborate(self, platform):
        m = Module()
        max_blocks = -(-self._max_count // LANES)

        # (defined here, not at module level: its qualified name is in the netlist)
        class Phase(enum.Enum):
            BETWEEN = 0   # next beat is a header or a bypassed beat
            BLOCKS = 1    # cutting blocks
            CHECK = 2     # last block in stage A: judge the packet (and start the next)
            TAIL = 3      # all blocks out, nothing extra yet, tlast still to come
            DRAIN = 4     # verdict given (dropped), swallow the rest of the packet

        # The stages below take the parts they use and return the part they make.
        ctx = _Context(Phase=Phase, m=m, max_blocks=max_blocks)
        inp = self._input_fifo(ctx)
        win = self._window_state(ctx)
        out = self._output_stages(ctx, inp, win)
        book = self._window_bookkeeping(ctx, inp, win)
        ptr_loop = self._pointer_loop(ctx, win)
        probe = self._probe(ctx, win, out, ptr_loop)
        self._advance(ctx, inp, win, out, book, ptr_loop, probe)
        start_packet = self._header(ctx, inp, win, out)
        self._phases(ctx, inp, win, out, book, probe, start_packet)
        return m

    def _input_fifo(self, ctx):
        """The block-ends stage and the two-entry FIFO after it, which holds the window's input
        beat.
        """
        m = ctx.m
        m.submodules.ends = ends_stage = BlockEnds()
        wiring.connect(m, wiring.flipped(self.i), ends_stage.i)
        # The window's input ready is decided here, from the phase and the pointer. A
        # two-entry FIFO takes the beats, so that ready only moves the read pointer: it is
        # no clock enable of the 790 bits of a beat, nor of the block-ends stage and
        # everything before. The wide fields (data, ends) are LUT RAM read through the read
        # pointer; they only go into the window's registers. The few fields the control
        # decisions read (header, bypass, last, ...) are flip-flops, so those decisions
        # start from a 2:1 multiplexer of registers placed beside them and not from a RAM
        # read spread over the chip.
        #
        # The window reads the beat at the read pointer on every clock, valid or not (see
        # below), so every entry must always hold a beat whose block ends are possible:
        # BlockEnds's are (a block at byte j ends at j + 2 or later, which a slot without
        # data never holds), and so is the initial value, whose blocks end past any window.
        never_fits_beat = {"ends": [NEVER_FITS] * BEAT_BYTES,
                           "last_ends": [NEVER_FITS] * BEAT_BYTES}
        m.submodules.ends_fifo = ends_fifo = Memory(shape=_WideFields, depth=2,
                                                    init=[never_fits_beat] * 2)
        fifo_write = ends_fifo.write_port()
        fifo_read = ends_fifo.read_port(domain="comb")
        fifo_produce, fifo_consume = Signal(), Signal()
        fifo_level = Signal(range(3))
        in_ready = Signal()
        beat_valid = Signal()
        fifo_writes, fifo_reads = Signal(), Signal()
        written = ends_stage.o.p
        m.d.comb += [
            ends_stage.o.ready.eq(fifo_level != 2),
            fifo_writes.eq(ends_stage.o.valid & ends_stage.o.ready),
            fifo_write.addr.eq(fifo_produce),
            fifo_write.data.eq(Cat(*(written[name] for name in _WideFields.members))),
            fifo_write.en.eq(fifo_writes),
            fifo_read.addr.eq(fifo_consume),
            beat_valid.eq(fifo_level != 0),
            fifo_reads.eq(beat_valid & in_ready),
        ]
        m.d.sync += [
            fifo_produce.eq(fifo_produce ^ fifo_writes),
            fifo_consume.eq(fifo_consume ^ fifo_reads),
        ]
        # (written as two cases: Yosys 0.70's ABC9 step fails an assertion on some
        # subtractions of a 1-bit flag)
        with m.If(fifo_writes & ~fifo_reads):
            m.d.sync += fifo_level.eq(fifo_level + 1)
        with m.Elif(fifo_reads & ~fifo_writes):
            m.d.sync += fifo_level.eq(fifo_level - 1)

        # The control fields: both entries in flip-flops, read through a copy of the read
        # pointer of their own (ready reaches only the two pointer flip-flops; the RAM's
        # copy fans out to its 790 bits, this one to the control fields).
        written_control = Signal(_ControlFields)
        written_header = data.View(HeaderLayout, written.data)
        m.d.comb += [written_control[name].eq(written[name])
                     for name in _ControlFields.members if name in BeatWithEnds.members]
        m.d.comb += [written_control.k.eq(written_header.k),
                     written_control.count_low.eq(written_header.count[:3])]
        entries = [Signal(_ControlFields, name=f"fifo_control{n}") for n in range(2)]
        for n, entry in enumerate(entries):
            with m.If(fifo_writes & (fifo_produce == n)):
                m.d.sync += entry.eq(written_control)
        control_consume = replica(1, name="fifo_control_consume")
        m.d.sync += control_consume.eq(control_consume ^ fifo_reads)
        head = Signal(_ControlFields)
        m.d.comb += head.eq(Mux(control_consume, entries[1], entries[0]))

        beat = Signal(BeatWithEnds)
        for name in _WideFields.members:
            m.d.comb += beat[name].eq(fifo_read.data[name])
        for name in _ControlFields.members:
            if name in BeatWithEnds.members:
                m.d.comb += beat[name].eq(head[name])
        return _InputBeat(beat=beat, beat_valid=beat_valid, in_ready=in_ready,
                          header_k=head.k, header_count_low=head.count_low)

    def _window_state(self, ctx):
        """The packet's phase, the circular window, and the block pointer with its copies."""
        Phase, m, max_blocks = ctx.Phase, ctx.m, ctx.max_blocks
        phase = Signal(Phase)
        in_blocks = Signal()
        m.d.comb += in_blocks.eq(phase == Phase.BLOCKS)

        # The window is circular: input words are written into fixed slots (slot s is bits
        # 256 s .. 256 s + 255) and never move, so no wide shifter sits on it; positions are
        # absolute byte indices modulo WINDOW_BYTES.
        window = Signal(8 * WINDOW_BYTES, reset_less=True)
        read_slot = Signal(2)                         # the oldest slot still in the window
        write_slot = Signal(2)                        # the slot the next input word goes to
        write_slot_onehot = Signal(WINDOW_WORDS)
        full = Signal()                               # all four slots hold packet data
        win_bytes = Signal(range(WINDOW_BYTES + 1))   # valid bytes from read_slot's start
        # ends[q]: absolute end of a block starting at byte q; last_ends[q]: its masked,
        # padded end as the packet's last block, relative to the start of q's slot.
        ends = [Signal(END_BITS, name=f"end_at{q}", reset_less=True)
                for q in range(WINDOW_BYTES)]
        last_ends = [Signal(END_BITS, name=f"last_end_at{q}", reset_less=True)
                     for q in range(WINDOW_BYTES)]
        fits = Signal(WINDOW_BYTES)
        ptr = replica(7, name="ptr")                  # next block's first byte (absolute)
        # Copies of ptr for everything but the loop, so the loop's select lines do not also
        # spread over the window: one for the last-end select, loaded with ptr (it must
        # follow ptr at once). The probe reads its tag vector through `tags_ptr`, ptr a
        # clock late, so that copy hangs on a register and not on the loop; the probe
        # waits a clock after every move of ptr. (Replicas: synthesis keeps them apart.)
        last_end_ptr = replica(7, name="last_end_ptr")
        tags_ptr = replica(7, name="tags_ptr")
        ptr_slot = replica(2, name="ptr_slot")        # for the window's bookkeeping
        ended = Signal()                              # the packet's tlast is in the window
        # The block count follows `fire` a clock late (it is wide; `fire` ends the loop), so
        # blocks left = blocks_left - block_fired; is_last_block is kept exact.
        blocks_left = Signal(range(max_blocks + 1))
        block_fired = Signal()
        is_last_block = Signal()                      # one block left
        two_left = Signal()                           # two blocks left
        k = Signal(4)
        last_tag_mask = Signal(2 * LANES)             # lanes of the last block below count
        last_keep = Signal(BEAT_BYTES)
        good_end = Signal(END_BITS)                   # where a good packet ends (CHECK)
        return _Window(block_fired=block_fired, blocks_left=blocks_left,
                       ended=ended, ends=ends, fits=fits, full=full,
                       good_end=good_end, in_blocks=in_blocks,
                       is_last_block=is_last_block, k=k, last_end_ptr=last_end_ptr,
                       last_ends=last_ends, last_keep=last_keep,
                       last_tag_mask=last_tag_mask, phase=phase, ptr=ptr,
                       ptr_slot=ptr_slot, read_slot=read_slot, tags_ptr=tags_ptr,
                       two_left=two_left, win_bytes=win_bytes, window=window,
                       write_slot=write_slot, write_slot_onehot=write_slot_onehot)

    def _output_stages(self, ctx, inp, win):
        """Stage A (the pending item) and stage B (the item read out of the window) into the
        credit buffer, and the helpers that load stage A.
        """
        Phase, beat, k, m, phase, window = ctx.Phase, inp.beat, win.k, ctx.m, win.phase, win.window
        # -- output: stage A (pending item), stage B (item), then a credit buffer ---------
        # Stages A and B move on every clock, so no register of theirs waits for the
        # output's ready: an item enters stage A only when the credit buffer's `space` (a
        # register) says it will find room two clocks later.
        pending = Signal(_PendingItem)
        pending_valid = Signal()
        item = Signal(UnpackedItem)
        item_valid = Signal()
        m.submodules.out_buffer = out_buffer = CreditBuffer(UnpackedItem, latency=2)
        m.d.comb += [out_buffer.i.p.eq(item), out_buffer.i.valid.eq(item_valid)]
        wiring.connect(m, out_buffer.o, wiring.flipped(self.o))
        space = out_buffer.space
        # Stage B reads a block out of the live window, a clock after it fired: its bytes
        # are still there (a slot is rewritten only after the pointer has left it, and the
        # write lands a clock after that at the earliest), so stage A needs only the start.
        block_in_window = shift_right_bytes(m, Cat(window, window), pending.start, BLOCK_BITS,
                                            "block_in_window")
        block = Signal(BLOCK_BITS)
        m.d.comb += block.eq(Mux(pending.raw, pending.beat, block_in_window))
        m.d.sync += [
            item_valid.eq(pending_valid),
            item.bits.eq(Cat(block[:2 * LANES] & pending.tag_mask, block[2 * LANES:])),
            *[getattr(item, name).eq(getattr(pending, name)) for name in _ITEM_FIELDS],
            pending_valid.eq(0),    # unless an item is emitted below
        ]
        # In CHECK, stage A holds the last block and the packet's verdict is decided: it goes
        # out with the block.
        verdict = Signal(End)
        with m.If(phase == Phase.CHECK):
            m.d.sync += item.end.eq(verdict)

        def emit(**fields):
            """Load stage A's item fields (the caller checks ``space``; the wide fields load
            by themselves, see below)."""
            m.d.sync += pending_valid.eq(1)
            defaults = dict(raw=0, write=0, keep=(1 << BEAT_BYTES) - 1, last=0, end=End.NONE,
                            k=k)
            defaults.update(fields)
            for name, value in defaults.items():
                target = pending.end.as_value() if name == "end" else getattr(pending, name)
                if isinstance(value, End):
                    value = value.value
                m.d.sync += target.eq(value)

        def emit_verdict(end):
            """Load stage A with a data-less item carrying only ``end`` (the caller checks
            ``space``). Only ``write`` and ``end`` change: the wide fields keep
            whatever they hold, so their inputs never wait for this decision."""
            m.d.sync += [pending_valid.eq(1), pending.write.eq(0), pending.end.eq(end)]

        events = self.events
        m.d.sync += events.eq(0)

        in_bytes = beat.bytes                         # bytes of this input beat
        return _Output(emit=emit, emit_verdict=emit_verdict, events=events,
                       in_bytes=in_bytes, pending=pending,
                       pending_valid=pending_valid, space=space, verdict=verdict)

    def _window_bookkeeping(self, ctx, inp, win):
        """Slots the pointer passed leave the window, one input word may enter, and whether
        each byte's block fits.
        """
        beat, ends, fits, full, last_ends = inp.beat, win.ends, win.fits, win.full, win.last_ends
        m, ptr_slot, read_slot, win_bytes = ctx.m, win.ptr_slot, win.read_slot, win.win_bytes
        window, write_slot, write_slot_onehot = win.window, win.write_slot, win.write_slot_onehot
        # -- window bookkeeping: passed slots leave, one word may enter ------------------
        drop = Signal(2)                              # slots ptr has passed
        m.d.comb += drop.eq(ptr_slot - read_slot)
        take_word = Signal()
        # Next values of the bookkeeping registers (the header beat resets them).
        win_bytes_next = Signal.like(win_bytes)
        write_slot_next = Signal.like(write_slot)
        m.d.comb += [win_bytes_next.eq(win_bytes), write_slot_next.eq(write_slot)]
        m.d.sync += [
            win_bytes.eq(win_bytes_next),
            write_slot.eq(write_slot_next),
            write_slot_onehot.eq(1 << write_slot_next),
            full.eq(win_bytes_next > WINDOW_BYTES - BEAT_BYTES),
        ]
        # A full window's write slot is the read slot: free once ptr has left it (it leaves
        # the window at this clock edge, and the word entering takes its place).
        room = Signal()
        m.d.comb += room.eq(~full | (ptr_slot != read_slot))
        # The input beat is written into the write slot whenever that slot is free, taken or
        # not (a free slot's contents do not matter), so the enables of the window registers
        # are one LUT of registers.
        write_enable = Signal(WINDOW_WORDS)
        for s in range(WINDOW_WORDS):
            m.d.comb += write_enable[s].eq(write_slot_onehot[s] & ~(full & (ptr_slot == s)))

        def relative(position, slot):
            """A 7-bit absolute position as an offset from the start of ``slot``."""
            return Cat(position[:5], (position[5:7] - slot)[:2])

        def absolute(offset, slot):
            """An offset from the start of ``slot`` as a 7-bit absolute position."""
            return Cat(offset[:5], (offset[5:7] + slot)[:2])

        # Each slot takes the input beat whenever it is the free slot to write; the entry of
        # byte 31 of the slot before it (whose tag vector needs this beat) comes along.
        for s in range(WINDOW_WORDS):
            before = (s - 1) % WINDOW_WORDS
            with m.If(write_enable[s]):
                m.d.sync += window.word_select(s, DATA_BITS).eq(beat.data)
                for j in range(BEAT_BYTES - 1):
                    m.d.sync += [ends[BEAT_BYTES * s + j].eq(absolute(beat.ends[j], s)),
                                 last_ends[BEAT_BYTES * s + j].eq(beat.last_ends[j])]
                last = BEAT_BYTES - 1
                m.d.sync += [
                    ends[BEAT_BYTES * before + last].eq(absolute(beat.ends[last], before)),
                    last_ends[BEAT_BYTES * before + last].eq(beat.last_ends[last]),
                ]

        # fits[q]: the block at byte q is all in the window. From registers (so it lags a
        # clock for blocks reaching into a word that just entered; data only arrives, so
        # it is never wrong), except for the entering word's own blocks.
        available = []                                # valid bytes from each slot's start
        for s in range(WINDOW_WORDS):
            words_before = Signal(4, name=f"words_before_slot{s}")
            m.d.comb += words_before.eq(win_bytes[5:8] - ((s - read_slot)[:2]))
            avail = Signal(range(WINDOW_BYTES + 1), name=f"available_from_slot{s}")
            m.d.comb += avail.eq(Mux(words_before[3], 0, Cat(win_bytes[:5], words_before[:3])))
            available.append(avail)
        taken = [Signal(name=f"taken_into_slot{s}") for s in range(WINDOW_WORDS)]
        for s in range(WINDOW_WORDS):
            m.d.comb += taken[s].eq(take_word & write_slot_onehot[s])   # (room: enabled)
        next_fits = Signal(WINDOW_BYTES)
        for q in range(WINDOW_BYTES):
            s, j = divmod(q, BEAT_BYTES)
            in_window = relative(ends[q], s) <= available[s]
            writer = s if j < BEAT_BYTES - 1 else (s + 1) % WINDOW_WORDS
            m.d.comb += next_fits[q].eq(Mux(taken[writer], beat.fits[j], in_window))
        m.d.sync += fits.eq(next_fits)
        return _Bookkeeping(absolute=absolute, drop=drop, relative=relative,
                            room=room, take_word=take_word,
                            win_bytes_next=win_bytes_next,
                            write_slot_next=write_slot_next)

    def _pointer_loop(self, ctx, win):
        """The pointer loop: the (end, fits) at the pointer, selected through copies of its low
        bits.
        """
        ends, fits, last_end_ptr, last_ends = win.ends, win.fits, win.last_end_ptr, win.last_ends
        m, ptr, ptr_slot, tags_ptr, window = ctx.m, win.ptr, win.ptr_slot, win.tags_ptr, win.window
        # -- the pointer loop ------------------------------------------------------------
        # Each group of LOOP_GROUP_BYTES positions selects with its own copy of ptr's low
        # bits: one register driving every leaf of a 128-way multiplexer would be a net of
        # hundreds of loads on the loop.
        group_bits = LOOP_GROUP_BYTES.bit_length() - 1
        ptr_low_copies = replicas(WINDOW_BYTES // LOOP_GROUP_BYTES, group_bits,
                                  name="ptr_low_copy")

        def move_ptr(value):
            """Set ``ptr`` and all its copies."""
            m.d.sync += [ptr.eq(value), last_end_ptr.eq(value),
                         ptr_slot.eq(value[5:7]),
                         *[copy.eq(value[:group_bits]) for copy in ptr_low_copies]]

        group_selected = [
            mux_tree(m, [Cat(ends[q], fits[q])
                         for q in range(g * LOOP_GROUP_BYTES, (g + 1) * LOOP_GROUP_BYTES)],
                     copy, END_BITS + 1, f"selected_in_group{g}")
            for g, copy in enumerate(ptr_low_copies)]
        selected = mux_tree(m, group_selected, ptr[group_bits:], END_BITS + 1, "selected")
        # Off the loop: where the packet should end if the block at ptr is its last.
        selected_last_end = mux_tree(m, last_ends, last_end_ptr, END_BITS, "selected_last_end")
        selected_end, selected_fits = selected[:END_BITS], selected[END_BITS]

        # The word at ptr's slot and the first byte after it: the probe's tag vectors.
        from_ptr_slot = Signal(DATA_BITS + 8)
        m.d.sync += tags_ptr.eq(ptr)     # (0 with ptr between packets)
        with m.Switch(tags_ptr[5:7]):
            for s in range(WINDOW_WORDS):
                with m.Case(s):
                    m.d.comb += from_ptr_slot.eq(Cat(
                        window.word_select(s, DATA_BITS),
                        window.word_select((s + 1) % WINDOW_WORDS, DATA_BITS)[:8]))
        return _Pointer(from_ptr_slot=from_ptr_slot, move_ptr=move_ptr,
                        selected_end=selected_end, selected_fits=selected_fits,
                        selected_last_end=selected_last_end)

    def _probe(self, ctx, win, out, ptr_loop):
        """The probe's registers (the exact, masked end of the block at the pointer, five
        clocks) and what fires a block.
        """
        block_fired, blocks_left = win.block_fired, win.blocks_left
        from_ptr_slot, in_blocks = ptr_loop.from_ptr_slot, win.in_blocks
        is_last_block, last_tag_mask, m, ptr = win.is_last_block, win.last_tag_mask, ctx.m, win.ptr
        selected_end, selected_fits = ptr_loop.selected_end, ptr_loop.selected_fits
        space = out.space
        tags_ptr, two_left = win.tags_ptr, win.two_left
        # -- the probe: exact (masked) end of the block at ptr, five clocks --------------
        probe_tags = Signal(2 * LANES)
        probe_start = Signal(5)
        probe_slot = Signal(2)
        probe_tags_valid = Signal()
        probe_end = Signal(END_BITS)                  # relative to probe_slot's start
        probe_end_absolute = Signal(END_BITS)
        probe_end_valid = Signal()
        tags_at_ptr = mux_tree(m, [from_ptr_slot[8 * q:8 * q + 16] for q in range(BEAT_BYTES)],
                               tags_ptr[:5], 2 * LANES, "tags_at_ptr")
        m.d.comb += two_left.eq(Mux(block_fired, blocks_left == 3, blocks_left == 2))
        probe_mask = Signal(2 * LANES)
        m.d.comb += probe_mask.eq(Mux(is_last_block, last_tag_mask, TAG_MASK_ALL))
        # The block length (tag vector and payload) at a start of 0, then the start added.
        probe_length = block_end(m, probe_tags & probe_mask, 0, "probe_length")
        # Third stage: the comparison, registered with whether the data was final then.
        probe_checked = Signal()
        probe_fits = Signal()
        probe_final = Signal()

        fire_fast = Signal()
        fire_slow = Signal()
        fire = Signal()
        m.d.comb += [
            fire_fast.eq(in_blocks & selected_fits & space),
            fire_slow.eq(in_blocks & probe_checked & probe_fits & space),
            fire.eq(fire_fast | fire_slow),
        ]
        next_ptr = Signal(7)
        m.d.comb += next_ptr.eq(Mux(fire_fast, selected_end,
                                    Mux(fire_slow, probe_end_absolute, ptr)))
        return _Probe(fire=fire, next_ptr=next_ptr, probe_checked=probe_checked,
                      probe_end=probe_end, probe_end_absolute=probe_end_absolute,
                      probe_end_valid=probe_end_valid, probe_final=probe_final,
                      probe_fits=probe_fits, probe_length=probe_length,
                      probe_slot=probe_slot, probe_start=probe_start,
                      probe_tags=probe_tags, probe_tags_valid=probe_tags_valid,
                      tags_at_ptr=tags_at_ptr)

    def _advance(self, ctx, inp, win, out, book, ptr_loop, probe):
        """Every clock in BLOCKS the window and the pointer move and the probe steps; outside
        BLOCKS all of them reset.
        """
        absolute, beat, beat_valid = book.absolute, inp.beat, inp.beat_valid
        block_fired, blocks_left, drop = win.block_fired, win.blocks_left, book.drop
        ended, fire, fits, good_end = win.ended, probe.fire, win.fits, win.good_end
        in_blocks, in_bytes, is_last_block = win.in_blocks, out.in_bytes, win.is_last_block
        k, last_keep, m = win.k, win.last_keep, ctx.m
        move_ptr, next_ptr = ptr_loop.move_ptr, probe.next_ptr
        pending, probe_checked, probe_end = out.pending, probe.probe_checked, probe.probe_end
        probe_end_absolute, probe_end_valid = probe.probe_end_absolute, probe.probe_end_valid
        probe_final, probe_fits = probe.probe_final, probe.probe_fits
        probe_length = probe.probe_length
        probe_slot, probe_start, probe_tags = probe.probe_slot, probe.probe_start, probe.probe_tags
        probe_tags_valid, ptr_slot, read_slot = probe.probe_tags_valid, win.ptr_slot, win.read_slot
        relative, room, selected_last_end = book.relative, book.room, ptr_loop.selected_last_end
        tags_at_ptr, tags_ptr, take_word = probe.tags_at_ptr, win.tags_ptr, book.take_word
        two_left, win_bytes, win_bytes_next = win.two_left, win.win_bytes, book.win_bytes_next
        write_slot, write_slot_next = win.write_slot, book.write_slot_next
        with m.If(in_blocks):
            m.d.comb += [
                take_word.eq(beat_valid & room & ~ended),
                win_bytes_next.eq(win_bytes - (drop << 5) + Mux(take_word, in_bytes, 0)),
                write_slot_next.eq(write_slot + take_word),
            ]
            m.d.sync += [
                read_slot.eq(ptr_slot),
            ]
            move_ptr(next_ptr)
            with m.If(take_word & beat.last):
                m.d.sync += ended.eq(1)
            # The probe restarts whenever ptr moves; its data registers load every clock (only
            # their valid flags say whether they mean anything), so they stay off `fire`.
            with m.If(fire):
                m.d.sync += [probe_tags_valid.eq(0), probe_end_valid.eq(0), probe_checked.eq(0),
                             is_last_block.eq(two_left)]
            with m.Else():
                m.d.sync += [
                    # Tags read before both their bytes arrived mean nothing, unless none
                    # will ever arrive (then the end lies past win_bytes: truncated); nor
                    # do tags read at tags_ptr in the clock after ptr moved.
                    probe_tags_valid.eq(~block_fired &
                                        ((relative(tags_ptr, read_slot) + 2 <= win_bytes) |
                                         ended)),
                    probe_end_valid.eq(probe_tags_valid),
                    probe_checked.eq(probe_end_valid),
                ]
            m.d.sync += [
                block_fired.eq(fire),
                blocks_left.eq(Mux(block_fired, blocks_left - 1, blocks_left)),
                probe_end.eq(probe_start + probe_length),
                probe_end_absolute.eq(absolute(probe_end, probe_slot)),
                probe_tags.eq(tags_at_ptr),
                probe_start.eq(tags_ptr[:5]),
                probe_slot.eq(tags_ptr[5:7]),
                probe_fits.eq(probe_end <= win_bytes),
                probe_final.eq(ended),
                # Where the packet should end if the block at ptr is its last (kept from the
                # clock the last block fires, for CHECK).
                good_end.eq(selected_last_end),
            ]
            # Stage A's item fields follow ptr; only `valid` needs a block.
            m.d.sync += [
                pending.raw.eq(0),
                pending.write.eq(1),
                pending.keep.eq(Mux(is_last_block, last_keep, (1 << BEAT_BYTES) - 1)),
                pending.last.eq(is_last_block),
                pending.end.eq(End.NONE),
                pending.k.eq(k),
            ]

        with m.Else():
            # Outside BLOCKS the window and the probe are reset on every clock, whatever the
            # input beat: a header then finds them ready, and the header's decode reaches
            # none of these registers (nor the pointer loop's). CHECK still reads win_bytes
            # and ended, as they were before this clock.
            m.d.sync += [
                read_slot.eq(0), ended.eq(0), fits.eq(0), block_fired.eq(0), tags_ptr.eq(0),
                probe_tags_valid.eq(0), probe_end_valid.eq(0), probe_checked.eq(0),
            ]
            move_ptr(Const(0, 7))
            m.d.comb += [win_bytes_next.eq(0), write_slot_next.eq(0)]

    def _header(self, ctx, inp, win, out):
        """The header beat: decode count and k, rewrite the type; how a packet starts."""
        Phase, beat, beat_valid, blocks_left = ctx.Phase, inp.beat, inp.beat_valid, win.blocks_left
        emit, events, in_blocks, in_ready = out.emit, out.events, win.in_blocks, inp.in_ready
        is_last_block, k, last_keep = win.is_last_block, win.k, win.last_keep
        last_tag_mask, m, pending, phase = win.last_tag_mask, ctx.m, out.pending, win.phase
        ptr, space = win.ptr, out.space
        # -- header beat: decode count and k, rewrite type ------------------------------
        rewritten = Signal(HeaderLayout)
        m.d.comb += [rewritten.eq(beat.data), rewritten.type.eq(PacketType.RAW_F32)]

        # Stage A's wide fields load every clock (the input beat, a bypassed beat or a
        # rewritten header, for raw items; ptr for blocks), so their inputs never wait for a
        # decision; `pending_valid` and the item fields say whether and what the item is.
        m.d.sync += [
            pending.beat.eq(Mux(beat.bypass, beat.data, rewritten)),
            pending.start.eq(ptr),
            pending.tag_mask.eq(Mux(in_blocks & is_last_block, last_tag_mask, TAG_MASK_ALL)),
        ]
        count_lanes_left = inp.header_count_low        # values in a partial last block
        count_blocks = beat.blocks

        def start_packet(allowed=1):
            """Take a header or bypassed beat (phase BETWEEN, or CHECK once a packet is
            over, if ``allowed``)."""
            m.d.comb += in_ready.eq(space & allowed)
            with m.If(beat_valid & space & allowed):
                with m.If(beat.bypass):
                    emit(raw=1, write=1, keep=beat.keep,
                         last=beat.last, end=End.COMMIT)
                with m.Elif(beat.empty):
                    # No values: good iff nothing follows the header.
                    emit(raw=1, write=1, last=1, k=inp.header_k,
                         end=Mux(beat.last, End.COMMIT.value, End.NONE.value))
                    with m.If(beat.last):
                        m.d.sync += events.decompressed.eq(1)
                    with m.Else():
                        m.d.sync += phase.eq(Phase.TAIL)
                with m.Else():
                    emit(raw=1, write=1, last=0, k=inp.header_k,
                         end=Mux(beat.last, End.REWIND.value, End.NONE.value))
                    with m.If(beat.last):
                        m.d.sync += events.drop_truncated.eq(1)
                    with m.Else():
                        m.d.sync += phase.eq(Phase.BLOCKS)
                with m.If(~beat.bypass):
                    lanes = Mux(count_lanes_left == 0, LANES, count_lanes_left)
                    m.d.sync += [
                        k.eq(inp.header_k),
                        blocks_left.eq(count_blocks),
                        is_last_block.eq(beat.one_block),
                    ]
                    with m.Switch(lanes):
                        for n in range(1, LANES + 1):
                            with m.Case(n):
                                m.d.sync += [last_tag_mask.eq((1 << 2 * n) - 1),
                                             last_keep.eq(keep_for_lanes(n))]
        return start_packet

    def _phases(self, ctx, inp, win, out, book, probe, start_packet):
        """The phase machine: packets start, blocks fire, and the verdict of each packet."""
        Phase, beat, beat_valid = ctx.Phase, inp.beat, inp.beat_valid
        emit_verdict, ended, events, fire = out.emit_verdict, win.ended, out.events, probe.fire
        good_end, in_bytes, in_ready = win.good_end, out.in_bytes, inp.in_ready
        is_last_block, m, pending_valid = win.is_last_block, ctx.m, out.pending_valid
        phase, probe_checked, probe_final = win.phase, probe.probe_checked, probe.probe_final
        probe_fits, room, space = probe.probe_fits, book.room, out.space
        start_packet, verdict, win_bytes = start_packet, out.verdict, win.win_bytes
        with m.Switch(phase):
            with m.Case(Phase.BETWEEN):
                start_packet()

            with m.Case(Phase.BLOCKS):
                m.d.comb += in_ready.eq(room & ~ended)
                with m.If(fire):
                    m.d.sync += pending_valid.eq(1)
                    with m.If(is_last_block):
                        # The verdict needs the whole window after this clock; decide it in
                        # CHECK, from registers: where the packet should end (whichever path
                        # fired, the masked end of the block at ptr, in the coordinates of
                        # the window after this clock's shift) against win_bytes.
                        m.d.sync += phase.eq(Phase.CHECK)
                with m.Elif(probe_checked & probe_final & ~probe_fits & space):
                    # The input is over and the block at ptr is not all there.
                    emit_verdict(End.REWIND)
                    m.d.sync += [events.drop_truncated.eq(1), phase.eq(Phase.BETWEEN)]

            with m.Case(Phase.CHECK):
                # Any whole 32-bit word past the good end makes the packet over-long.
                overlong = Signal()
                m.d.comb += overlong.eq(win_bytes > good_end)
                with m.If(overlong):
                    m.d.comb += verdict.eq(End.REWIND)
                    m.d.sync += [events.drop_overlong.eq(1),
                                 phase.eq(Mux(ended, Phase.BETWEEN, Phase.DRAIN))]
                with m.Elif(ended):
                    m.d.comb += verdict.eq(End.COMMIT)
                    m.d.sync += [events.decompressed.eq(1), phase.eq(Phase.BETWEEN)]
                with m.Else():
                    m.d.comb += verdict.eq(End.NONE)
                    m.d.sync += phase.eq(Phase.TAIL)
                with m.If(ended):
                    # The packet is judged: the next one can start in this clock, unless
                    # its header is all of it (its verdict strobe would meet this one's).
                    start_packet(allowed=beat.bypass | ~beat.last)

            with m.Case(Phase.TAIL):
                m.d.comb += in_ready.eq(space)
                with m.If(beat_valid & space):
                    with m.If(in_bytes != 0):   # (a register compare: 6 bits)
                        emit_verdict(End.REWIND)
                        m.d.sync += [events.drop_overlong.eq(1),
                                     phase.eq(Mux(beat.last, Phase.BETWEEN, Phase.DRAIN))]
                    with m.Elif(beat.last):
                        emit_verdict(End.COMMIT)
                        m.d.sync += [events.decompressed.eq(1), phase.eq(Phase.BETWEEN)]

            with m.Case(Phase.DRAIN):
                m.d.comb += in_ready.eq(1)
                with m.If(beat_valid & beat.last):
                    m.d.sync += phase.eq(Phase.BETWEEN)
