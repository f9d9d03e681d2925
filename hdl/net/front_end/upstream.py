"""Which job a tree's packet belongs to (aggregator-protocol.md section 4).

Two combinational searches over every job's active configuration (the front end's copy of
the switch's, :class:`~hdl.net.front_end.job_workers.JobWorkers`), each the lowest job
that matches:

- :class:`UpstreamSource`: a result from upstream names the *upstream's* job; the leaf's
  job is the one whose upstream is the datagram's source address and port and has that
  job number. No match: the result is dropped (``drop_result_source``).
- :class:`SlotOwner`: an aggregate the engine sends upstream carries the upstream's job
  number too; the leaf's job, whose upstream it goes to, is the configured job whose slot
  range holds its slot (the switch refuses overlapping ranges, so there is one at most).

A board serves a few jobs (four on every top), so both are a compare per job.
"""
from __future__ import annotations

from amaranth import Module
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from hdl.switch.control import ActiveJob

__all__ = ["UpstreamSource", "SlotOwner"]


def _check_jobs(who, jobs):
    if isinstance(jobs, bool) or not isinstance(jobs, int) or not 1 <= jobs <= 64:
        raise ValueError(f"{who} jobs must be 1..64, not {jobs!r}")


class UpstreamSource(wiring.Component):
    """The leaf job whose upstream sent a result.

    Parameters
    ----------
    jobs : int
        Jobs the switch serves.

    Members
    -------
    active : In(ArrayLayout(ActiveJob, jobs))
    ip_address, port, job : In
        The datagram's source address and port and its header's ``job``.
    match : Out(1)
        Some job's upstream is that source with that job.
    leaf : Out(8)
        The lowest such job.
    """

    def __init__(self, *, jobs):
        _check_jobs("UpstreamSource", jobs)
        self.jobs = jobs
        super().__init__({
            "active": In(data.ArrayLayout(ActiveJob, jobs)),
            "ip_address": In(32),
            "port": In(16),
            "job": In(8),
            "match": Out(1),
            "leaf": Out(8),
        })

    def elaborate(self, platform):
        m = Module()
        for j in reversed(range(self.jobs)):
            a = self.active[j]
            with m.If(a.upstream & (a.up_ip == self.ip_address) & (a.up_port == self.port)
                      & (a.up_job == self.job)):
                m.d.comb += [self.match.eq(1), self.leaf.eq(j)]
        return m


class SlotOwner(wiring.Component):
    """The job with an upstream whose slot range holds a slot.

    Parameters
    ----------
    jobs : int
        Jobs the switch serves.

    Members
    -------
    active : In(ArrayLayout(ActiveJob, jobs))
    slot : In(16)
    match : Out(1)
        A job with an upstream holds the slot.
    job : Out(8)
        That job.
    """

    def __init__(self, *, jobs):
        _check_jobs("SlotOwner", jobs)
        self.jobs = jobs
        super().__init__({
            "active": In(data.ArrayLayout(ActiveJob, jobs)),
            "slot": In(16),
            "match": Out(1),
            "job": Out(8),
        })

    def elaborate(self, platform):
        m = Module()
        for j in reversed(range(self.jobs)):
            a = self.active[j]
            with m.If(a.upstream & (a.base <= self.slot) & (self.slot < a.end)):
                m.d.comb += [self.match.eq(1), self.job.eq(j)]
        return m
