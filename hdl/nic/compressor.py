"""INCEPTIONN compressor: the NIC transmit path (``docs/nic-contract.md``, TX).

Pipeline (every stage a register with the stream handshake; back-pressure propagates
through the ``ready`` chain or, for stages 1-4, through credit, so nothing is lost or
duplicated):

====  =================  ====================================================================
 #    stage              what it does
====  =================  ====================================================================
 -    skid buffer        registers the input (and its tready)
 -    judge              the header checks (magic, version, type, flag, ``k``, ``count``),
                         registered beside every beat
 0    front (comb)       at the header beat, picks the packet's mode (compress or pass
                         through) and rewrites ``type`` to ``INC_F32``; counts payload words
 1    encode             8 lanes classified and shifted (:class:`~hdl.nic.lane_encoder.EncodeStage`)
 2    prefix sum         payload byte offsets and block width (:class:`~hdl.nic.block_packer.BlockPacker`)
 3    assembly           one contiguous block of 2..34 bytes
 4    rotate             block shifted to its byte position in the output word
                         (:class:`~hdl.nic.bit_accumulator.BlockRotator`)
 -    credit buffer      blocks wait here for the accumulator, in LUT RAM; stages 1-4 never
                         stall (a beat enters only when the buffer will have room for its
                         block), and the accumulator's ready moves only the read pointer
 5    accumulate         full 256-bit words out; flush and pad at ``tlast``
                         (:class:`~hdl.nic.bit_accumulator.BitAccumulator`)
 -    skid buffer        registers the output (and the tready the pipeline sees)
====  =================  ====================================================================

A packet goes through in one of two modes, chosen at its header beat:

* compress (magic, version ok, ``RAW_F32``, ``COMPRESS`` flag, ``1 <= k <= 15``): the header
  leaves with ``type = INC_F32``; each payload beat becomes one block; the output is the
  golden bitstream, padded to whole 32-bit words at the end.
* pass through (everything else, including ``bad_k`` and ``too_large``, a ``count`` above
  ``NIC_MAX_COUNT`` that no receive path could take back): every beat travels as a raw
  32-byte item and leaves unchanged, with its own ``tkeep``.

One input beat is accepted per clock as long as the blocks are at most 32 bytes and the
output is ready; with 34-byte blocks (all values raw) the output word rate is the limit,
16 input beats per 17 clocks.
"""
from amaranth import Cat, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from contract.counters import NIC_TX_COUNTERS
from contract.header import K_MAX, K_MIN, LANES, MAGIC, NIC_MAX_COUNT, VERSION, Flags, PacketType
from hdl.header import HeaderLayout
from hdl.nic.bit_accumulator import BitAccumulator, BlockRotator, RotatedItem
from hdl.nic.block_packer import BlockPacker
from hdl.nic.lane_encoder import EncodeStage
from hdl.stream.axis import AxisBeat
from hdl.stream.credit_buffer import CreditBuffer
from hdl.stream.skid_buffer import SkidBuffer
from hdl.stream.stage import register_stage

__all__ = ["TxEvents", "Compressor"]

#: One strobe per transmit counter (``contract.counters.NIC_TX_COUNTERS`` order), high for one
#: cycle when the counter must be incremented.
TxEvents = data.StructLayout({name: unsigned(1) for name in NIC_TX_COUNTERS})


#: Clocks from a beat entering the encoder to its block reaching the credit buffer (encode,
#: prefix sum, assembly, rotate).
PACK_LATENCY = 4


#: A beat with the verdicts of the header checks, as if it were a header.
_JudgedBeat = data.StructLayout({
    "beat": AxisBeat,
    "wants_compression": unsigned(1),   # magic, version, RAW_F32 and the COMPRESS flag
    "k_ok": unsigned(1),
    "count_ok": unsigned(1),
    "starts_compressed": unsigned(1),   # all three: the packet is compressed
    "rewritten_type": HeaderLayout["type"].shape,   # the header's type after the rewrite
})


def popcount(m, bits, name):
    result = Signal(range(len(bits) + 1), name=name)
    m.d.comb += result.eq(sum(bits[i] for i in range(len(bits))))
    return result


class Compressor(wiring.Component):
    """The NIC transmit engine: ``RAW_F32`` + ``COMPRESS`` packets in, ``INC_F32`` out.

    Ports
    -----
    i : In(stream.Signature(AxisBeat))
        Packets: header beat, then payload beats of eight fp32 lanes.
    o : Out(stream.Signature(AxisBeat))
        Packets: compressed ones with the bitstream as payload, the others unchanged.
    events : Out(TxEvents)
        Counter strobes. ``packets`` and ``bypassed``/``bad_k``/``too_large`` at the header beat;
        ``compressed`` or ``length_mismatch`` one cycle after the last beat of a compressed
        packet.
    """

    def __init__(self):
        super().__init__({
            "i": In(stream.Signature(AxisBeat)),
            "o": Out(stream.Signature(AxisBeat)),
            "events": Out(TxEvents),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.encode = encode = EncodeStage()
        m.submodules.pack = pack = BlockPacker()
        m.submodules.rotate = rotate = BlockRotator()
        m.submodules.accumulate = accumulate = BitAccumulator()
        # Skid buffers on both ports register tready in both directions, so the ready
        # chain through the five stages never reaches a port.
        m.submodules.ingress = ingress = SkidBuffer(AxisBeat)
        m.submodules.egress = egress = SkidBuffer(AxisBeat)
        # Encoder, packer and rotator never stall: a beat enters them only when the credit
        # buffer after them has room for it four clocks later (`space`, a register), so the
        # accumulator's ready (from its fill level) reaches no enable of theirs. The buffer
        # is LUT RAM read at its read pointer: that ready moves the pointer, and is no clock
        # enable of the 568 bits of a rotated block.
        m.submodules.blocks = blocks = CreditBuffer(RotatedItem, latency=PACK_LATENCY,
                                                    registered_output=False)
        wiring.connect(m, wiring.flipped(self.i), ingress.i)
        # The header's checks are decided a stage ahead, so that the mode decision and the
        # type rewrite start from flip-flops (every beat is judged as if it were a header;
        # only header beats' verdicts are used).
        judged = stream.Signature(_JudgedBeat).create(path=("judged",))
        header_in = data.View(HeaderLayout, ingress.o.p.data)
        wants_compression_in = Signal()
        k_ok_in, count_ok_in = Signal(), Signal()
        m.d.comb += [
            wants_compression_in.eq(
                (header_in.magic == MAGIC) & (header_in.version == VERSION) &
                (header_in.type == PacketType.RAW_F32) & (header_in.flags & Flags.COMPRESS).any()),
            k_ok_in.eq((header_in.k >= K_MIN) & (header_in.k <= K_MAX)),
            count_ok_in.eq(header_in.count <= NIC_MAX_COUNT),
        ]
        starts_compressed_in = wants_compression_in & k_ok_in & count_ok_in
        with register_stage(m, ingress.o, judged):
            m.d.sync += [
                judged.p.beat.eq(ingress.o.p),
                judged.p.wants_compression.eq(wants_compression_in),
                judged.p.k_ok.eq(k_ok_in),
                judged.p.count_ok.eq(count_ok_in),
                judged.p.starts_compressed.eq(starts_compressed_in),
                judged.p.rewritten_type.eq(
                    Mux(starts_compressed_in, PacketType.INC_F32, header_in.type)),
            ]
        wiring.connect(m, encode.o, pack.i)
        wiring.connect(m, pack.o, rotate.i)
        m.d.comb += [blocks.i.p.eq(rotate.o.p), blocks.i.valid.eq(rotate.o.valid),
                     rotate.o.ready.eq(1)]     # (space guarantees it)
        wiring.connect(m, blocks.o, accumulate.i)
        wiring.connect(m, accumulate.o, egress.i)
        wiring.connect(m, egress.o, wiring.flipped(self.o))
        source = judged

        # -- front end: per-packet mode, header rewrite ---------------------------------
        in_payload = Signal()        # the next beat is a payload beat (else a header)
        compressing = Signal()       # mode of the current packet
        k = Signal(4)
        count = Signal(32)
        words_seen = Signal(32)      # payload words of the current packet so far

        beat = source.p.beat
        header = data.View(HeaderLayout, beat.data)
        wants_compression = source.p.wants_compression
        k_ok, count_ok = source.p.k_ok, source.p.count_ok
        starts_compressed = source.p.starts_compressed

        rewritten = Signal(HeaderLayout)
        m.d.comb += [rewritten.eq(beat.data), rewritten.type.eq(source.p.rewritten_type)]

        # A lane holds a value when its first byte is kept (tkeep is whole words).
        lanes_valid = Signal(LANES)
        m.d.comb += lanes_valid.eq(Cat(beat.keep[4 * j] for j in range(LANES)))
        lanes_in_beat = popcount(m, lanes_valid, "lanes_in_beat")

        req = encode.i.p
        m.d.comb += [
            encode.i.valid.eq(source.valid & blocks.space),
            source.ready.eq(blocks.space),
            req.lanes_valid.eq(lanes_valid),
            req.keep.eq(beat.keep),
            req.last.eq(beat.last),
            req.k.eq(k),
        ]
        with m.If(~in_payload):
            m.d.comb += [req.raw.eq(1), req.words.eq(rewritten.as_value())]
        with m.Else():
            m.d.comb += [req.raw.eq(~compressing), req.words.eq(beat.data)]

        # -- per-packet bookkeeping and counter events ----------------------------------
        events = self.events
        m.d.sync += events.eq(0)
        total_words = Signal(32)
        m.d.comb += total_words.eq(words_seen + lanes_in_beat)
        # The word count is compared with `count` the cycle after the last beat (when
        # `words_seen` holds the total), so the 32-bit add and the compare are not one path.
        check_length = Signal()
        m.d.sync += check_length.eq(0)
        with m.If(check_length):
            m.d.sync += [events.compressed.eq(words_seen == count),
                         events.length_mismatch.eq(words_seen != count)]
        with m.If(source.valid & source.ready):
            with m.If(~in_payload):
                m.d.sync += [
                    in_payload.eq(~beat.last),
                    compressing.eq(starts_compressed),
                    k.eq(header.k),
                    count.eq(header.count),
                    words_seen.eq(0),
                    events.packets.eq(1),
                    events.bypassed.eq(~wants_compression),
                    events.bad_k.eq(wants_compression & ~k_ok),
                    events.too_large.eq(wants_compression & k_ok & ~count_ok),
                ]
                # A header-only compressed packet ends here, with no payload words: its
                # check (0 == count) runs next cycle like any other, so it can never collide
                # with the previous packet's check.
                m.d.sync += check_length.eq(beat.last & starts_compressed)
            with m.Else():
                m.d.sync += words_seen.eq(total_words)
                with m.If(beat.last):
                    m.d.sync += [in_payload.eq(0), check_length.eq(compressing)]
        return m
