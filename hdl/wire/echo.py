"""The board service's ICMP echo responder (``network.md`` section 6; ``GoldenWire._answer``).

It answers an echo request to the board's IP address that carries at most
:data:`ICMP_MAX_DATA` bytes of data (LiteEth's limit, kept so that the wire answers as the
network top does) with the echo reply: the same identifier, sequence and data, the ICMP
checksum adjusted for the new type (no second pass over the data). It reads the request's
fields off the frame buffer's words as they pass; the reply is the request's own words from
the ICMP header's second half on, behind the reply multiplexer's headers
(:class:`hdl.wire.reply.ReplyMux`).
"""
from amaranth import Cat, Const, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from contract.frames import IP_HEADER, IP_PROTO_ICMP
from hdl.wire.classify import BEAT_BYTES, be16
from hdl.wire.request import IpRequest, RequestWord, TransportWords, halves

__all__ = ["ICMP_MAX_DATA", "EchoResponder"]

#: LiteEth answers pings with at most this much ICMP data (its ``icmp_fifo_depth``)
ICMP_MAX_DATA = 128
_ICMP_ECHO_REQUEST = 8
#: an ICMP header: type, code, checksum, identifier, sequence
_ICMP_HEADER = 8


class EchoResponder(wiring.Component):
    """Answers an ICMP echo request to the board.

    Members
    -------
    rx : In(stream.Signature(RequestWord, always_ready=True))
        The request's words as they come.
    ip : In(IpRequest)
        The request's Ethernet and IPv4 headers, as the reply multiplexer reads them.
    answer : Out(1)
        The frame is a request it answers (valid once the frame is in).
    read_data : In(8 * BEAT_BYTES)
        The frame buffer's word as the reply is sent (the request's word of the same
        place).
    words : Out(TransportWords)
        Its part of the reply: ICMP type and code 0 (echo reply), the checksum, the rest of
        the request's words.
    """

    def __init__(self):
        super().__init__({
            "rx": In(stream.Signature(RequestWord, always_ready=True)),
            "ip": In(IpRequest),
            "answer": Out(1),
            "read_data": In(8 * BEAT_BYTES),
            "words": Out(TransportWords),
        })

    def elaborate(self, platform):
        m = Module()
        rx, ip, request = self.rx, self.ip, self.read_data
        half = halves(rx.p.data)

        echo_request = Signal()
        icmp_checksum = Signal(16)
        with m.If(rx.valid):
            with m.Switch(rx.p.index):
                with m.Case(8):
                    m.d.sync += echo_request.eq(half[1] == _ICMP_ECHO_REQUEST)
                with m.Case(9):
                    m.d.sync += icmp_checksum.eq(be16(half[0]))
        m.d.comb += self.answer.eq(~ip.arp & ip.for_board & (ip.protocol == IP_PROTO_ICMP)
                                   & echo_request
                                   & (ip.total <= IP_HEADER + _ICMP_HEADER + ICMP_MAX_DATA))

        # The type goes from 8 to 0: the checksum (ones' complement of the sum) grows by
        # 0x0800, with the end-around carry.
        new_icmp_checksum = Signal(16)
        m.d.comb += new_icmp_checksum.eq(icmp_checksum + 0x0800 + (icmp_checksum >= 0xF800))
        m.d.comb += [
            self.words.port.eq(Const(0, 16)),
            self.words.words[0].eq(Cat(be16(new_icmp_checksum), request[16:])),
            self.words.words[1].eq(request),
            self.words.words[2].eq(request),
        ]
        return m
