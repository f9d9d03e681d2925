"""The control service's address space: the engines' register ports and the front end's own.

``CTRL`` addresses are 32 bits, ``region << 16 | local`` (``contract.network``): region
``nic`` is the NIC top's (read-only) counter port, ``switch`` the switch top's register
port, ``net`` the front end's own registers (:class:`NetRegisters`: its counters, the
board's addresses, the link and the worker table). :class:`RegisterRouter` sends each
access to its region; addresses in no region, or in the region of an engine this bitstream
does not have, read 0 and ignore writes.
"""
from __future__ import annotations

import operator
from functools import reduce

from amaranth import Array, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from contract.counters import AUTH_COUNTERS, NET_COUNTERS
from contract.network import NETWORK_REGIONS
from contract.registers import (AUTH_FEATURE_CONTROL, AUTH_FEATURE_JOBS, AUTH_REGISTERS,
                                NET_REGISTERS, RegisterArray)
from hdl.ctrl_port import RegisterPort
from hdl.net.front_end.ctrl_service import REGISTER_ADDRESS_SETUP, RegisterBusSignature
from hdl.net.front_end.worker_table import GroupLookup, LookupSignature, WorkerTable
from hdl.replica import replica

__all__ = ["RegisterRouter", "NET_EVENT_WIDTHS", "NetEvents", "AuthEvents",
           "JobAuthRegister", "NetRegisters"]

_REGION = {r.name: r.index for r in NETWORK_REGIONS}


class RegisterRouter(wiring.Component):
    """Decodes the control bus into the three regions.

    The bus's address and value are held ``REGISTER_ADDRESS_SETUP`` (1) clock before its
    strobes, and it answers ``REGISTER_READ_LATENCY`` (2) clocks after ``re``: the ``net`` region
    (:class:`NetRegisters`) does, its address decode being a clock of its own; the engines'
    ports answer the clock after ``re``, and their ``rdata`` is registered here once more.

    Parameters
    ----------
    nic, switch : bool
        Whether the design has that engine top (its region reads 0 otherwise).

    Members
    -------
    bus : In(RegisterBusSignature)
    nic : Out(RegisterPort(writable=False))
    switch : Out(RegisterPort())
    net : Out(RegisterPort())
    """

    def __init__(self, *, nic=True, switch=True):
        self._present = {"nic": nic, "switch": switch, "net": True}
        super().__init__({
            "bus": In(RegisterBusSignature),
            "nic": Out(RegisterPort(writable=False)),
            "switch": Out(RegisterPort()),
            "net": Out(RegisterPort()),
        })

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        # The address and value are held a clock before a strobe (REGISTER_ADDRESS_SETUP),
        # so the router registers them, and the region the address selects, every clock:
        # the ports' address decoders and the strobes' gates start from these flip-flops.
        assert REGISTER_ADDRESS_SETUP == 1
        # One copy of the address per region: each fans out to its own register
        # multiplexer, placed beside it (replicas: synthesis keeps them apart).
        wdata = Signal(32)
        m.d.sync += wdata.eq(bus.wdata)
        selected = {}
        for name in ("nic", "switch", "net"):
            port = getattr(self, name)
            addr = replica(16, name=f"{name}_addr")
            m.d.sync += addr.eq(bus.addr[:16])
            hit = Signal(name=f"{name}_hit")
            m.d.sync += hit.eq((bus.addr[16:] == _REGION[name]) & self._present[name])
            selected[name] = hit
            m.d.comb += [port.addr.eq(addr), port.re.eq(bus.re & hit)]
            if name != "nic":
                m.d.comb += [port.wdata.eq(wdata), port.we.eq(bus.we & hit)]
        # rdata two clocks after re, from the region that was read
        read_from = Signal(2)
        answer_from = Signal(2)
        with m.If(bus.re):
            m.d.sync += read_from.eq(0)
            for n, name in enumerate(("nic", "switch", "net"), 1):
                with m.If(selected[name]):
                    m.d.sync += read_from.eq(n)
        m.d.sync += answer_from.eq(read_from)
        answers = {"net": self.net.rdata}     # already two clocks after re
        for name in ("nic", "switch"):
            answers[name] = Signal(32, name=f"{name}_rdata")
            m.d.sync += answers[name].eq(getattr(self, name).rdata)
        with m.Switch(answer_from):
            for n, name in enumerate(("nic", "switch", "net"), 1):
                with m.Case(n):
                    m.d.comb += bus.rdata.eq(answers[name])
        return m


#: Increments per clock each counter can take (a strobe, or several outputs at once).
NET_EVENT_WIDTHS = {name: 1 for name in NET_COUNTERS} | {"drop_reply_full": 3,
                                                         "drop_bad_ctrl": 2}
#: One field per network counter: what to add this clock.
NetEvents = data.StructLayout({name: unsigned(w) for name, w in NET_EVENT_WIDTHS.items()})
#: Section 7's counters (``contract.counters.AUTH_COUNTERS``): what to add this clock (the
#: control service and the switch's job gate may drop a datagram in the same clock).
AuthEvents = data.StructLayout({name: 2 for name in AUTH_COUNTERS})
#: A job's ``job_auth`` registers as written (applied by its commit, in the job gate).
JobAuthRegister = data.StructLayout({"enable": 1, "epoch": 32})


class NetRegisters(wiring.Component):
    """The ``net`` region: ``contract.registers.NET_REGISTERS``.

    Its port is a :class:`hdl.ctrl_port.RegisterPort` with one difference: ``rdata`` answers
    two clocks after ``re`` (``REGISTER_READ_LATENCY``), not one. Counters count their events a
    clock after they come.

    Parameters
    ----------
    mac, ip : int
        The board's MAC (48 bits) and IPv4 (32 bits) addresses.
    port_base : int
        UDP port of the first service.
    services : int
        Bit i: the service at ``port_base + i`` exists.
    jobs, max_workers : int
        The worker table's size (the switch's).
    authenticated : bool
        Section 7's control: also ``contract.registers.AUTH_REGISTERS``' counters, write
        counter and ``auth_features``.
    job_auth : bool
        Section 7's jobs too (``authenticated`` and a switch): the ``job_auth`` registers.
        (``upstream_key`` reads 0 and ignores writes: no upstream keys in the gateware.)

    Members
    -------
    ctrl : In(RegisterPort())
        The register port (answering two clocks after ``re``).
    events : In(NetEvents)
    link : In(1)
    check, fanout : In(LookupSignature)
        The worker table's lookup ports.
    group : In(GroupLookup)
        Each job's result group (``group`` registers, flip-flops: a few jobs of 48 bits).
    counters : Out(StructLayout({name: 32 for name in NET_COUNTERS}))
        The counters' values (for the board's report and LEDs).
    auth_events : In(AuthEvents)
        Section 7 only.
    write_counter : In(64)
        Section 7 only: the control service's largest accepted write counter.
    job_auth_registers : Out(ArrayLayout(JobAuthRegister, jobs))
        ``job_auth`` only: each job's registers as written.
    """

    def __init__(self, *, mac, ip, port_base, services, jobs, max_workers,
                 authenticated=False, job_auth=False):
        self._constants = {"mac_high": mac >> 32, "mac_low": mac & 0xFFFFFFFF, "ip": ip,
                           "port_base": port_base, "services": services}
        self._table = WorkerTable(jobs=jobs, max_workers=max_workers)
        self._jobs = jobs
        self.authenticated = bool(authenticated)
        self.job_auth = self.authenticated and bool(job_auth)
        members = {
            "ctrl": In(RegisterPort()),
            "events": In(NetEvents),
            "link": In(1),
            "check": In(LookupSignature),
            "fanout": In(LookupSignature),
            "group": In(GroupLookup),
            "counters": Out(data.StructLayout({name: 32 for name in NET_COUNTERS})),
        }
        if self.authenticated:
            members.update({"auth_events": In(AuthEvents), "write_counter": In(64)})
        if self.job_auth:
            members["job_auth_registers"] = Out(data.ArrayLayout(JobAuthRegister, jobs))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.table = table = self._table
        wiring.connect(m, wiring.flipped(self.check), table.check)
        wiring.connect(m, wiring.flipped(self.fanout), table.fanout)

        # The events are registered before they are added: they come from the services'
        # decisions all over the front end, the adders are here.
        events = Signal(NetEvents)
        m.d.sync += events.eq(self.events)
        for name in NET_COUNTERS:
            counter = self.counters[name]
            with m.If(events[name] != 0):
                m.d.sync += counter.eq(counter + events[name])   # wraps at 2^32

        addr = self.ctrl.addr
        worker = NET_REGISTERS["worker"]
        assert isinstance(worker, RegisterArray)
        span = worker.field_bits + worker.index_bits
        in_table = Signal()
        m.d.comb += [
            in_table.eq(addr[span:] == worker.base >> span),
            table.reg_entry.eq(addr[worker.field_bits:span]),
            table.reg_port_field.eq(addr[:worker.field_bits] == worker.field("port").address),
            table.reg_re.eq(self.ctrl.re & in_table),
            table.reg_we.eq(self.ctrl.we & in_table),
            table.reg_wdata.eq(self.ctrl.wdata),
        ]
        # Each job's result group: written like the worker table, read with the other
        # registers below; the jobs beyond the switch's read 0 and ignore writes.
        group = NET_REGISTERS["group"]
        assert isinstance(group, RegisterArray)
        group_ip = Array(Signal(32, name=f"group_ip_{j}") for j in range(self._jobs))
        group_port = Array(Signal(16, name=f"group_port_{j}") for j in range(self._jobs))
        group_span = group.field_bits + group.index_bits
        group_index = addr[group.field_bits:group_span]
        with m.If(self.ctrl.we & (addr[group_span:] == group.base >> group_span)
                  & (group_index < self._jobs)):
            with m.If(addr[:group.field_bits] == group.field("port").address):
                m.d.sync += group_port[group_index].eq(self.ctrl.wdata)
            with m.Else():
                m.d.sync += group_ip[group_index].eq(self.ctrl.wdata)
        known_job = self.group.job < self._jobs
        m.d.comb += [
            self.group.entry.ip_address.eq(Mux(known_job, group_ip[self.group.job], 0)),
            self.group.entry.port.eq(Mux(known_job, group_port[self.group.job], 0)),
        ]

        # A read answers two clocks after `re` (REGISTER_READ_LATENCY), in two steps
        # that run on every clock (a read has no side effect here): the address is
        # decoded into registers (which block of 32 registers, which one in it), then
        # the register is selected from them. Neither step has the other's logic in front.
        sources = {address: self.counters[name]
                   for name, address in NET_REGISTERS["counter"].items()}
        for name, constant in self._constants.items():
            register = NET_REGISTERS[name]
            sources[register.address] = Const(constant & ((1 << register.width) - 1), 32)
        sources[NET_REGISTERS["link"].address] = self.link
        for j in range(self._jobs):
            sources[group.address(j, "ip")] = group_ip[j]
            sources[group.address(j, "port")] = group_port[j]
        if self.authenticated:
            auth_events = Signal(AuthEvents)
            m.d.sync += auth_events.eq(self.auth_events)
            for name, address in AUTH_REGISTERS["auth_counter"].items():
                counter = Signal(32, name=f"auth_{name}")
                with m.If(auth_events[name] != 0):
                    m.d.sync += counter.eq(counter + auth_events[name])
                sources[address] = counter
            sources[AUTH_REGISTERS["write_counter_low"].address] = self.write_counter[:32]
            sources[AUTH_REGISTERS["write_counter_high"].address] = self.write_counter[32:]
            features = AUTH_FEATURE_CONTROL | (AUTH_FEATURE_JOBS if self.job_auth else 0)
            sources[AUTH_REGISTERS["auth_features"].address] = Const(features, 32)
        if self.job_auth:
            self._job_auth(m, addr, sources)
        block_bits = 5
        blocks = sorted({address >> block_bits for address in sources})
        index = Signal(block_bits)
        in_block = Signal(len(blocks))
        read_table = Signal()
        m.d.sync += [index.eq(addr[:block_bits]), read_table.eq(in_table)]
        selected = []
        for k, block in enumerate(blocks):
            m.d.sync += in_block[k].eq(addr[block_bits:] == block)
            entries = Array(sources.get(block << block_bits | j, Const(0, 32))
                            for j in range(1 << block_bits))
            selected.append(Mux(in_block[k], entries[index], 0))
        value = Signal(32)
        table_value = Signal(32)
        answer_table = Signal()
        m.d.sync += [value.eq(reduce(operator.or_, selected)),
                     table_value.eq(table.reg_rdata), answer_table.eq(read_table)]
        m.d.comb += self.ctrl.rdata.eq(Mux(answer_table, table_value, value))
        return m

    def _job_auth(self, m, addr, sources):
        """Each job's ``job_auth`` registers (section 7): written and read like the group
        registers; the jobs beyond the switch's read 0 and ignore writes."""
        array = AUTH_REGISTERS["job_auth"]
        assert isinstance(array, RegisterArray)
        span = array.field_bits + array.index_bits
        index = addr[array.field_bits:span]
        registers = self.job_auth_registers
        with m.If(self.ctrl.we & (addr[span:] == array.base >> span) & (index < self._jobs)):
            for j in range(self._jobs):
                with m.If(index == j):
                    with m.If(addr[:array.field_bits] == array.field("enable").address):
                        m.d.sync += registers[j].enable.eq(self.ctrl.wdata[0])
                    with m.Elif(addr[:array.field_bits] == array.field("epoch").address):
                        m.d.sync += registers[j].epoch.eq(self.ctrl.wdata)
        for j in range(self._jobs):
            sources[array.address(j, "enable")] = registers[j].enable
            sources[array.address(j, "epoch")] = registers[j].epoch
