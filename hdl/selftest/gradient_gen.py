"""LFSR-driven fp32 gradient packets for the NIC self-test (and a bit-exact Python model).

:class:`GradientGenerator` emits an endless stream of packets, one beat per clock whenever
its output is ready: a header beat (``contract/header.py`` layout), then ``ceil(count/8)``
payload beats of eight fp32 lanes. Values follow the value classes of
``docs/protocol/inceptionn-format.md`` section 2 for the packet's ``k``: mostly below the
error bound (tag 00, zeros and denormals included), some in each of the 8-bit, 16-bit and
raw classes, exact class boundaries and their 1-ulp neighbours, ±Inf, NaNs with payloads,
the largest finite value. Packets are mostly ``RAW_F32`` + ``COMPRESS`` with a good ``k``,
some without ``COMPRESS``, some of another type, some with ``k`` outside 1..15 (all of
which the NIC passes through untouched), some header-only (``count = 0``).

The output is a pure function of ``seed`` and the number of beats taken: all randomness
comes from :class:`hdl.selftest.lfsr.LFSR` instances that advance only when a beat is taken. A
second generator with the same seed therefore replays the stream for a checker, whatever
the stalls on either side. :class:`GradientModel` computes the same beats in Python.
"""
from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import Out

from contract.header import BEAT_BYTES, LANES, MAGIC, VERSION, Flags, Header, PacketType
from hdl.header import HeaderLayout
from hdl.replica import replicas
from hdl.selftest.lfsr import LFSR, lfsr_advance
from hdl.stream.axis import axis_signature

__all__ = ["RNG_WIDTH", "derive_seed", "lane_value_model", "header_model", "GradientModel",
           "GradientGenerator", "PacketEdges", "packet_edges", "lane_value"]

#: Width of every LFSR of the generator (a 64-bit state advanced 64 steps per beat: each
#: next-state bit is the XOR of at most 7 current bits).
RNG_WIDTH = 64
_MASK = (1 << RNG_WIDTH) - 1


def derive_seed(seed, index):
    """A non-zero 64-bit LFSR seed for stream ``index`` (SplitMix64 of ``seed``, ``index``)."""
    z = (seed * 0x9E3779B97F4A7C15 + (index + 1) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    z ^= z >> 31
    return z or 1


def _bits(r, lo, width):
    return (r >> lo) & ((1 << width) - 1)


# -- one lane -------------------------------------------------------------------------------
#
# Random bits of a lane's 64-bit LFSR value r:
#   r[0:4]   class bucket       r[4]     sign          r[5:28]  mantissa
#   r[28:30] mantissa mode (0: zero, 1: all ones, 2-3: random)
#   r[30:35] offset (exponent steps below/above a class edge)
#   r[35:38] variant within the bucket    r[38:45] raw exponent bits
#
# Buckets: 0-6 tag 00, 7-9 tag 01, 10-12 tag 10 (tag 01 when k <= 7: the class is empty),
# 13-14 tag 11 (1 <= |x| < 256), 15 special values and exact class edges.

def _e8(k):
    return min(134 - k, 127)


def lane_value_model(r, k):
    """The fp32 word the generator makes from lane random bits ``r`` for a given ``k``."""
    bucket, sign, mant, mode = _bits(r, 0, 4), _bits(r, 4, 1), _bits(r, 5, 23), _bits(r, 28, 2)
    off5, off3, variant, raw_e = _bits(r, 30, 5), _bits(r, 30, 3), _bits(r, 35, 3), _bits(r, 38, 7)
    m = (0, 0x7FFFFF, mant, mant)[mode]
    e8 = _e8(k)
    if bucket <= 6:                               # below the bound
        e = 0 if variant & 3 == 0 else 126 - k - off5
    elif bucket <= 9 or (bucket <= 12 and k <= 7):
        width = e8 - (127 - k)                    # tag 01
        e = 127 - k + (off3 if off3 < width else 0)
    elif bucket <= 12:
        width = 127 - e8                          # tag 10
        e = e8 + (off3 if off3 < width else width - 1)
    elif bucket <= 14:
        e = 127 + off3                            # tag 11
    else:
        low_side = mode & 1                       # just below an edge instead of on it
        if variant == 0:                          # +-Inf
            e, m = 255, 0
        elif variant == 1:                        # NaN, random payload
            e, m = 255, mant | 1
        elif variant == 2:                        # largest finite
            e, m = 254, 0x7FFFFF
        elif variant == 3:                        # anything at or above 2
            e = 128 + raw_e
        elif variant == 4:                        # 1.0, or 1 ulp below
            e, m = (126, 0x7FFFFF) if low_side else (127, 0)
        elif variant == 5:                        # 2^-k, or 1 ulp below
            e, m = (126 - k, 0x7FFFFF) if low_side else (127 - k, 0)
        elif variant == 6:                        # the 8-bit/16-bit edge, or 1 ulp below
            e, m = (e8 - 1, 0x7FFFFF) if low_side else (e8, 0)
        else:                                     # smallest or largest denormal
            e, m = 0, (0x7FFFFF if low_side else 1)
    return sign << 31 | e << 23 | m


#: Per-packet constants of :func:`lane_value`: functions of ``k`` alone, registered once per
#: packet so that no ``k`` arithmetic sits on the per-beat path.
PacketEdges = data.StructLayout({
    "k": 4,
    "small_k": 1,      # k <= 7: the 16-bit class is empty
    "top_00": 8,       # highest exponent of tag 00: 126 - k
    "edge_01": 8,      # lowest exponent of tag 01: 127 - k
    "e8": 8,           # lowest exponent of tag 10: min(134 - k, 127)
    "width_01": 4,     # exponents in tag 01: e8 - edge_01
    "width_10": 4,     # exponents in tag 10: 127 - e8
})


def packet_edges(m, k):
    """A ``PacketEdges`` value computed (combinationally) from ``k`` in 1..15."""
    edges = Signal(PacketEdges)
    e8 = Mux(k >= 7, 134 - k, 127)
    m.d.comb += [
        edges.k.eq(k), edges.small_k.eq(k <= 7), edges.top_00.eq(126 - k),
        edges.edge_01.eq(127 - k),
        edges.e8.eq(e8), edges.width_01.eq(e8 - (127 - k)), edges.width_10.eq(127 - e8),
    ]
    return edges


def lane_value(m, r, edges):
    """Amaranth version of :func:`lane_value_model`; returns a 32-bit ``Signal``.

    ``r`` is a 64-bit value, ``edges`` a :data:`PacketEdges` value (of ``k`` in 1..15).
    """
    bucket, sign, mant, mode = r[0:4], r[4], r[5:28], r[28:30]
    off5, off3, variant, raw_e = r[30:35], r[30:33], r[35:38], r[38:45]
    value = Signal(32)
    e, man = Signal(8), Signal(23)
    e8, edge_01 = edges.e8, edges.edge_01
    width_01, width_10 = edges.width_01, edges.width_10
    low_side = mode[0]
    m.d.comb += man.eq(Mux(mode[1], mant, Mux(mode[0], 0x7FFFFF, 0)))
    with m.If(bucket <= 6):
        m.d.comb += e.eq(Mux(variant[0:2] == 0, 0, edges.top_00 - off5))
    with m.Elif((bucket <= 9) | ((bucket <= 12) & edges.small_k)):
        m.d.comb += e.eq(edge_01 + Mux(off3 < width_01, off3, 0))
    with m.Elif(bucket <= 12):
        m.d.comb += e.eq(e8 + Mux(off3 < width_10, off3, width_10 - 1))
    with m.Elif(bucket <= 14):
        m.d.comb += e.eq(127 + off3)
    with m.Else():
        with m.Switch(variant):
            with m.Case(0):
                m.d.comb += [e.eq(255), man.eq(0)]
            with m.Case(1):
                m.d.comb += [e.eq(255), man.eq(mant | 1)]
            with m.Case(2):
                m.d.comb += [e.eq(254), man.eq(0x7FFFFF)]
            with m.Case(3):
                m.d.comb += e.eq(128 + raw_e)
            with m.Case(4, 5, 6):
                edge = Mux(variant == 4, 127, Mux(variant == 5, edge_01, e8))
                m.d.comb += [e.eq(Mux(low_side, edge - 1, edge)),
                             man.eq(Mux(low_side, 0x7FFFFF, 0))]
            with m.Case(7):
                m.d.comb += [e.eq(0), man.eq(Mux(low_side, 0x7FFFFF, 1))]
    m.d.comb += value.eq(Cat(man, e, sign))
    return value


# -- one packet header ----------------------------------------------------------------------
#
# Random bits of the packet LFSR value h:
#   h[0:4]   kind: 0 RAW_F32 without COMPRESS, 1 AGG_ADD_I32 (not a NIC type), 2 RAW_F32 +
#            COMPRESS with a bad k (h[16:24] | 16, or 0 when h[24]), else RAW_F32 + COMPRESS
#   h[4:8]   k (0 means 10, the paper's default)
#   h[8:11]  count kind: 0 header only, 1 max_count, 2-3 1..8, else 1 + h[32:48] % max_count
#   h[40:48] job, h[48:56] worker, h[56:64] exponent (carried along, never interpreted)

def _count_model(h, max_count):
    kind = _bits(h, 8, 3)
    if kind == 0:
        return 0
    if kind == 1:
        return max_count
    if kind <= 3:
        return 1 + _bits(h, 32, 3)
    return 1 + (_bits(h, 32, 16) & (max_count - 1))


def header_model(h, max_count, seq, offset):
    """``(header_fields, count, quantise_k)`` of the packet made from random bits ``h``;
    ``quantise_k`` is the ``k`` its values get through the NIC, or ``None`` if untouched."""
    kind, k = _bits(h, 0, 4), (_bits(h, 4, 4) or 10)
    packet_type, flags = PacketType.RAW_F32, Flags.COMPRESS
    if kind == 0:
        flags = Flags.NONE
    elif kind == 1:
        packet_type = PacketType.AGG_ADD_I32
    elif kind == 2:
        k = 0 if _bits(h, 24, 1) else _bits(h, 16, 8) | 16
    count = _count_model(h, max_count)
    fields = dict(magic=MAGIC, version=VERSION, type=packet_type, flags=flags, k=k,
                  job=_bits(h, 40, 8), worker=_bits(h, 48, 8),
                  exponent=_bits(h, 56, 8) - (256 if _bits(h, 63, 1) else 0),
                  count=count, slot=seq & 0xFFFF, slot_version=0, seq=seq, offset=offset)
    quantise_k = k if kind >= 3 else None
    return fields, count, quantise_k


def _generation_k(h):
    """The ``k`` the values of a packet are generated for (a good one even for a bad ``k``)."""
    return _bits(h, 4, 4) or 10


class GradientModel:
    """Bit-exact Python model of :class:`GradientGenerator` (same parameters).

    Iterating gives ``(data, keep, last)`` beats; :meth:`packets` groups them with the
    header fields and the ``k`` the NIC applies.
    """

    def __init__(self, *, seed=1, max_count=256):
        self.max_count = max_count
        self.header_state = derive_seed(seed, LANES)
        self.lane_states = [derive_seed(seed, j) for j in range(LANES)]
        self.seq = 0
        self.offset = 0

    def packets(self):
        """Endless ``(fields, quantise_k, beats)``; beats are ``(data, keep, last)``."""
        while True:
            h = self.header_state
            self.header_state = lfsr_advance(h, RNG_WIDTH, RNG_WIDTH)
            fields, count, quantise_k = header_model(h, self.max_count, self.seq,
                                                     self.offset)
            beats = [(Header(**fields).to_int(), (1 << BEAT_BYTES) - 1, count == 0)]
            k = _generation_k(h)
            left = count
            while left > 0:
                words = min(left, LANES)
                data = 0
                for j in range(LANES):
                    data |= lane_value_model(self.lane_states[j], k) << (32 * j)
                    self.lane_states[j] = lfsr_advance(self.lane_states[j], RNG_WIDTH,
                                                       RNG_WIDTH)
                left -= words
                beats.append((data, (1 << (4 * words)) - 1, left == 0))
            self.seq = (self.seq + 1) & 0xFFFFFFFF
            self.offset = (self.offset + count) & 0xFFFFFFFF
            yield fields, quantise_k, beats

    def beats(self):
        for _, _, beats in self.packets():
            yield from beats


class GradientGenerator(wiring.Component):
    """Endless stream of fp32 gradient packets (see the module docstring).

    Parameters
    ----------
    seed : int
        Selects the stream; two generators with the same parameters emit the same beats.
    max_count : int
        Largest ``count`` (values per packet), a power of two, 8..65536.

    Attributes
    ----------
    o : Out(axis_signature())
        The packets; ``valid`` is high except right after reset (the output is registered).
    """

    def __init__(self, *, seed=1, max_count=256):
        if not isinstance(max_count, int) or max_count < 8 or max_count > 1 << 16 \
                or max_count & (max_count - 1):
            raise ValueError(f"max_count must be a power of two in 8..65536, not {max_count!r}")
        self.seed, self.max_count = seed, max_count
        super().__init__({"o": Out(axis_signature())})

    def elaborate(self, platform):
        m = Module()
        m.submodules.header_rng = header_rng = LFSR(width=RNG_WIDTH,
                                                    seed=derive_seed(self.seed, LANES))
        lane_rngs = []
        for j in range(LANES):
            rng = LFSR(width=RNG_WIDTH, seed=derive_seed(self.seed, j))
            m.submodules[f"lane_rng{j}"] = rng
            lane_rngs.append(rng)

        seq = Signal(32)
        offset = Signal(32)
        left = Signal(range(self.max_count + 1))     # values still to send in this packet
        # The current packet's edges (of its generation k), one copy per lane: a single
        # register feeding all eight lanes' arithmetic was a wide net across the generator.
        # (A header loads them all before any payload beat.)
        edges = replicas(LANES, PacketEdges, name="edges_lane")
        take = Signal()                              # compute the next beat into the output
        m.d.comb += take.eq(~self.o.valid | self.o.ready)

        # header of the next packet, from the packet LFSR
        h = header_rng.value
        kind = h[0:4]
        k_field = Signal(8)
        m.d.comb += k_field.eq(Mux(h[4:8] == 0, 10, h[4:8]))
        with m.If(kind == 2):
            m.d.comb += k_field.eq(Mux(h[24], 0, h[16:24] | 16))
        count = Signal(range(self.max_count + 1))
        with m.Switch(h[8:11]):
            with m.Case(0):
                m.d.comb += count.eq(0)
            with m.Case(1):
                m.d.comb += count.eq(self.max_count)
            with m.Case(2, 3):
                m.d.comb += count.eq(1 + h[32:35])
            with m.Default():
                m.d.comb += count.eq(1 + (h[32:48] & (self.max_count - 1)))
        header = Signal(HeaderLayout)
        m.d.comb += [
            header.magic.eq(MAGIC), header.version.eq(VERSION),
            header.type.eq(Mux(kind == 1, PacketType.AGG_ADD_I32, PacketType.RAW_F32)),
            header.flags.eq(Mux(kind == 0, Flags.NONE, Flags.COMPRESS)),
            header.k.eq(k_field), header.job.eq(h[40:48]), header.worker.eq(h[48:56]),
            header.exponent.eq(h[56:64]), header.count.eq(count),
            header.slot.eq(seq[0:16]), header.seq.eq(seq), header.offset.eq(offset),
        ]

        lanes = Cat(lane_value(m, rng.value, lane_edges)
                    for rng, lane_edges in zip(lane_rngs, edges))
        words = Signal(range(LANES + 1))
        m.d.comb += words.eq(Mux(left >= LANES, LANES, left))

        # `left == 0` as a register of its own: it decides which LFSRs advance, so it
        # must be a flip-flop, not a compare, in front of their clock enables
        at_header = Signal(init=1)
        next_edges = packet_edges(m, Mux(h[4:8] == 0, 10, h[4:8]))
        with m.If(take):
            m.d.sync += self.o.valid.eq(1)
            with m.If(at_header):                    # next beat: a header
                m.d.comb += header_rng.advance.eq(1)
                m.d.sync += [
                    self.o.payload.data.eq(header.as_value()),
                    self.o.payload.keep.eq(Const(-1, BEAT_BYTES)),
                    self.o.payload.last.eq(count == 0),
                    left.eq(count),
                    at_header.eq(count == 0),
                    *[lane_edges.eq(next_edges) for lane_edges in edges],
                    seq.eq(seq + 1),
                    offset.eq(offset + count),
                ]
            with m.Else():                           # next beat: payload
                m.d.comb += [rng.advance.eq(1) for rng in lane_rngs]
                m.d.sync += [
                    self.o.payload.data.eq(lanes),
                    # one keep bit per byte: four per valid 32-bit word
                    self.o.payload.keep.eq((Const(1, 33) << (words * 4)) - 1),
                    self.o.payload.last.eq(left <= LANES),
                    left.eq(left - words),
                    at_header.eq(left <= LANES),
                ]
        return m
