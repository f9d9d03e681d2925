"""What every fp32 value must become after compress -> decompress: an independent quantiser.

Written from ``docs/protocol/inceptionn-format.md`` section 2 alone (it shares no code with
the compressor's lane encoder or the decompressor): classify by exponent, compute ``F``
(the significand with its hidden one shifted to exponent 127, truncated), ``P8 = F >> (23 -
k)`` or ``P16 = F >> 8``, then decode ``±P8 * 2^-k`` / ``±P16 * 2^-15`` back to fp32 by
normalising (leading one -> exponent, the bits after it -> mantissa). Tag 00 gives +0.0,
tag 11 the word unchanged.

:func:`quantize_model` is the same computation on Python integers; :class:`QuantizeStream`
applies it to the payload of every packet the NIC compresses (``RAW_F32`` + ``COMPRESS``,
good magic/version, ``1 <= k <= 15``) and passes every other beat through, so that it turns
the generator's replayed stream into the beats the NIC must deliver.
"""
from amaranth import C, Cat, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from contract.header import K_MAX, K_MIN, LANES, MAGIC, VERSION, Flags, PacketType
from hdl.header import HeaderLayout
from hdl.stream.axis import AxisBeat, axis_signature
from hdl.stream.credit_buffer import CreditBuffer

__all__ = ["quantize_model", "QuantizeStream", "nic_applies_k"]


def quantize_model(u, k):
    """The fp32 word ``u`` (an int) becomes after an encode/decode round trip at ``k``."""
    if not K_MIN <= k <= K_MAX:
        raise ValueError(f"k must be in {K_MIN}..{K_MAX}, not {k!r}")
    s, e, m = u >> 31 & 1, u >> 23 & 0xFF, u & 0x7FFFFF
    e8 = min(134 - k, 127)
    if e < 127 - k:
        return 0                                  # tag 00: +0.0
    if e >= 127:
        return u                                  # tag 11: raw
    f = ((1 << 23) | m) >> (127 - e)
    if e < e8:
        code, scale = f >> (23 - k), k            # tag 01: P8 * 2^-k
    else:
        code, scale = f >> 8, 15                  # tag 10: P16 * 2^-15
    top = code.bit_length() - 1                   # code >= 1 in both classes
    return s << 31 | (127 - scale + top) << 23 | ((code << (23 - top)) & 0x7FFFFF)


def nic_applies_k(fields):
    """The ``k`` the NIC quantises a packet's values with, or ``None`` if it passes them
    (header fields as a dict, ``contract.header.Header`` names)."""
    if (fields["magic"] == MAGIC and fields["version"] == VERSION
            and fields["type"] == PacketType.RAW_F32 and fields["flags"] & Flags.COMPRESS
            and K_MIN <= fields["k"] <= K_MAX):
        return fields["k"]
    return None


# Per-lane state between pipeline stages.
_Stage1 = data.StructLayout({"word": 32, "tag": 2, "f": 24})
_Stage2 = data.StructLayout({"word": 32, "tag": 2, "code": 15})
_Stage3 = data.StructLayout({"word": 32, "tag": 2, "code": 15, "top": 4})
# Per-beat state carried alongside.
# Per-beat state carried alongside: the packet's k enters only as constants computed once
# per packet (no k arithmetic on the per-beat path).
_Beat = data.StructLayout({"quantise": 1, "shift8": 5, "edge_01": 8, "keep": 32, "last": 1})


def _leading_one(m, code, name):
    """Position of the highest set bit of a 15-bit ``code`` (0 if none), as a log-depth tree
    rather than a priority chain."""
    b3 = code[8:15] != 0
    upper = Signal(8, name=f"{name}_8")
    m.d.comb += upper.eq(Mux(b3, code[8:15], code[0:8]))
    b2 = upper[4:8] != 0
    quarter = Signal(4, name=f"{name}_4")
    m.d.comb += quarter.eq(Mux(b2, upper[4:8], upper[0:4]))
    b1 = quarter[2:4] != 0
    b0 = Mux(b1, quarter[3], quarter[1])
    return Cat(b0, b1, b2, b3)


class QuantizeStream(wiring.Component):
    """Quantises the payload lanes of every packet the NIC compresses; four free-running
    pipeline stages, then a :class:`hdl.stream.credit_buffer.CreditBuffer`.

    Attributes
    ----------
    i : In(axis_signature())
        Packets as the NIC's transmit side receives them.
    o : Out(axis_signature())
        The same packets as the NIC's receive side must deliver them.
    """

    LATENCY = 4

    def __init__(self):
        super().__init__({"i": In(axis_signature()), "o": Out(axis_signature())})

    def elaborate(self, platform):
        m = Module()
        # The stages move on every clock (no clock enable on ~1800 flip-flops); the buffer
        # at the end takes what comes out, and its registered `space` is the input's ready.
        m.submodules.buffer = buffer = CreditBuffer(AxisBeat, latency=self.LATENCY)
        wiring.connect(m, buffer.o, wiring.flipped(self.o))
        take = Signal()
        m.d.comb += [self.i.ready.eq(buffer.space), take.eq(self.i.valid & self.i.ready)]

        # which beats to quantise: the payload of a compressible packet
        first = Signal(init=1)                   # the next input beat is a header
        quantise_packet = Signal()
        # the packet's class edges: 127 - k (lowest exponent of tag 01), min(134 - k, 127)
        # (lowest of tag 10), 23 - k (the shift from F to P8)
        edge_01, e8, shift8 = Signal(8), Signal(8), Signal(5)
        header = data.View(HeaderLayout, self.i.payload.data)
        k_in = header.k[0:4]
        with m.If(take):
            m.d.sync += first.eq(self.i.payload.last)
            with m.If(first):
                m.d.sync += [
                    quantise_packet.eq((header.magic == MAGIC) & (header.version == VERSION)
                                       & (header.type == PacketType.RAW_F32)
                                       & ((header.flags & Flags.COMPRESS) != 0)
                                       & (header.k >= K_MIN) & (header.k <= K_MAX)),
                    edge_01.eq(127 - k_in),
                    e8.eq(Mux(k_in >= 7, 134 - k_in, 127)),
                    shift8.eq(23 - k_in),
                ]

        valid = [Signal(name=f"valid{n}") for n in range(1, 5)]
        beat = [Signal(_Beat, name=f"beat{n}") for n in range(1, 5)]
        s1 = [Signal(_Stage1, name=f"s1_lane{j}") for j in range(LANES)]
        s2 = [Signal(_Stage2, name=f"s2_lane{j}") for j in range(LANES)]
        s3 = [Signal(_Stage3, name=f"s3_lane{j}") for j in range(LANES)]
        out = [Signal(32, name=f"out_lane{j}") for j in range(LANES)]

        m.d.sync += [
            valid[0].eq(take),
            beat[0].quantise.eq(~first & quantise_packet),
            beat[0].shift8.eq(shift8),
            beat[0].edge_01.eq(edge_01),
            beat[0].keep.eq(self.i.payload.keep),
            beat[0].last.eq(self.i.payload.last),
        ]
        for n in range(1, 4):
            m.d.sync += [valid[n].eq(valid[n - 1]), beat[n].eq(beat[n - 1])]

        for j in range(LANES):
            word = self.i.payload.data[32 * j:32 * j + 32]
            e, mant = word[23:31], word[0:23]
            # stage 1: the class, and F (only used for tags 01 and 10, where 127 - e <= 15)
            tag = Signal(2, name=f"tag{j}")
            with m.If(e < edge_01):
                m.d.comb += tag.eq(0b00)
            with m.Elif(e < e8):
                m.d.comb += tag.eq(0b01)
            with m.Elif(e < 127):
                m.d.comb += tag.eq(0b10)
            with m.Else():
                m.d.comb += tag.eq(0b11)
            shift = (127 - e)[0:4]
            m.d.sync += [s1[j].word.eq(word), s1[j].tag.eq(tag),
                         s1[j].f.eq(Cat(mant, C(1, 1)) >> shift)]
            # stage 2: the payload code, P8 or P16 (without the sign)
            code = Mux(s1[j].tag == 0b01, s1[j].f >> beat[0].shift8, s1[j].f >> 8)
            m.d.sync += [s2[j].word.eq(s1[j].word), s2[j].tag.eq(s1[j].tag),
                         s2[j].code.eq(code)]
            # stage 3: position of the code's leading one
            top = _leading_one(m, s2[j].code, f"top{j}")
            m.d.sync += [s3[j].word.eq(s2[j].word), s3[j].tag.eq(s2[j].tag),
                         s3[j].code.eq(s2[j].code), s3[j].top.eq(top)]
            # stage 4: decode to fp32: exponent from the leading one, mantissa after it
            scale_base = Mux(s3[j].tag == 0b01, beat[2].edge_01, 127 - 15)
            normalised = (s3[j].code << (14 - s3[j].top).as_unsigned())[0:14]
            decoded = Cat(C(0, 9), normalised, (scale_base + s3[j].top)[0:8], s3[j].word[31])
            result = Mux(s3[j].tag == 0b00, 0, Mux(s3[j].tag == 0b11, s3[j].word, decoded))
            m.d.sync += out[j].eq(Mux(beat[2].quantise, result, s3[j].word))

        m.d.comb += [
            buffer.i.valid.eq(valid[3]),
            buffer.i.payload.data.eq(Cat(*out)),
            buffer.i.payload.keep.eq(beat[3].keep),
            buffer.i.payload.last.eq(beat[3].last),
        ]
        return m
