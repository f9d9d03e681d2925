"""The register port of the engines (register maps: ``contract/registers.py``).

``addr`` selects a register; ``we`` writes ``wdata`` to it; ``re`` reads it into ``rdata``,
valid the cycle after. Read-only ports (the NIC's counters) have no ``wdata``/``we``.

Inside the gateware the port is the typed :class:`RegisterPort`, connected with
``wiring.connect``; the exported tops (``make verilog``) show it as the flat ports
``ctrl_addr``, ``ctrl_re``, ``ctrl_rdata``, ``ctrl_wdata``, ``ctrl_we`` (:mod:`hdl.export`).
"""
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from contract.registers import ADDRESS_BITS, DATA_BITS

__all__ = ["RegisterPort", "RegisterWrites"]


class RegisterPort(wiring.Signature):
    """A synchronous register port, seen from the side that drives it (a bus master).

    The engine that serves it has ``In(RegisterPort(...))``; the block that reads and writes
    its registers has ``Out(RegisterPort(...))``.

    Parameters
    ----------
    writable : bool
        Whether the port has ``wdata`` and ``we`` (the NIC's counters are read-only).

    Members
    -------
    addr : Out(ADDRESS_BITS)
    re : Out(1)
        Read strobe: ``rdata`` holds the register at ``addr`` the cycle after.
    rdata : In(DATA_BITS)
    wdata : Out(DATA_BITS)
        Only when ``writable``.
    we : Out(1)
        Write strobe (only when ``writable``).
    """

    def __init__(self, *, writable=True):
        if not isinstance(writable, bool):
            raise TypeError(f"writable must be a bool, not {writable!r}")
        self.writable = writable
        members = {"addr": Out(ADDRESS_BITS), "re": Out(1), "rdata": In(DATA_BITS)}
        if writable:
            members.update({"wdata": Out(DATA_BITS), "we": Out(1)})
        super().__init__(members)

    def __eq__(self, other):
        return type(other) is RegisterPort and other.writable == self.writable

    def __hash__(self):
        return hash((RegisterPort, self.writable))

    def __repr__(self):
        return f"RegisterPort(writable={self.writable})"


class RegisterWrites(wiring.Signature):
    """The write half of a :class:`RegisterPort` (``addr``, ``wdata``, ``we``), for a block
    that follows the writes another port gets (a copy of some of its registers) without
    serving reads. Seen from the side that drives it, as :class:`RegisterPort`."""

    def __init__(self):
        super().__init__({"addr": Out(ADDRESS_BITS), "wdata": Out(DATA_BITS), "we": Out(1)})

    def __eq__(self, other):
        return type(other) is RegisterWrites

    def __hash__(self):
        return hash(RegisterWrites)

    def __repr__(self):
        return "RegisterWrites()"
