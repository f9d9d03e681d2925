"""INCEPTIONN value decoder: (tag, payload) -> fp32 lane, and the 3-stage block decoder.

Decoding (section 2 of ``docs/protocol/inceptionn-format.md``): tag 00 gives +0.0; tag 01
gives ``±P8 * 2^-k``; tag 10 gives ``±P16 * 2^-15``; tag 11 gives the raw word. The two
scaled classes are exact in fp32: with ``L`` the index of ``P``'s leading one, the result
has biased exponent ``127 - k + L`` (resp. ``112 + L``) and the bits of ``P`` below its
leading one as the top of the mantissa. A zero code (only in malformed streams) gives a
zero with the code's sign bit, as the golden model does.
"""
from amaranth import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from contract.header import BEAT_BYTES, LANES
from hdl.nic.layouts import TAG_P8, TAG_P16, TAG_RAW, TAG_VECTOR_BYTES, prefix_offsets
from hdl.nic.unpacker import UnpackedItem, block_payload_bytes
from hdl.stream.packet_buffer import BufferItem, End
from hdl.stream.stage import register_stage

__all__ = ["decode_lane", "LaneDecoder", "BufferItem", "BlockDecoder"]

def _normalise(m, code, bits, exponent_base, name):
    """fp32 magnitude (exponent and mantissa, no sign) of ``code * 2^(exponent_base-127)``,
    ``code`` an unsigned integer of ``bits`` bits. Zero for a zero code.

    Built flat rather than as a priority chain: a one-hot "leading one is at ``l``" vector
    (bit ``l`` set and nothing above it), then an AND-OR of the ``bits`` candidate
    mantissas and of the leading-one position, then one small add for the exponent.
    """
    lead_onehot = Signal(bits, name=f"{name}_lead")
    for lead in range(bits):
        above = code[lead + 1:bits]
        m.d.comb += lead_onehot[lead].eq(code[lead] & (~above.any() if len(above) else 1))
    mantissa = 0
    position = 0
    for lead in range(bits):
        below = code[:lead] << (23 - lead) if lead else Const(0, 23)
        mantissa = mantissa | Mux(lead_onehot[lead], below, 0)
        position = position | Mux(lead_onehot[lead], lead, 0)
    magnitude = Signal(31, name=name)
    m.d.comb += magnitude.eq(Mux(lead_onehot.any(),
                                 Cat(mantissa[:23], (exponent_base + position)[:8]), 0))
    return magnitude


def decode_lane(m, tag, payload, k, name="lane"):
    """Add the logic that decodes one lane; return the 32-bit fp32 word (a comb Signal)."""
    word = Signal(32, name=f"{name}_word")
    p8 = _normalise(m, payload[:7], 7, 127 - k, f"{name}_p8")
    p16 = _normalise(m, payload[:15], 15, Const(112, 8), f"{name}_p16")
    with m.Switch(tag):
        with m.Case(TAG_P8):
            m.d.comb += word.eq(Cat(p8, payload[7]))
        with m.Case(TAG_P16):
            m.d.comb += word.eq(Cat(p16, payload[15]))
        with m.Case(TAG_RAW):
            m.d.comb += word.eq(payload)
        with m.Default():
            m.d.comb += word.eq(0)
    return word


class LaneDecoder(wiring.Component):
    """Combinational decoder of one lane.

    Ports
    -----
    tag : In(2)
    payload : In(32)
        Right-aligned payload (bits above the tag's width are ignored).
    k : In(4)
        Error-bound exponent of the packet, 1..15.
    value : Out(32)
        The fp32 word.
    """

    def __init__(self):
        super().__init__({"tag": In(2), "payload": In(32), "k": In(4), "value": Out(32)})

    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.value.eq(decode_lane(m, self.tag, self.payload, self.k))
        return m


class BlockDecoder(wiring.Component):
    """Three registered stages from one block to one output beat of eight fp32 lanes.

    1. **prefix sum**: the byte offset of every lane's payload in the block;
    2. **extract**: each lane's payload (lane ``j`` can only start at bytes 2..2+4j);
    3. **decode**: each lane's fp32 word.

    Raw items (headers, bypassed beats) and verdict-only items pass through.

    Ports
    -----
    i : In(stream.Signature(UnpackedItem))
    o : Out(stream.Signature(BufferItem))
    """

    def __init__(self):
        super().__init__({
            "i": In(stream.Signature(UnpackedItem)),
            "o": Out(stream.Signature(BufferItem)),
        })

    def elaborate(self, platform):
        m = Module()
        Offsets = data.StructLayout({
            "item": UnpackedItem,
            "offsets": data.ArrayLayout(unsigned(5), LANES),
        })
        Extracted = data.StructLayout({
            "payloads": data.ArrayLayout(unsigned(32), LANES),
            "tags": unsigned(2 * LANES),
            "raw": unsigned(1),
            "write": unsigned(1),
            "keep": unsigned(BEAT_BYTES),
            "last": unsigned(1),
            "end": End,
            "k": unsigned(4),
        })
        s1 = stream.Signature(Offsets).create(path=("offsets",))
        s2 = stream.Signature(Extracted).create(path=("extracted",))

        def stage(src, dst, assign):
            with register_stage(m, src, dst):
                m.d.sync += assign

        # -- stage 1: prefix sum ----------------------------------------------------------
        tags = self.i.p.bits[:2 * LANES]
        _, widths = block_payload_bytes(m, tags, "lane_bytes")
        offsets, _ = prefix_offsets(m, widths, "offset")
        stage(self.i, s1, [s1.p.item.eq(self.i.p)] +
              [s1.p.offsets[j].eq(offsets[j]) for j in range(LANES)])

        # -- stage 2: extract the payloads ------------------------------------------------
        item = s1.p.item
        payloads = []
        for j in range(LANES):
            payload = Signal(32, name=f"payload{j}")
            with m.If(item.raw):
                m.d.comb += payload.eq(item.bits.word_select(j, 32))
            with m.Else():
                with m.Switch(s1.p.offsets[j]):
                    for o in range(TAG_VECTOR_BYTES, TAG_VECTOR_BYTES + 4 * j + 1):
                        with m.Case(o):
                            m.d.comb += payload.eq(item.bits[8 * o:8 * o + 32])
            payloads.append(payload)
        stage(s1, s2, [s2.p.payloads[j].eq(payloads[j]) for j in range(LANES)] + [
            s2.p.tags.eq(item.bits[:2 * LANES]),
            s2.p.raw.eq(item.raw), s2.p.write.eq(item.write), s2.p.keep.eq(item.keep),
            s2.p.last.eq(item.last), s2.p.end.eq(item.end), s2.p.k.eq(item.k),
        ])

        # -- stage 3: decode --------------------------------------------------------------
        words = []
        for j in range(LANES):
            word = decode_lane(m, s2.p.tags[2 * j:2 * j + 2], s2.p.payloads[j], s2.p.k,
                               name=f"lane{j}")
            words.append(Mux(s2.p.raw, s2.p.payloads[j], word))
        stage(s2, self.o, [
            self.o.p.data.eq(Cat(words)),
            self.o.p.keep.eq(s2.p.keep), self.o.p.last.eq(s2.p.last),
            self.o.p.write.eq(s2.p.write), self.o.p.end.eq(s2.p.end),
        ])
        return m
