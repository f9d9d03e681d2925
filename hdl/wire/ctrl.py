"""The board service's ``CTRL`` responder (``network.md`` sections 4 and 6).

A ``CTRL`` request to the control port with the bitstream's key reads the registers of
``contract.registers.WIRE_REGISTERS`` in region ``wire`` of the ``CTRL`` address space, on
:attr:`CtrlResponder.bus` (every register is a counter: a write is read back and changes
nothing; other addresses read 0). A request with a wrong key, or shorter than a header, gets
no answer; a malformed one the header alone with ``RESULT`` and ``ERROR``. The checks are
:mod:`hdl.ctrl_request`'s, the network top's control service's too; here each is made on
the 32-bit word that carries its field as the request passes, and kept in one bit.

The request is worked in place: each pair's value is read into the frame buffer over the
request's, so the reply is the request's own words behind new headers
(:class:`hdl.wire.reply.ReplyMux` writes the Ethernet and IPv4 ones, this responder the UDP
header and the reply's flags).
"""
import dataclasses

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from contract.frames import ETH_HEADER, IP_HEADER, IP_PROTO_UDP, PAYLOAD_OFFSET
from contract.network import (CTRL_MAX_PAIRS, NETWORK_REGIONS, PORT_BASE, SERVICE_OFFSETS,
                              Service)
from hdl import ctrl_request as check
from hdl.ctrl_port import RegisterPort
from hdl.wire.classify import BEAT_BYTES, be16, lanes
from hdl.wire.request import (BUFFER_WORDS, BufferRead, BufferWrite, IpRequest, RequestWord,
                              Step, TransportWords, halves)

__all__ = ["CTRL_PORT", "CtrlResponder"]

#: The UDP port of the control service
CTRL_PORT = PORT_BASE + SERVICE_OFFSETS[Service.CTRL]
_WIRE_REGION = next(r.index for r in NETWORK_REGIONS if r.name == "wire")
#: IPv4 and UDP headers: the bytes of the IPv4 total length before the CTRL header
_BEFORE = PAYLOAD_OFFSET - ETH_HEADER
#: frame byte -> (word, lane): the CTRL header's fields (payload byte p at frame byte 42 + p)
_PAIR_WORD = (PAYLOAD_OFFSET + 32) // BEAT_BYTES        # the first pair starts in its upper half
assert (PAYLOAD_OFFSET + 32) % BEAT_BYTES == 2


@dataclasses.dataclass(frozen=True)
class _Request:
    """What the responder keeps of the request: the requester's UDP port (where the reply
    goes), the pair count, and whether the request is refused (set at ``DECIDE``)."""
    peer_port: Signal
    count: Signal
    refused: Signal


class CtrlResponder(wiring.Component):
    """Answers a ``CTRL`` request with the wire's registers, read in place.

    Parameters
    ----------
    key : int
        The 64-bit control key, a constant of the bitstream.

    Members
    -------
    rx : In(stream.Signature(RequestWord, always_ready=True))
        The request's words as they come.
    ip : In(IpRequest)
        The request's Ethernet and IPv4 headers, as the reply multiplexer reads them.
    step : In(Step)
        The service's step: the responder loads its pair walk at ``DECIDE`` and works a
        pair in the ``PAIR_*`` steps.
    answer : Out(1)
        A request it answers (to the control port, with the key, a whole header); valid
        once the frame is in.
    ok : Out(1)
        ... and carries out: its fields, count and length agree (else refused).
    last_pair : Out(1)
        The pair being worked is the request's last.
    read : Out(BufferRead)
        Its reads of the frame buffer (address 0 when not reading), in the ``PAIR_ADDRESS``
        steps; ``data`` is also the request's word as the reply is sent.
    write : Out(BufferWrite)
        Its writes into the frame buffer, in the ``PAIR_VALUE`` steps.
    bus : Out(RegisterPort(writable=False))
        The wire's registers (``WIRE_REGISTERS``' local addresses).
    reply_total : In(16)
        The reply's IPv4 total length (its UDP length follows).
    words : Out(TransportWords)
        Its part of the reply: the UDP header from the control port, the reply's flags.
    """

    def __init__(self, *, key):
        self._key = check.check_key(key)
        super().__init__({
            "rx": In(stream.Signature(RequestWord, always_ready=True)),
            "ip": In(IpRequest),
            "step": In(Step),
            "answer": Out(1),
            "ok": Out(1),
            "last_pair": Out(1),
            "read": Out(BufferRead),
            "write": Out(BufferWrite),
            "bus": Out(RegisterPort(writable=False)),
            "reply_total": In(16),
            "words": Out(TransportWords),
        })

    def __repr__(self):
        return "CtrlResponder(key=<secret>)"     # the key never goes into logs

    def elaborate(self, platform):
        m = Module()
        request_fields = self._request(m)
        self._pairs(m, request_fields)
        # The reply's UDP header, from the control port to the requester's, and the
        # request's header with its flags set (a refused request ends there: the reply
        # multiplexer's length says so).
        request = self.read.data
        udp_length = Signal(16)
        m.d.comb += udp_length.eq(self.reply_total - IP_HEADER)
        flags = check.reply_flags(request_fields.refused)
        m.d.comb += [
            self.words.port.eq(be16(Const(CTRL_PORT, 16))),
            self.words.words[0].eq(Cat(request_fields.peer_port, be16(udp_length))),
            self.words.words[1].eq(Cat(Const(0, 16), request[16:])),
            self.words.words[2].eq(request | (flags << 8)),
        ]
        return m

    def _request(self, m):
        """The request's fields as their words pass, and what they decide."""
        rx, ip = self.rx, self.ip
        w = rx.p.data
        half = halves(w)
        peer_port = Signal(16)
        to_ctrl_port = Signal()
        ctrl_fields_ok = Signal()
        ctrl_count = Signal(32)
        key_lanes = Signal(64)
        with m.If(rx.valid):
            with m.Switch(rx.p.index):
                with m.Case(8):
                    m.d.sync += peer_port.eq(half[1])
                with m.Case(9):
                    m.d.sync += to_ctrl_port.eq(half[0] == lanes(CTRL_PORT.to_bytes(2, "big")))
                with m.Case(10):
                    m.d.sync += ctrl_fields_ok.eq(check.magic_ok(half[1][:8], half[1][8:]))
                with m.Case(11):
                    m.d.sync += ctrl_fields_ok.eq(check.request_ok(ctrl_fields_ok,
                                                                   w[:8], w[16:24]))
                with m.Case(12):
                    m.d.sync += ctrl_count[:16].eq(half[1])
                with m.Case(13):
                    m.d.sync += ctrl_count[16:].eq(half[0])
                with m.Case(16):
                    m.d.sync += key_lanes[:16].eq(half[1])
                with m.Case(17):
                    m.d.sync += key_lanes[16:48].eq(w)
                with m.Case(18):
                    m.d.sync += key_lanes[48:].eq(half[0])

        # the request's payload (total - 28 bytes) holds a whole header, and the key
        m.d.comb += self.answer.eq(
            ~ip.arp & ip.for_board & (ip.protocol == IP_PROTO_UDP) & ip.udp_ok & to_ctrl_port
            & check.whole_header(ip.total, before=_BEFORE)
            & check.key_matches(key_lanes, self._key))
        # carried out when its fields and its length agree, else refused
        m.d.comb += self.ok.eq(ctrl_fields_ok & check.count_ok(ctrl_count)
                               & check.length_ok(ip.total, ctrl_count, before=_BEFORE))
        refused = Signal()
        with m.Switch(self.step):
            with m.Case(Step.DECIDE):
                m.d.sync += refused.eq(~self.ok)
        return _Request(peer_port=peer_port, count=ctrl_count, refused=refused)

    def _pairs(self, m, request_fields):
        """A pair, at a step each: its address's halves from two words, the register read,
        its value's halves written over the request's (the buffer's upper half of one word
        and the lower half of the next)."""
        read, write, bus = self.read, self.write, self.bus
        pairs_left = Signal(range(CTRL_MAX_PAIRS + 1))
        pair_word = Signal(range(BUFFER_WORDS))     # the pair's first word (address low half)
        address = Signal(32)
        value = Signal(32)
        in_region = Signal()
        m.d.comb += self.last_pair.eq(pairs_left == 1)
        with m.Switch(self.step):
            with m.Case(Step.DECIDE):
                m.d.sync += [pairs_left.eq(request_fields.count[:7]), pair_word.eq(_PAIR_WORD)]
            with m.Case(Step.PAIR_ADDRESS_LOW):
                m.d.comb += read.addr.eq(pair_word)
            with m.Case(Step.PAIR_ADDRESS_HIGH):
                m.d.comb += read.addr.eq(pair_word + 1)
                m.d.sync += address[:16].eq(read.data[16:])
            with m.Case(Step.PAIR_REGION):
                # (registered: the register multiplexers behind the bus start from
                # flip-flops, not from the block RAM's output)
                m.d.sync += in_region.eq(read.data[:16] == _WIRE_REGION)
            with m.Case(Step.PAIR_READ):
                m.d.comb += [bus.addr.eq(address[:16]), bus.re.eq(in_region)]
            with m.Case(Step.PAIR_VALUE_LOW):
                m.d.sync += value.eq(Mux(in_region, bus.rdata, 0))
                m.d.comb += [write.addr.eq(pair_word + 1),
                             write.data.eq(Cat(Const(0, 16), Mux(in_region, bus.rdata[:16], 0))),
                             write.en.eq(0b10)]
            with m.Case(Step.PAIR_VALUE_HIGH):
                m.d.comb += [write.addr.eq(pair_word + 2), write.data.eq(value[16:]),
                             write.en.eq(0b01)]
                m.d.sync += [pairs_left.eq(pairs_left - 1), pair_word.eq(pair_word + 2)]
