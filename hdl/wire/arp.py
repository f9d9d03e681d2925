"""The board service's ARP responder (``network.md`` section 6; ``GoldenWire._answer``).

It answers a request (Ethernet/IPv4, op 1) for the board's IP address, sent to the board's
MAC or broadcast, with the reply to the request's sender: the board's MAC for its IP. It
reads the request's fields off the frame buffer's words as they pass
(:class:`hdl.wire.request.RequestBuffer`'s ``rx``), and gives the
:class:`hdl.wire.reply.ReplyMux` the words of its reply after the Ethernet addresses.
"""
from amaranth import Cat, Const, Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from contract.network import DEFAULT_IP, DEFAULT_MAC
from hdl.wire.classify import BEAT_BYTES, address_value, lanes
from hdl.wire.request import Peer, RequestWord, halves

__all__ = ["ARP_WORDS", "ArpWords", "ArpResponder"]

#: The reply's words 3..10 (after the Ethernet addresses; an ARP frame is 42 bytes, the
#: MAC pads it)
ARP_WORDS = range(3, 11)
ArpWords = data.ArrayLayout(8 * BEAT_BYTES, len(ARP_WORDS))


class ArpResponder(wiring.Component):
    """Answers an ARP request for the board's IP address.

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
    is_arp : Out(1)
        The frame is ARP (its EtherType), from word 3 on.
    answer : Out(1)
        The frame is a request it answers (valid once the frame is in).
    peer : In(Peer)
        The requester (the reply multiplexer catches it).
    words : Out(ArpWords)
        The reply's words :data:`ARP_WORDS`.
    """

    def __init__(self, *, mac=DEFAULT_MAC, ip=DEFAULT_IP):
        self.mac = address_value(mac, 48, "mac")
        self.ip = address_value(ip, 32, "ip")
        super().__init__({
            "rx": In(stream.Signature(RequestWord, always_ready=True)),
            "is_arp": Out(1),
            "answer": Out(1),
            "peer": In(Peer),
            "words": Out(ArpWords),
        })

    def elaborate(self, platform):
        m = Module()
        rx, peer = self.rx, self.peer
        mac = self.mac.to_bytes(6, "big")
        ip = self.ip.to_bytes(4, "big")
        w = rx.p.data
        half = halves(w)

        # What makes it a request for the board: Ethernet to the board or broadcast, ARP for
        # Ethernet/IPv4, op 1, the target the board's IP; each checked as its word passes.
        dst_board = Signal()
        dst_broadcast = Signal()
        is_arp = self.is_arp
        arp_request = Signal()
        arp_target = Signal()
        with m.If(rx.valid):
            with m.Switch(rx.p.index):
                with m.Case(0):
                    m.d.sync += [dst_board.eq(w == lanes(mac[:4])),
                                 dst_broadcast.eq(w == 0xFFFF_FFFF)]
                with m.Case(1):
                    m.d.sync += [dst_board.eq(dst_board & (half[0] == lanes(mac[4:]))),
                                 dst_broadcast.eq(dst_broadcast & (half[0] == 0xFFFF))]
                with m.Case(3):
                    m.d.sync += [is_arp.eq(half[0] == lanes(b"\x08\x06")),
                                 arp_request.eq(half[1] == lanes(b"\x00\x01"))]
                with m.Case(4):
                    m.d.sync += arp_request.eq(arp_request & (w == lanes(b"\x08\x00\x06\x04")))
                with m.Case(5):
                    m.d.sync += arp_request.eq(arp_request & (half[0] == lanes(b"\x00\x01")))
                with m.Case(9):
                    m.d.sync += arp_target.eq(half[1] == lanes(ip[:2]))
                with m.Case(10):
                    m.d.sync += arp_target.eq(arp_target & (half[0] == lanes(ip[2:])))
        m.d.comb += self.answer.eq(is_arp & (dst_board | dst_broadcast) & arp_request
                                   & arp_target)

        # The reply: op 2, the board's MAC and IP as the sender, the requester as the target.
        words = {
            3: Const(lanes(b"\x08\x06\x00\x01"), 32),
            4: Const(lanes(b"\x08\x00\x06\x04"), 32),
            5: Const(lanes(b"\x00\x02" + mac[:2]), 32),
            6: Const(lanes(mac[2:]), 32),
            7: Const(lanes(ip), 32),
            8: peer.mac[:32],
            9: Cat(peer.mac[32:], peer.ip_high),
            10: Cat(peer.ip_low, Const(0, 16)),
        }
        for k, n in enumerate(ARP_WORDS):
            m.d.comb += self.words[k].eq(words[n])
        return m
