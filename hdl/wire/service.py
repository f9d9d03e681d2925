"""The board's own service on the host side of the NIC in the wire (``network.md`` section 6).

The board keeps a MAC and an IPv4 address on port 0, and answers three kinds of frame there,
as the golden model does (``host/board/wire_golden.py``, ``GoldenWire._answer``):

- **ARP**: a request (Ethernet/IPv4, op 1) for the board's IP, to its MAC or broadcast:
  the reply to the request's sender;
- **ICMP echo**: a request to the board's IP with at most 128 bytes of data (LiteEth's
  limit, kept so that the wire answers as the network top does): the reply with the same
  identifier, sequence and data, its checksum adjusted for the new type;
- **CTRL** (section 4) to the control port with the bitstream's key: the registers of
  ``contract.registers.WIRE_REGISTERS`` in region ``wire`` of the ``CTRL`` address space,
  read on :attr:`BoardService.bus` (every register is a counter: a write is read back and
  changes nothing; other addresses read 0). A request with a wrong key, or shorter than a
  header, gets no answer; a malformed one the header alone with ``RESULT`` and ``ERROR``.

IP replies are as LiteEth sends them: identification 0, no flags, TTL 128, UDP checksum 0.
Everything else the :class:`~hdl.wire.path.WirePath` hands over (``FOR_BOARD``) goes
unanswered and is counted (``drop_unanswered``).

The service takes one frame at a time, whole, into a block RAM of :data:`BUFFER_WORDS`
32-bit words (longer frames are taken, their words past the buffer dropped: no request the
service answers is that long), works the request in place (a ``CTRL`` read's value is written
over the request's, so the reply is the request's own words with new headers), and sends
the reply at a word every two clocks, the host port's line rate.
"""
from amaranth import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from contract.frames import (ARP_BYTES, ETH_HEADER, IP_HEADER, IP_PROTO_ICMP, IP_PROTO_UDP,
                             PAYLOAD_OFFSET, UDP_HEADER)
from contract.header import MAGIC, VERSION, Flags
from contract.network import (CTRL_KEY_BYTES, CTRL_MAX_PAIRS, CTRL_TYPE, DEFAULT_IP,
                              DEFAULT_MAC, NETWORK_REGIONS, PORT_BASE, SERVICE_OFFSETS, CtrlOp,
                              Service)
from hdl.ctrl_port import RegisterPort
from hdl.wire.classify import (BEAT_BYTES, MacBeat, Verdict, address_value, be16, lanes,
                               ones_sum16)

__all__ = ["BoardWord", "ServiceEvents", "BoardService", "BUFFER_WORDS", "ICMP_MAX_DATA"]

#: One word of a frame for the board, with the classifier's verdict on the frame (the same
#: on every word of it).
BoardWord = data.StructLayout({
    "data": unsigned(8 * BEAT_BYTES),
    "last": unsigned(1),
    "verdict": Verdict,
})

#: Counter strobes of the host port (``WIRE_COUNTERS`` names), one cycle per frame:
#: ``answered`` and ``frames_out`` once a reply has gone out, ``drop_unanswered`` for a
#: frame the service does not answer.
ServiceEvents = data.StructLayout({"answered": 1, "drop_unanswered": 1, "frames_out": 1})

#: The request buffer: 1024 bytes, more than the longest request answered (a ``CTRL``
#: request of 64 pairs: a 586-byte frame).
BUFFER_WORDS = 256
#: LiteEth answers pings with at most this much ICMP data (its ``icmp_fifo_depth``)
ICMP_MAX_DATA = 128

_CTRL_PORT = PORT_BASE + SERVICE_OFFSETS[Service.CTRL]
_WIRE_REGION = next(r.index for r in NETWORK_REGIONS if r.name == "wire")
_REPLY_TTL = 128
_ICMP_ECHO_REQUEST = 8
#: frame byte -> (word, lane); the CTRL header's fields (payload byte p at frame byte 42 + p)
_PAYLOAD = PAYLOAD_OFFSET
_PAIR_WORD = (_PAYLOAD + 32) // BEAT_BYTES        # the first pair starts in its upper half
assert (_PAYLOAD + 32) % BEAT_BYTES == 2


class BoardService(wiring.Component):
    """Answers ARP, ping and ``CTRL`` for the board's own address, one frame at a time.

    Parameters
    ----------
    key : int
        The 64-bit control key, a constant of the bitstream.
    mac : str or int
        The board's MAC address.
    ip : str or int
        The board's IPv4 address.

    Members
    -------
    i : In(stream.Signature(BoardWord, always_ready=True))
        Frames for the board (``FOR_BOARD``), a word a clock at most; a frame's first word
        may come only while ``free`` is high (the rest follow whenever they come).
    free : Out(1)
        The service can take a frame.
    o : Out(stream.Signature(MacBeat))
        Replies to the host-side MAC: ``last_be`` one-hot on the last word, ``error`` 0, no
        Ethernet padding (the MAC pads).
    bus : Out(RegisterPort(writable=False))
        The wire's registers (``WIRE_REGISTERS``' local addresses), for ``CTRL`` reads.
    events : Out(ServiceEvents)
    """

    def __init__(self, *, key, mac=DEFAULT_MAC, ip=DEFAULT_IP):
        self._key = self.check_key(key)
        self.mac = address_value(mac, 48, "mac")
        self.ip = address_value(ip, 32, "ip")
        super().__init__({
            "i": In(stream.Signature(BoardWord, always_ready=True)),
            "free": Out(1),
            "o": Out(stream.Signature(MacBeat)),
            "bus": Out(RegisterPort(writable=False)),
            "events": Out(ServiceEvents),
        })

    @staticmethod
    def check_key(key):
        """``key`` if it is a control key (a 64-bit integer), else ``ValueError``."""
        if isinstance(key, bool) or not isinstance(key, int) \
                or not 0 <= key < 1 << (8 * CTRL_KEY_BYTES):
            raise ValueError(f"The control key must be a {8 * CTRL_KEY_BYTES}-bit integer")
        return key

    def __repr__(self):
        return "BoardService(key=<secret>)"     # the key never goes into logs

    def elaborate(self, platform):
        m = Module()
        i, o, bus, events = self.i, self.o, self.bus, self.events
        mac = self.mac.to_bytes(6, "big")
        ip = self.ip.to_bytes(4, "big")
        m.d.sync += events.eq(0)

        m.submodules.buffer = buffer = Memory(shape=8 * BEAT_BYTES, depth=BUFFER_WORDS,
                                              init=[])
        buffer_w = buffer.write_port(granularity=16)
        buffer_r = buffer.read_port()

        # -- receive: the frame into the buffer, its fields as they pass ------------------
        word = Signal(range(BUFFER_WORDS + 1))     # the frame word arriving; saturates
        verdict = Signal(Verdict)
        w = i.p.data
        half = [w[:16], w[16:]]
        m.d.comb += [buffer_w.addr.eq(word), buffer_w.data.eq(w)]

        dst_board, dst_broadcast = Signal(), Signal()
        is_arp, arp_request, arp_target = Signal(), Signal(), Signal()
        protocol = Signal(8)
        to_board_ip = Signal()
        echo_request = Signal()
        to_ctrl_port = Signal()
        # What the reply is sent to: the request's source (ARP: its sender) MAC, IP (each
        # half as the lanes carry it) and UDP port
        peer_mac = Signal(48)
        peer_ip = [Signal(16, name="peer_ip_high"), Signal(16, name="peer_ip_low")]
        peer_port = Signal(16)
        icmp_checksum = Signal(16)
        ctrl_fields_ok = Signal()
        ctrl_count = Signal(32)
        key_lanes = Signal(64)

        with m.If(i.valid):
            m.d.comb += buffer_w.en.eq(Mux(word < BUFFER_WORDS, 0b11, 0))
            m.d.sync += word.eq(Mux(i.p.last, 0, Mux(word < BUFFER_WORDS, word + 1, word)))
            with m.Switch(word):
                with m.Case(0):
                    m.d.sync += [verdict.eq(i.p.verdict),
                                 dst_board.eq(w == lanes(mac[:4])),
                                 dst_broadcast.eq(w == 0xFFFF_FFFF)]
                with m.Case(1):
                    m.d.sync += [dst_board.eq(dst_board & (half[0] == lanes(mac[4:]))),
                                 dst_broadcast.eq(dst_broadcast & (half[0] == 0xFFFF)),
                                 peer_mac[:16].eq(half[1])]
                with m.Case(2):
                    m.d.sync += peer_mac[16:].eq(w)
                with m.Case(3):
                    m.d.sync += [is_arp.eq(half[0] == lanes(b"\x08\x06")),
                                 arp_request.eq(half[1] == lanes(b"\x00\x01"))]
                with m.Case(4):
                    m.d.sync += arp_request.eq(arp_request & (w == lanes(b"\x08\x00\x06\x04")))
                with m.Case(5):
                    m.d.sync += [arp_request.eq(arp_request & (half[0] == lanes(b"\x00\x01"))),
                                 protocol.eq(w[24:])]
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
                    m.d.sync += [to_board_ip.eq(to_board_ip & (half[0] == lanes(ip[2:]))),
                                 echo_request.eq(half[1] == _ICMP_ECHO_REQUEST),
                                 peer_port.eq(half[1])]
                with m.Case(9):
                    m.d.sync += [icmp_checksum.eq(be16(half[0])),
                                 to_ctrl_port.eq(half[0] == lanes(_CTRL_PORT.to_bytes(2, "big"))),
                                 arp_target.eq(half[1] == lanes(ip[:2]))]
                with m.Case(10):
                    m.d.sync += [arp_target.eq(arp_target & (half[0] == lanes(ip[2:]))),
                                 ctrl_fields_ok.eq(half[1] == lanes(bytes((MAGIC, VERSION))))]
                with m.Case(11):
                    m.d.sync += ctrl_fields_ok.eq(
                        ctrl_fields_ok & (w[:8] == CTRL_TYPE)
                        & ((w[16:24] == CtrlOp.READ) | (w[16:24] == CtrlOp.WRITE)))
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

        # -- what the frame is ------------------------------------------------------------
        ip_total = verdict.ip_total
        # an IPv4 packet for the board's address, whole in its frame, long enough for a
        # UDP header (the golden model's order: no answer otherwise)
        for_board_ip = Signal()
        m.d.comb += for_board_ip.eq(verdict.ipv4_ok & to_board_ip
                                    & (ip_total >= IP_HEADER + UDP_HEADER)
                                    & (ip_total + ETH_HEADER <= verdict.length))
        answer_arp, answer_ping, answer_ctrl = Signal(), Signal(), Signal()
        m.d.comb += [
            answer_arp.eq(is_arp & (dst_board | dst_broadcast) & arp_request & arp_target),
            answer_ping.eq(~is_arp & for_board_ip & (protocol == IP_PROTO_ICMP) & echo_request
                           & (ip_total <= IP_HEADER + 8 + ICMP_MAX_DATA)),
            # the request's payload (total - 28 bytes) holds a whole header, and the key
            answer_ctrl.eq(~is_arp & for_board_ip & (protocol == IP_PROTO_UDP) & verdict.udp_ok
                           & to_ctrl_port & (ip_total >= _PAYLOAD - ETH_HEADER + 32)
                           & (key_lanes == Const(self._key, 64))),
        ]
        # a CTRL request is carried out when its fields and its length agree, else refused
        ctrl_ok = Signal()
        m.d.comb += ctrl_ok.eq(ctrl_fields_ok & (ctrl_count >= 1) & (ctrl_count <= CTRL_MAX_PAIRS)
                               & (ip_total == _PAYLOAD - ETH_HEADER + 32 + 8 * ctrl_count[:7]))

        # -- the reply's variable fields --------------------------------------------------
        kind_arp, kind_icmp = Signal(), Signal()
        refused = Signal()
        reply_total = Signal(16)        # its IPv4 total length
        ip_checksum = Signal(16)
        new_icmp_checksum = Signal(16)
        reply_words = Signal(range(BUFFER_WORDS + 1))
        reply_last_be = Signal(BEAT_BYTES)
        base = 0x4500 + (_REPLY_TTL << 8) + int.from_bytes(ip[:2], "big") \
            + int.from_bytes(ip[2:], "big")
        m.d.comb += new_icmp_checksum.eq(icmp_checksum + 0x0800
                                         + (icmp_checksum >= 0xF800))

        pairs_left = Signal(range(CTRL_MAX_PAIRS + 1))
        pair_word = Signal(range(BUFFER_WORDS))     # the pair's first word (address low half)
        address = Signal(32)
        value = Signal(32)
        in_region = Signal()
        out_word = Signal(range(BUFFER_WORDS + 1))

        m.d.comb += self.free.eq(0)
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.free.eq(1)
                with m.If(i.valid):
                    m.next = "RECEIVE"
                    with m.If(i.p.last):
                        m.next = "DECIDE"
            with m.State("RECEIVE"):
                with m.If(i.valid & i.p.last):
                    m.next = "DECIDE"
            with m.State("DECIDE"):
                m.d.sync += [kind_arp.eq(is_arp), kind_icmp.eq(protocol == IP_PROTO_ICMP),
                             refused.eq(~ctrl_ok), pairs_left.eq(ctrl_count[:7]),
                             pair_word.eq(_PAIR_WORD), out_word.eq(0)]
                with m.If(answer_ctrl & ~ctrl_ok):
                    # the header alone: 32 payload bytes
                    m.d.sync += reply_total.eq(_PAYLOAD - ETH_HEADER + 32)
                with m.Else():
                    m.d.sync += reply_total.eq(ip_total)
                with m.If(answer_arp):
                    m.next = "LENGTH"
                with m.Elif(answer_ping):
                    m.next = "LENGTH"
                with m.Elif(answer_ctrl & ctrl_ok):
                    m.next = "PAIR_ADDRESS_LOW"
                with m.Elif(answer_ctrl):
                    m.next = "LENGTH"
                with m.Else():
                    m.d.sync += events.drop_unanswered.eq(1)
                    m.next = "IDLE"

            # A pair: its address's halves from two words, the register read, its value's
            # halves written over the request's (the buffer's upper half of one word and
            # the lower half of the next).
            with m.State("PAIR_ADDRESS_LOW"):
                m.d.comb += buffer_r.addr.eq(pair_word)
                m.next = "PAIR_ADDRESS_HIGH"
            with m.State("PAIR_ADDRESS_HIGH"):
                m.d.comb += buffer_r.addr.eq(pair_word + 1)
                m.d.sync += address[:16].eq(buffer_r.data[16:])
                m.next = "PAIR_REGION"
            with m.State("PAIR_REGION"):
                # (registered: the register multiplexers behind the bus start from flip-flops,
                # not from the block RAM's output)
                m.d.sync += in_region.eq(buffer_r.data[:16] == _WIRE_REGION)
                m.next = "PAIR_READ"
            with m.State("PAIR_READ"):
                m.d.comb += [bus.addr.eq(address[:16]), bus.re.eq(in_region)]
                m.next = "PAIR_VALUE_LOW"
            with m.State("PAIR_VALUE_LOW"):
                m.d.sync += value.eq(Mux(in_region, bus.rdata, 0))
                m.d.comb += [buffer_w.addr.eq(pair_word + 1),
                             buffer_w.data.eq(Cat(Const(0, 16), Mux(in_region, bus.rdata[:16], 0))),
                             buffer_w.en.eq(0b10)]
                m.next = "PAIR_VALUE_HIGH"
            with m.State("PAIR_VALUE_HIGH"):
                m.d.comb += [buffer_w.addr.eq(pair_word + 2), buffer_w.data.eq(value[16:]),
                             buffer_w.en.eq(0b01)]
                m.d.sync += [pairs_left.eq(pairs_left - 1), pair_word.eq(pair_word + 2)]
                with m.If(pairs_left == 1):
                    m.next = "LENGTH"
                with m.Else():
                    m.next = "PAIR_ADDRESS_LOW"

            with m.State("LENGTH"):
                # reply bytes: ARP 42, IP replies 14 + their total length
                peer_sum = be16(peer_ip[0]) + be16(peer_ip[1])
                reply_bytes = Mux(kind_arp, ETH_HEADER + ARP_BYTES, ETH_HEADER + reply_total)
                m.d.sync += [
                    ip_checksum.eq(~ones_sum16(base + Mux(kind_icmp, IP_PROTO_ICMP, IP_PROTO_UDP)
                                               + reply_total + peer_sum)),
                    reply_words.eq((reply_bytes + BEAT_BYTES - 1) >> 2),
                    reply_last_be.eq(Const(1, BEAT_BYTES) << (reply_bytes[:2] - 1)[:2]),
                ]
                m.next = "FETCH"
            # A reply word every two clocks: the buffer's word is read, then sent with the
            # reply's own fields in place of the request's.
            with m.State("FETCH"):
                m.d.comb += buffer_r.addr.eq(out_word)
                m.next = "SEND"
            with m.State("SEND"):
                m.d.comb += [buffer_r.addr.eq(out_word), o.valid.eq(1)]
                with m.If(o.ready):
                    m.d.sync += out_word.eq(out_word + 1)
                    m.next = "FETCH"
                    with m.If(o.p.last):
                        m.d.sync += [events.answered.eq(1), events.frames_out.eq(1)]
                        m.next = "IDLE"

        # -- the reply's words --------------------------------------------------------------
        udp_length = Signal(16)
        m.d.comb += udp_length.eq(reply_total - IP_HEADER)
        flags = Mux(refused, Flags.RESULT | Flags.ERROR, Flags.RESULT)
        request = buffer_r.data
        mac_lanes = lanes(mac)
        ip_lanes = lanes(ip)
        arp_words = {
            0: peer_mac[:32],
            1: Cat(peer_mac[32:], Const(mac_lanes & 0xFFFF, 16)),
            2: Const(mac_lanes >> 16, 32),
            3: Const(lanes(b"\x08\x06\x00\x01"), 32),
            4: Const(lanes(b"\x08\x00\x06\x04"), 32),
            5: Const(lanes(b"\x00\x02" + mac[:2]), 32),
            6: Const(lanes(mac[2:]), 32),
            7: Const(ip_lanes, 32),
            8: peer_mac[:32],
            9: Cat(peer_mac[32:], peer_ip[0]),
            10: Cat(peer_ip[1], Const(0, 16)),
        }
        ip_words = {
            0: peer_mac[:32],
            1: Cat(peer_mac[32:], Const(mac_lanes & 0xFFFF, 16)),
            2: Const(mac_lanes >> 16, 32),
            3: Const(lanes(b"\x08\x00\x45\x00"), 32),
            4: Cat(be16(reply_total), Const(0, 16)),
            5: Cat(Const(0, 16), Const(_REPLY_TTL, 8), Mux(kind_icmp, IP_PROTO_ICMP, IP_PROTO_UDP)),
            6: Cat(be16(ip_checksum), Const(ip_lanes & 0xFFFF, 16)),
            7: Cat(Const(ip_lanes >> 16, 16), peer_ip[0]),
            8: Cat(peer_ip[1], Mux(kind_icmp, 0, be16(Const(_CTRL_PORT, 16)))),
            9: Mux(kind_icmp, Cat(be16(new_icmp_checksum), request[16:]),
                   Cat(peer_port, be16(udp_length))),
            10: Mux(kind_icmp, request, Cat(Const(0, 16), request[16:])),
            11: Mux(kind_icmp, request, request | (flags << 8)),
        }
        data_out = Signal(8 * BEAT_BYTES)
        m.d.comb += data_out.eq(request)
        with m.Switch(out_word):
            for n in range(12):
                with m.Case(n):
                    if n in arp_words:
                        m.d.comb += data_out.eq(Mux(kind_arp, arp_words[n], ip_words[n]))
                    else:
                        m.d.comb += data_out.eq(ip_words[n])
        last = out_word == reply_words - 1
        m.d.comb += [o.p.data.eq(data_out), o.p.last.eq(last),
                     o.p.last_be.eq(Mux(last, reply_last_be, 0)), o.p.error.eq(0)]
        return m
