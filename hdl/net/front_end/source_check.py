"""The switch's source check: an ``AGG`` datagram must come from its (job, worker) entry.

network.md section 3: the aggregator accepts a datagram only when its source IP address
and UDP port are the worker-table entry of the (job, worker) its header names, so that a
host can contribute neither for another worker nor for another job. The check looks the
entry up as the datagram's first beat goes by and marks the datagram's last beat ``drop``
when the source is wrong (the input buffer then forgets it), counting it once.

A datagram with ``RESULT`` set is a result from a job's upstream (aggregator-protocol.md
section 4): it passes only when its source address and port and its ``job`` are some
configured job's upstream (:class:`~hdl.net.front_end.upstream.UpstreamSource`), and then
leaves with that leaf job's number in ``job``, as the engine expects it; otherwise it is
dropped and counted apart (``drop_result_source``).

Datagrams too short to name a (job, worker) (under 7 bytes) pass unchecked: the engine
drops them as the short packets they are.
"""
from __future__ import annotations

from amaranth import Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from contract.header import HEADER_FIELDS, Flags
from hdl.net.front_end.layouts import WideBeat
from hdl.net.front_end.upstream import UpstreamSource
from hdl.net.front_end.worker_table import LookupSignature
from hdl.switch.control import ActiveJob

__all__ = ["SourceCheck"]

_FIELDS = {f.name: f for f in HEADER_FIELDS}
JOB_BYTE = _FIELDS["job"].offset
WORKER_BYTE = _FIELDS["worker"].offset
FLAGS_BYTE = _FIELDS["flags"].offset
RESULT_BIT = Flags.RESULT.bit_length() - 1
#: A datagram names a (job, worker) when it reaches the worker byte.
MIN_CHECKED_LENGTH = WORKER_BYTE + 1


class SourceCheck(wiring.Component):
    """Marks datagrams whose source is not their (job, worker) table entry, or for a result
    not a job's upstream; latency 3.

    Parameters
    ----------
    jobs : int
        Jobs the switch serves.

    Members
    -------
    i : In(stream.Signature(WideBeat))
    o : Out(stream.Signature(WideBeat))
        The same beats; ``drop`` set on the last beat of a refused datagram; a result from
        upstream with its leaf job's number in ``job``.
    table : Out(LookupSignature)
    active : In(ArrayLayout(ActiveJob, jobs))
        Every job's active configuration (its upstream).
    bad_source : Out(1)
        One strobe per refused datagram that the core did not flag ``error``.
    result_source : Out(1)
        The same, for a refused result (``RESULT`` set): counted apart.
    """

    def __init__(self, *, jobs):
        self.jobs = jobs
        super().__init__({
            "i": In(stream.Signature(WideBeat)),
            "o": Out(stream.Signature(WideBeat)),
            "table": Out(LookupSignature),
            "active": In(data.ArrayLayout(ActiveJob, jobs)),
            "bad_source": Out(1),
            "result_source": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        i, o = self.i, self.o
        # A three-register pipe that moves as a whole: the table's answer to the lookup made
        # as a beat enters the first register is there when the beat leaves it, and is
        # compared with the beat's source into the second (the table's block RAM output and
        # the 48-bit compare, then the decision, each a clock of their own).
        advance = Signal()
        m.d.comb += [advance.eq(~o.valid | o.ready), i.ready.eq(advance)]

        first_in = Signal(init=1)
        stage = Signal(WideBeat)
        stage_valid = Signal()
        stage_first = Signal()
        m.d.comb += [
            self.table.en.eq(advance),
            self.table.job.eq(i.p.data.word_select(JOB_BYTE, 8)),
            self.table.worker.eq(i.p.data.word_select(WORKER_BYTE, 8)),
        ]
        entry = self.table.entry
        m.submodules.upstream = upstream = UpstreamSource(jobs=self.jobs)
        checked_length = stage.meta.length >= MIN_CHECKED_LENGTH
        is_result = checked_length & stage.data.word_select(FLAGS_BYTE, 8)[RESULT_BIT]
        m.d.comb += [
            upstream.active.eq(self.active),
            upstream.ip_address.eq(stage.meta.ip_address),
            upstream.port.eq(stage.meta.src_port),
            upstream.job.eq(stage.data.word_select(JOB_BYTE, 8)),
        ]
        matches = Signal()
        m.d.comb += matches.eq(
            ~checked_length
            | Mux(is_result, upstream.match,
                  self.table.valid & (entry.port != 0) & (entry.port == stage.meta.src_port)
                  & (entry.ip_address == stage.meta.ip_address)))
        checked = Signal(WideBeat)
        checked_valid = Signal()
        checked_first = Signal()
        checked_matches = Signal()
        checked_result = Signal()    # the first beat in `checked` is a result's
        checked_leaf = Signal(8)
        refused = Signal()           # the datagram in the checked register, once decided
        refused_result = Signal()
        refuse_now = Signal()
        refuse_result = Signal()
        m.d.comb += [refuse_now.eq(Mux(checked_first, ~checked_matches, refused)),
                     refuse_result.eq(Mux(checked_first, checked_result, refused_result))]

        m.d.sync += [self.bad_source.eq(0), self.result_source.eq(0)]
        with m.If(advance):
            m.d.sync += [stage_valid.eq(i.valid), checked_valid.eq(stage_valid),
                         o.valid.eq(checked_valid)]
            with m.If(i.valid):
                m.d.sync += [stage.eq(i.p), stage_first.eq(first_in), first_in.eq(i.p.last)]
            with m.If(stage_valid):
                m.d.sync += [checked.eq(stage), checked_first.eq(stage_first),
                             checked_matches.eq(matches),
                             checked_result.eq(stage_first & is_result),
                             checked_leaf.eq(upstream.leaf)]
            with m.If(checked_valid):
                m.d.sync += [o.p.eq(checked),
                             o.p.drop.eq(checked.drop | (checked.last & refuse_now)),
                             refused.eq(refuse_now), refused_result.eq(refuse_result)]
                with m.If(checked_first & checked_result & checked_matches):
                    # the engine knows the result by the leaf's own job number
                    m.d.sync += o.p.data.word_select(JOB_BYTE, 8).eq(checked_leaf)
                with m.If(checked.last & refuse_now & ~checked.error):
                    with m.If(refuse_result):
                        m.d.sync += self.result_source.eq(1)
                    with m.Else():
                        m.d.sync += self.bad_source.eq(1)
        return m
