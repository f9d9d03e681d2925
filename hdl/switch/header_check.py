"""The aggregator's header-beat checks, in the drop-cause priority of ``contract/counters.py``.

Everything that can be decided from the header beat and the job's configuration alone is
decided here, in one combinational block: bad magic or version, a type that is not an
aggregation type, an unconfigured job, a worker outside the job, a slot outside the job's
range, a slot version other than 0 or 1, a count other than ``P``. The remaining causes
need more than the header: a bad length is only known at ``tlast``, a mixed operation only
once the slot's state is read.

Causes are numbered ``1 + AGG_DROP_CAUSES.index(name)`` (0 = no cause), so a smaller number
is a higher priority, and the engine keeps the first cause found along the packet.
"""
from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from contract.counters import AGG_DROP_CAUSES
from contract.header import MAGIC, VERSION, Flags, PacketType
from hdl.header import HeaderLayout

__all__ = ["CAUSE_NONE", "CAUSE", "cause_bits", "HeaderCheck"]

#: Cause code of a packet that passed every check.
CAUSE_NONE = 0
#: Cause code of each drop cause (priority order: lower code wins).
CAUSE = {name: 1 + i for i, name in enumerate(AGG_DROP_CAUSES)}


def cause_bits():
    """Width of a cause code."""
    return len(AGG_DROP_CAUSES).bit_length()


class HeaderCheck(wiring.Component):
    """First applicable header-time drop cause of one header beat.

    Parameters
    ----------
    lanes : int
        ``P``, the only ``count`` value the engine accepts.
    max_workers : int
        Width of the worker count.

    Attributes
    ----------
    header : View(HeaderLayout), in
        The header beat.
    job_configured : Signal(1), in
        The header's job exists and is configured (``workers != 0``).
    workers, slot_base, slot_end : Signal, in
        The job's configuration: ``n`` and the slot range ``[slot_base, slot_end)``.
    cause : Signal, out
        :data:`CAUSE_NONE` or the code of the first applicable cause in :data:`CAUSE`.
    """

    def __init__(self, *, lanes, max_workers):
        self._lanes = lanes
        super().__init__({
            "header": In(HeaderLayout),
            "job_configured": In(1),
            "workers": In(range(max_workers + 1)),
            "slot_base": In(16),
            "slot_end": In(17),
            "cause": Out(cause_bits()),
        })

    def elaborate(self, platform):
        m = Module()
        h = self.header
        checks = [   # in priority order
            ("bad_header", (h.magic != MAGIC) | (h.version != VERSION)),
            ("bad_type", (h.type != PacketType.AGG_ADD_I32) & (h.type != PacketType.AGG_OR32)),
            ("unconfigured_job", ~self.job_configured),
            # A result from upstream numbers workers the upstream's way (section 4).
            ("bad_worker", ~(h.flags & Flags.RESULT).any() & (h.worker >= self.workers)),
            ("bad_slot", (h.slot < self.slot_base) | (h.slot >= self.slot_end)),
            # aggregator-protocol.md section 2: a version other than 0 or 1 is a drop
            ("bad_slot_version", h.slot_version > 1),
            ("bad_count", h.count != self._lanes),
        ]
        assert [name for name, _ in checks] == list(AGG_DROP_CAUSES[:len(checks)])
        with m.If(checks[0][1]):
            m.d.comb += self.cause.eq(CAUSE[checks[0][0]])
        for name, bad in checks[1:]:
            with m.Elif(bad):
                m.d.comb += self.cause.eq(CAUSE[name])
        with m.Else():
            m.d.comb += self.cause.eq(CAUSE_NONE)
        return m
