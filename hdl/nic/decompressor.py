"""INCEPTIONN decompressor: the NIC receive path (``docs/nic-contract.md``, RX).

Pipeline:

====  ===============  ======================================================================
 #    stage            what it does
====  ===============  ======================================================================
 0    front (comb)     header checks; drops bad-header / bad-k / too-large packets whole
                       (their beats are swallowed, nothing is written); marks bypass packets
 1    skid buffer      registers the unpacker's input and ready
 2-8  unpack           block ends of each word, then one block per clock out of the bitstream
                       and its extraction (:class:`~hdl.nic.unpacker.Unpacker`), end-of-packet
                       verdict (good / truncated / over-long); its output is a credit buffer,
                       so the ready it sees stops there
 9-11 block decode     prefix sum, payload extraction, lane decode
                       (:class:`~hdl.nic.lane_decoder.BlockDecoder`); never stalls: items enter
                       only while the packet buffer has room for all in flight
 12   packet buffer    block RAM FIFO with a commit pointer
                       (:class:`~hdl.stream.packet_buffer.PacketBuffer`)
====  ===============  ======================================================================

Truncation and over-length are only known at the end of a packet, so decoded beats go into
the packet buffer, whose reader only sees committed beats: a good packet commits at its end,
a malformed one rewinds the write pointer and disappears whole. Bypassed packets commit every
beat (cut-through, any length). The buffer holds a whole ``max_count`` packet
(``ceil(max_count / 8) + 1`` beats, rounded up to a power of two: 512 for 2048), so a packet in
progress can always complete while earlier committed packets drain.
"""
from amaranth import Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from contract.counters import NIC_RX_COUNTERS
from contract.header import K_MAX, K_MIN, LANES, MAGIC, VERSION, PacketType
from hdl.header import HeaderLayout
from hdl.nic.lane_decoder import BlockDecoder
from hdl.nic.unpacker import Unpacker, UnpackRequest
from hdl.stream.axis import AxisBeat
from hdl.stream.packet_buffer import PacketBuffer
from hdl.stream.skid_buffer import SkidBuffer

__all__ = ["RxEvents", "Decompressor", "buffer_depth"]

#: One strobe per receive counter (``contract.counters.NIC_RX_COUNTERS`` order).
RxEvents = data.StructLayout({name: unsigned(1) for name in NIC_RX_COUNTERS})

#: Largest ``max_count`` accepted: keeps the buffer within reason for an ECP5's block RAM.
MAX_COUNT_LIMIT = 1 << 16


#: Items that can be on their way into the packet buffer after it last said it had room:
#: the decoder's three stages, the one released this clock, and the registered room flag's
#: own clock of delay (:attr:`~hdl.stream.packet_buffer.PacketBuffer.room`).
IN_FLIGHT = 5


def buffer_depth(max_count):
    """Beats of packet buffer for packets of up to ``max_count`` values (power of two): a
    whole packet (header and ``ceil(max_count / 8)`` beats) on top of the beats in flight."""
    beats = 1 + -(-max_count // LANES) + IN_FLIGHT
    return 1 << (beats - 1).bit_length()


class Decompressor(wiring.Component):
    """The NIC receive engine: ``INC_F32`` packets in, ``RAW_F32`` out; malformed ones dropped.

    Parameters
    ----------
    max_count : int
        Largest ``count`` of an ``INC_F32`` packet that is decompressed (default 2048); larger
        ones are dropped (``drop_too_large``). Sizes the packet buffer.

    Ports
    -----
    i : In(stream.Signature(AxisBeat))
    o : Out(stream.Signature(AxisBeat))
    events : Out(RxEvents)
        Counter strobes, each high for one cycle per packet it counts.
    """

    def __init__(self, *, max_count=2048):
        if isinstance(max_count, bool) or not isinstance(max_count, int) or \
                not 1 <= max_count <= MAX_COUNT_LIMIT:
            raise ValueError(f"max_count must be an integer in 1..{MAX_COUNT_LIMIT}, "
                             f"not {max_count!r}")
        self.max_count = max_count
        super().__init__({
            "i": In(stream.Signature(AxisBeat)),
            "o": Out(stream.Signature(AxisBeat)),
            "events": Out(RxEvents),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.unpack = unpack = Unpacker(max_count=self.max_count)
        m.submodules.decode = decode = BlockDecoder()
        m.submodules.buffer = buffer = PacketBuffer(depth=buffer_depth(self.max_count),
                                                    headroom=IN_FLIGHT)
        # A skid buffer registers the unpacker's input (the front end's header checks stay
        # out of its block-finding loop). Its output is a credit buffer: `ready` reaches
        # only that buffer's read side.
        m.submodules.unpack_in = unpack_in = SkidBuffer(UnpackRequest)
        wiring.connect(m, unpack_in.o, unpack.i)
        # The decoder never stalls: an item enters it only while the packet buffer has room
        # for everything in flight (a registered flag), so no ready chain runs back through
        # its wide stages.
        m.d.comb += [
            decode.i.p.eq(unpack.o.p),
            decode.i.valid.eq(unpack.o.valid & buffer.room),
            unpack.o.ready.eq(buffer.room),
            buffer.i.p.eq(decode.o.p),
            buffer.i.valid.eq(decode.o.valid),
            decode.o.ready.eq(1),
        ]
        wiring.connect(m, buffer.o, wiring.flipped(self.o))

        # -- front end: header checks ---------------------------------------------------
        in_payload = Signal()
        dropping = Signal()
        bypassing = Signal()

        beat = self.i.p
        header = data.View(HeaderLayout, beat.data)
        bad_header = Signal()
        is_inc = Signal()
        bad_k = Signal()
        too_large = Signal()
        m.d.comb += [
            bad_header.eq((header.magic != MAGIC) | (header.version != VERSION)),
            is_inc.eq(header.type == PacketType.INC_F32),
            bad_k.eq((header.k < K_MIN) | (header.k > K_MAX)),
            too_large.eq(header.count > self.max_count),
        ]
        # Causes in priority order (contract.counters): the first that applies counts.
        drop_now = bad_header | (is_inc & (bad_k | too_large))
        bypass_now = ~bad_header & ~is_inc

        dropped_beat = Signal()
        m.d.comb += dropped_beat.eq(Mux(in_payload, dropping, drop_now))
        m.d.comb += [
            unpack_in.i.p.data.eq(beat.data),
            unpack_in.i.p.keep.eq(beat.keep),
            unpack_in.i.p.last.eq(beat.last),
            unpack_in.i.p.bypass.eq(Mux(in_payload, bypassing, bypass_now)),
            unpack_in.i.valid.eq(self.i.valid & ~dropped_beat),
            # Ready is the skid buffer's (a register) for dropped beats too: a drop waits for
            # room like any beat, and the header checks stay off the upstream ready path.
            self.i.ready.eq(unpack_in.i.ready),
        ]

        events = self.events
        m.d.sync += events.eq(0)
        m.d.sync += [
            events.decompressed.eq(unpack.events.decompressed),
            events.drop_truncated.eq(unpack.events.drop_truncated),
            events.drop_overlong.eq(unpack.events.drop_overlong),
        ]
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += in_payload.eq(~beat.last)
            with m.If(~in_payload):
                m.d.sync += [
                    dropping.eq(drop_now),
                    bypassing.eq(bypass_now),
                    events.packets.eq(1),
                    events.bypassed.eq(bypass_now),
                    events.drop_bad_header.eq(bad_header),
                    events.drop_bad_k.eq(~bad_header & is_inc & bad_k),
                    events.drop_too_large.eq(~bad_header & is_inc & ~bad_k & too_large),
                ]
        return m
