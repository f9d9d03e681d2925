"""The frame classifier of the NIC in the wire (``docs/protocol/network.md`` section 6).

:class:`FrameClassifier` watches the frames one port of the wire receives, as they leave
that port's LiteEth MAC, and at the end of each frame says what the wire does with it
(:class:`FrameClass`): forward it unchanged, hand it to the board (host side), send its UDP
payload through a NIC path (a gradient datagram), or drop it for one of the
``contract.counters.WIRE_DROP_CAUSES`` a frame's bytes alone decide. It stores nothing of
the frame: whatever keeps the frame (a packet buffer beside it) acts on the verdict.

The decisions and their order are those of the golden model
(``host/board/wire_golden.py``, ``GoldenWire._one``), the reference its tests compare with:

1. ``DROP_FCS`` (the MAC's ``error``, on any beat), ``DROP_RUNT`` (< 60 bytes without the
   FCS, 64 with), ``DROP_OVERSIZE`` (> 9014 bytes without the FCS, 9018 with);
2. for the board: a frame to the board's MAC, or ARP (any ARP frame) whose target IP is the
   board's. Host side ``FOR_BOARD`` (the board answers or drops it: not the classifier's
   call), network side ``DROP_BOARD_ADDRESS``;
3. a gradient datagram: IPv4 (EtherType 0x0800 right after the MAC addresses: untagged),
   version 4 with a 20-byte header, a valid header checksum, not a fragment (neither MF nor
   an offset; DF is fine), UDP to the gradient port. Then ``DROP_UDP_LENGTH`` when the UDP
   length is not the IPv4 payload's (total length - 20, at least 8) or the IPv4 packet is
   longer than the frame; ``DROP_UDP_CHECKSUM`` when the UDP checksum is not zero and the
   ones' complement sum of the pseudo-header and the datagram is not 0xFFFF; otherwise
   ``GRADIENT`` (the NIC path decides the rest: malformed, incompressible, passed);
4. ``PASS`` for everything else.

Bytes after the IPv4 packet (Ethernet padding) are part of the frame but not of the
datagram: they count in the frame's length, never in the UDP checksum.
"""
import dataclasses

from amaranth import Cat, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.wiring import In, Out

from contract.frames import (ETH_HEADER, ETHERTYPE_ARP, ETHERTYPE_IPV4, FCS_BYTES, IP_HEADER,
                             IP_PROTO_UDP, MAX_BODY_BYTES, MIN_BODY_BYTES, PAYLOAD_OFFSET,
                             UDP_HEADER)
from contract.network import (DEFAULT_IP, DEFAULT_MAC, PORT_BASE, SERVICE_OFFSETS,
                              WIRE_GRADIENT_PORT, Service, ip_to_int, mac_to_int)
from hdl.wire.mac import BEAT_BYTES, MacBeat     # (the frames come from there)

__all__ = ["BEAT_BYTES", "FCS_BYTES", "MIN_BODY_BYTES", "MAX_BODY_BYTES", "PAYLOAD_OFFSET",
           "LENGTH_BITS", "DIRECTIONS", "MacBeat", "FrameClass", "Verdict", "FrameClassifier",
           "ones_sum16", "lanes", "be16", "address_value"]

# The frame's sizes and offsets are contract.frames' (FCS_BYTES, MIN_BODY_BYTES and
# MAX_BODY_BYTES: frame lengths as the classifier sees them, the MAC having stripped the FCS;
# PAYLOAD_OFFSET: where a gradient datagram's UDP payload starts in its frame: the classifier
# accepts only untagged frames and 20-byte IPv4 headers, so this is the same for every one).
#: frame lengths in a verdict; they saturate at 2^14 (such frames are all oversize)
LENGTH_BITS = 15
_LENGTH_LIMIT = 1 << (LENGTH_BITS - 1)
#: the beat counter saturates here: far beyond the longest frame the wire accepts
_MAX_BEAT = _LENGTH_LIMIT // BEAT_BYTES - 1
#: ``direction`` -> the port its frames arrive on: ``tx`` from the host (port 0, on their
#: way through the NIC transmit path), ``rx`` from the network (port 1, the receive path)
DIRECTIONS = {"tx": 0, "rx": 1}
#: the largest UDP checksum sum a frame the wire accepts can reach: every 16-bit word of the
#: longest frame, plus the pseudo-header's protocol and UDP length
_UDP_SUM_BITS = ((MAX_BODY_BYTES // 2 + 2) * 0xFFFF).bit_length()


class FrameClass(enum.Enum, shape=4):
    """What the wire does with a frame. A ``DROP_*`` member's name, in lower case, is its
    counter in ``contract.counters.WIRE_COUNTERS``."""
    PASS = 0                # to the other port, byte for byte
    FOR_BOARD = 1           # host side: the board's own (answered or drop_unanswered)
    GRADIENT = 2            # UDP payload through the NIC path of the frame's direction
    DROP_FCS = 3
    DROP_RUNT = 4
    DROP_OVERSIZE = 5
    DROP_BOARD_ADDRESS = 6  # network side: to the board's MAC, or ARP for its IP
    DROP_UDP_LENGTH = 7
    DROP_UDP_CHECKSUM = 8


#: The classifier's answer for one frame. ``kind`` and ``length`` for every frame; the
#: lengths and sums are meaningful for ``GRADIENT`` only (what the rewrite stage needs);
#: ``ip_total`` and the two ``_ok`` flags for every frame (what the board's service needs).
Verdict = data.StructLayout({
    "kind": FrameClass,
    #: frame bytes without the FCS (Ethernet padding included), saturating at 2^14
    "length": unsigned(LENGTH_BITS),
    #: the IPv4 total length: the datagram ends at byte ``14 + ip_total`` of the frame, and
    #: bytes from there to ``length`` are padding, not part of the NIC packet
    "ip_total": unsigned(16),
    #: UDP payload bytes (the NIC packet), from byte :data:`PAYLOAD_OFFSET` of the frame
    "payload_length": unsigned(16),
    #: the ones' complement sum (folded to 16 bits) of the IPv4 header's words other than the
    #: total length and the header checksum: a rewritten header's checksum is
    #: ``~ones_sum16(ip_sum + new_total)``, with no second pass over the header
    "ip_sum": unsigned(16),
    #: untagged IPv4 the wire may handle: version 4 with a 20-byte header, a valid header
    #: checksum, not a fragment (what a gradient datagram needs before its UDP port; the
    #: board's own service takes only such packets too)
    "ipv4_ok": unsigned(1),
    #: ``ipv4_ok`` and UDP whose length is the IPv4 payload's, within the frame, and whose
    #: checksum is zero or right: a datagram the board's service may take
    "udp_ok": unsigned(1),
})


def ones_sum16(value):
    """The 16-bit ones' complement sum of the 16-bit words of ``value`` (at most 32 bits
    wide): its end-around carries folded back in. Two folds are enough: the first leaves at
    most 0x1FFFE, whose fold is at most 0xFFFF. Zero only for a zero ``value``.

    (A checksum test alone would need one fold: below 2^32, a multiple of 0xFFFF folds to
    0xFFFF at once. The rewrite's ``ip_sum`` needs both.)"""
    if len(value) > 32:
        raise ValueError(f"ones_sum16 folds at most 32 bits, not {len(value)}")
    once = value[:16] + value[16:]
    return (once[:16] + once[16:])[:16]


def _ethertype(value: int) -> int:
    """An EtherType as the value of the two beat lanes that carry it (network order)."""
    return lanes(value.to_bytes(2, "big"))


def lanes(raw: bytes) -> int:
    """``raw`` as the value of the beat lanes that carry it (first byte in bits 0-7)."""
    return int.from_bytes(raw, "little")


def be16(value):
    """A 16-bit value as two beat lanes in network order (its high byte first)."""
    return Cat(value[8:16], value[:8])


def address_value(value, bits, name):
    """The board's MAC (``bits`` 48) or IPv4 address (32) given as a string or an integer,
    as an integer; ``name`` names the parameter in the error."""
    parse, what = {48: (mac_to_int, "a MAC address"), 32: (ip_to_int, "an IPv4 address")}[bits]
    if isinstance(value, str):
        try:
            return parse(value)
        except ValueError as error:
            raise ValueError(f"{name} must be {what}, not {value!r}") from error
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << bits:
        raise ValueError(f"{name} must be {what} (a string or a {bits}-bit integer), "
                         f"not {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class _Fields:
    """The header fields a verdict needs (registers, caught as their beats pass)."""
    to_board_mac: Signal
    ethertype_ipv4: Signal
    ethertype_arp: Signal
    version_ihl_ok: Signal
    ip_total: Signal
    ip_end: Signal           # 14 + total: where the IPv4 packet ends in the frame
    not_fragment: Signal
    proto_udp: Signal
    ip_checksum: Signal
    to_gradient_port: Signal
    udp_length: Signal
    arp_target_board: Signal
    udp_checksum_zero: Signal


@dataclasses.dataclass(frozen=True)
class _End:
    """A frame's end: the clock after its last beat (``ended``), its error and length."""
    ended: Signal
    error: Signal
    length: Signal


class FrameClassifier(wiring.Component):
    """Classifies each frame of one direction of the wire at its end, without storing it.

    The input never stalls: LiteEth's MAC cannot hold a frame back from the wire, so ``i``
    is a stream whose ``ready`` is always 1 (``always_ready``). To watch a stream that does
    stall, feed ``i`` with that stream's ``valid & ready`` and its payload. A 32-bit beat at
    LiteEth's 62.5 MHz carries 2 Gb/s, twice the 1 GbE line rate, so the classifier keeps up
    with back-to-back frames (frames of one beat included).

    The verdict of a frame is valid on ``o`` two cycles after the frame's last beat, one
    per frame, in frame order. ``o`` never waits either (``always_ready``): its consumer
    takes every verdict (a FIFO of verdicts, as deep as the frames its frame buffer holds).

    Parameters
    ----------
    direction : str
        ``"tx"``: frames from the host (port 0); ``"rx"``: frames from the network (port 1).
        Only frames for the board differ: ``FOR_BOARD`` on the host side,
        ``DROP_BOARD_ADDRESS`` on the network side.
    mac : str or int
        The board's MAC address (``"02:47:57:00:00:01"`` or its 48-bit value).
    ip : str or int
        The board's IPv4 address (``"192.168.77.2"`` or its 32-bit value).
    gradient_port : int
        UDP destination port of gradient datagrams, 1..65535, not the control port.

    Members
    -------
    i : In(stream.Signature(MacBeat, always_ready=True))
        The frames, as the MAC delivers them.
    o : Out(stream.Signature(Verdict, always_ready=True))
        One verdict per frame.
    """

    def __init__(self, *, direction, mac=DEFAULT_MAC, ip=DEFAULT_IP,
                 gradient_port=WIRE_GRADIENT_PORT):
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {', '.join(map(repr, DIRECTIONS))}, "
                             f"not {direction!r}")
        ctrl_port = PORT_BASE + SERVICE_OFFSETS[Service.CTRL]
        if isinstance(gradient_port, bool) or not isinstance(gradient_port, int) \
                or not 1 <= gradient_port <= 0xFFFF:
            raise ValueError(f"gradient_port must be a UDP port 1..65535, not {gradient_port!r}")
        if gradient_port == ctrl_port:
            raise ValueError(f"gradient_port {gradient_port} is the control port")
        self.direction = direction
        self.port = DIRECTIONS[direction]
        self.mac = address_value(mac, 48, "mac")
        self.ip = address_value(ip, 32, "ip")
        self.gradient_port = gradient_port
        super().__init__({
            "i": In(stream.Signature(MacBeat, always_ready=True)),
            "o": Out(stream.Signature(Verdict, always_ready=True)),
        })

    def elaborate(self, platform):
        m = Module()
        i = self.i
        byte = [i.p.data[8 * j:8 * j + 8] for j in range(BEAT_BYTES)]
        # the beat's two 16-bit words in network order (bytes 0-1 and 2-3)
        word = [Cat(byte[1], byte[0]), Cat(byte[3], byte[2])]

        # Index of the current beat in its frame. It saturates, so that however long a
        # frame, its fields are never taken from a later beat that wrapped around.
        beat = Signal(range(_MAX_BEAT + 1))
        with m.If(i.valid):
            with m.If(i.p.last):
                m.d.sync += beat.eq(0)
            with m.Elif(beat != _MAX_BEAT):
                m.d.sync += beat.eq(beat + 1)

        fields = self._fields(m, beat, byte, word)
        ip_sum = self._ip_sum(m, beat, word)
        udp_sum = self._udp_sum(m, beat, byte, fields.ip_end)
        end = self._frame_end(m, beat)
        self._decide(m, fields, ip_sum, udp_sum, end)
        return m

    def _fields(self, m, beat, byte, word):
        """The header fields the decision needs, as their beats pass."""
        i = self.i
        mac = self.mac.to_bytes(6, "big")
        ip = self.ip.to_bytes(4, "big")
        # Header fields, each caught at the beat that carries it (byte n: beat n // 4). A
        # frame long enough not to be a runt (15 beats) has them all before its last beat.
        mac_head = Signal()        # bytes 0-3 are the board MAC's
        to_board_mac = Signal()
        ethertype_ipv4, ethertype_arp, version_ihl_ok = Signal(), Signal(), Signal()
        ip_total = Signal(16)
        ip_end = Signal(17)        # 14 + total: where the IPv4 packet ends in the frame
        not_fragment, proto_udp = Signal(), Signal()
        ip_checksum = Signal(16)
        to_gradient_port = Signal()
        udp_length = Signal(16)
        arp_target_head, arp_target_board = Signal(), Signal()
        udp_checksum_zero = Signal()
        with m.If(i.valid):
            with m.Switch(beat):
                with m.Case(0):
                    m.d.sync += mac_head.eq(i.p.data == lanes(mac[0:4]))
                with m.Case(1):
                    m.d.sync += to_board_mac.eq(mac_head & (i.p.data[:16] == lanes(mac[4:6])))
                with m.Case(3):
                    m.d.sync += [
                        ethertype_ipv4.eq(i.p.data[:16] == _ethertype(ETHERTYPE_IPV4)),
                        ethertype_arp.eq(i.p.data[:16] == _ethertype(ETHERTYPE_ARP)),
                        version_ihl_ok.eq(byte[2] == 0x45),
                    ]
                with m.Case(4):
                    m.d.sync += [ip_total.eq(word[0]), ip_end.eq(word[0] + ETH_HEADER)]
                with m.Case(5):
                    m.d.sync += [not_fragment.eq((word[0] & 0x3FFF) == 0),  # (DF is bit 14)
                                 proto_udp.eq(byte[3] == IP_PROTO_UDP)]
                with m.Case(6):
                    m.d.sync += ip_checksum.eq(word[0])
                with m.Case(9):
                    m.d.sync += [to_gradient_port.eq(word[0] == self.gradient_port),
                                 udp_length.eq(word[1]),
                                 arp_target_head.eq(word[1] == int.from_bytes(ip[:2], "big"))]
                with m.Case(10):
                    m.d.sync += [
                        arp_target_board.eq(arp_target_head
                                            & (word[0] == int.from_bytes(ip[2:], "big"))),
                        udp_checksum_zero.eq(word[0] == 0),
                    ]
        return _Fields(to_board_mac=to_board_mac, ethertype_ipv4=ethertype_ipv4,
                       ethertype_arp=ethertype_arp, version_ihl_ok=version_ihl_ok,
                       ip_total=ip_total, ip_end=ip_end, not_fragment=not_fragment,
                       proto_udp=proto_udp, ip_checksum=ip_checksum,
                       to_gradient_port=to_gradient_port, udp_length=udp_length,
                       arp_target_board=arp_target_board, udp_checksum_zero=udp_checksum_zero)

    def _ip_sum(self, m, beat, word):
        """The sum of the IPv4 header's words but the total length and the checksum."""
        i = self.i
        # The IPv4 header's words (bytes 14-33) but the total length and the checksum, so
        # that the rewrite stage can checksum a new total length from this sum alone.
        ip_sum = Signal(19)        # 8 words
        with m.If(i.valid):
            with m.Switch(beat):
                with m.Case(3):
                    m.d.sync += ip_sum.eq(word[1])                  # version .. TOS
                with m.Case(4, 6):
                    m.d.sync += ip_sum.eq(ip_sum + word[1])         # id; source IP's first half
                with m.Case(5, 7):
                    m.d.sync += ip_sum.eq(ip_sum + word[0] + word[1])
                with m.Case(8):
                    m.d.sync += ip_sum.eq(ip_sum + word[0])         # destination IP's end

        return ip_sum

    def _udp_sum(self, m, beat, byte, ip_end):
        """The UDP checksum's sum of the pseudo-header and the datagram, on the fly."""
        i = self.i
        # The UDP checksum's sum, on the fly: the pseudo-header (source and destination IP,
        # protocol, UDP length) and the datagram, bytes 26 up to the IPv4 packet's end.
        # Bytes past that end (padding, or lanes past the last byte) count as zero, which
        # also pads an odd-length datagram with the zero byte RFC 768 asks for. The UDP
        # length is the pseudo-header's and the UDP header's: it counts twice.
        in_packet = Signal(signed(18))     # packet bytes left from this beat's first lane
        m.d.comb += in_packet.eq(ip_end - beat * BEAT_BYTES)
        lane = [Signal(8, name=f"udp_byte{j}") for j in range(BEAT_BYTES)]
        for j in range(BEAT_BYTES):
            m.d.comb += lane[j].eq(byte[j] & (in_packet > j).replicate(8))
        udp_word = [Cat(lane[1], lane[0]), Cat(lane[3], lane[2])]
        udp_sum = Signal(_UDP_SUM_BITS)
        udp_sum_next = Signal(_UDP_SUM_BITS)
        with m.Switch(beat):
            with m.Case(0, 1, 2, 3, 4, 5):
                m.d.comb += udp_sum_next.eq(0)
            with m.Case(6):
                m.d.comb += udp_sum_next.eq(IP_PROTO_UDP + udp_word[1])   # source IP's half
            with m.Case(9):
                m.d.comb += udp_sum_next.eq(udp_sum + udp_word[0] + udp_word[1] * 2)
            with m.Default():
                m.d.comb += udp_sum_next.eq(udp_sum + udp_word[0] + udp_word[1])
        with m.If(i.valid):
            m.d.sync += udp_sum.eq(udp_sum_next)

        return udp_sum

    def _frame_end(self, m, beat):
        """The frame's length and error, at its last beat."""
        i = self.i
        # The last beat: its own byte count and error, then the decision the next cycle.
        # Every register above still holds this frame's fields then: the next frame's
        # first beat, if it comes that very cycle, writes them only at its end.
        last_bytes = Signal(range(BEAT_BYTES + 1))
        m.d.comb += last_bytes.eq(BEAT_BYTES)      # (last_be zero: a whole beat)
        for j in range(BEAT_BYTES):                # highest marked byte wins
            with m.If(i.p.last_be[j]):
                m.d.comb += last_bytes.eq(j + 1)
        ended, error, error_so_far = Signal(), Signal(), Signal()
        beyond = Signal()          # the frame went on past the beat counter's last value
        length = Signal(LENGTH_BITS)
        m.d.sync += ended.eq(i.valid & i.p.last)
        with m.If(i.valid & i.p.last):
            m.d.sync += [error.eq(error_so_far | i.p.error),
                         error_so_far.eq(0),
                         beyond.eq(0),
                         length.eq(Mux(beyond, _LENGTH_LIMIT,
                                       beat * BEAT_BYTES + last_bytes))]
        with m.Elif(i.valid):
            m.d.sync += [error_so_far.eq(error_so_far | i.p.error),
                         beyond.eq(beyond | (beat == _MAX_BEAT))]

        return _End(ended=ended, error=error, length=length)

    def _decide(self, m, f, ip_sum, udp_sum, end):
        """The verdict, the clock after the last beat."""
        o = self.o
        ip_total, ip_checksum, udp_length = f.ip_total, f.ip_checksum, f.udp_length
        ended, error, length = end.ended, end.error, end.length
        header_ok = Signal()
        m.d.comb += header_ok.eq(ones_sum16(ip_sum + ip_total + ip_checksum) == 0xFFFF)
        ipv4_ok = Signal()
        m.d.comb += ipv4_ok.eq(f.ethertype_ipv4 & f.version_ihl_ok & header_ok & f.not_fragment)
        gradient = Signal()
        m.d.comb += gradient.eq(ipv4_ok & f.proto_udp & f.to_gradient_port)
        udp_length_bad = Signal()
        m.d.comb += udp_length_bad.eq((f.ip_end > length) | (udp_length < UDP_HEADER)
                                      | (udp_length + IP_HEADER != ip_total))
        # a valid sum is 0xFFFF ("negative zero"), and the sum is never 0 here: the checksum
        # field in it is not zero
        udp_checksum_bad = Signal()
        m.d.comb += udp_checksum_bad.eq(~f.udp_checksum_zero & (ones_sum16(udp_sum) != 0xFFFF))

        kind = Signal(FrameClass)
        with m.If(error):
            m.d.comb += kind.eq(FrameClass.DROP_FCS)
        with m.Elif(length < MIN_BODY_BYTES):
            m.d.comb += kind.eq(FrameClass.DROP_RUNT)
        with m.Elif(length > MAX_BODY_BYTES):
            m.d.comb += kind.eq(FrameClass.DROP_OVERSIZE)
        with m.Elif(f.to_board_mac | (f.ethertype_arp & f.arp_target_board)):
            m.d.comb += kind.eq(FrameClass.FOR_BOARD if self.direction == "tx"
                                else FrameClass.DROP_BOARD_ADDRESS)
        with m.Elif(gradient & udp_length_bad):
            m.d.comb += kind.eq(FrameClass.DROP_UDP_LENGTH)
        with m.Elif(gradient & udp_checksum_bad):
            m.d.comb += kind.eq(FrameClass.DROP_UDP_CHECKSUM)
        with m.Elif(gradient):
            m.d.comb += kind.eq(FrameClass.GRADIENT)
        with m.Else():
            m.d.comb += kind.eq(FrameClass.PASS)

        m.d.sync += o.valid.eq(ended)
        with m.If(ended):
            m.d.sync += [
                o.p.kind.eq(kind),
                o.p.length.eq(length),
                o.p.ip_total.eq(ip_total),
                o.p.payload_length.eq(udp_length - UDP_HEADER),
                o.p.ip_sum.eq(ones_sum16(ip_sum)),
                o.p.ipv4_ok.eq(ipv4_ok),
                o.p.udp_ok.eq(ipv4_ok & f.proto_udp & ~udp_length_bad & ~udp_checksum_bad),
            ]
