"""The switch's results to the job's workers (network.md section 3).

A multicast result (worker ``0xFF``) goes as one datagram to each of workers ``0 .. n - 1``
of its job (``n`` the job's configured workers, :mod:`hdl.net.front_end.job_workers`) whose
worker-table entry is set (port not 0); a unicast answer to a retransmission goes to the
retransmitting worker's entry. The result is stored once in the switch's output buffer and
sent once per worker (the buffer's ``replay``). The next destination is looked up while the
current copy is being sent, so a result's copies follow each other at the pace of the
transmit path; the table is read as each copy is addressed, so the workers of a job are
those with an entry at that moment. ``n`` is read once per result, as the result reaches
the output, and registered: the search for its first copy starts a clock later (``START``),
so the job-workers lookup, ``n - 1`` and the search's bounds are not one path in one clock.

A job may have a result group (its ``group`` registers, both fields set): its multicast
results then leave once, to the group's address and port, without a search (the network's
switches copy them to the members); unicast answers still go to the worker's entry. The
group is looked up with ``n`` and registered beside it.

An aggregate the engine sends upstream (aggregator-protocol.md section 4; tagged
``upstream`` with its leaf job, :class:`~hdl.net.front_end.upstream.SlotOwner`) leaves
once, to the leaf job's upstream address and port (looked up with ``n``), without a
search.

A result whose job has no worker to go to (an unconfigured job, or no entry among its
workers) goes nowhere (``undeliverable``): the host cleared the table or reconfigured the
job while the job was running.
"""
from __future__ import annotations

import dataclasses

from amaranth import Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from contract.header import WORKER_MULTICAST
from hdl.net.front_end.job_workers import JobWorkersLookup
from hdl.net.front_end.layouts import TxBeat, egress_word
from hdl.net.front_end.worker_table import GroupLookup, LookupSignature, WorkerEntry

__all__ = ["ResultTag", "FanOut"]

#: What the switch's output buffer keeps about a result: its job and worker fields, or for
#: an aggregate going upstream the leaf's job and ``upstream`` set.
ResultTag = data.StructLayout({"job": 8, "worker": 8, "upstream": 1})


@dataclasses.dataclass(frozen=True)
class _Search:
    """What the search hands the sending side: the job it searches, whether it is still
    searching, its start controls, and the worker it found (number and entry)."""
    job: Signal
    searching: Signal
    start: Signal
    start_from: Signal
    start_to: Signal
    found: Signal
    found_w: Signal
    found_entry: Signal


class FanOut(wiring.Component):
    """Addresses each stored result to its workers, one datagram per worker.

    Parameters
    ----------
    port : int
        The switch service's UDP port (the results' source port).
    max_workers : int
        Workers per job in the table.

    Members
    -------
    i : In(stream.Signature(egress_word(ResultTag)))
        Results, from the switch's output buffer.
    replay : Out(1)
        To the buffer: send the result again (another worker follows).
    o : Out(stream.Signature(TxBeat))
    table : Out(LookupSignature)
    jobs : Out(JobWorkersLookup)
        Each job's configured workers (combinational).
    group : Out(GroupLookup)
        Each job's result group (combinational).
    sent : Out(1)
        One strobe per datagram handed on.
    group_sent : Out(1)
        One strobe per datagram handed on to a job's group (each also a ``sent``).
    upstream_sent : Out(1)
        One strobe per aggregate handed on to a job's upstream (each also a ``sent``).
    undeliverable : Out(1)
        One strobe per result that had no worker to go to.
    """

    def __init__(self, *, port, max_workers):
        if not isinstance(max_workers, int) or not 1 <= max_workers <= 32:
            raise ValueError(f"FanOut max_workers must be 1..32, not {max_workers!r}")
        self.port, self.max_workers = port, max_workers
        super().__init__({
            "i": In(stream.Signature(egress_word(ResultTag))),
            "replay": Out(1),
            "o": Out(stream.Signature(TxBeat)),
            "table": Out(LookupSignature),
            "jobs": Out(JobWorkersLookup),
            "group": Out(GroupLookup),
            "sent": Out(1),
            "group_sent": Out(1),
            "upstream_sent": Out(1),
            "undeliverable": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        i, o = self.i, self.o
        W = self.max_workers
        search = self._search(m)
        job, searching, start, start_from, start_to = (
            search.job, search.searching, search.start, search.start_from, search.start_to)
        found, found_w, found_entry = search.found, search.found_w, search.found_entry

        # -- sending ----------------------------------------------------------------------
        entry = Signal(WorkerEntry)      # the copy being sent goes here
        multicast = Signal()
        last_w = Signal(range(W))        # a multicast result's last worker, n - 1
        # The result's tag and its job's n, registered in IDLE and used in START: the path
        # from the output's tag through the job-workers lookup, n - 1 and the search's
        # bounds into `last_cand` did not fit one clock (ECP5, 125 MHz).
        tag_worker = Signal(8)
        job_workers = Signal.like(self.jobs.workers)
        workers = Signal(range(W + 1))   # n of the job of the result being started
        group_entry = Signal(WorkerEntry)
        group_set = Signal()             # the job has a result group
        to_group = Signal()              # the copy being sent goes to the job's group
        upward = Signal()                # the result is an aggregate for the job's upstream
        upstream_entry = Signal(WorkerEntry)
        to_upstream = Signal()           # the copy being sent goes to the job's upstream
        m.d.comb += [
            self.jobs.job.eq(i.p.tag.job),
            self.group.job.eq(i.p.tag.job),
            workers.eq(Mux(job_workers > W, W, job_workers)),
        ]
        current_w = Signal(range(W))
        m.d.sync += [self.sent.eq(0), self.group_sent.eq(0), self.upstream_sent.eq(0),
                     self.undeliverable.eq(0)]
        with m.FSM():
            with m.State("IDLE"):
                with m.If(i.valid):
                    m.d.sync += [job.eq(i.p.tag.job), tag_worker.eq(i.p.tag.worker),
                                 multicast.eq(i.p.tag.worker == WORKER_MULTICAST),
                                 job_workers.eq(self.jobs.workers),
                                 group_entry.eq(self.group.entry),
                                 group_set.eq((self.group.entry.ip_address != 0)
                                              & (self.group.entry.port != 0)),
                                 upward.eq(i.p.tag.upstream),
                                 upstream_entry.eq(self.jobs.upstream)]
                    m.next = "START"
            with m.State("START"):
                m.d.comb += start.eq(1)
                m.d.sync += to_upstream.eq(0)
                with m.If(upward):
                    # one copy, to the upstream (none: reconfigured since, it goes nowhere)
                    m.d.comb += start_from.eq(W)
                    m.d.sync += [entry.eq(upstream_entry), to_group.eq(0), to_upstream.eq(1)]
                    with m.If(upstream_entry.port != 0):
                        m.next = "SEND"
                    with m.Else():
                        m.next = "DRAIN"
                with m.Elif(multicast & group_set & (workers != 0)):
                    # one copy, to the group: the search looks at nothing
                    m.d.comb += start_from.eq(W)
                    m.d.sync += [entry.eq(group_entry), to_group.eq(1)]
                    m.next = "SEND"
                with m.Else():
                    m.d.comb += [
                        # an unconfigured job's multicast result searches nothing
                        start_from.eq(Mux(multicast, Mux(workers == 0, W, 0),
                                          Mux(tag_worker < W, tag_worker, W))),
                        start_to.eq(Mux(multicast, workers - 1, tag_worker)),
                    ]
                    m.d.sync += [last_w.eq(workers - 1), to_group.eq(0)]
                    m.next = "FIRST"
            with m.State("FIRST"):
                with m.If(~searching):
                    with m.If(found):
                        m.d.sync += [entry.eq(found_entry), current_w.eq(found_w)]
                        m.d.comb += [start.eq(1), start_from.eq(found_w + 1),
                                     start_to.eq(Mux(multicast, last_w, 0))]
                        with m.If(~multicast):
                            m.d.comb += start_from.eq(W)        # one copy only
                        m.next = "SEND"
                    with m.Else():
                        m.next = "DRAIN"
            with m.State("SEND"):
                # The last word waits for the next destination's lookup: it decides replay.
                hold = i.p.last & searching
                m.d.comb += [
                    o.valid.eq(i.valid & ~hold),
                    i.ready.eq(o.ready & ~hold),
                    self.replay.eq(found),
                ]
                with m.If(o.valid & o.ready & o.p.last):
                    m.d.sync += [self.sent.eq(1), self.group_sent.eq(to_group),
                                 self.upstream_sent.eq(to_upstream)]
                    with m.If(found):
                        m.d.sync += [entry.eq(found_entry), current_w.eq(found_w)]
                        m.d.comb += [start.eq(1), start_from.eq(found_w + 1),
                                     start_to.eq(last_w)]
                    with m.Else():
                        m.next = "IDLE"
            with m.State("DRAIN"):
                m.d.comb += [i.ready.eq(1), self.replay.eq(0)]
                with m.If(i.valid & i.p.last):
                    m.d.sync += self.undeliverable.eq(1)
                    m.next = "IDLE"
        m.d.comb += [
            o.p.data.eq(i.p.data),
            o.p.last.eq(i.p.last),
            o.p.last_be.eq(Mux(i.p.last & (i.p.length != 0), 0b1000, 0)),
            o.p.meta.ip_address.eq(entry.ip_address),
            o.p.meta.dst_port.eq(entry.port),
            o.p.meta.src_port.eq(self.port),
            o.p.meta.length.eq(i.p.length),
        ]
        return m

    def _search(self, m):
        """The search: the next worker with an entry, candidates ``cand .. last_cand``;
        started by the sending side (``start``, ``start_from``, ``start_to``)."""
        table = self.table
        W = self.max_workers
        # A lookup's answer is registered before it is judged (`answered`): the table's
        # block RAM output goes into flip-flops, not through a compare into the search's
        # enables. Two lookups may be in flight; the search stops at the first hit.
        job = Signal(8)
        searching = Signal()
        cand = Signal(range(W + 1))
        last_cand = Signal(range(W))
        issued = Signal()                # a lookup of `issued_w` was issued last clock
        issued_w = Signal(range(W))
        answered = Signal()              # ... and the clock before: its answer registered
        answered_w = Signal(range(W))
        answered_entry = Signal(WorkerEntry)
        answered_set = Signal()          # the entry is inside the table and has a port
        found = Signal()
        found_w = Signal(range(W))
        found_entry = Signal(WorkerEntry)
        start = Signal()                 # start a search this clock ...
        start_from = Signal(range(W + 1))  # ... at this candidate ...
        start_to = Signal(range(W))        # ... up to this one
        hit = Signal()
        issue = Signal()                 # look the candidate up (unless the search ends)
        m.d.comb += [
            hit.eq(answered & answered_set),
            issue.eq(searching & ~hit & (cand <= last_cand)),
            # Not gated by `start`: a lookup issued as a new search starts is answered while
            # `issued` is clear and so ignored, and the enable does not wait for the
            # transmit path's decisions that make `start`.
            table.en.eq(issue),
            table.job.eq(job),
            table.worker.eq(cand),
        ]
        m.d.sync += [answered_w.eq(issued_w), answered_entry.eq(table.entry),
                     answered_set.eq(table.valid & (table.entry.port != 0))]
        with m.If(start):
            m.d.sync += [searching.eq(start_from < W), cand.eq(start_from), last_cand.eq(start_to),
                         issued.eq(0), answered.eq(0), found.eq(0)]
        with m.Elif(searching):
            with m.If(hit):
                m.d.sync += [searching.eq(0), issued.eq(0), answered.eq(0), found.eq(1),
                             found_w.eq(answered_w), found_entry.eq(answered_entry)]
            with m.Else():
                m.d.sync += [answered.eq(issued), issued.eq(issue)]
                with m.If(issue):
                    m.d.sync += [issued_w.eq(cand), cand.eq(cand + 1)]
                with m.Elif(~issued & ~answered):
                    m.d.sync += searching.eq(0)    # every candidate's answer was a miss
        return _Search(job=job, searching=searching, start=start, start_from=start_from,
                       start_to=start_to, found=found, found_w=found_w,
                       found_entry=found_entry)
