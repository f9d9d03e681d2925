"""The network front end: datagrams from the core to the engines' services and back.

::

    core rx (32 bit) -> Upsizer -> Dispatch by port -+-> NIC TX:  IngressBuffer -> OneInFlight -> engine
                                  (closed: counted)  +-> NIC RX:  IngressBuffer -> OneInFlight -> engine
                                                     +-> switch:  SourceCheck -> IngressBuffer [-> JobGate] -> engine
                                                     +-> control: IngressBuffer -> OneInFlight -> CtrlService

    engine -> EgressBuffer -> ReplyPort (to the requester) -----------------+
    switch -> EgressBuffer [-> ResultSeal] -> FanOut (to the job's workers) -+-> PacketArbiter -> core tx
                                  (a skid buffer at each of the arbiter's ports)
    CtrlService -> SkidBuffer -> EgressBuffer -> ReplyPort -----------------+

    CtrlService -> RegisterRouter -> switch's register port
                                  -> JobWorkers (the jobs' configured workers, for FanOut)

``JobGate`` and ``ResultSeal`` (:mod:`hdl.net.front_end.job_auth`) are there with a 128-bit
control key: section 7's tags and replay filter for jobs with authentication.

Every part runs in one clock domain (the engines'); :class:`hdl.net.core.cdc.EthCrossing`
connects it to the core. The receive path never stalls: each service takes a datagram
whole into its own buffer or drops it whole (counted), so an engine that is slow or busy
fills only its own buffer. Each engine's output is taken whole into its own output buffer
or dropped whole (counted), so a held-up transmit path stalls no engine. The control
service reaches the NIC's and switch's register ports and the front end's own registers
(:mod:`hdl.net.front_end.registers`).

Which counter counts what is ``docs/network-contract.md``.
"""
from __future__ import annotations

import dataclasses

from amaranth import Cat, Module, Mux
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from contract.counters import NET_CORE_DROPS, NET_COUNTERS
from contract.header import HEADER_FIELDS
from contract.network import SERVICE_OFFSETS, BufferSizes, Service, service_ports
from hdl.ctrl_port import RegisterPort
from hdl.net.core.eth_core import CoreEvents, RxBeat, TxBeat, UdpMeta
from hdl.net.front_end.ctrl_service import PAIR_BYTES, CtrlService
from hdl.net.front_end.dispatch import Dispatch
from hdl.net.front_end.egress import EgressBuffer
from hdl.net.front_end.fanout import FanOut, ResultTag
from hdl.net.front_end.ingress import IngressBuffer
from hdl.net.front_end.job_auth import JobGate, ResultSeal
from hdl.net.front_end.job_workers import JobWorkers
from hdl.net.front_end.layouts import ReplyTag
from hdl.net.front_end.registers import NetRegisters, RegisterRouter
from hdl.net.front_end.reply import OneInFlight, ReplyPort
from hdl.net.front_end.source_check import RESULT_BIT, SourceCheck
from hdl.net.front_end.upstream import SlotOwner
from hdl.stream.arbiter import PacketArbiter
from hdl.stream.axis import axis_signature
from hdl.stream.skid_buffer import SkidBuffer
from hdl.stream.width import Upsizer

__all__ = ["BufferSizes", "FrontEndStatus", "NetworkFrontEnd"]

_FIELDS = {f.name: f for f in HEADER_FIELDS}
CTRL_MAX_LENGTH = 32 + 64 * PAIR_BYTES


FrontEndStatus = wiring.Signature({
    "rx_datagram": Out(1),    # a datagram was taken by a service
    "tx_datagram": Out(1),    # a reply left for the wire
    "drop": Out(1),           # something was dropped and counted (any cause)
})


@dataclasses.dataclass
class _Parts:
    """What the front end's parts hand each other while it is elaborated: the module and
    its shared blocks, and what the services made (their input buffers by name, the full
    strobes of the buffers, the reply streams for the arbiter)."""
    m: Module
    sizes: BufferSizes
    dispatch: Dispatch
    registers: NetRegisters
    events: object
    ingress: dict = dataclasses.field(default_factory=dict)
    ingress_full: list = dataclasses.field(default_factory=list)
    egress_full: list = dataclasses.field(default_factory=list)
    replies: list = dataclasses.field(default_factory=list)    # TxBeat streams


class NetworkFrontEnd(wiring.Component):
    """Dispatch, buffers, reply addressing, the control service and the counters.

    Parameters
    ----------
    mac, ip : int
        The board's addresses (for the registers that report them).
    port_base : int
        UDP port of the first service (``contract.network.service_ports``).
    key : int or bytes
        The control key: 64 bits (section 4) or 16 bytes (section 7's tags,
        :class:`~hdl.net.front_end.ctrl_service.CtrlService`).
    nic, switch : bool
        Whether the design has the NIC engines (two services) and the aggregator.
    jobs, max_workers, slots : int
        The switch's, for the worker table and the jobs' configuration
        (:mod:`hdl.net.front_end.job_workers`).
    sizes : BufferSizes

    Members
    -------
    rx : In(stream.Signature(RxBeat)), tx : Out(stream.Signature(TxBeat))
        The core's streams (through the clock crossing).
    core_events : In(CoreEvents)
    link : In(1)
    nic_tx_in, nic_rx_in, switch_in : Out(axis_signature())
        To the engines' inputs (present with their engine).
    nic_tx_out, nic_rx_out, switch_out : In(axis_signature())
        The engines' outputs (always ready).
    nic_rx_dropped : In(1)
        The receive engine dropped its packet (any of its drop strobes).
    switch_drained : In(1)
        The switch engine's ``drained`` (it holds no packet; present with the switch): when
        the switch grants a commit of a job's configuration.
    nic_ctrl : Out(RegisterPort(writable=False))
    switch_ctrl : Out(RegisterPort())
    status : Out(FrontEndStatus)
    counters : Out(...)
        Every network counter's value (``contract.counters.NET_COUNTERS``).
    """

    def __init__(self, *, mac, ip, port_base, key, nic=True, switch=True, jobs=4,
                 max_workers=32, slots=64, sizes=BufferSizes()):
        if not (nic or switch):
            raise ValueError("A network front end needs at least one engine (nic or switch)")
        service_ports(port_base)                      # checks the range
        self.port_base, self.nic, self.switch = port_base, nic, switch
        self.sizes = sizes
        self.services = tuple(s for s in Service
                              if s is Service.CTRL or (nic if s in (Service.NIC_TX,
                                                                    Service.NIC_RX) else switch))
        self._ctrl = CtrlService(key=key)
        # Section 7's jobs come with its control (a 128-bit key) where there is a switch.
        self._job_gate = (JobGate(key=key, jobs=jobs, slots=slots, max_workers=max_workers)
                          if switch and self._ctrl.authenticated else None)
        self._registers = NetRegisters(
            mac=mac, ip=ip, port_base=port_base, jobs=jobs, max_workers=max_workers,
            services=sum(1 << SERVICE_OFFSETS[s] for s in self.services),
            authenticated=self._ctrl.authenticated, job_auth=self._job_gate is not None)
        self.max_workers = max_workers
        self._jobs_served = jobs
        self._job_workers = (JobWorkers(slots=slots, max_workers=max_workers, jobs=jobs)
                             if switch else None)
        members = {
            "rx": In(stream.Signature(RxBeat)),
            "tx": Out(stream.Signature(TxBeat)),
            "core_events": In(CoreEvents),
            "link": In(1),
            "status": Out(FrontEndStatus),
            "counters": Out(self._registers.signature.members["counters"].shape),
            "switch_ctrl": Out(RegisterPort()),
            "nic_ctrl": Out(RegisterPort(writable=False)),
        }
        if nic:
            members.update({
                "nic_tx_in": Out(axis_signature()), "nic_tx_out": In(axis_signature()),
                "nic_rx_in": Out(axis_signature()), "nic_rx_out": In(axis_signature()),
                "nic_rx_dropped": In(1),
            })
        if switch:
            members.update({"switch_in": Out(axis_signature()),
                            "switch_out": In(axis_signature()),
                            "switch_drained": In(1)})
        super().__init__(members)

    def __repr__(self):
        return f"NetworkFrontEnd(port_base={self.port_base}, services={self.services})"

    def elaborate(self, platform):
        m = Module()
        m.submodules.upsizer = upsizer = Upsizer(UdpMeta)
        m.submodules.dispatch = dispatch = Dispatch(port_base=self.port_base,
                                                    services=self.services)
        wiring.connect(m, wiring.flipped(self.rx), upsizer.i)
        wiring.connect(m, upsizer.o, dispatch.i)
        m.submodules.registers = registers = self._registers
        parts = _Parts(m=m, sizes=self.sizes, dispatch=dispatch, registers=registers,
                       events=registers.events)
        if self.nic:
            self._nic(parts)
        if self.switch:
            self._switch(parts)
        else:
            m.d.comb += registers.check.en.eq(0)
        self._control(parts)
        self._transmit(parts)
        self._counters(parts)
        self._status(parts)
        return m

    # -- the services' buffers and replies (the parts record what they made) ---------------

    def _ingress(self, p, name, depth, *, count_in=True, **kwargs):
        buffer = IngressBuffer(depth=depth, datagrams=p.sizes.queue, **kwargs)
        p.m.submodules[f"{name}_ingress"] = buffer
        p.ingress[name] = buffer
        p.ingress_full.append(buffer.events.full)
        if count_in:
            p.m.d.comb += p.events[f"{name}_in"].eq(buffer.events.accepted)
        return buffer

    def _egress(self, p, name, depth, tag_shape):
        buffer = EgressBuffer(depth=depth, packets=p.sizes.queue, tag_shape=tag_shape)
        p.m.submodules[f"{name}_egress"] = buffer
        p.egress_full.append(buffer.events.full)
        return buffer

    @staticmethod
    def _to_engine(p, source, engine_in, *, whole_header=False):
        """A service beat stream into an engine's AXI-Stream input. ``whole_header`` (the
        NIC engines): a datagram's first beat keeps all 32 bytes, so a datagram shorter than
        a header reaches the engine completed with zero bytes up to 32 (the bytes past its
        end are zero already), as docs/network-contract.md says."""
        keep = source.p.keep
        if whole_header:
            keep = Mux(source.p.first, (1 << len(source.p.keep)) - 1, source.p.keep)
        p.m.d.comb += [engine_in.valid.eq(source.valid), source.ready.eq(engine_in.ready),
                       engine_in.p.data.eq(source.p.data), engine_in.p.keep.eq(keep),
                       engine_in.p.last.eq(source.p.last)]

    def _request_reply(self, p, name, service, depth_in, depth_out, engine_in, engine_out,
                       dropped, **ingress_kwargs):
        """Ingress -> one request in flight -> engine -> egress -> reply to the sender."""
        m = p.m
        buffer_in = self._ingress(p, name, depth_in, **ingress_kwargs)
        wiring.connect(m, getattr(p.dispatch, service.value), buffer_in.i)
        m.submodules[f"{name}_flight"] = flight = OneInFlight()
        wiring.connect(m, buffer_in.o, flight.i)
        if engine_in is None:
            return buffer_in, flight
        self._to_engine(p, flight.o, engine_in, whole_header=True)
        self._finish(p, name, flight, engine_out, dropped, depth_out)
        return buffer_in, flight

    def _finish(self, p, name, flight, engine_out, dropped, depth_out):
        m = p.m
        buffer_out = self._egress(p, name, depth_out, ReplyTag)
        wiring.connect(m, engine_out, buffer_out.i)
        m.d.comb += [
            buffer_out.tag.eq(flight.reply),
            buffer_out.replay.eq(0),
            flight.output_done.eq(engine_out.valid & engine_out.ready & engine_out.p.last),
            flight.dropped.eq(dropped),
        ]
        m.submodules[f"{name}_reply"] = reply = ReplyPort()
        wiring.connect(m, buffer_out.o, reply.i)
        m.d.comb += p.events[f"{name}_out"].eq(reply.sent)
        p.replies.append(reply.o)

    # -- the services -------------------------------------------------------------------------

    def _nic(self, p):
        """NIC: transmit and receive paths."""
        sizes = p.sizes
        self._request_reply(p, "nic_tx", Service.NIC_TX, sizes.nic_in, sizes.nic_out,
                            self.nic_tx_in, wiring.flipped(self.nic_tx_out), 0)
        self._request_reply(p, "nic_rx", Service.NIC_RX, sizes.nic_in, sizes.nic_out,
                            self.nic_rx_in, wiring.flipped(self.nic_rx_out), self.nic_rx_dropped)

    def _switch(self, p):
        """Switch: source check, results to the job's workers."""
        m, dispatch, registers, events = p.m, p.dispatch, p.registers, p.events
        m.submodules.source_check = check = SourceCheck(jobs=self._jobs_served)
        wiring.connect(m, dispatch.switch, check.i)
        wiring.connect(m, check.table, registers.check)
        m.d.comb += [events.drop_bad_source.eq(check.bad_source),
                     events.drop_result_source.eq(check.result_source)]
        # switch_in counts every datagram that reaches the switch port, as it arrives
        # (docs/network-contract.md), the ones the source check drops included
        arriving = dispatch.switch
        m.d.comb += events.switch_in.eq(arriving.valid & arriving.ready & arriving.p.last
                                        & ~arriving.p.error)
        gate = self._job_gate
        switch_in = self._ingress(p, "switch", p.sizes.switch_in, count_in=False,
                                  byte_keep=True, hold=gate is not None)
        wiring.connect(m, check.o, switch_in.i)
        results = self._egress(p, "switch", p.sizes.switch_out, ResultTag)
        results_out = results.o
        if gate is not None:
            # section 7's jobs: tags and the replay filter before the engine, tags on the
            # results before the fan-out
            m.submodules.job_gate = gate
            wiring.connect(m, switch_in.o, gate.i)
            m.d.comb += [switch_in.again.eq(gate.again), switch_in.release.eq(gate.release),
                         gate.pending.eq(registers.job_auth_registers)]
            self._to_engine(p, gate.o, self.switch_in)
            m.submodules.result_seal = seal = ResultSeal(jobs=self._jobs_served)
            wiring.connect(m, results.o, seal.i)
            m.d.comb += seal.keys.eq(gate.keys)
            results_out = seal.o
        else:
            self._to_engine(p, switch_in.o, self.switch_in)
        switch_out = wiring.flipped(self.switch_out)
        wiring.connect(m, switch_out, results.i)
        job, worker, flags = _FIELDS["job"], _FIELDS["worker"], _FIELDS["flags"]
        slot = _FIELDS["slot"]
        # An aggregate going upstream (RESULT clear) names the upstream's job: it is
        # tagged with its leaf job, the owner of its slot, whose upstream it goes to.
        m.submodules.slot_owner = owner = SlotOwner(jobs=self._jobs_served)
        upward = ~switch_out.p.data.word_select(flags.offset, 8)[RESULT_BIT]
        m.d.comb += [
            owner.slot.eq(switch_out.p.data[8 * slot.offset:8 * slot.offset + 16]),
            results.tag.job.eq(Mux(upward, owner.job,
                                   switch_out.p.data.word_select(job.offset, 8))),
            results.tag.worker.eq(switch_out.p.data.word_select(worker.offset, 8)),
            results.tag.upstream.eq(upward),
        ]
        ports = service_ports(self.port_base)
        m.submodules.fanout = fanout = FanOut(port=ports[Service.SWITCH],
                                              max_workers=self.max_workers)
        wiring.connect(m, results_out, fanout.i)
        if gate is not None:
            m.d.comb += [results.replay.eq(seal.replay), seal.o_replay.eq(fanout.replay)]
        else:
            m.d.comb += results.replay.eq(fanout.replay)
        wiring.connect(m, fanout.table, registers.fanout)
        # The jobs' configured workers, from the writes the switch's register port gets
        m.submodules.job_workers = job_workers = self._job_workers
        wiring.connect(m, fanout.jobs, job_workers.lookup)
        wiring.connect(m, fanout.group, registers.group)
        m.d.comb += [job_workers.writes.addr.eq(self.switch_ctrl.addr),
                     job_workers.writes.wdata.eq(self.switch_ctrl.wdata),
                     job_workers.writes.we.eq(self.switch_ctrl.we),
                     job_workers.drained.eq(self.switch_drained)]
        m.d.comb += [check.active.eq(job_workers.active),
                     owner.active.eq(job_workers.active)]
        if gate is not None:
            m.d.comb += [gate.commit.eq(job_workers.commit), gate.active.eq(job_workers.active)]
        m.d.comb += [events.switch_out.eq(fanout.sent),
                     events.switch_group_out.eq(fanout.group_sent),
                     events.switch_upstream_out.eq(fanout.upstream_sent)]
        p.replies.append(fanout.o)

    def _control(self, p):
        """The control service, its reply, and its register bus to every register port."""
        m, events = p.m, p.events
        m.submodules.ctrl = ctrl = self._ctrl
        # Section 4 answers a request longer than the longest from its header (refused).
        # Section 7 cannot: its tag covers the whole datagram, which the buffer does not
        # keep, so such a request is dropped at the buffer, unanswered (`drop_bad_ctrl`).
        authenticated = ctrl.authenticated
        buffer_in, flight = self._request_reply(p, "ctrl", Service.CTRL, p.sizes.ctrl_in, None,
                                                None, None, None, max_length=CTRL_MAX_LENGTH,
                                                header_of_long=not authenticated)
        wiring.connect(m, flight.o, ctrl.i)
        # The service's reply beats come from its state machine; a skid buffer registers
        # them before the output buffer's word count and queue write.
        m.submodules.ctrl_slice = ctrl_slice = SkidBuffer(ctrl.o.p.shape())
        wiring.connect(m, ctrl.o, ctrl_slice.i)
        self._finish(p, "ctrl", flight, ctrl_slice.o, ctrl.events.no_reply, p.sizes.ctrl_out)
        too_long = buffer_in.events.too_long if authenticated else 0
        m.d.comb += [
            events.drop_bad_key.eq(ctrl.events.bad_key),
            # section 4: a request longer than the longest is refused by the service
            # (header_of_long); section 7: dropped by the buffer
            events.drop_bad_ctrl.eq(ctrl.events.bad_ctrl + too_long),
        ]
        if authenticated:
            gate_events = (self._job_gate.events if self._job_gate is not None
                           else {"bad_tag": 0, "replay": 0})
            m.d.comb += [
                p.registers.auth_events.drop_bad_tag.eq(ctrl.events.bad_tag
                                                        + gate_events["bad_tag"]),
                p.registers.auth_events.drop_replay.eq(ctrl.events.replay
                                                       + gate_events["replay"]),
                p.registers.write_counter.eq(ctrl.write_counter),
            ]
        m.submodules.router = router = RegisterRouter(nic=self.nic, switch=self.switch)
        wiring.connect(m, ctrl.bus, router.bus)
        wiring.connect(m, router.nic, wiring.flipped(self.nic_ctrl))
        wiring.connect(m, router.switch, wiring.flipped(self.switch_ctrl))
        wiring.connect(m, router.net, p.registers.ctrl)

    def _transmit(self, p):
        """The replies onto the core's transmit stream, a datagram at a time.

        A skid buffer on each side of the arbiter, so that no ``ready`` runs from the
        crossing through the arbiter's grant into a service's output logic (the fan-out's
        worker search, an output buffer's downsizer and memory read): each of these paths
        ends at a register. Each service's replies pass a second one first: the services sit
        far apart on the chip, and a ready that crossed it and then went through a service's
        output logic was over a clock (routing, not logic)."""
        m = p.m
        m.submodules.arbiter = arbiter = PacketArbiter(len(p.replies), shape=TxBeat)
        for k, (port, reply) in enumerate(zip(arbiter.inputs, p.replies)):
            m.submodules[f"reply_slice{k}"] = reply_slice = SkidBuffer(TxBeat)
            m.submodules[f"tx_slice{k}"] = tx_slice = SkidBuffer(TxBeat)
            wiring.connect(m, reply, reply_slice.i)
            wiring.connect(m, reply_slice.o, tx_slice.i)
            wiring.connect(m, tx_slice.o, port)
        m.submodules.tx_slice = tx_slice = SkidBuffer(TxBeat)
        wiring.connect(m, arbiter.o, tx_slice.i)
        wiring.connect(m, tx_slice.o, wiring.flipped(self.tx))

    def _counters(self, p):
        """The network counters' strobes that no service makes."""
        m, registers, events = p.m, p.registers, p.events
        core = self.core_events
        for name in NET_CORE_DROPS:
            m.d.comb += events[name].eq(core[name])
        # A datagram whose beats disagree with its length is a UDP length error that the
        # core let through (it never does; counted there all the same).
        mismatch = Cat(*(p.ingress[s.value].events.mismatch for s in self.services)).any()
        m.d.comb += [
            events.udp_length.eq(core.udp_length | mismatch),
            events.arp_miss.eq(core.arp_miss),
            events.arp_unreachable.eq(core.arp_unreachable),
            events.arp_busy_drop.eq(core.arp_busy_drop),
            events.drop_closed_port.eq(p.dispatch.closed_port),
            # one datagram ends per clock on the receive side; outputs may end together
            events.drop_service_full.eq(Cat(*p.ingress_full).any() | Cat(
                *(p.ingress[s.value].events.too_long
                  for s in self.services if s is not Service.CTRL)).any()),
            events.drop_reply_full.eq(sum(p.egress_full)),
            registers.link.eq(self.link),
            self.counters.eq(registers.counters),
        ]
        if not self.nic:
            for name in ("nic_tx_in", "nic_tx_out", "nic_rx_in", "nic_rx_out"):
                m.d.comb += events[name].eq(0)
        if not self.switch:
            for name in ("switch_in", "switch_out", "drop_bad_source"):
                m.d.comb += events[name].eq(0)
            m.d.comb += registers.fanout.en.eq(0)

    def _status(self, p):
        """The status strobes (LEDs)."""
        events = p.events
        drops = [events[n] for n in NET_COUNTERS
                 if n.startswith(("drop_", "arp_unreach", "arp_busy"))]
        drops += [events[n] for n in NET_CORE_DROPS]
        p.m.d.sync += [
            self.status.rx_datagram.eq(Cat(*(events[f"{s.value}_in"]
                                             for s in self.services)).any()),
            self.status.tx_datagram.eq(self.tx.valid & self.tx.ready & self.tx.p.last),
            self.status.drop.eq(Cat(*(d != 0 for d in drops)).any()),
        ]
