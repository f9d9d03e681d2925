"""INCEPTIONN value encoder: one fp32 lane -> (tag, payload, width), and the 8-lane stage.

Implements section 2 of ``docs/protocol/inceptionn-format.md`` in gateware. The
classification only looks at the biased exponent ``e`` (all thresholds are powers of two),
so it is a few small compares; the payload is the 24-bit significand shifted right by an
amount that takes only 7 (``P8``) or 8 (``P16``) values, i.e. a narrow mux, not a barrel
shifter.

With ``t = e + k``:

=====  ==========================  =========================================
tag    condition                   payload
=====  ==========================  =========================================
``00`` ``t < 127``                 none
``01`` ``127 <= t < 134, e < 127`` ``s << 7 | sig >> (150 - t)``  (``150-t`` in 17..23)
``10`` ``t >= 134, e < 127``       ``s << 15 | sig >> (135 - e)`` (``135-e`` in 9..16)
``11`` ``e >= 127``                the word unchanged
=====  ==========================  =========================================

where ``sig = (1 << 23) | m``. ``t < 127`` is ``e < 127 - k``; ``t < 134`` is
``e < 134 - k``; and ``E8 = min(134 - k, 127)`` is covered by also requiring ``e < 127``
for tag 01, which is why ``t`` is enough.
"""
from amaranth import Cat, Module, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from contract.header import LANES
from hdl.nic.layouts import TAG_P8, TAG_P16, TAG_RAW, TAG_ZERO
from hdl.stream.stage import register_stage

__all__ = ["LaneCode",
           "EncodeRequest", "EncodedBeat", "LaneEncoder", "EncodeStage"]

#: One encoded lane: the payload is right-aligned, zero above ``width`` bytes.
LaneCode = data.StructLayout({
    "tag": unsigned(2),
    "payload": unsigned(32),
    "width": unsigned(3),      # payload length in bytes: 0, 1, 2 or 4
})

#: What the compressor front end hands the encoder stage for every input beat.
#: ``raw`` beats (headers, bypassed packets) are carried through untouched: their words
#: travel in the lane payloads, with width 4, so no separate 256-bit register is needed.
EncodeRequest = data.StructLayout({
    "words": data.ArrayLayout(unsigned(32), LANES),
    "lanes_valid": unsigned(LANES),   # lanes that hold a value (tag 00 for the others)
    "k": unsigned(4),
    "raw": unsigned(1),
    "keep": unsigned(LANES * 4),      # tkeep, used for raw beats only
    "last": unsigned(1),
})

#: The encoder stage's output: eight lane codes plus the beat's framing.
EncodedBeat = data.StructLayout({
    "lanes": data.ArrayLayout(LaneCode, LANES),
    "raw": unsigned(1),
    "empty": unsigned(1),             # no valid lane: the beat contributes no block at all
    "keep": unsigned(LANES * 4),
    "last": unsigned(1),
})


def encode_lane(m, value, k, code, *, domain="comb"):
    """Add the logic that encodes one fp32 word.

    Parameters
    ----------
    m : Module
        Module to add the statements to.
    value : Value
        The 32-bit input word.
    k : Value
        The error-bound exponent, 1..15 (other values give meaningless codes; the
        compressor never encodes with them).
    code : View of :data:`LaneCode`
        Assigned in ``domain``.
    """
    sign = value[31]
    exponent = value[23:31]
    significand = Cat(value[:23], 1)                  # 24 bits, hidden one restored
    t = Signal(9, name="lane_t")   # e + k, 9 bits: no wrap-around
    m.d.comb += t.eq(exponent + k)

    # P8: shift by 150 - t, 17..23. Indexing by t's low bits instead of subtracting keeps
    # it a plain 7-input mux (t in 127..133 whenever tag 01 is chosen).
    # Those 7 values of t differ in their low 3 bits, so the mux selects on 3 bits only.
    p8 = Signal(7, name="lane_p8")
    with m.Switch(t[:3]):
        for tt in range(127, 134):
            with m.Case(tt % 8):
                m.d.comb += p8.eq(significand >> (150 - tt))
    # P16: shift by 135 - e, 9..16 (e in 119..126 whenever tag 10 is chosen; again
    # distinct in the low 3 bits).
    p16 = Signal(15, name="lane_p16")
    with m.Switch(exponent[:3]):
        for ee in range(119, 127):
            with m.Case(ee % 8):
                m.d.comb += p16.eq(significand >> (135 - ee))

    d = getattr(m.d, domain)
    with m.If(exponent >= 127):
        d += [code.tag.eq(TAG_RAW), code.payload.eq(value), code.width.eq(4)]
    with m.Elif(t >= 134):
        d += [code.tag.eq(TAG_P16), code.payload.eq(Cat(p16, sign)), code.width.eq(2)]
    with m.Elif(t >= 127):
        d += [code.tag.eq(TAG_P8), code.payload.eq(Cat(p8, sign)), code.width.eq(1)]
    with m.Else():
        d += [code.tag.eq(TAG_ZERO), code.payload.eq(0), code.width.eq(0)]


class LaneEncoder(wiring.Component):
    """Combinational encoder of one fp32 lane (section 2 of the format spec).

    Ports
    -----
    value : In(32)
        The fp32 word.
    k : In(4)
        Error-bound exponent, 1..15.
    code : Out(LaneCode)
        Tag, right-aligned payload and payload width in bytes.
    """

    def __init__(self):
        super().__init__({"value": In(32), "k": In(4), "code": Out(LaneCode)})

    def elaborate(self, platform):
        m = Module()
        encode_lane(m, self.value, self.k, self.code)
        return m


class EncodeStage(wiring.Component):
    """Registered pipeline stage: classify and shift all eight lanes of a beat.

    Invalid lanes (``lanes_valid`` bit clear: past the end of a packet whose value count is
    not a multiple of 8) get tag 00. Raw beats keep their words in the lane payloads with
    width 4.

    Ports
    -----
    i : In(stream.Signature(EncodeRequest))
    o : Out(stream.Signature(EncodedBeat))
    """

    def __init__(self):
        super().__init__({
            "i": In(stream.Signature(EncodeRequest)),
            "o": Out(stream.Signature(EncodedBeat)),
        })

    def elaborate(self, platform):
        m = Module()
        codes = []
        for j in range(LANES):
            code = Signal(LaneCode, name=f"code{j}")
            encode_lane(m, self.i.p.words[j], self.i.p.k, code)
            codes.append(code)

        with register_stage(m, self.i, self.o):
            m.d.sync += [
                self.o.p.raw.eq(self.i.p.raw),
                self.o.p.empty.eq(~self.i.p.raw & (self.i.p.lanes_valid == 0)),
                self.o.p.keep.eq(self.i.p.keep),
                self.o.p.last.eq(self.i.p.last),
            ]
            for j in range(LANES):
                lane = self.o.p.lanes[j]
                with m.If(self.i.p.raw):
                    m.d.sync += [lane.tag.eq(TAG_RAW), lane.payload.eq(self.i.p.words[j]),
                                 lane.width.eq(4)]
                with m.Elif(self.i.p.lanes_valid[j]):
                    m.d.sync += lane.eq(codes[j])
                with m.Else():
                    m.d.sync += [lane.tag.eq(TAG_ZERO), lane.payload.eq(0), lane.width.eq(0)]
        return m
