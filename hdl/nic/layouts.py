"""The INCEPTIONN block format in gateware terms, shared by the transmit and receive paths.

Tag codes, payload widths and block sizes of ``docs/protocol/inceptionn-format.md``
sections 2 and 3, and the one piece of block arithmetic both paths compute: the byte offset
of every lane's payload inside a block (a prefix sum of the lanes' payload widths; the
packer places payloads there, the block decoder extracts them from there).
"""
from amaranth import Signal

from contract.header import LANES

__all__ = ["TAG_ZERO", "TAG_P8", "TAG_P16", "TAG_RAW", "TAG_BYTES", "TAG_VECTOR_BYTES",
           "BLOCK_BYTES", "BLOCK_BITS", "prefix_offsets"]

TAG_ZERO, TAG_P8, TAG_P16, TAG_RAW = 0, 1, 2, 3
#: Payload length in bytes of each tag (every width is a whole number of bytes, which is
#: what lets the packer and the accumulator shift by bytes instead of bits).
TAG_BYTES = {TAG_ZERO: 0, TAG_P8: 1, TAG_P16: 2, TAG_RAW: 4}

TAG_VECTOR_BYTES = 2
#: Longest block: the tag vector and eight raw 32-bit payloads.
BLOCK_BYTES = TAG_VECTOR_BYTES + 4 * LANES
BLOCK_BITS = 8 * BLOCK_BYTES
assert BLOCK_BITS == 272


def prefix_offsets(m, widths, name):
    """Byte offset of every lane's payload in a block (``2 + sum of the widths before it``)
    and the block's length, as a log-depth prefix sum (3 adder levels for 8 lanes, not a
    ripple of 7).

    Returns ``(offsets, total)``: a list of ``Signal`` and the total length (an expression).
    """
    n = len(widths)
    # Kogge-Stone style: after step d, sums[j] covers lanes j-2^d+1 .. j.
    sums = list(widths)
    step = 1
    while step < n:
        sums = [sums[j] + sums[j - step] if j >= step else sums[j] for j in range(n)]
        step *= 2
    offsets = []
    for j in range(n):
        offset = Signal(range(TAG_VECTOR_BYTES + 4 * j + 1), name=f"{name}{j}")
        m.d.comb += offset.eq(TAG_VECTOR_BYTES + (sums[j - 1] if j else 0))
        offsets.append(offset)
    return offsets, TAG_VECTOR_BYTES + sums[n - 1]
