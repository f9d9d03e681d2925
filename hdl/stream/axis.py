"""AXI-Stream beats as Amaranth streams, and flat AXI-Stream ports for exported tops.

Inside the gateware every 256-bit AXI-Stream is an ``amaranth.lib.stream`` interface whose
payload is :data:`AxisBeat` (``data``, ``keep``, ``last``). Exported tops expose them as flat
ports named the AXI way (``s_axis_tdata``, ``m_axis_tready``, ...), which ``cocotbext-axi``
binds to by prefix, instead of Amaranth's ``path__member`` names.
"""
from amaranth import unsigned
from amaranth.lib import data, stream
from amaranth.lib.wiring import In, Out

from contract.header import BEAT_BYTES, LANES

__all__ = ["DATA_BITS", "AxisBeat", "axis_signature", "flat_axis_members", "connect_flat_axis"]

DATA_BITS = 8 * BEAT_BYTES
assert DATA_BITS == 32 * LANES

#: One beat: ``data`` (lane j in bits 32j+31..32j), ``keep`` (one bit per byte; only
#: meaningful on the last beat, whole 32-bit words) and ``last``.
AxisBeat = data.StructLayout({
    "data": unsigned(DATA_BITS),
    "keep": unsigned(BEAT_BYTES),
    "last": unsigned(1),
})


def axis_signature():
    """The stream signature of a 256-bit AXI-Stream with ``tkeep`` and ``tlast``."""
    return stream.Signature(AxisBeat)


def flat_axis_members(prefix, *, sink):
    """Signature members of one flat AXI-Stream port group.

    Parameters
    ----------
    prefix : str
        Port name prefix, for example ``"s_axis"``; ports are ``{prefix}_tdata`` and so on.
    sink : bool
        ``True`` for a port group that receives beats (``s_axis``), ``False`` for one that
        sends them (``m_axis``).
    """
    fwd, back = (In, Out) if sink else (Out, In)
    return {
        f"{prefix}_tdata": fwd(DATA_BITS),
        f"{prefix}_tkeep": fwd(BEAT_BYTES),
        f"{prefix}_tlast": fwd(1),
        f"{prefix}_tvalid": fwd(1),
        f"{prefix}_tready": back(1),
    }


def connect_flat_axis(m, top, prefix, interface, *, sink):
    """Wire the flat ports ``{prefix}_t*`` of ``top`` to a stream ``interface``.

    With ``sink=True`` the flat ports drive ``interface`` (an ``In`` stream of an inner
    component); with ``sink=False`` ``interface`` (an ``Out`` stream) drives the flat ports.
    """
    port = lambda name: getattr(top, f"{prefix}_{name}")
    if sink:
        m.d.comb += [
            interface.payload.data.eq(port("tdata")),
            interface.payload.keep.eq(port("tkeep")),
            interface.payload.last.eq(port("tlast")),
            interface.valid.eq(port("tvalid")),
            port("tready").eq(interface.ready),
        ]
    else:
        m.d.comb += [
            port("tdata").eq(interface.payload.data),
            port("tkeep").eq(interface.payload.keep),
            port("tlast").eq(interface.payload.last),
            port("tvalid").eq(interface.valid),
            interface.ready.eq(port("tready")),
        ]
