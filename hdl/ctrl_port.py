"""The ``ctrl_*`` register port of the engine tops (register maps: ``contract/registers.py``).

``ctrl_addr`` selects a register; ``ctrl_we`` writes ``ctrl_wdata`` to it; ``ctrl_re`` reads
it into ``ctrl_rdata``, valid the cycle after. Read-only ports (the NIC's counters) have no
``ctrl_wdata``/``ctrl_we``.
"""
from amaranth.lib.wiring import In, Out

from contract.registers import ADDRESS_BITS as ADDR_BITS
from contract.registers import DATA_BITS

__all__ = ["ctrl_port_members", "connect_ctrl_port"]


def ctrl_port_members(*, writable=True):
    """Signature members of a register port seen from the component that serves it."""
    members = {"ctrl_addr": In(ADDR_BITS), "ctrl_re": In(1), "ctrl_rdata": Out(DATA_BITS)}
    if writable:
        members.update({"ctrl_wdata": In(DATA_BITS), "ctrl_we": In(1)})
    return members


def connect_ctrl_port(m, outer, inner, *, writable=True):
    """Pass the register port of ``outer`` (a top) through to ``inner`` (its engine)."""
    names = ("ctrl_addr", "ctrl_re") + (("ctrl_wdata", "ctrl_we") if writable else ())
    m.d.comb += [getattr(inner, name).eq(getattr(outer, name)) for name in names]
    m.d.comb += outer.ctrl_rdata.eq(inner.ctrl_rdata)
