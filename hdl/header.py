"""The packet header as an Amaranth layout, derived from ``contract.header.HEADER_FIELDS``.

The host definition is the single source of truth; this module only translates it, so the
gateware and the software always agree on every bit (``tests/contract/test_header.py`` checks it).
"""
from amaranth import signed, unsigned
from amaranth.lib import data

from contract.header import HEADER_BYTES, HEADER_FIELDS

__all__ = ["HeaderLayout", "header_layout"]


def header_layout():
    """A ``data.StructLayout`` of the 32-byte header, field order = byte order (LSB first)."""
    return data.StructLayout({
        f.name: (signed if f.signed else unsigned)(f.bits) for f in HEADER_FIELDS
    })


#: The header beat as a 256-bit view: ``tdata.as_value()`` viewed with this layout.
HeaderLayout = header_layout()
assert HeaderLayout.size == 8 * HEADER_BYTES
