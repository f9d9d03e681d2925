"""Unpacker: cut one INCEPTIONN block per clock out of a compressed packet's bitstream.

The receive path's front end hands this component the beats of every packet it does not
drop, each marked ``bypass`` (passed through) or not (an ``INC_F32`` packet: header beat,
then bitstream beats). For an ``INC_F32`` packet it emits the rewritten header
(``type = RAW_F32``) and then one item per block, each the 34 bytes starting at the block
(tag vector in bits 0..15), plus the packet's end verdict.

How a block is found
--------------------
Every field of the bitstream is a whole number of bytes, so blocks start on byte
boundaries. The unread part of the bitstream sits in a window of four 256-bit words
(``win_bytes`` valid bytes) with a byte pointer ``ptr`` (0..65) into it. Each clock:

* the block length ``2 + payload bytes`` (2..34) that a block starting at byte ``p`` would
  have was computed for every position ``p`` the clock before and registered; ``ptr``
  selects one (a balanced mux tree);
* if the window holds the whole block (``length <= available``, ``available`` being a
  register too), the 34 bytes at ``ptr`` go out as one item (a byte shifter feeding the
  output register) and ``ptr`` advances by the length;
* the words ``ptr`` has passed (0, 1 or 2, from the ``ptr`` register's upper bits) leave
  the window, and a new input word enters whenever a slot is free.

The pointer-advance loop (``ptr`` -> length -> ``ptr``) is the only recurrence, and it is
kept to a mux tree, one compare and one add; the length sums and the window shift hang off
registers. With blocks of up to 32 bytes the window never runs dry, so a block leaves every
clock as long as the input keeps up; 34-byte blocks are limited by the input word rate.

End of packet (``notes/nic-contract.md``)
------------------------------------------
The block count is ``ceil(count / 8)``; lanes past ``count`` in the last block carry
nothing whatever their tag bits (as the golden decoder reads them). The packet is

* **truncated** if the input ends (``tlast`` in the window) before a block is complete;
* **over-long** if any 32-bit word follows the last block's padded end (in the window
  already, or arriving before ``tlast``);
* good otherwise.

The verdict travels with the data as ``end``: ``COMMIT`` on the last item of a good packet,
``REWIND`` on the item at which a bad one is detected (the output buffer then discards
everything written since the last commit). Bypassed beats all carry ``COMMIT`` (cut-through).
"""
from amaranth import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.wiring import In, Out

from host.header import BEAT_BYTES, LANES, PacketType

from .axis import DATA_BITS
from .block_packer import BLOCK_BITS, BLOCK_BYTES, TAG_VECTOR_BYTES
from .header import HeaderLayout

__all__ = ["End", "UnpackRequest", "UnpackedItem", "RxUnpackEvents", "block_payload_bytes",
           "Unpacker"]

WINDOW_WORDS = 4
WINDOW_BYTES = WINDOW_WORDS * BEAT_BYTES
#: Positions the block pointer can take: below 32 plus one longest block.
POSITIONS = BEAT_BYTES + BLOCK_BYTES


class End(enum.Enum, shape=2):
    """What the output packet buffer does after writing an item."""
    NONE = 0      # packet goes on
    COMMIT = 1    # make everything written so far visible to the reader
    REWIND = 2    # forget everything written since the last commit (malformed packet)


#: One input beat of a packet the front end did not drop.
UnpackRequest = data.StructLayout({
    "data": unsigned(DATA_BITS),
    "keep": unsigned(BEAT_BYTES),
    "last": unsigned(1),
    "bypass": unsigned(1),     # pass the beat through untouched
})

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

#: Receive counters decided here (strobes).
RxUnpackEvents = data.StructLayout({
    "decompressed": unsigned(1),
    "drop_truncated": unsigned(1),
    "drop_overlong": unsigned(1),
})


def block_payload_bytes(m, tags, name):
    """Payload bytes of a block from its 16-bit tag vector (tags 00/01/10/11 -> 0/1/2/4).

    Returns ``(total, widths)``. The total is summed from four 4-bit lane pairs, each a
    plain 4-input function (one LUT level), so the adder tree is only two levels deep.
    """
    widths = []
    for j in range(LANES):
        w = Signal(3, name=f"{name}_w{j}")
        tag = tags[2 * j:2 * j + 2]
        # 00 -> 0, 01 -> 1, 10 -> 2, 11 -> 4
        m.d.comb += w.eq(Cat(tag[0] & ~tag[1], tag[1] & ~tag[0], tag[0] & tag[1]))
        widths.append(w)
    pairs = []
    for j in range(0, LANES, 2):
        pair = Signal(4, name=f"{name}_pair{j // 2}")
        with m.Switch(tags[2 * j:2 * j + 4]):
            for v in range(16):
                with m.Case(v):
                    m.d.comb += pair.eq(PAIR_BYTES[v])
        pairs.append(pair)
    total = Signal(6, name=name)
    m.d.comb += total.eq((pairs[0] + pairs[1]) + (pairs[2] + pairs[3]))
    return total, widths


#: Payload bytes of two lanes from their 4 tag bits.
PAIR_BYTES = [(0, 1, 2, 4)[v & 3] + (0, 1, 2, 4)[v >> 2] for v in range(16)]


def shift_right_bytes(m, value, amount, width, name):
    """``width`` bits of ``value >> (8 * amount)``, as a logarithmic byte shifter (one 2:1
    mux level per bit of ``amount``; a balanced tree, unlike a 32-way case mux)."""
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
    """``values[select]`` as a balanced tree of 2:1 muxes (``len(values)`` a power of two)."""
    level = list(values)
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

        window = Signal(8 * WINDOW_BYTES)
        win_bytes = Signal(range(WINDOW_BYTES + 1))   # valid bytes from the window start
        ptr = Signal(7)                               # next block's first byte, 0..65
        ended = Signal()                              # the packet's tlast is in the window
        blocks_left = Signal(range(max_blocks + 1))
        k = Signal(4)
        last_tag_mask = Signal(2 * LANES)             # lanes of the last block below count
        last_keep = Signal(BEAT_BYTES)

        class Phase(enum.Enum):
            BETWEEN = 0   # next beat is a header or a bypassed beat
            BLOCKS = 1    # cutting blocks
            TAIL = 2      # all blocks out, nothing extra yet, tlast still to come
            DRAIN = 3     # verdict given (dropped), swallow the rest of the packet
        phase = Signal(Phase)

        beat = self.i.p
        out = self.o.p
        out_free = Signal()
        m.d.comb += out_free.eq(~self.o.valid | self.o.ready)
        with m.If(self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        events = self.events
        m.d.sync += events.eq(0)

        def emit(**fields):
            m.d.sync += self.o.valid.eq(1)
            defaults = dict(bits=0, raw=0, write=0, keep=(1 << BEAT_BYTES) - 1, last=0,
                            end=End.NONE, k=k)
            defaults.update(fields)
            for name, value in defaults.items():
                target = out.end.as_value() if name == "end" else getattr(out, name)
                if isinstance(value, End):
                    value = value.value
                m.d.sync += target.eq(value)

        in_bytes = Signal(range(BEAT_BYTES + 1))      # bytes of this input beat
        m.d.comb += in_bytes.eq(4 * sum(beat.keep[4 * j] for j in range(LANES)))

        # -- block finder (the per-clock recurrence) -------------------------------------
        # The loop is ptr -> block length -> ptr, and it is kept to a mux tree, a compare
        # and an add:
        # * the length a block starting at each position would have is computed for the
        #   window as it will be next clock, and registered (with and without the mask of
        #   the last block's lanes), so the loop only selects one;
        # * `available` (win_bytes - ptr) is a register, so "is the block all there" is one
        #   compare;
        # * words that ptr has passed leave the window one clock late, decided from the ptr
        #   register (its bits 5..6), so the window shift is not part of the loop either.
        #   ptr therefore ranges over 0..65 (< 32 plus one block).
        is_last_block = Signal()                      # blocks_left == 1, kept as a register
        available = Signal(range(WINDOW_BYTES + 1))   # win_bytes - ptr, kept as a register
        # Never below 2 (a tag vector), not even before the first word: with `available`
        # 0 nothing can fire on a stale length.
        lengths = [Signal(6, name=f"length_at{p}", init=BLOCK_BYTES) for p in range(POSITIONS)]
        last_lengths = [Signal(6, name=f"last_length_at{p}", init=BLOCK_BYTES)
                        for p in range(POSITIONS)]

        # Window bookkeeping: passed words leave, one word may enter.
        take_word = Signal()
        drop_words = Signal(2)
        m.d.comb += drop_words.eq(ptr[5:7])
        shifted = Signal(8 * WINDOW_BYTES)
        with m.Switch(drop_words):
            for d in range(3):
                with m.Case(d):
                    m.d.comb += shifted.eq(window >> (DATA_BITS * d))
        bytes_kept = Signal(range(WINDOW_BYTES + 1))
        m.d.comb += bytes_kept.eq(win_bytes - BEAT_BYTES * drop_words)
        next_window = Signal(8 * WINDOW_BYTES)
        m.d.comb += next_window.eq(shifted)
        with m.If(take_word):
            # Before tlast the window holds whole words, so the free slot is bytes_kept / 32.
            with m.Switch(bytes_kept[5:7]):
                for slot in range(WINDOW_WORDS):
                    with m.Case(slot):
                        m.d.comb += next_window.word_select(slot, DATA_BITS).eq(beat.data)
        next_lengths, next_last_lengths = [], []
        for p in range(POSITIONS):
            tags_at = next_window[8 * p:8 * p + 16]
            payload_at, _ = block_payload_bytes(m, tags_at, f"payload_bytes_at{p}")
            last_payload_at, _ = block_payload_bytes(m, tags_at & last_tag_mask,
                                                     f"last_payload_bytes_at{p}")
            next_lengths.append(TAG_VECTOR_BYTES + payload_at)
            next_last_lengths.append(TAG_VECTOR_BYTES + last_payload_at)

        candidates = [Mux(is_last_block, last_lengths[p], lengths[p]) for p in range(POSITIONS)]
        candidates += [Const(BLOCK_BYTES, 6)] * (2 ** len(ptr) - POSITIONS)   # unreachable
        length = mux_tree(m, candidates, ptr, 6, "length")
        block_in_window = Signal()
        m.d.comb += block_in_window.eq(length <= available)
        # The block itself only feeds the output register: a byte shifter off the loop.
        tag_mask = Signal(2 * LANES)
        m.d.comb += tag_mask.eq(Mux(is_last_block, last_tag_mask, (1 << 2 * LANES) - 1))
        block_at_ptr = shift_right_bytes(m, window, ptr, BLOCK_BITS, "block_at_ptr")
        block_bits = Signal(BLOCK_BITS)
        m.d.comb += block_bits.eq(Cat(block_at_ptr[:2 * LANES] & tag_mask,
                                      block_at_ptr[2 * LANES:]))
        ptr_after = Signal(7)                         # up to 65 + 34, window coordinates
        m.d.comb += ptr_after.eq(ptr + length)

        fire = Signal()
        with m.If(phase == Phase.BLOCKS):
            m.d.sync += [
                window.eq(next_window),
                win_bytes.eq(bytes_kept + Mux(take_word, in_bytes, 0)),
                # (ptr - 32 * drop_words) + length, in the coordinates of the next window
                ptr.eq(ptr[:5] + Mux(fire, length, 0)),
                available.eq(available - Mux(fire, length, 0) + Mux(take_word, in_bytes, 0)),
            ]
            m.d.sync += [lengths[p].eq(next_lengths[p]) for p in range(POSITIONS)]
            m.d.sync += [last_lengths[p].eq(next_last_lengths[p]) for p in range(POSITIONS)]
            with m.If(fire):
                m.d.sync += is_last_block.eq(blocks_left == 2)
            with m.If(take_word & beat.last):
                m.d.sync += ended.eq(1)

        # -- header beat: decode count and k, rewrite type ------------------------------
        header = data.View(HeaderLayout, beat.data)
        rewritten = Signal(HeaderLayout)
        m.d.comb += [rewritten.eq(beat.data), rewritten.type.eq(PacketType.RAW_F32)]
        count_lanes_left = header.count[:3]           # values in a partial last block
        count_blocks = Signal(range(max_blocks + 1))
        m.d.comb += count_blocks.eq((header.count + LANES - 1) >> 3)

        with m.Switch(phase):
            with m.Case(Phase.BETWEEN):
                m.d.comb += self.i.ready.eq(out_free)
                with m.If(self.i.valid & out_free):
                    with m.If(beat.bypass):
                        emit(bits=beat.data, raw=1, write=1, keep=beat.keep, last=beat.last,
                             end=End.COMMIT)
                    with m.Elif(header.count == 0):
                        # No values: good iff nothing follows the header.
                        emit(bits=rewritten, raw=1, write=1, last=1,
                             end=Mux(beat.last, End.COMMIT.value, End.NONE.value))
                        with m.If(beat.last):
                            m.d.sync += events.decompressed.eq(1)
                        with m.Else():
                            m.d.sync += phase.eq(Phase.TAIL)
                    with m.Else():
                        emit(bits=rewritten, raw=1, write=1, last=0,
                             end=Mux(beat.last, End.REWIND.value, End.NONE.value))
                        with m.If(beat.last):
                            m.d.sync += events.drop_truncated.eq(1)
                        with m.Else():
                            m.d.sync += phase.eq(Phase.BLOCKS)
                    with m.If(~beat.bypass):
                        lanes = Mux(count_lanes_left == 0, LANES, count_lanes_left)
                        m.d.sync += [
                            k.eq(header.k),
                            blocks_left.eq(count_blocks),
                            window.eq(0), win_bytes.eq(0), ptr.eq(0), ended.eq(0),
                            available.eq(0), is_last_block.eq(count_blocks == 1),
                        ]
                        with m.Switch(lanes):
                            for n in range(1, LANES + 1):
                                with m.Case(n):
                                    m.d.sync += [last_tag_mask.eq((1 << 2 * n) - 1),
                                                 last_keep.eq(keep_for_lanes(n))]
                        # the emitted header must carry this packet's k, not the last one's
                        m.d.sync += out.k.eq(header.k)

            with m.Case(Phase.BLOCKS):
                m.d.comb += [
                    take_word.eq(self.i.valid & ~ended & (bytes_kept < WINDOW_BYTES)),
                    self.i.ready.eq(~ended & (bytes_kept < WINDOW_BYTES)),
                    fire.eq(block_in_window & out_free),
                ]
                with m.If(fire):
                    m.d.sync += blocks_left.eq(blocks_left - 1)
                    with m.If(~is_last_block):
                        emit(bits=block_bits, write=1)
                    with m.Else():
                        # Verdict: any whole 32-bit word past the padded end is over-long.
                        # The word entering this clock counts too: it is either data
                        # past the end (over-long) or the packet's tlast.
                        padded_end = Signal(7)
                        bytes_in_packet = Signal(range(WINDOW_BYTES + BEAT_BYTES + 1))
                        ended_now = Signal()
                        m.d.comb += [
                            padded_end.eq((ptr_after + 3) & 0x7C),
                            bytes_in_packet.eq(win_bytes + Mux(take_word, in_bytes, 0)),
                            ended_now.eq(ended | (take_word & beat.last)),
                        ]
                        with m.If(bytes_in_packet > padded_end):
                            emit(bits=block_bits, write=1, keep=last_keep, last=1,
                                 end=End.REWIND)
                            m.d.sync += [events.drop_overlong.eq(1),
                                         phase.eq(Mux(ended_now, Phase.BETWEEN, Phase.DRAIN))]
                        with m.Elif(ended_now):
                            emit(bits=block_bits, write=1, keep=last_keep, last=1,
                                 end=End.COMMIT)
                            m.d.sync += [events.decompressed.eq(1), phase.eq(Phase.BETWEEN)]
                        with m.Else():
                            emit(bits=block_bits, write=1, keep=last_keep, last=1)
                            m.d.sync += phase.eq(Phase.TAIL)
                with m.Elif(ended & ~block_in_window & out_free):
                    # The input is over and the next block is not all there.
                    emit(end=End.REWIND)
                    m.d.sync += [events.drop_truncated.eq(1), phase.eq(Phase.BETWEEN)]

            with m.Case(Phase.TAIL):
                m.d.comb += self.i.ready.eq(out_free)
                with m.If(self.i.valid & out_free):
                    with m.If(in_bytes != 0):
                        emit(end=End.REWIND)
                        m.d.sync += [events.drop_overlong.eq(1),
                                     phase.eq(Mux(beat.last, Phase.BETWEEN, Phase.DRAIN))]
                    with m.Elif(beat.last):
                        emit(end=End.COMMIT)
                        m.d.sync += [events.decompressed.eq(1), phase.eq(Phase.BETWEEN)]

            with m.Case(Phase.DRAIN):
                m.d.comb += self.i.ready.eq(1)
                with m.If(self.i.valid & beat.last):
                    m.d.sync += phase.eq(Phase.BETWEEN)
        return m
