"""The aggregator's control registers: job configuration, slot clearing, counters.

The register map is ``contract.registers.SWITCH_REGISTERS`` (job array, counter block,
parameters); read data is valid the cycle after the read strobe and held until the next read.
The decoder below takes every address, stride and field from that declaration.

A commit (the value ``contract.registers.COMMIT`` written to a job's ``commit`` register;
any other value does nothing) waits until the engine is drained (it stops taking new
packets meanwhile), then applies the pending values and clears the metadata of the job's
slots, one slot per clock. A configuration the hardware cannot hold (``n > max_workers``,
an empty range or one beyond the pool, a range overlapping another configured job's) is
rejected: the job becomes unconfigured and the status bit ``JobStatus.REJECTED`` is set;
the status of a job beyond the engine's ``jobs`` always reads rejected. Commits of several
jobs queue, one per job, a clock apart. Reads of the job registers return the pending
values, as the reference model's do.
"""
import dataclasses

from amaranth import Array, Cat, Module, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out
from amaranth.hdl import unsigned
from amaranth.utils import ceil_log2

from contract.counters import AGG_COUNTERS
from contract.registers import (COMMIT, SWITCH_REGISTERS, JobStatus, switch_limits_word,
                                switch_params_word)
from hdl.ctrl_port import RegisterPort

__all__ = ["AggControl", "ActiveJob"]

_JOB = SWITCH_REGISTERS["job"]
_UPSTREAM = SWITCH_REGISTERS["upstream"]
_COUNTERS = SWITCH_REGISTERS["counter"]
_PARAMS = SWITCH_REGISTERS["params"]
_LIMITS = SWITCH_REGISTERS["limits"]
assert JobStatus.BUSY == 1   # the status word's bit 0 is `busy` itself
_REJECTED_BIT = JobStatus.REJECTED.bit_length() - 1
_FIELD = {name: _JOB.field(name).address
          for name in ("workers", "slot_base", "slot_count", "commit")}
_UP_FIELDS = tuple(f.name for f in _UPSTREAM.fields)    # ip, port, job, worker
assert _JOB.field_bits == _UPSTREAM.field_bits and _JOB.index_bits == _UPSTREAM.index_bits

#: One job's active configuration, as the network front end sees every job's at once
#: (``AggControl.active``): the slot range, and the upstream (aggregator-protocol.md
#: section 4) that its completed slots go to (``upstream`` 0: none).
ActiveJob = data.StructLayout({
    "base": unsigned(16),
    "end": unsigned(17),
    "upstream": unsigned(1),
    "up_ip": unsigned(_UPSTREAM.field("ip").width),
    "up_port": unsigned(_UPSTREAM.field("port").width),
    "up_job": unsigned(_UPSTREAM.field("job").width),
    "up_worker": unsigned(_UPSTREAM.field("worker").width),
})


@dataclasses.dataclass(frozen=True)
class _Jobs:
    """The jobs' configuration registers (pending and active, per job; the upstream
    registers by field), the commit requests and refusals, and the register port's decoded
    address (job, field, a job register, an upstream register)."""
    pend_workers: Array
    pend_base: Array
    pend_count: Array
    act_workers: Array
    act_base: Array
    act_end: Array
    pend_up: dict
    act_up: dict
    act_upstream: Signal
    commit_req: Signal
    rejected: Signal
    reg_job: object
    reg_field: object
    job_reg: object
    up_reg: object


class AggControl(wiring.Component):
    """Register file of the aggregator (see the module docstring for the map).

    Parameters
    ----------
    slots, lanes, max_workers, jobs : int
        The engine's parameters (checked by the engine).

    Attributes
    ----------
    ctrl : In(RegisterPort())
        The register port.
    count_inc : Signal(len(AGG_COUNTERS)), in
        One strobe per counter: add one this cycle.
    lookup_job : Signal(8), in
        Job number to look up (combinationally) for the header checks.
    lookup_configured, lookup_workers, lookup_base, lookup_end : Signal, out
        Its active configuration; ``lookup_configured`` is 0 for a job beyond ``jobs``.
    lookup_upstream, lookup_up_job, lookup_up_worker : Signal, out
        Whether it has an upstream, the upstream's job and its worker number there.
    active : Out(ArrayLayout(ActiveJob, jobs))
        Every job's active slot range and upstream at once (for the network front end's copy).
    drained : Signal(1), in
        The engine holds no packet (nothing in flight, between packets at the input).
    busy : Signal(1), out
        A commit is waiting or slots are being cleared: the engine must not start packets.
    clear_en, clear_slot : Signal, out
        Metadata row to clear this cycle (only while ``busy`` and drained).
    commit_done, commit_job, commit_configured : Signal, out
        A strobe the clock after a commit of ``commit_job`` is granted (``active`` holds
        what it applied by then), and whether the job is configured after it (section 7's
        job authentication follows the job's commit: the network front end's copy).
    """

    def __init__(self, *, slots, lanes, max_workers, jobs):
        self._slots, self._lanes, self._max_workers, self._jobs = slots, lanes, max_workers, jobs
        super().__init__({
            "ctrl": In(RegisterPort()),
            "count_inc": In(len(AGG_COUNTERS)),
            "lookup_job": In(8),
            "lookup_configured": Out(1),
            "lookup_workers": Out(range(max_workers + 1)),
            "lookup_base": Out(16),
            "lookup_end": Out(17),
            "lookup_upstream": Out(1),
            "lookup_up_job": Out(8),
            "lookup_up_worker": Out(8),
            "active": Out(data.ArrayLayout(ActiveJob, jobs)),
            "drained": In(1),
            "busy": Out(1),
            "clear_en": Out(1),
            "clear_slot": Out(range(slots)),
            "commit_done": Out(1),
            "commit_job": Out(range(jobs)),
            "commit_configured": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        W, J = self._max_workers, self._jobs

        # Pending values hold the full 32-bit writes so that a commit can reject what does
        # not fit instead of silently truncating it.
        pend_workers = Array(Signal(32, name=f"pend_workers{j}") for j in range(J))
        pend_base = Array(Signal(32, name=f"pend_base{j}") for j in range(J))
        pend_count = Array(Signal(32, name=f"pend_count{j}") for j in range(J))
        act_workers = Array(Signal(range(W + 1), name=f"act_workers{j}") for j in range(J))
        act_base = Array(Signal(16, name=f"act_base{j}") for j in range(J))
        act_end = Array(Signal(17, name=f"act_end{j}") for j in range(J))
        # Each job's upstream registers, pending and active (written and read as declared).
        pend_up = {f: Array(Signal(_UPSTREAM.field(f).width, name=f"pend_up_{f}{j}")
                            for j in range(J)) for f in _UP_FIELDS}
        act_up = {f: Array(Signal(_UPSTREAM.field(f).width, name=f"act_up_{f}{j}")
                           for j in range(J)) for f in _UP_FIELDS}
        act_upstream = Signal(J)
        commit_req = Signal(J)
        rejected = Signal(J)
        counters = Array(Signal(32, name=f"counter_{name}") for name in AGG_COUNTERS)

        # -- lookup for the header checks ---------------------------------------------
        job_bits = max(1, ceil_log2(J))
        job_index = self.lookup_job[:job_bits]
        in_range = self.lookup_job < J
        m.d.comb += [
            self.lookup_workers.eq(act_workers[job_index]),
            self.lookup_base.eq(act_base[job_index]),
            self.lookup_end.eq(act_end[job_index]),
            self.lookup_configured.eq(in_range & (act_workers[job_index] != 0)),
            self.lookup_upstream.eq(act_upstream.bit_select(job_index, 1)),
            self.lookup_up_job.eq(act_up["job"][job_index]),
            self.lookup_up_worker.eq(act_up["worker"][job_index]),
        ]
        for j in range(J):
            m.d.comb += [
                self.active[j].base.eq(act_base[j]),
                self.active[j].end.eq(act_end[j]),
                self.active[j].upstream.eq(act_upstream[j]),
            ] + [self.active[j][f"up_{f}"].eq(act_up[f][j]) for f in _UP_FIELDS]

        # -- counters ---------------------------------------------------------------------
        for i in range(len(AGG_COUNTERS)):
            with m.If(self.count_inc[i]):
                m.d.sync += counters[i].eq(counters[i] + 1)

        # -- register writes --------------------------------------------------------------
        reg_job = self.ctrl.addr[_JOB.field_bits:_JOB.field_bits + _JOB.index_bits]
        reg_field = self.ctrl.addr[:_JOB.field_bits]
        job_reg = (self.ctrl.addr < _JOB.end) & (reg_job < J)
        with m.If(self.ctrl.we & job_reg):
            with m.Switch(reg_field):
                with m.Case(_FIELD["workers"]):
                    m.d.sync += pend_workers[reg_job].eq(self.ctrl.wdata)
                with m.Case(_FIELD["slot_base"]):
                    m.d.sync += pend_base[reg_job].eq(self.ctrl.wdata)
                with m.Case(_FIELD["slot_count"]):
                    m.d.sync += pend_count[reg_job].eq(self.ctrl.wdata)
                # The commit field is handled with the grant logic below, so a grant in
                # the same cycle cannot lose a new request.
        up_reg = ((self.ctrl.addr >= _UPSTREAM.base) & (self.ctrl.addr < _UPSTREAM.end)
                  & (reg_job < J))
        with m.If(self.ctrl.we & up_reg):
            with m.Switch(reg_field):
                for f in _UP_FIELDS:
                    with m.Case(_UPSTREAM.field(f).address):
                        m.d.sync += pend_up[f][reg_job].eq(self.ctrl.wdata)

        jobs = _Jobs(pend_workers=pend_workers, pend_base=pend_base, pend_count=pend_count,
                     act_workers=act_workers, act_base=act_base, act_end=act_end,
                     pend_up=pend_up, act_up=act_up, act_upstream=act_upstream,
                     commit_req=commit_req, rejected=rejected, reg_job=reg_job,
                     reg_field=reg_field, job_reg=job_reg, up_reg=up_reg)
        self._commit(m, jobs)
        self._reads(m, jobs, counters)
        return m

    def _commit(self, m, jobs):
        """A job's commit: wait for the engine to drain, apply what fits, clear its slots."""
        S, W, J = self._slots, self._max_workers, self._jobs
        pend_workers, pend_base, pend_count = jobs.pend_workers, jobs.pend_base, jobs.pend_count
        act_workers, act_base, act_end = jobs.act_workers, jobs.act_base, jobs.act_end
        pend_up, act_up, act_upstream = jobs.pend_up, jobs.act_up, jobs.act_upstream
        commit_req, rejected = jobs.commit_req, jobs.rejected
        reg_job, reg_field, job_reg = jobs.reg_job, jobs.reg_field, jobs.job_reg
        clearing = Signal()
        clear_slot = Signal(range(S))
        clear_last = Signal(range(S))
        m.d.comb += [
            self.busy.eq((commit_req != 0) | clearing),
            self.clear_en.eq(clearing),
            self.clear_slot.eq(clear_slot),
        ]
        with m.If(clearing):
            m.d.sync += clear_slot.eq(clear_slot + 1)
            with m.If(clear_slot == clear_last):
                m.d.sync += clearing.eq(0)

        # What a commit of each job would apply, registered a clock behind the pending
        # values (a commit request comes at least a clock after the values it commits), so
        # a grant only selects: the 32-bit compares and adds stay off its path.
        snap_fits = Signal(J)
        snap_clear = Signal(J)
        snap_workers = Array(Signal(range(W + 1), name=f"snap_workers{j}") for j in range(J))
        snap_base = Array(Signal(range(S), name=f"snap_base{j}") for j in range(J))
        snap_end = Array(Signal(17, name=f"snap_end{j}") for j in range(J))
        snap_last = Array(Signal(range(S), name=f"snap_last{j}") for j in range(J))
        snap_upstream = Signal(J)
        for j in range(J):
            m.d.sync += snap_upstream[j].eq((pend_up["ip"][j] != 0) & (pend_up["port"][j] != 0))
            workers, base, count = pend_workers[j], pend_base[j], pend_count[j]
            # Isolation in hardware (aggregator-protocol.md section 2): a range that
            # overlaps another configured job's is refused, so one job's packets can never
            # reach another job's slots.
            overlaps = [(act_workers[other] != 0) & (base < act_end[other])
                        & (act_base[other] < base + count)
                        for other in range(J) if other != j]
            m.d.sync += [
                snap_fits[j].eq((workers == 0) |
                                ((workers <= W) & (base < S) & (count != 0) & (count <= S) &
                                 (base + count <= S) & ~Cat(*overlaps).any())),
                snap_clear[j].eq((workers != 0) & (count != 0)),
                snap_workers[j].eq(workers),
                snap_base[j].eq(base),
                snap_end[j].eq(base + count),
                snap_last[j].eq(base + count - 1),
            ]

        # Lowest requested job first.
        grant_job = Signal(range(J))
        for j in reversed(range(J)):
            with m.If(commit_req[j]):
                m.d.comb += grant_job.eq(j)
        # A clock between grants: the snapshots above compare with the active ranges as
        # they were a clock ago, so a commit right after another would miss its change.
        granted = Signal()
        grant = (commit_req != 0) & ~clearing & ~granted & self.drained
        m.d.sync += [granted.eq(grant), self.commit_done.eq(grant),
                     self.commit_job.eq(grant_job),
                     self.commit_configured.eq(snap_fits.bit_select(grant_job, 1)
                                               & (snap_workers[grant_job] != 0))]
        req_next = Signal(J)
        m.d.comb += req_next.eq(commit_req)
        with m.If(grant):
            m.d.comb += req_next.bit_select(grant_job, 1).eq(0)
            with m.If(snap_fits.bit_select(grant_job, 1)):
                m.d.sync += [
                    act_workers[grant_job].eq(snap_workers[grant_job]),
                    act_base[grant_job].eq(snap_base[grant_job]),
                    act_end[grant_job].eq(snap_end[grant_job]),
                    act_upstream.bit_select(grant_job, 1).eq(
                        snap_upstream.bit_select(grant_job, 1)),
                    rejected.bit_select(grant_job, 1).eq(0),
                ] + [act_up[f][grant_job].eq(pend_up[f][grant_job]) for f in _UP_FIELDS]
                with m.If(snap_clear.bit_select(grant_job, 1)):
                    m.d.sync += [
                        clearing.eq(1),
                        clear_slot.eq(snap_base[grant_job]),
                        clear_last.eq(snap_last[grant_job]),
                    ]
            with m.Else():
                m.d.sync += [
                    act_workers[grant_job].eq(0),
                    act_base[grant_job].eq(0),
                    act_end[grant_job].eq(0),
                    act_upstream.bit_select(grant_job, 1).eq(0),
                    rejected.bit_select(grant_job, 1).eq(1),
                ]
        with m.If(self.ctrl.we & job_reg & (reg_field == _FIELD["commit"])
                  & (self.ctrl.wdata == COMMIT)):
            m.d.comb += req_next.bit_select(reg_job, 1).eq(1)
        m.d.sync += commit_req.eq(req_next)


    def _reads(self, m, jobs, counters):
        """Register reads: the jobs' pending values and status, the counters, the
        parameters."""
        W, J = self._max_workers, self._jobs
        reg_job, reg_field, job_reg = jobs.reg_job, jobs.reg_field, jobs.job_reg
        with m.If(self.ctrl.re):
            with m.If(job_reg):
                with m.Switch(reg_field):
                    with m.Case(_FIELD["workers"]):
                        m.d.sync += self.ctrl.rdata.eq(jobs.pend_workers[reg_job])
                    with m.Case(_FIELD["slot_base"]):
                        m.d.sync += self.ctrl.rdata.eq(jobs.pend_base[reg_job])
                    with m.Case(_FIELD["slot_count"]):
                        m.d.sync += self.ctrl.rdata.eq(jobs.pend_count[reg_job])
                    with m.Case(_FIELD["commit"]):
                        m.d.sync += self.ctrl.rdata.eq(
                            self.busy | (jobs.rejected.bit_select(reg_job, 1) << _REJECTED_BIT))
            with m.Elif(jobs.up_reg):
                with m.Switch(reg_field):
                    for f in _UP_FIELDS:
                        with m.Case(_UPSTREAM.field(f).address):
                            m.d.sync += self.ctrl.rdata.eq(jobs.pend_up[f][reg_job])
                    with m.Default():
                        m.d.sync += self.ctrl.rdata.eq(0)
            with m.Elif((self.ctrl.addr < _JOB.end) & (reg_field == _FIELD["commit"])):
                # A job beyond the engine's: every commit to it is refused.
                m.d.sync += self.ctrl.rdata.eq(JobStatus.REJECTED)
            with m.Elif((self.ctrl.addr >= _COUNTERS.base)
                        & (self.ctrl.addr < _COUNTERS.end)):
                m.d.sync += self.ctrl.rdata.eq(counters[self.ctrl.addr - _COUNTERS.base])
            with m.Elif(self.ctrl.addr == _PARAMS.address):
                m.d.sync += self.ctrl.rdata.eq(switch_params_word(slots=self._slots,
                                                                  lanes=self._lanes))
            with m.Elif(self.ctrl.addr == _LIMITS.address):
                m.d.sync += self.ctrl.rdata.eq(switch_limits_word(jobs=J, max_workers=W))
            with m.Else():
                m.d.sync += self.ctrl.rdata.eq(0)
