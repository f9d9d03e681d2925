"""The board's own service on the host side of the NIC in the wire (``network.md`` section 6).

The board keeps a MAC and an IPv4 address on port 0, and answers three kinds of frame there,
as the golden model does (``host/board/wire_golden.py``, ``GoldenWire._answer``), each with
a responder of its own:

- **ARP** (:class:`~hdl.wire.arp.ArpResponder`): a request (Ethernet/IPv4, op 1) for the
  board's IP, to its MAC or broadcast: the reply to the request's sender;
- **ICMP echo** (:class:`~hdl.wire.echo.EchoResponder`): a request to the board's IP with at
  most 128 bytes of data (LiteEth's limit, kept so that the wire answers as the network top
  does): the reply with the same identifier, sequence and data, its checksum adjusted for
  the new type;
- **CTRL** (section 4; :class:`~hdl.wire.ctrl.CtrlResponder`) to the control port with the
  bitstream's key: the registers of ``contract.registers.WIRE_REGISTERS`` in region ``wire``
  of the ``CTRL`` address space, read on :attr:`BoardService.bus` (every register is a
  counter: a write is read back and changes nothing; other addresses read 0). A request with
  a wrong key, or shorter than a header, gets no answer; a malformed one the header alone
  with ``RESULT`` and ``ERROR``.

IP replies are as LiteEth sends them: identification 0, no flags, TTL 128, UDP checksum 0.
Everything else the :class:`~hdl.wire.path.WirePath` hands over (``FOR_BOARD``) goes
unanswered and is counted (``drop_unanswered``).

The service takes one frame at a time, whole, into a block RAM of :data:`BUFFER_WORDS`
32-bit words (:class:`~hdl.wire.request.RequestBuffer`; longer frames are taken, their words
past the buffer dropped: no request the service answers is that long); the responders read
the fields they need as the words pass. It works the request in place (a ``CTRL`` read's
value is written over the request's, so the reply is the request's own words with new
headers), and the reply multiplexer (:class:`~hdl.wire.reply.ReplyMux`) sends the reply at a
word every two clocks, the host port's line rate. One register, the service's
:class:`~hdl.wire.request.Step`, says what each part does in a clock; :class:`BoardService`
moves it on.
"""
from amaranth import Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from contract.network import DEFAULT_IP, DEFAULT_MAC
from hdl import ctrl_request
from hdl.ctrl_port import RegisterPort
from hdl.wire.arp import ArpResponder
from hdl.wire.classify import MacBeat, address_value
from hdl.wire.ctrl import CtrlResponder
from hdl.wire.echo import ICMP_MAX_DATA, EchoResponder
from hdl.wire.reply import ReplyMux
from hdl.wire.request import BUFFER_WORDS, BoardWord, RequestBuffer, Step

__all__ = ["BoardWord", "ServiceEvents", "BoardService", "BUFFER_WORDS", "ICMP_MAX_DATA"]

#: Counter strobes of the host port (``WIRE_COUNTERS`` names), one cycle per frame:
#: ``answered`` and ``frames_out`` once a reply has gone out, ``drop_unanswered`` for a
#: frame the service does not answer.
ServiceEvents = data.StructLayout({"answered": 1, "drop_unanswered": 1, "frames_out": 1})


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
        return ctrl_request.check_key(key)

    def __repr__(self):
        return "BoardService(key=<secret>)"     # the key never goes into logs

    def elaborate(self, platform):
        m = Module()
        m.submodules.request = request = RequestBuffer()
        m.submodules.arp = arp = ArpResponder(mac=self.mac, ip=self.ip)
        m.submodules.echo = echo = EchoResponder()
        m.submodules.ctrl = ctrl = CtrlResponder(key=self._key)
        m.submodules.reply = reply = ReplyMux(mac=self.mac, ip=self.ip)
        step = Signal(Step)

        wiring.connect(m, wiring.flipped(self.i), request.i)
        for part in (arp, echo, ctrl, reply):      # (always ready: the words only pass by)
            wiring.connect(m, request.rx, part.rx)
        m.d.comb += [ctrl.step.eq(step), reply.step.eq(step), reply.verdict.eq(request.verdict),
                     reply.is_arp.eq(arp.is_arp), arp.peer.eq(reply.peer)]
        m.d.comb += [echo.ip.eq(reply.header), ctrl.ip.eq(reply.header)]
        # the buffer reads at its readers' addresses together: each drives 0 when not reading
        m.d.comb += [request.read.addr.eq(reply.read.addr | ctrl.read.addr),
                     reply.read.data.eq(request.read.data), ctrl.read.data.eq(request.read.data),
                     echo.read_data.eq(request.read.data)]
        wiring.connect(m, ctrl.write, request.write)
        wiring.connect(m, ctrl.bus, wiring.flipped(self.bus))
        m.d.comb += [reply.header_only.eq(ctrl.answer & ~ctrl.ok),
                     ctrl.reply_total.eq(reply.reply_total),
                     reply.arp_words.eq(arp.words), reply.echo_words.eq(echo.words),
                     reply.ctrl_words.eq(ctrl.words)]
        wiring.connect(m, reply.o, wiring.flipped(self.o))
        self._sequence(m, step, arp, echo, ctrl)
        return m

    def _sequence(self, m, step, arp, echo, ctrl):
        """The service's steps, one frame at a time, and its counter strobes."""
        i, o, events = self.i, self.o, self.events
        m.d.sync += events.eq(0)
        m.d.comb += self.free.eq(0)
        with m.Switch(step):
            with m.Case(Step.IDLE):
                m.d.comb += self.free.eq(1)
                with m.If(i.valid):
                    m.d.sync += step.eq(Step.RECEIVE)
                    with m.If(i.p.last):
                        m.d.sync += step.eq(Step.DECIDE)
            with m.Case(Step.RECEIVE):
                with m.If(i.valid & i.p.last):
                    m.d.sync += step.eq(Step.DECIDE)
            with m.Case(Step.DECIDE):
                with m.If(arp.answer):
                    m.d.sync += step.eq(Step.LENGTH)
                with m.Elif(echo.answer):
                    m.d.sync += step.eq(Step.LENGTH)
                with m.Elif(ctrl.answer & ctrl.ok):
                    m.d.sync += step.eq(Step.PAIR_ADDRESS_LOW)
                with m.Elif(ctrl.answer):
                    m.d.sync += step.eq(Step.LENGTH)
                with m.Else():
                    m.d.sync += events.drop_unanswered.eq(1)
                    m.d.sync += step.eq(Step.IDLE)
            # a CTRL pair, a step at a time (the responder's), then the next or the reply
            for now, after in ((Step.PAIR_ADDRESS_LOW, Step.PAIR_ADDRESS_HIGH),
                               (Step.PAIR_ADDRESS_HIGH, Step.PAIR_REGION),
                               (Step.PAIR_REGION, Step.PAIR_READ),
                               (Step.PAIR_READ, Step.PAIR_VALUE_LOW),
                               (Step.PAIR_VALUE_LOW, Step.PAIR_VALUE_HIGH)):
                with m.Case(now):
                    m.d.sync += step.eq(after)
            with m.Case(Step.PAIR_VALUE_HIGH):
                with m.If(ctrl.last_pair):
                    m.d.sync += step.eq(Step.LENGTH)
                with m.Else():
                    m.d.sync += step.eq(Step.PAIR_ADDRESS_LOW)
            with m.Case(Step.LENGTH):
                m.d.sync += step.eq(Step.FETCH)
            with m.Case(Step.FETCH):
                m.d.sync += step.eq(Step.SEND)
            with m.Case(Step.SEND):
                with m.If(o.ready):
                    m.d.sync += step.eq(Step.FETCH)
                    with m.If(o.p.last):
                        m.d.sync += [events.answered.eq(1), events.frames_out.eq(1)]
                        m.d.sync += step.eq(Step.IDLE)
