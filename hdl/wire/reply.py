"""The board service's reply multiplexer (``network.md`` section 6; ``GoldenWire._answer``).

:class:`ReplyMux` frames every reply the service sends: to the request's sender (it catches
the sender's MAC and IPv4 address as the request passes: the Ethernet and IPv4 source, or an
ARP request's sender), from the board's addresses, with the body of the responder that
answers: the ARP responder's words after the Ethernet addresses, or an IPv4 header of its
own and the echo or ``CTRL`` responder's transport words after it, then the request's own
words. It also reads the IPv4 header the IP responders depend on (:data:`IpRequest`).

IP replies are as LiteEth sends them: identification 0, no flags, TTL 128, UDP checksum 0.
A reply goes out at a word every two clocks (a read of the frame buffer, then the word),
the host port's line rate.
"""
import dataclasses

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from contract.frames import (ARP_BYTES, ETH_HEADER, IP_HEADER, IP_PROTO_ICMP, IP_PROTO_UDP,
                             UDP_HEADER)
from contract.network import DEFAULT_IP, DEFAULT_MAC
from hdl.wire.arp import ARP_WORDS, ArpWords
from hdl.wire.classify import (BEAT_BYTES, MacBeat, Verdict, address_value, be16, lanes,
                               ones_sum16)
from hdl.wire.request import (BUFFER_WORDS, BufferRead, IpRequest, Peer, RequestWord, Step,
                              TransportWords, halves)

__all__ = ["REPLY_TTL", "HEADER_ONLY_TOTAL", "ReplyMux"]

REPLY_TTL = 128
#: The IPv4 total length of a reply that is a ``CTRL`` header alone (a refused request)
HEADER_ONLY_TOTAL = IP_HEADER + UDP_HEADER + 32
#: the words an IP reply writes: its Ethernet and IPv4 headers and the responder's
_IP_WORDS = 12


@dataclasses.dataclass(frozen=True)
class _Reply:
    """The reply being sent: its kind, IPv4 header checksum, the word going out."""
    kind_arp: Signal
    kind_icmp: Signal
    ip_checksum: Signal
    out_word: Signal


class ReplyMux(wiring.Component):
    """Where a reply goes, and the reply, a word every two clocks, from the answering
    responder's words.

    Parameters
    ----------
    mac : str or int
        The board's MAC address.
    ip : str or int
        The board's IPv4 address.

    Members
    -------
    rx : In(stream.Signature(RequestWord, always_ready=True))
        The request's words as they come.
    verdict : In(Verdict)
        The classifier's verdict on the request.
    step : In(Step)
        The service's step: the multiplexer picks the reply's kind at ``DECIDE``, works out
        its length at ``LENGTH``, and sends it in ``FETCH`` and ``SEND``.
    is_arp : In(1)
        The request is ARP (the ARP responder's).
    peer : Out(Peer)
        The requester.
    header : Out(IpRequest)
        The request's Ethernet and IPv4 headers, for the IP responders.
    header_only : In(1)
        The reply is a ``CTRL`` header alone (a refused request).
    reply_total : Out(16)
        The reply's IPv4 total length.
    arp_words : In(ArpWords)
    echo_words, ctrl_words : In(TransportWords)
        The responders' words.
    read : Out(BufferRead)
        Its reads of the frame buffer (address 0 when not reading): the request's words.
    o : Out(stream.Signature(MacBeat))
        Replies to the host-side MAC: ``last_be`` one-hot on the last word, ``error`` 0, no
        Ethernet padding (the MAC pads).
    """

    def __init__(self, *, mac=DEFAULT_MAC, ip=DEFAULT_IP):
        self.mac = address_value(mac, 48, "mac")
        self.ip = address_value(ip, 32, "ip")
        super().__init__({
            "rx": In(stream.Signature(RequestWord, always_ready=True)),
            "verdict": In(Verdict),
            "step": In(Step),
            "is_arp": In(1),
            "peer": Out(Peer),
            "header": Out(IpRequest),
            "header_only": In(1),
            "reply_total": Out(16),
            "arp_words": In(ArpWords),
            "echo_words": In(TransportWords),
            "ctrl_words": In(TransportWords),
            "read": Out(BufferRead),
            "o": Out(stream.Signature(MacBeat)),
        })

    def elaborate(self, platform):
        m = Module()
        self._request(m)
        reply = self._send(m)
        self._words(m, reply)
        return m

    def _request(self, m):
        """The requester, and the IPv4 header's fields, as the request's words pass."""
        rx, verdict, is_arp = self.rx, self.verdict, self.is_arp
        ip = self.ip.to_bytes(4, "big")
        w = rx.p.data
        half = halves(w)
        peer_mac = Signal(48)
        peer_ip = [Signal(16, name="peer_ip_high"), Signal(16, name="peer_ip_low")]
        m.d.comb += [self.peer.mac.eq(peer_mac), self.peer.ip_high.eq(peer_ip[0]),
                     self.peer.ip_low.eq(peer_ip[1])]
        protocol = Signal(8)
        to_board_ip = Signal()
        with m.If(rx.valid):
            with m.Switch(rx.p.index):
                with m.Case(1):
                    m.d.sync += peer_mac[:16].eq(half[1])
                with m.Case(2):
                    m.d.sync += peer_mac[16:].eq(w)
                with m.Case(5):
                    m.d.sync += protocol.eq(w[24:])
                    # the ARP sender's MAC sits where the Ethernet source sat, a word on
                    with m.If(is_arp):
                        m.d.sync += peer_mac[:16].eq(half[1])
                with m.Case(6):
                    with m.If(is_arp):
                        m.d.sync += peer_mac[16:].eq(w)
                    with m.Else():
                        m.d.sync += peer_ip[0].eq(half[1])
                with m.Case(7):
                    with m.If(is_arp):
                        m.d.sync += [peer_ip[0].eq(half[0]), peer_ip[1].eq(half[1])]
                    with m.Else():
                        m.d.sync += [peer_ip[1].eq(half[0]),
                                     to_board_ip.eq(half[1] == lanes(ip[:2]))]
                with m.Case(8):
                    m.d.sync += to_board_ip.eq(to_board_ip & (half[0] == lanes(ip[2:])))

        # an IPv4 packet for the board's address, whole in its frame, long enough for a
        # UDP header (the golden model's order: no answer otherwise)
        ip_total = verdict.ip_total
        for_board_ip = Signal()
        m.d.comb += for_board_ip.eq(verdict.ipv4_ok & to_board_ip
                                    & (ip_total >= IP_HEADER + UDP_HEADER)
                                    & (ip_total + ETH_HEADER <= verdict.length))
        header = self.header
        m.d.comb += [header.arp.eq(is_arp), header.for_board.eq(for_board_ip),
                     header.protocol.eq(protocol), header.total.eq(ip_total),
                     header.udp_ok.eq(verdict.udp_ok)]

    def _send(self, m):
        """The reply's kind and length, its IPv4 header checksum, and the reply's words read
        out of the buffer, one every two clocks."""
        o, read, step = self.o, self.read, self.step
        ip = self.ip.to_bytes(4, "big")
        protocol = self.header.protocol
        kind_arp = Signal()
        kind_icmp = Signal()
        reply_total = self.reply_total
        ip_checksum = Signal(16)
        reply_words = Signal(range(BUFFER_WORDS + 1))
        reply_last_be = Signal(BEAT_BYTES)
        base = 0x4500 + (REPLY_TTL << 8) + int.from_bytes(ip[:2], "big") \
            + int.from_bytes(ip[2:], "big")
        out_word = Signal(range(BUFFER_WORDS + 1))
        with m.Switch(step):
            with m.Case(Step.DECIDE):
                m.d.sync += [kind_arp.eq(self.is_arp), kind_icmp.eq(protocol == IP_PROTO_ICMP),
                             out_word.eq(0)]
                with m.If(self.header_only):
                    m.d.sync += reply_total.eq(HEADER_ONLY_TOTAL)
                with m.Else():
                    m.d.sync += reply_total.eq(self.header.total)
            with m.Case(Step.LENGTH):
                # reply bytes: ARP 42, IP replies 14 + their total length
                peer_sum = be16(self.peer.ip_high) + be16(self.peer.ip_low)
                reply_bytes = Mux(kind_arp, ETH_HEADER + ARP_BYTES, ETH_HEADER + reply_total)
                m.d.sync += [
                    ip_checksum.eq(~ones_sum16(base + Mux(kind_icmp, IP_PROTO_ICMP, IP_PROTO_UDP)
                                               + reply_total + peer_sum)),
                    reply_words.eq((reply_bytes + BEAT_BYTES - 1) >> 2),
                    reply_last_be.eq(Const(1, BEAT_BYTES) << (reply_bytes[:2] - 1)[:2]),
                ]
            # A reply word every two clocks: the buffer's word is read, then sent with the
            # reply's own fields in place of the request's.
            with m.Case(Step.FETCH):
                m.d.comb += read.addr.eq(out_word)
            with m.Case(Step.SEND):
                m.d.comb += [read.addr.eq(out_word), o.valid.eq(1)]
                with m.If(o.ready):
                    m.d.sync += out_word.eq(out_word + 1)
        last = out_word == reply_words - 1
        m.d.comb += [o.p.last.eq(last), o.p.last_be.eq(Mux(last, reply_last_be, 0)),
                     o.p.error.eq(0)]
        return _Reply(kind_arp=kind_arp, kind_icmp=kind_icmp, ip_checksum=ip_checksum,
                      out_word=out_word)

    def _words(self, m, reply):
        """The reply's words: its own headers and the answering responder's words in place
        of the request's first words, the request's own words after them."""
        mac = self.mac.to_bytes(6, "big")
        ip = self.ip.to_bytes(4, "big")
        peer, reply_total = self.peer, self.reply_total
        request = self.read.data
        mac_lanes = lanes(mac)
        ip_lanes = lanes(ip)
        ethernet_words = {
            0: peer.mac[:32],
            1: Cat(peer.mac[32:], Const(mac_lanes & 0xFFFF, 16)),
            2: Const(mac_lanes >> 16, 32),
        }
        echo, ctrl = self.echo_words, self.ctrl_words
        kind_arp, kind_icmp = reply.kind_arp, reply.kind_icmp
        ip_words = {
            3: Const(lanes(b"\x08\x00\x45\x00"), 32),
            4: Cat(be16(reply_total), Const(0, 16)),
            5: Cat(Const(0, 16), Const(REPLY_TTL, 8), Mux(kind_icmp, IP_PROTO_ICMP, IP_PROTO_UDP)),
            6: Cat(be16(reply.ip_checksum), Const(ip_lanes & 0xFFFF, 16)),
            7: Cat(Const(ip_lanes >> 16, 16), peer.ip_high),
            8: Cat(peer.ip_low, Mux(kind_icmp, echo.port, ctrl.port)),
            **{9 + k: Mux(kind_icmp, echo.words[k], ctrl.words[k]) for k in range(3)},
        }
        assert len(ethernet_words) + len(ip_words) == _IP_WORDS
        data_out = Signal(8 * BEAT_BYTES)
        m.d.comb += data_out.eq(request)
        with m.Switch(reply.out_word):
            for n in range(_IP_WORDS):
                with m.Case(n):
                    if n in ethernet_words:
                        m.d.comb += data_out.eq(ethernet_words[n])
                    elif n in ARP_WORDS:
                        m.d.comb += data_out.eq(Mux(kind_arp, self.arp_words[n - ARP_WORDS.start],
                                                    ip_words[n]))
                    else:
                        m.d.comb += data_out.eq(ip_words[n])
        m.d.comb += self.o.p.data.eq(data_out)
