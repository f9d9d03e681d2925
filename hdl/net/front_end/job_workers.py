"""Each job's configured worker count, as the switch engine holds it (network.md section 3).

A multicast result goes to workers ``0 .. n - 1`` of its job, ``n`` the job's *active*
``workers`` (``contract.registers.SWITCH_REGISTERS["job"]``): the value its last accepted
commit applied, 0 after a rejected one or before any. The front end cannot read that from
the switch's register port (a read of ``workers`` returns the pending value, not the
active one), so :class:`JobWorkers` keeps its own copy of the switch's job configuration:
an instance of the engine's very control block (:class:`hdl.switch.control.AggControl`)
that sees every access the control service makes to the switch region and the engine's
``drained`` signal. With the same inputs in the same clocks, that copy holds the same
active configuration as the engine's, clock for clock: pending values, a commit that waits
for the engine to drain, commits of several jobs granted lowest job first, a commit that is
rejected (a range beyond the pool or overlapping another job's, ``n > max_workers``) and
so unconfigures the job, a job beyond the engine's ``jobs`` never configured. Its
register reads and counters are unused (and optimised away).
"""
from __future__ import annotations

from amaranth import Module, Mux
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from contract.registers import MAX_JOBS_IN_TABLE, MAX_WORKERS_IN_TABLE
from hdl.ctrl_port import RegisterWrites
from hdl.net.front_end.worker_table import WorkerEntry
from hdl.switch.control import ActiveJob, AggControl

__all__ = ["JobCommit", "JobWorkersLookup", "JobWorkers"]

#: A job's commit as the switch granted it: a strobe, the job, and whether the job is
#: configured after it (section 7's job authentication is applied by the job's commit).
JobCommit = data.StructLayout({"done": 1, "job": 8, "configured": 1})

#: A combinational lookup, seen from its user: ``workers`` is job ``job``'s active worker
#: count (0: unconfigured, or a job beyond the switch's); ``upstream`` is its upstream
#: aggregator's address (all zero: none; aggregator-protocol.md section 4).
JobWorkersLookup = wiring.Signature({
    "job": Out(8),
    "workers": In(range(MAX_WORKERS_IN_TABLE + 1)),
    "upstream": In(WorkerEntry),
})


class JobWorkers(wiring.Component):
    """The switch's active worker count per job, kept beside the switch.

    Parameters
    ----------
    slots, max_workers, jobs : int
        The switch engine's (all three decide whether a commit is accepted).

    Members
    -------
    writes : In(RegisterWrites())
        The writes the switch's register port gets, in the same clocks (reads change no
        configuration).
    drained : In(1)
        The switch engine's own ``drained`` (it holds no packet): when a commit is granted.
    lookup : In(JobWorkersLookup)
    active : Out(ArrayLayout(ActiveJob, jobs))
        Every job's active slot range and upstream at once.
    commit : Out(JobCommit)
        Each commit the switch grants (``active`` holds what it applied by then).
    """

    def __init__(self, *, slots, max_workers, jobs):
        if not isinstance(jobs, int) or not 1 <= jobs <= MAX_JOBS_IN_TABLE:
            raise ValueError(f"JobWorkers jobs must be 1..{MAX_JOBS_IN_TABLE}, not {jobs!r}")
        if not isinstance(max_workers, int) or not 1 <= max_workers <= MAX_WORKERS_IN_TABLE:
            raise ValueError(f"JobWorkers max_workers must be 1..{MAX_WORKERS_IN_TABLE}, "
                             f"not {max_workers!r}")
        if not isinstance(slots, int) or not 1 <= slots < 1 << 16:
            raise ValueError(f"JobWorkers slots must be 1..65535, not {slots!r}")
        self.slots, self.max_workers, self.jobs = slots, max_workers, jobs
        super().__init__({
            "writes": In(RegisterWrites()),
            "drained": In(1),
            "lookup": In(JobWorkersLookup),
            "active": Out(data.ArrayLayout(ActiveJob, jobs)),
            "commit": Out(JobCommit),
        })

    def elaborate(self, platform):
        m = Module()
        # lanes only sets the `params` register's value, which this copy never serves
        m.submodules.control = control = AggControl(
            slots=self.slots, lanes=1, max_workers=self.max_workers, jobs=self.jobs)
        m.d.comb += [
            control.ctrl.addr.eq(self.writes.addr),
            control.ctrl.wdata.eq(self.writes.wdata),
            control.ctrl.we.eq(self.writes.we),
            control.ctrl.re.eq(0),
            control.count_inc.eq(0),
            control.drained.eq(self.drained),
            control.lookup_job.eq(self.lookup.job),
            self.lookup.workers.eq(Mux(control.lookup_configured, control.lookup_workers, 0)),
            self.active.eq(control.active),
            self.commit.done.eq(control.commit_done),
            self.commit.job.eq(control.commit_job),
            self.commit.configured.eq(control.commit_configured),
        ]
        # The upstream of a job beyond the switch's reads as none.
        job_bits = max(1, (self.jobs - 1).bit_length())
        with m.If(self.lookup.job < self.jobs):
            chosen = control.active[self.lookup.job[:job_bits]] if self.jobs > 1 \
                else control.active[0]
            with m.If(chosen.upstream):
                m.d.comb += [self.lookup.upstream.ip_address.eq(chosen.up_ip),
                             self.lookup.upstream.port.eq(chosen.up_port)]
        return m
