"""The control service (network.md section 4): ``CTRL`` packets read and write registers.

A request is one ``CTRL`` packet: the 32-byte header (``op`` read or write, ``count``
pairs, ``seq``, the 64-bit ``key``) and ``count`` (address, value) pairs of little-endian
32-bit words. The reply is the request's header with ``RESULT`` set and the same pairs,
each value replaced by the register's value (a write's read back after writing); the
register accesses go out on :attr:`CtrlService.bus` in the order of the pairs.

What happens to a request, checked in this order on its header beat (the input buffer has
already checked its FCS and holds it whole):

1. shorter than a header: dropped, no reply, counted ``bad_ctrl``;
2. key not the bitstream's: dropped, no reply, counted ``bad_key``; nothing it asked for
   happens (so a host without the key learns nothing, not even what it sent wrong);
3. not magic/version/type ``CTRL``, ``count`` outside 1..64, ``op`` neither read nor
   write, or a length other than ``32 + 8 * count`` bytes: refused; the reply is the
   header alone with ``RESULT`` and ``ERROR`` set, counted ``bad_ctrl``; no register is
   touched (``docs/network-contract.md``, the golden board's order);
4. otherwise executed (``executed``).

With section 7's 128-bit key (16 ``bytes``), :class:`~hdl.net.front_end.ctrl_auth.CtrlAuth`
checks each request's tag before step 2 (a wrong one: dropped, no reply, ``bad_tag``) and
tags each reply; step 2 is gone (the tag replaces the key), and after step 3 a write whose
64-bit counter (header bytes 16..23) is not above the largest accepted is dropped with no
reply (``replay``); an accepted write raises that counter (:attr:`CtrlService.write_counter`).

The checks themselves are :mod:`hdl.ctrl_request`'s, which the wire's CTRL responder
(:class:`hdl.wire.ctrl.CtrlResponder`) applies too.
"""
from __future__ import annotations

from amaranth import Cat, Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from contract.network import (CTRL_COUNT_OFFSET, CTRL_COUNTER_BYTES, CTRL_COUNTER_OFFSET,
                              CTRL_KEY_BYTES, CTRL_KEY_OFFSET, CTRL_MAX_PAIRS, CTRL_OP_OFFSET,
                              CtrlOp)
from hdl import ctrl_request as request
from hdl.ctrl_request import PAIR_BYTES
from hdl.header import HeaderLayout
from hdl.net.front_end.ctrl_auth import CtrlAuth, check_auth_key
from hdl.net.front_end.layouts import WORDS_PER_BEAT, ServiceBeat
from hdl.stream.axis import DATA_BITS, axis_signature

__all__ = ["REGISTER_ADDRESS_SETUP", "REGISTER_READ_LATENCY", "RegisterBusSignature",
           "CtrlEvents", "CtrlService", "PAIR_BYTES"]

PAIRS_PER_BEAT = WORDS_PER_BEAT // 2

#: Clocks from ``re`` on the register bus to its ``rdata`` (the address decoders behind the
#: bus take a clock of their own: :class:`hdl.net.front_end.registers.RegisterRouter`).
REGISTER_READ_LATENCY = 2

#: Clocks ``addr`` and ``wdata`` hold their value before ``re`` or ``we`` (the router
#: registers them and decodes the region from the address ahead of the strobe).
REGISTER_ADDRESS_SETUP = 1

#: The control service's register bus, seen from the service: 32-bit network addresses
#: (``contract.network.network_address``), held :data:`REGISTER_ADDRESS_SETUP` clocks
#: before a strobe; ``rdata`` is valid :data:`REGISTER_READ_LATENCY` clocks after ``re``.
RegisterBusSignature = wiring.Signature({
    "addr": Out(32),
    "re": Out(1),
    "we": Out(1),
    "wdata": Out(32),
    "rdata": In(32),
})

CtrlEvents = data.StructLayout({
    "executed": 1,      # a request was carried out and answered
    "bad_key": 1,       # wrong key: dropped, no reply
    "bad_ctrl": 1,      # not a control packet (no reply) or refused (ERROR reply)
    "no_reply": 1,      # the request ends without a reply (bad_key, or not a CTRL packet)
    "bad_tag": 1,       # section 7: wrong tag, dropped, no reply
    "replay": 1,        # section 7: a write whose counter is not above the largest accepted
})


class CtrlService(wiring.Component):
    """Executes ``CTRL`` requests on a register bus; one request at a time.

    Parameters
    ----------
    key : int or bytes
        The control key, a constant of the bitstream: a 64-bit ``int`` (section 4, carried
        in clear) or 16 ``bytes`` (section 7: tags, write counter).

    Members
    -------
    i : In(stream.Signature(ServiceBeat))
        Requests (``meta.length`` is the datagram's length in bytes).
    o : Out(axis_signature())
        Replies.
    bus : Out(RegisterBusSignature)
    events : Out(CtrlEvents)
    write_counter : Out(64)
        Section 7 only: the largest counter of an accepted write (0 after power-up).
    """

    def __init__(self, *, key):
        if isinstance(key, (bytes, bytearray)):
            self._key = check_auth_key(key)
        else:
            self._key = request.check_key(key)
        self.authenticated = isinstance(self._key, bytes)
        members = {
            "i": In(stream.Signature(ServiceBeat)),
            "o": Out(axis_signature()),
            "bus": Out(RegisterBusSignature),
            "events": Out(CtrlEvents),
        }
        if self.authenticated:
            members["write_counter"] = Out(64)
        super().__init__(members)

    def __repr__(self):
        return "CtrlService(key=<secret>)"      # the key never goes into logs

    def elaborate(self, platform):
        m = Module()
        if not self.authenticated:
            m.submodules.executor = executor = _Executor(key=self._key)
            wiring.connect(m, wiring.flipped(self.i), executor.i)
            wiring.connect(m, executor.o, wiring.flipped(self.o))
            wiring.connect(m, executor.bus, wiring.flipped(self.bus))
            m.d.comb += self.events.eq(executor.events)
            return m
        m.submodules.auth = auth = CtrlAuth(key=self._key)
        m.submodules.executor = executor = _Executor(key=None)
        wiring.connect(m, wiring.flipped(self.i), auth.i)
        wiring.connect(m, auth.service_i, executor.i)
        wiring.connect(m, executor.o, auth.service_o)
        wiring.connect(m, auth.o, wiring.flipped(self.o))
        wiring.connect(m, executor.bus, wiring.flipped(self.bus))
        m.d.comb += [
            auth.service_no_reply.eq(executor.events.no_reply),
            self.events.eq(executor.events),
            self.events.bad_tag.eq(auth.events.bad_tag),
            self.events.no_reply.eq(executor.events.no_reply | auth.no_reply),
            self.write_counter.eq(executor.write_counter),
        ]
        return m


class _Executor(wiring.Component):
    """The service's state machine: checks a request's header, runs its pairs on the bus,
    answers. ``key=None``: section 7 (no key field; the write counter instead)."""

    def __init__(self, *, key):
        self._key = key
        members = {
            "i": In(stream.Signature(ServiceBeat)),
            "o": Out(axis_signature()),
            "bus": Out(RegisterBusSignature),
            "events": Out(CtrlEvents),
        }
        if key is None:
            members["write_counter"] = Out(64)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        authenticated = self._key is None
        i, o, bus = self.i, self.o, self.bus
        beat = i.p
        header = data.View(HeaderLayout, beat.data)
        op = beat.data.word_select(CTRL_OP_OFFSET, 8)
        key = beat.data[8 * CTRL_KEY_OFFSET:8 * (CTRL_KEY_OFFSET + CTRL_KEY_BYTES)]
        count = beat.data.word_select(CTRL_COUNT_OFFSET // 4, 32)
        length = beat.meta.length

        whole_header = Signal()
        key_ok = Signal()
        # A request is well formed when all three hold; they are registered apart and
        # combined the clock after (the header beat comes straight from the input buffer's
        # block RAM, and the length check is an adder and a compare of its own).
        fields_ok = Signal()
        count_ok = Signal()
        length_ok = Signal()
        # (the checks are the wire's too: hdl.ctrl_request)
        m.d.comb += [
            whole_header.eq(request.whole_header(length)),
            key_ok.eq(1 if authenticated else request.key_matches(key, self._key)),
            fields_ok.eq(request.request_ok(request.magic_ok(header.magic, header.version),
                                            header.type, op)),
            count_ok.eq(request.count_ok(count)),
            length_ok.eq(request.length_ok(length, count)),
        ]
        checks = Signal(3)
        # Section 7: a write whose counter is not above the largest accepted is a replay
        # (compared as the header comes, so the decision starts from a register).
        replayed = Signal()
        counter = beat.data.word_select(CTRL_COUNTER_OFFSET // CTRL_COUNTER_BYTES, 64)
        if authenticated:
            m.d.sync += replayed.eq((op == CtrlOp.WRITE) & (counter <= self.write_counter))

        writing = Signal()
        refused = Signal()
        m.d.comb += refused.eq(~checks.all())
        # The reply's header: the request's, RESULT set (and ERROR when refused).
        flags_offset = 8 * 3
        reply_flags = Signal(8)
        m.d.comb += reply_flags.eq(request.reply_flags(refused))
        pairs_left = Signal(range(CTRL_MAX_PAIRS + 1))
        pair = Signal(range(PAIRS_PER_BEAT))
        out_data = Signal(DATA_BITS)     # the beat being answered, values replaced
        # The bus's address and value come from registers: the regions' decoders and the
        # engines' register ports behind them are a clock of their own away from the
        # input buffer's memory and the pair selection.
        bus_addr = Signal(32)
        bus_wdata = Signal(32)
        m.d.comb += [bus.addr.eq(bus_addr), bus.wdata.eq(bus_wdata)]

        m.d.sync += self.events.eq(0)
        with m.FSM():
            with m.State("HEADER"):
                with m.If(i.valid):
                    m.d.sync += [out_data.eq(beat.data),
                                 checks.eq(Cat(fields_ok, count_ok, length_ok)),
                                 writing.eq(op == CtrlOp.WRITE), pairs_left.eq(count[:7])]
                    with m.If(~whole_header | ~key_ok):
                        m.d.sync += [self.events.bad_ctrl.eq(~whole_header),
                                     self.events.bad_key.eq(whole_header),
                                     self.events.no_reply.eq(1)]
                        m.next = "DRAIN"
                    with m.Else():
                        m.next = "REPLY_HEADER"
            with m.State("REPLY_HEADER"):
                # The header beat answers from a register, a clock after the request came.
                replay = ~refused & replayed
                m.d.comb += [o.valid.eq(~replay),
                             o.p.data.eq(out_data | (reply_flags << flags_offset)),
                             o.p.keep.eq((1 << (DATA_BITS // 8)) - 1), o.p.last.eq(refused)]
                with m.If(replay):
                    m.d.sync += [self.events.replay.eq(1), self.events.no_reply.eq(1)]
                    m.next = "DRAIN"
                with m.Elif(o.ready):
                    if authenticated:
                        with m.If(~refused & writing):
                            m.d.sync += self.write_counter.eq(
                                out_data.word_select(CTRL_COUNTER_OFFSET // 8, 64))
                    with m.If(refused):
                        m.d.sync += self.events.bad_ctrl.eq(1)
                        m.next = "DRAIN"
                    with m.Else():
                        m.d.comb += i.ready.eq(1)
                        m.next = "PAIR_START"
            with m.State("DRAIN"):
                # the rest of a request that gets no (more) answer; `last` ends it
                m.d.comb += i.ready.eq(1)
                with m.If(i.valid & i.p.last):
                    m.next = "HEADER"
            with m.State("PAIR_START"):
                with m.If(i.valid):
                    m.d.sync += [out_data.eq(beat.data), pair.eq(0),
                                 bus_addr.eq(beat.data.word_select(0, 32)),
                                 bus_wdata.eq(beat.data.word_select(1, 32))]
                    m.next = "SETUP"
            with m.State("SETUP"):
                # the bus holds a new address a clock before the strobe
                assert REGISTER_ADDRESS_SETUP == 1
                m.next = "ACCESS"
            with m.State("ACCESS"):
                # A write, then the read that answers it; a read alone.
                m.d.comb += [bus.we.eq(writing), bus.re.eq(~writing)]
                with m.If(writing):
                    m.next = "READ"
                with m.Else():
                    m.next = "WAIT"
            with m.State("READ"):
                m.d.comb += bus.re.eq(1)
                m.next = "WAIT"
            with m.State("WAIT"):
                # The bus's second clock of read latency. The next pair's address and value
                # (words the capture leaves alone) go on the bus now, a clock before its
                # strobe: the access is done with the address.
                assert REGISTER_READ_LATENCY == 2
                next_pair = (pair + 1)[:len(pair)]
                m.d.sync += [bus_addr.eq(out_data.word_select(2 * next_pair, 32)),
                             bus_wdata.eq(out_data.word_select(2 * next_pair + 1, 32))]
                m.next = "CAPTURE"
            with m.State("CAPTURE"):
                with m.Switch(pair):
                    for p in range(PAIRS_PER_BEAT):
                        with m.Case(p):
                            m.d.sync += out_data.word_select(2 * p + 1, 32).eq(bus.rdata)
                m.d.sync += [pairs_left.eq(pairs_left - 1), pair.eq(pair + 1)]
                with m.If((pair == PAIRS_PER_BEAT - 1) | (pairs_left == 1)):
                    m.next = "EMIT"
                with m.Else():
                    m.next = "ACCESS"
            with m.State("EMIT"):
                m.d.comb += [o.valid.eq(1), o.p.data.eq(out_data), o.p.keep.eq(beat.keep),
                             o.p.last.eq(beat.last)]
                with m.If(o.ready):
                    m.d.comb += i.ready.eq(1)
                    with m.If(beat.last):
                        m.d.sync += self.events.executed.eq(1)
                        m.next = "HEADER"
                    with m.Else():
                        m.next = "PAIR_START"
        return m
