"""The aggregator's worker table: where worker w of job j receives results (network.md s. 3).

Entry (job, worker) holds an IPv4 address and a UDP port; port 0 means "no worker". The
control service writes it (``contract.registers.NET_REGISTERS["worker"]``); two lookup
ports read it: the switch's source check (is this datagram from the worker it claims to
be?) and the result fan-out (where do the job's results go?). A board holds entries for
its switch's ``jobs`` x ``max_workers``; the other entries of the address map read 0 and
ignore writes.

An entry's address and port are two registers, written one at a time: a host that
rewrites a live entry writes the port 0 first, then the address, then the port.
"""
from __future__ import annotations

from amaranth import Cat, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from contract.registers import MAX_JOBS_IN_TABLE, MAX_WORKERS_IN_TABLE

__all__ = ["WorkerEntry", "LookupSignature", "GroupLookup", "WorkerTable"]

WorkerEntry = data.StructLayout({"ip_address": 32, "port": 16})

#: A read port of the table, seen from its user: ``job``/``worker`` sampled while ``en``
#: is high, ``entry`` and ``valid`` (the pair is inside the table) the clock after, held
#: while ``en`` is low.
LookupSignature = wiring.Signature({
    "job": Out(8),
    "worker": Out(8),
    "en": Out(1),
    "entry": In(WorkerEntry),
    "valid": In(1),
})

#: A job's result group, seen from its user: ``entry`` is job ``job``'s group (address and
#: port, 0 where none or the job is beyond the table), combinationally.
GroupLookup = wiring.Signature({
    "job": Out(8),
    "entry": In(WorkerEntry),
})


class WorkerTable(wiring.Component):
    """``jobs`` x ``max_workers`` entries, two lookup ports and a register port.

    Parameters
    ----------
    jobs : int
        Jobs of the switch (1..64).
    max_workers : int
        Workers per job (1..32).

    Members
    -------
    check, fanout : In(LookupSignature)
        Lookup ports (the source check, the result fan-out).
    reg_entry : In(range(MAX_JOBS_IN_TABLE * MAX_WORKERS_IN_TABLE))
        Entry of a register access: ``job * MAX_WORKERS_IN_TABLE + worker``.
    reg_port_field : In(1)
        0 the address, 1 the port.
    reg_re, reg_we, reg_wdata, reg_rdata
        Read (data the clock after) and write of that field; entries outside the board's
        table read 0 and ignore writes.
    """

    def __init__(self, *, jobs, max_workers):
        if not isinstance(jobs, int) or not 1 <= jobs <= MAX_JOBS_IN_TABLE:
            raise ValueError(f"WorkerTable jobs must be 1..{MAX_JOBS_IN_TABLE}, not {jobs!r}")
        if not isinstance(max_workers, int) or not 1 <= max_workers <= MAX_WORKERS_IN_TABLE:
            raise ValueError(f"WorkerTable max_workers must be 1..{MAX_WORKERS_IN_TABLE}, "
                             f"not {max_workers!r}")
        self.jobs, self.max_workers = jobs, max_workers
        self._worker_bits = max(1, ceil_log2(max_workers))
        self._job_bits = max(1, ceil_log2(jobs))
        super().__init__({
            "check": In(LookupSignature),
            "fanout": In(LookupSignature),
            "reg_entry": In(range(MAX_JOBS_IN_TABLE * MAX_WORKERS_IN_TABLE)),
            "reg_port_field": In(1),
            "reg_re": In(1),
            "reg_we": In(1),
            "reg_wdata": In(32),
            "reg_rdata": Out(32),
        })

    def _index(self, job, worker):
        """(memory address, inside the table) of a (job, worker) pair."""
        inside = (job < self.jobs) & (worker < self.max_workers)
        return Cat(worker[:self._worker_bits], job[:self._job_bits]), inside

    def elaborate(self, platform):
        m = Module()
        depth = 1 << (self._worker_bits + self._job_bits)
        # Two 16-bit lanes of address and one of port, written separately.
        m.submodules.memory = memory = Memory(shape=WorkerEntry.size, depth=depth, init=[])
        write = memory.write_port(granularity=16)

        for name in ("check", "fanout"):
            port = getattr(self, name)
            read = memory.read_port()
            address, inside = self._index(port.job, port.worker)
            valid = Signal(name=f"{name}_valid")
            m.d.comb += [read.addr.eq(address), read.en.eq(port.en),
                         port.entry.as_value().eq(read.data), port.valid.eq(valid)]
            with m.If(port.en):
                m.d.sync += valid.eq(inside)

        # Register access: entry = job * MAX_WORKERS_IN_TABLE + worker.
        worker_field_bits = ceil_log2(MAX_WORKERS_IN_TABLE)
        job = Signal(8)
        worker = Signal(8)
        m.d.comb += [worker.eq(self.reg_entry[:worker_field_bits]),
                     job.eq(self.reg_entry[worker_field_bits:])]
        address, inside = self._index(job, worker)
        read = memory.read_port()
        m.d.comb += [read.addr.eq(address), read.en.eq(self.reg_re),
                     write.addr.eq(address),
                     write.data.eq(Cat(self.reg_wdata, self.reg_wdata[:16]))]
        with m.If(self.reg_we & inside):
            m.d.comb += write.en.eq(Mux(self.reg_port_field, 0b100, 0b011))
        was_inside = Signal()
        was_port = Signal()
        with m.If(self.reg_re):
            m.d.sync += [was_inside.eq(inside), was_port.eq(self.reg_port_field)]
        stored = data.View(WorkerEntry, read.data)
        m.d.comb += self.reg_rdata.eq(
            Mux(was_inside, Mux(was_port, stored.port, stored.ip_address), 0))
        return m
