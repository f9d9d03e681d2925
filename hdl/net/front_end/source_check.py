"""The switch's source check: an ``AGG`` datagram must come from its (job, worker) entry.

network.md section 3: the aggregator accepts a datagram only when its source IP address
and UDP port are the worker-table entry of the (job, worker) its header names, so that a
host can contribute neither for another worker nor for another job. The check looks the
entry up as the datagram's first beat goes by and marks the datagram's last beat ``drop``
when the source is wrong (the input buffer then forgets it), counting it once.

Datagrams too short to name a (job, worker) (under 7 bytes) pass unchecked: the engine
drops them as the short packets they are.
"""
from __future__ import annotations

from amaranth import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from contract.header import HEADER_FIELDS
from hdl.net.front_end.layouts import WideBeat
from hdl.net.front_end.worker_table import LookupSignature

__all__ = ["SourceCheck"]

_FIELDS = {f.name: f for f in HEADER_FIELDS}
JOB_BYTE = _FIELDS["job"].offset
WORKER_BYTE = _FIELDS["worker"].offset
#: A datagram names a (job, worker) when it reaches the worker byte.
MIN_CHECKED_LENGTH = WORKER_BYTE + 1


class SourceCheck(wiring.Component):
    """Marks datagrams whose source is not their (job, worker) table entry; latency 3.

    Members
    -------
    i : In(stream.Signature(WideBeat))
    o : Out(stream.Signature(WideBeat))
        The same beats; ``drop`` set on the last beat of a refused datagram.
    table : Out(LookupSignature)
    bad_source : Out(1)
        One strobe per refused datagram that the core did not flag ``error``.
    """

    def __init__(self):
        super().__init__({
            "i": In(stream.Signature(WideBeat)),
            "o": Out(stream.Signature(WideBeat)),
            "table": Out(LookupSignature),
            "bad_source": Out(1),
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
        matches = Signal()
        m.d.comb += matches.eq(
            (stage.meta.length < MIN_CHECKED_LENGTH)
            | (self.table.valid & (entry.port != 0) & (entry.port == stage.meta.src_port)
               & (entry.ip_address == stage.meta.ip_address)))
        checked = Signal(WideBeat)
        checked_valid = Signal()
        checked_first = Signal()
        checked_matches = Signal()
        refused = Signal()           # the datagram in the checked register, once decided
        refuse_now = Signal()
        m.d.comb += refuse_now.eq(Mux(checked_first, ~checked_matches, refused))

        m.d.sync += self.bad_source.eq(0)
        with m.If(advance):
            m.d.sync += [stage_valid.eq(i.valid), checked_valid.eq(stage_valid),
                         o.valid.eq(checked_valid)]
            with m.If(i.valid):
                m.d.sync += [stage.eq(i.p), stage_first.eq(first_in), first_in.eq(i.p.last)]
            with m.If(stage_valid):
                m.d.sync += [checked.eq(stage), checked_first.eq(stage_first),
                             checked_matches.eq(matches)]
            with m.If(checked_valid):
                m.d.sync += [o.p.eq(checked),
                             o.p.drop.eq(checked.drop | (checked.last & refuse_now)),
                             refused.eq(refuse_now)]
                with m.If(checked.last & refuse_now & ~checked.error):
                    m.d.sync += self.bad_source.eq(1)
        return m
