"""INCEPTIONN golden model: the bit-exact reference of ``docs/protocol/inceptionn-format.md``.

Vectorised NumPy: no Python loop runs per value; the only loops run per pass of about
2^18 values, and, when finding block starts, over block indices with all streams (packets)
handled at once in each iteration.

* Values (section 2) are classified with one 512-entry look-up table indexed by the top
  nine bits of the fp32 word (sign and exponent): the tag, the shift that turns the
  significand into the ``P8``/``P16`` code and the sign bit's place in the code depend on
  those nine bits alone.
* Every field of the bitstream (the 16-bit tag vector and the 0/8/16/32-bit payloads) is a
  whole number of bytes, so blocks always start on a byte boundary and the LSB-first
  bitstream is simply the little-endian bytes of the fields in order. Encoding lays each
  block out as a fixed 34-byte row (tag vector + eight 4-byte codes, plus 3 spare bytes
  for the 32-bit padding) and compacts the used bytes with one boolean mask.
* Decoding must find where each block starts, and that depends on every earlier tag
  vector. The block that would start at byte ``p`` ends at ``p + 2 + payload_bytes(tag
  vector read at p)``; this "next block" function is computed for every byte position at
  once, then followed from each stream's start for all streams in lockstep, after
  composing it with itself (pointer doubling) when streams are long (see
  :func:`_block_starts`). Each lane's payload offset then comes from a table indexed by the
  block's tag vector.
* Lanes past ``count`` in a stream's last block carry nothing, whatever their tag bits
  say: the decoder, like the receive engine, knows ``count``. The values of the (< 32)
  padding bits are not checked either.

The packet level follows ``docs/nic-contract.md``: :func:`nic_tx` and :func:`nic_rx` are the
reference the gateware is compared with packet by packet; :func:`tensor_to_packets` and
:func:`packets_to_tensor` are what the driver and the tests use.
"""
from __future__ import annotations

import functools
import numbers
import typing

import numpy as np

from contract.header import (K_MAX, K_MIN, LANES, MAGIC, NIC_MAX_COUNT, VERSION, Flags, Header,
                             PacketType)
from contract.packet import Packet

__all__ = [
    "K_MIN", "K_MAX", "K_DEFAULT", "MAX_COUNT", "LANES", "TAG_VECTOR_BITS", "PAYLOAD_BITS",
    "TAG_ZERO", "TAG_BYTE", "TAG_HALF", "TAG_RAW",
    "StreamError", "ReassemblyError",
    "check_k", "classify", "codes", "quantize", "encode", "decode", "encode_many", "decode_many",
    "tag_histogram",
    "block_bits", "stream_bits", "stream_bytes",
    "tensor_to_packets", "packets_to_tensor", "nic_tx", "nic_rx",
    "quantize_with_feedback",
]

#: The paper's operating point: error bound 2^-10.
K_DEFAULT = 10
#: Default largest ``count`` the receive engine accepts (its output buffer holds this many).
MAX_COUNT = NIC_MAX_COUNT
#: Bits of the per-block tag vector (2 bits for each of the 8 lanes).
TAG_VECTOR_BITS = 16
#: The four classes (2-bit tags) of section 2.
TAG_ZERO, TAG_BYTE, TAG_HALF, TAG_RAW = 0, 1, 2, 3
#: Payload bits of each tag.
PAYLOAD_BITS = (0, 8, 16, 32)

_LANE_BYTES = np.array([b // 8 for b in PAYLOAD_BITS], dtype=np.uint8)
#: Which of a code's 4 little-endian bytes go into the stream, per tag: byte j of the
#: entry is 1 if byte j of the code is used (a uint32 so that one gather fills 4 bytes).
_USED_CODE_BYTES = np.array([sum(1 << (8 * j) for j in range(b // 8)) for b in PAYLOAD_BITS],
                            dtype="<u4")
_CODE_MASK = np.array([(1 << b) - 1 for b in PAYLOAD_BITS], dtype=np.uint32)
_TAG_SHIFTS = (2 * np.arange(LANES)).astype(np.uint16)
# Tables indexed by a block's 16-bit tag vector (built from the byte count of every lane):
_lane_bytes_of_vector = _LANE_BYTES[(np.arange(1 << 16)[:, None] >> _TAG_SHIFTS) & 3].astype(np.int64)
#: Payload bytes of the whole block.
_BLOCK_PAYLOAD_BYTES = _lane_bytes_of_vector.sum(axis=1)
#: Byte offset of each lane's payload from the block's start, at ``[tag_vector * LANES + lane]``:
#: 2 (the tag vector) plus the payload bytes of the earlier lanes.
_LANE_OFFSETS = (2 + np.cumsum(_lane_bytes_of_vector, axis=1) - _lane_bytes_of_vector).reshape(-1)
del _lane_bytes_of_vector
#: Most bytes a block takes: its tag vector and eight 32-bit payloads.
_MAX_BLOCK_BYTES = 2 + 4 * LANES
#: Bytes of one encoder row: tag vector, 8 codes of 4 bytes, 3 bytes of 32-bit padding.
_ROW_BYTES = _MAX_BLOCK_BYTES + 3

#: Values encoded or decoded per vectorised pass over many streams: enough to amortise the
#: Python-level work, few enough that the temporaries stay in cache.
_PASS_VALUES = 1 << 18

#: Values of ``decode_many``'s per-stream status, and the receive-path counter of each.
STREAM_OK, STREAM_TRUNCATED, STREAM_OVERLONG = 0, 1, 2
_STATUS_CAUSE = {STREAM_TRUNCATED: "drop_truncated", STREAM_OVERLONG: "drop_overlong"}


class StreamError(ValueError):
    """A bitstream does not hold exactly ``count`` values.

    Attributes
    ----------
    cause : str
        ``"drop_truncated"`` (the stream ends before ``count`` values) or ``"drop_overlong"``
        (32-bit words follow the padded end): the receive-path counter of the malformation.
    """

    def __init__(self, cause, message):
        self.cause = cause
        super().__init__(message)


class ReassemblyError(ValueError):
    """Packets do not reassemble into one tensor (gap, overlap, bad packet)."""


# -- parameters --------------------------------------------------------------------------

def check_k(k) -> int:
    """Return ``k`` as an int, or raise ``ValueError`` naming it if it is not an integer in
    ``K_MIN..K_MAX``."""
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise ValueError(f"k must be an integer in {K_MIN}..{K_MAX}, not {k!r}")
    if not K_MIN <= k <= K_MAX:
        raise ValueError(f"k must be in {K_MIN}..{K_MAX} (error bound 2^-k), got k={k}")
    return int(k)


def _check_count(name, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, not {value!r}")
    return int(value)


def _as_bits(values) -> np.ndarray:
    """The fp32 words of ``values``, flattened, as a uint32 array.

    A uint32 array is taken as raw fp32 words; anything else is converted to float32 and
    viewed, never converted numerically (NaN payloads and -0.0 survive).
    """
    arr = np.asarray(values)
    if arr.dtype == np.uint32:
        return np.ascontiguousarray(arr, dtype="=u4").reshape(-1)
    if arr.dtype != np.float32:
        if arr.dtype.kind not in "fiub":
            raise TypeError(f"cannot encode an array of dtype {arr.dtype} as fp32 values")
        arr = arr.astype(np.float32)
    return np.ascontiguousarray(arr, dtype="=f4").reshape(-1).view(np.uint32)


# -- one value (section 2) ---------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _value_table(k):
    """Look-up table indexed by ``u >> 23`` (sign and biased exponent) for one ``k``.

    Each uint32 entry packs three things that depend on those nine bits alone:
    bits 4..0, the right shift that turns the 24-bit significand (hidden one included) into
    ``P8`` (tag 01: ``150 - k - e``, i.e. ``127 - e`` then ``23 - k``) or ``P16`` (tag 10:
    ``135 - e``), or 31 for tags 00 and 11 so that the code comes out 0; bits 6..5, the tag;
    bits 23..8, the sign in its place in the code (bit 7 or bit 15).
    """
    index = np.arange(512)
    e, s = index & 0xFF, index >> 8
    e8 = min(134 - k, 127)
    tag = (e >= 127 - k).astype(np.int64) + (e >= e8) + (e >= 127)
    shift = np.select([tag == TAG_BYTE, tag == TAG_HALF], [150 - k - e, 135 - e], 31)
    sign_bit = np.select([tag == TAG_BYTE, tag == TAG_HALF], [s << 7, s << 15], 0)
    table = (shift | (tag << 5) | (sign_bit << 8)).astype(np.uint32)
    table.flags.writeable = False
    return table


def _tags_and_codes(bits, k):
    # One table gather per value (converting the index to intp once is cheaper than letting
    # several gathers convert it).
    packed = _value_table(k)[(bits >> 23).astype(np.intp)]
    tags = ((packed >> 5) & 3).astype(np.uint8)
    codes = ((bits & 0x7FFFFF) | 0x800000) >> (packed & 31)
    codes |= packed >> 8
    # Tag 11 carries the word unchanged.
    np.copyto(codes, bits, where=tags == TAG_RAW)
    return tags, codes


@functools.lru_cache(maxsize=None)
def _decode_table(k):
    """fp32 word of every tag-01 and tag-10 code for one ``k``: entry 0 is tag 00 (+0.0),
    entry ``1 + code`` a tag-01 code (8 bits), entry ``257 + code`` a tag-10 code (16 bits).

    ``P * 2^-k`` and ``P * 2^-15`` are exact in fp32 (``P < 2^15``, ``k <= 15``), so the float32
    products below are the exact values; the sign is set on the word (a zero magnitude, which
    the encoder never produces, decodes to a zero of that sign).
    """
    byte_codes = np.arange(256, dtype=np.uint32)
    half_codes = np.arange(1 << 16, dtype=np.uint32)
    byte_words = ((byte_codes & 0x7F).astype(np.float32) * np.float32(2.0 ** -k)).view(np.uint32)
    half_words = ((half_codes & 0x7FFF).astype(np.float32) * np.float32(2.0 ** -15)).view(np.uint32)
    table = np.concatenate([[0], byte_words | (byte_codes >> 7 << 31),
                            half_words | (half_codes >> 15 << 31)]).astype(np.uint32)
    table.flags.writeable = False
    return table


_DECODE_BASE = np.array([0, 1, 1 + 256, 0], dtype=np.intp)


def _words_from_codes(tags, codes, k):
    """fp32 words that tags and codes decode to (section 2, "Decoding")."""
    raw = tags == TAG_RAW
    index = codes.astype(np.intp)
    index += _DECODE_BASE[tags]
    index[raw] = 0
    words = _decode_table(k)[index]
    np.copyto(words, codes, where=raw)
    return words


def classify(values, k) -> np.ndarray:
    """The 2-bit tag of every value (uint8, same shape as ``values``).

    ``values``: float32 (or convertible), or uint32 taken as raw fp32 words.
    """
    k = check_k(k)
    shape = np.shape(values)
    packed = _value_table(k)[(_as_bits(values) >> 23).astype(np.intp)]
    return ((packed >> 5) & 3).astype(np.uint8).reshape(shape)


def codes(values, k):
    """``(tags, codes)`` of every value, flattened: the payload code is ``s << 7 | P8``
    (tag 01), ``s << 15 | P16`` (tag 10), the word itself (tag 11) or 0 (tag 00)."""
    return _tags_and_codes(_as_bits(values), check_k(k))


def quantize(values, k) -> np.ndarray:
    """What ``values`` become after an encode/decode round trip (float32, same shape),
    bit for bit ``decode(encode(values, k), n, k)`` without building the bitstream."""
    k = check_k(k)
    shape = np.shape(values)
    bits = _as_bits(values)
    out = np.empty(bits.size, dtype=np.uint32)
    for start in range(0, bits.size, _PASS_VALUES):   # passes keep temporaries in cache
        tags, code = _tags_and_codes(bits[start:start + _PASS_VALUES], k)
        out[start:start + _PASS_VALUES] = _words_from_codes(tags, code, k)
    return out.view(np.float32).reshape(shape)


def quantize_with_feedback(values, residual, k):
    """Error feedback around :func:`quantize`: ``(sent, residual')`` for one step.

    The building block of error-feedback compression (1-bit SGD, EF-SGD, GRACE's
    ``Memory``): what the codec takes away from a value is kept and added to the next
    value at the same place, so it is delayed, not lost. In float32::

        corrected = values + residual          # one float32 addition per value
        sent      = quantize(corrected, k)     # what the NIC's codec carries unchanged
        residual' = corrected - sent           # exact (see below)

    ``sent`` is on the codec's grid, so the NIC compresses it exactly as the spec says and
    decodes it to the same bits (``quantize(sent) == sent``): error feedback is the host's
    part, the wire format does not change.

    ``corrected - sent`` is computed exactly: ``sent`` is ``corrected`` truncated toward zero
    (same sign), either to +0.0 (tag 00: the subtraction returns ``corrected`` itself), to
    itself (tag 11: residual +0.0), or, for tags 01 and 10, to a value with
    ``|sent| <= |corrected| <= 2 |sent|`` (the dropped part is below the grid step, and the
    step, 2^-k or 2^-15, is at most ``|sent|``), where Sterbenz's lemma makes the float32
    subtraction exact. Hence ``sent + residual' == corrected`` exactly, ``|residual'| <
    2^-k``, and over many steps ``sum(sent) == sum(values) - residual_last`` exactly
    whenever every addition ``values + residual`` is exact in float32 (for example a
    constant gradient with a few significant bits); otherwise each step adds that
    addition's rounding, at most 2^-24 of ``|corrected|``.

    A non-finite ``corrected`` (NaN or Inf in ``values``, or an addition that overflowed)
    is sent raw, as the codec sends it, and leaves a residual of +0.0 there: a NaN is not
    remembered and cannot poison later steps.

    Parameters
    ----------
    values : array_like of float32
        This step's values (e.g. one rank's gradient bucket).
    residual : array_like of float32, or None
        The residual the previous step returned, same shape (``None``: all zero, the
        first step).
    k : int
        Error bound exponent, 1..15.

    Returns
    -------
    sent : numpy.ndarray of float32
        ``quantize(values + residual, k)``, the shape of ``values``.
    residual : numpy.ndarray of float32
        The new residual, the shape of ``values``.
    """
    k = check_k(k)
    values = np.asarray(values)
    if values.dtype != np.float32:
        raise TypeError(f"values must be float32, not {values.dtype}")
    if residual is None:
        corrected = values.copy()
    else:
        residual = np.asarray(residual)
        if residual.dtype != np.float32:
            raise TypeError(f"residual must be float32, not {residual.dtype}")
        if residual.shape != values.shape:
            raise ValueError(f"residual has shape {residual.shape}, values {values.shape}")
        with np.errstate(invalid="ignore", over="ignore"):   # NaN, Inf: sent raw
            corrected = values + residual
    sent = quantize(corrected, k)
    with np.errstate(invalid="ignore"):
        new_residual = corrected - sent
    new_residual[~np.isfinite(corrected)] = 0.0
    return sent, new_residual


# -- sizes -------------------------------------------------------------------------------

def block_bits(tags) -> np.ndarray:
    """Length in bits of every block (16 + its payload bits) of values with these tags;
    missing lanes of a last partial block count as tag 00."""
    tags = np.asarray(tags, dtype=np.uint8).reshape(-1)
    padded = np.zeros(-(-tags.size // LANES) * LANES, dtype=np.uint8)
    padded[:tags.size] = tags
    return TAG_VECTOR_BITS + 8 * _LANE_BYTES[padded.reshape(-1, LANES)].sum(axis=1, dtype=np.int64)


def stream_bits(tags) -> int:
    """Bits of the bitstream for values with these tags, before the 32-bit padding."""
    return int(block_bits(tags).sum())


def stream_bytes(tags) -> int:
    """Bytes of the padded bitstream (a multiple of 4) for values with these tags."""
    return 4 * -(-stream_bits(tags) // 32)


# -- bitstreams (section 3) --------------------------------------------------------------

def _segment_lengths(n, chunk_values):
    chunk_values = int(chunk_values)
    lengths = np.full(n // chunk_values, chunk_values, dtype=np.int64)
    if n % chunk_values:
        lengths = np.append(lengths, n % chunk_values)
    return lengths


def _pass_groups(values_per_item):
    """Split consecutive items (streams or pieces) into groups of about ``_PASS_VALUES``
    values; returns the group boundaries ``[0, ..., len(items)]``."""
    before = np.cumsum(values_per_item) - values_per_item
    group = before // _PASS_VALUES
    return [0] + (np.flatnonzero(np.diff(group)) + 1).tolist() + [len(values_per_item)]


def _encode_segments(bits, lengths, k):
    """Encode consecutive runs of ``bits`` (``lengths[i]`` values each) as independent,
    padded bitstreams, back to back.

    Returns ``(stream, sizes)``: all streams as one uint8 array, and the byte size of each.
    Works in passes of about ``_PASS_VALUES`` values; a stream longer than that is cut at
    block boundaries into pieces (blocks need no alignment, so the pieces' bytes simply
    follow one another; only a stream's last piece is padded).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if bits.size <= _PASS_VALUES:
        return _encode_pass(bits, lengths, np.ones(lengths.size, dtype=bool), k)
    pieces = np.maximum(1, -(-lengths // _PASS_VALUES))
    segment_of_piece = np.repeat(np.arange(lengths.size), pieces)
    first_piece = np.cumsum(pieces) - pieces
    piece_in_segment = np.arange(segment_of_piece.size) - first_piece[segment_of_piece]
    piece_lengths = np.minimum(_PASS_VALUES,
                               lengths[segment_of_piece] - piece_in_segment * _PASS_VALUES)
    piece_first_value = np.concatenate([[0], np.cumsum(piece_lengths)])
    # A stream in one piece is padded by its pass; one in several pieces afterwards, since
    # its padding depends on the length of all its pieces.
    whole = (pieces == 1)[segment_of_piece]
    streams, piece_sizes = [], []
    bounds = _pass_groups(piece_lengths)
    for a, b in zip(bounds[:-1], bounds[1:]):
        stream, sizes = _encode_pass(bits[piece_first_value[a]:piece_first_value[b]],
                                     piece_lengths[a:b], whole[a:b], k)
        streams.append(stream)
        piece_sizes.append(sizes)
    stream = np.concatenate(streams)
    sizes = np.add.reduceat(np.concatenate(piece_sizes), first_piece)
    pad = np.where(pieces > 1, -sizes % 4, 0)
    if pad.any():
        ends = np.cumsum(sizes)
        stream = np.insert(stream, np.repeat(ends, pad), 0)
        sizes = sizes + pad
    return stream, sizes


def _encode_pass(bits, lengths, padded_end, k):
    """One vectorised pass of :func:`_encode_segments`: streams ``i`` with
    ``padded_end[i]`` false are pieces that another piece continues (no padding)."""
    blocks = -(-lengths // LANES)
    total_blocks = int(blocks.sum())
    tags, code = _tags_and_codes(bits, k)
    if np.all(lengths[:-1] % LANES == 0):
        slot = None   # values already sit in their lanes; only the tail needs padding
    else:
        # Lane slot of each value: its segment's first slot + its index in the segment.
        first_slot = LANES * (np.cumsum(blocks) - blocks)
        first_value = np.cumsum(lengths) - lengths
        slot = np.repeat(first_slot - first_value, lengths) + np.arange(bits.size)
    lane_tags = np.zeros(total_blocks * LANES, dtype=np.uint8)
    lane_codes = np.zeros(total_blocks * LANES, dtype="<u4")
    if slot is None:
        lane_tags[:bits.size], lane_codes[:bits.size] = tags, code
    else:
        lane_tags[slot], lane_codes[slot] = tags, code
    lane_tags = lane_tags.reshape(total_blocks, LANES)

    rows = np.zeros((total_blocks, _ROW_BYTES), dtype=np.uint8)
    used = np.zeros((total_blocks, _ROW_BYTES), dtype=bool)
    tag_vector = (lane_tags.astype(np.uint16) << _TAG_SHIFTS).sum(axis=1, dtype=np.uint16)
    rows[:, 0:2] = tag_vector.astype("<u2").view(np.uint8).reshape(-1, 2)
    rows[:, 2:2 + 4 * LANES] = lane_codes.view(np.uint8).reshape(total_blocks, 4 * LANES)
    used[:, 0:2] = True
    used[:, 2:2 + 4 * LANES] = _USED_CODE_BYTES[lane_tags].view(np.uint8).view(bool).reshape(
        total_blocks, 4 * LANES)

    # Zero padding up to a 32-bit boundary, in the spare bytes of each stream's last row.
    block_bytes = 2 + _BLOCK_PAYLOAD_BYTES[tag_vector]
    bytes_before = np.concatenate([[0], np.cumsum(block_bytes)])
    first_block = np.cumsum(blocks) - blocks
    unpadded = bytes_before[first_block + blocks] - bytes_before[first_block]
    pad = np.where(padded_end, -unpadded % 4, 0)
    last_block = (first_block + blocks - 1)[blocks > 0]
    for j in range(3):
        used[last_block, 2 + 4 * LANES + j] = pad[blocks > 0] > j
    return rows[used], unpadded + pad


def encode(values, k) -> bytes:
    """The section-3 bitstream of ``values`` (one packet's fp32 values), zero-padded to a
    32-bit boundary, as bytes (LSB-first: stream bit ``i`` is bit ``i % 8`` of byte ``i // 8``).

    ``values``: float32 (or convertible), or a uint32 array taken as raw fp32 words;
    flattened in C order.
    """
    k = check_k(k)
    bits = _as_bits(values)
    stream, _ = _encode_segments(bits, [bits.size], k)
    return stream.tobytes()


def encode_many(values, k, chunk_values) -> list:
    """Encode ``values`` as independent bitstreams of ``chunk_values`` values each (the last
    one shorter): one ``bytes`` per chunk, all computed in one vectorised pass."""
    k = check_k(k)
    if isinstance(chunk_values, bool) or not isinstance(chunk_values, numbers.Integral) \
            or chunk_values < 1:
        raise ValueError(f"chunk_values must be a positive integer, not {chunk_values!r}")
    bits = _as_bits(values)
    stream, sizes = _encode_segments(bits, _segment_lengths(bits.size, chunk_values), k)
    data = stream.tobytes()
    ends = np.cumsum(sizes).tolist()
    return [data[a:b] for a, b in zip([0] + ends[:-1], ends)]


def _doubling_levels(size, streams, widest):
    """How many times to square the next-block function in :func:`_block_starts`.

    A rough cost model (seconds on a typical core): each squaring is one gather over all
    ``size + 1`` positions; each Python iteration costs a few microseconds plus its
    elements. Few long streams favour more squarings, many short ones (packets) none.
    """
    def cost(levels):
        step = 1 << levels
        groups = -(-widest // step)
        return (levels * size * 2e-9
                + groups * (1e-5 + streams * 2e-9)
                + step * (1e-5 + streams * groups * 2e-9))
    return min(range(max(widest, 1).bit_length()), key=cost)


def _block_starts(next_start, first, blocks):
    """Starts of blocks ``0..blocks[i]-1`` of every stream ``i`` beginning at ``first[i]``;
    a ``(streams, max(blocks))`` array (entries past a stream's blocks are meaningless).

    ``next_start[p]`` is where the block after one starting at ``p`` begins (clipped to the
    last index, which maps to itself). Finding the starts is pointer chasing, so it is done
    in two vectorised passes: ``jump = next_start`` composed ``step`` times (``log2(step)``
    squarings, each a gather over every position) gives the starts of blocks ``0, step,
    2*step, ...`` of all streams in lockstep; from those, ``next_start`` gives the blocks in
    between, all groups in lockstep. The Python loops run ``max(blocks) / step`` and
    ``step`` times, each iteration working on every stream (or group) at once.
    """
    streams = first.size
    widest = int(blocks.max()) if streams else 0
    if widest == 0:
        return np.zeros((streams, 0), dtype=np.intp)
    levels = _doubling_levels(next_start.size, streams, widest)
    step = 1 << levels
    jump = next_start   # no copies without squarings (many short streams)
    if levels:
        jump, spare = next_start.copy(), np.empty_like(next_start)
        for _ in range(levels):
            # mode="wrap" skips the bounds check (every entry is a valid index already).
            np.take(jump, jump, out=spare, mode="wrap")
            jump, spare = spare, jump
        del spare
    groups = -(-widest // step)
    group_starts = np.empty((streams, groups), dtype=np.intp)
    position = first.astype(np.intp)
    for g in range(groups):
        group_starts[:, g] = position
        position = jump[position]
    starts = np.empty((streams, groups, step), dtype=np.intp)
    position = group_starts
    for b in range(step):
        starts[:, :, b] = position
        position = next_start[position]
    return starts.reshape(streams, groups * step)[:, :widest]


def _maximum_bytes(counts):
    """Most bytes (padded) a stream of ``counts`` values can take: every lane that carries
    a value is raw (lanes past ``count`` carry nothing)."""
    counts = np.asarray(counts, dtype=np.int64)
    return 4 * -(-(2 * -(-counts // LANES) + 4 * counts) // 4)


class _Blocks(typing.NamedTuple):
    """Where the blocks of one pass's streams start (see :func:`_find_blocks`)."""
    #: The pass's bytes followed by 8 zero bytes (reads past the end stay in bounds).
    padded: np.ndarray
    #: Bytes of the pass (without the zero bytes).
    size: int
    counts: np.ndarray
    #: Start of every block of every stream, stream after stream.
    starts: np.ndarray
    #: Tag vector of every block, lanes past ``count`` cleared.
    tag_vector: np.ndarray
    #: Per stream: ``STREAM_OK``, ``STREAM_TRUNCATED`` or ``STREAM_OVERLONG``.
    status: np.ndarray
    #: Per stream: the byte after its last block.
    ends: np.ndarray
    #: Index (in ``starts``) of the last block of every stream that has blocks, and how many
    #: of its lanes carry values.
    last_block: np.ndarray
    lanes_in_last: np.ndarray


def _find_blocks(buf, first, sizes, counts):
    """The blocks of independent bitstreams in ``buf`` (one vectorised pass): stream ``i``
    occupies bytes ``first[i] .. first[i] + sizes[i]`` and holds ``counts[i]`` values."""
    size = buf.size
    # Zero bytes after the end so that reads past it (truncated streams) stay in bounds.
    padded = np.zeros(size + 8, dtype=np.uint8)
    padded[:size] = buf
    tag_vector_at = padded[:size + 1].astype(np.uint16) | (padded[1:size + 2].astype(np.uint16) << 8)

    next_start = _BLOCK_PAYLOAD_BYTES[tag_vector_at].astype(np.intp, copy=False)
    next_start += np.arange(2, size + 3, dtype=np.intp)
    np.minimum(next_start, size, out=next_start)

    blocks = -(-counts // LANES)
    starts_2d = _block_starts(next_start, np.minimum(first, size), blocks)
    del next_start
    starts = starts_2d[np.arange(starts_2d.shape[1]) < blocks[:, None]].astype(np.int64)
    del starts_2d
    tag_vector = tag_vector_at[starts]
    # Lanes past `count` in a stream's last block carry nothing, whatever their tag bits.
    has_blocks = blocks > 0
    last_block = (np.cumsum(blocks) - 1)[has_blocks]
    lanes_in_last = counts[has_blocks] - LANES * (blocks[has_blocks] - 1)
    tag_vector[last_block] &= ((1 << (2 * lanes_in_last)) - 1).astype(np.uint16)

    block_end = starts[last_block] + 2 + _BLOCK_PAYLOAD_BYTES[tag_vector[last_block]]
    ends = first.copy()
    ends[has_blocks] = block_end
    needed = ends - first
    status = np.where(needed > sizes, STREAM_TRUNCATED,
                      np.where(sizes > 4 * -(-needed // 4), STREAM_OVERLONG, STREAM_OK))
    return _Blocks(padded, size, counts, starts, tag_vector, status.astype(np.int8), ends,
                   last_block, lanes_in_last)


def _scan_segments(buf, first, sizes, counts, visit):
    """Find the blocks of independent bitstreams in passes of about ``_PASS_VALUES`` values
    each, whatever the lengths of the streams; returns the status of every stream.

    Stream ``i`` occupies bytes ``first[i] .. first[i] + sizes[i]`` of ``buf`` (in
    increasing order, not overlapping) and holds ``counts[i]`` values. ``visit(blocks,
    value_first)`` is called for every pass with its :class:`_Blocks`, whose values are
    values ``value_first ..`` of all streams' values concatenated. Short streams are
    grouped, several to a pass; a stream longer than a pass is cut into pieces of
    ``_PASS_VALUES // LANES`` blocks: a piece starts where the one before it ended, and
    its blocks all lie in the next ``_MAX_BLOCK_BYTES`` bytes per block, so a pass never
    looks at more than about ``4.25 * _PASS_VALUES`` bytes.
    """
    buf = np.asarray(buf, dtype=np.uint8).reshape(-1)
    first = np.asarray(first, dtype=np.int64).reshape(-1)
    counts = np.asarray(counts, dtype=np.int64).reshape(-1)
    # A stream longer than its count can take is over-long whatever its bytes are; reading
    # no more than 4 bytes past that bound keeps it over-long and bounds the bytes a pass
    # reads by its values.
    sizes = np.minimum(np.asarray(sizes, dtype=np.int64).reshape(-1),
                       _maximum_bytes(counts) + 4)
    status = np.zeros(counts.size, dtype=np.int8)
    value_first = np.cumsum(counts) - counts
    start = 0
    for stop in np.flatnonzero(counts > _PASS_VALUES).tolist() + [counts.size]:
        if stop > start:
            bounds = _pass_groups(counts[start:stop])
            for a, b in zip(bounds[:-1], bounds[1:]):
                a, b = a + start, b + start
                pass_buf, pass_first = _pass_bytes(buf, first[a:b], sizes[a:b])
                blocks = _find_blocks(pass_buf, pass_first, sizes[a:b], counts[a:b])
                status[a:b] = blocks.status
                visit(blocks, int(value_first[a]))
        if stop < counts.size:
            status[stop] = _scan_long_stream(buf, int(first[stop]), int(sizes[stop]),
                                             int(counts[stop]), int(value_first[stop]), visit)
        start = stop + 1
    return status


def _pass_bytes(buf, first, sizes):
    """The bytes of one pass over streams ``first, sizes`` and where each starts in them:
    a slice of ``buf``, or the streams gathered when other bytes lie between them."""
    low, high = int(first[0]), int(first[-1] + sizes[-1])
    if high - low <= int(sizes.sum()) + 4 * sizes.size:
        return buf[low:high], first - low
    gathered = np.concatenate([buf[a:a + n] for a, n in zip(first.tolist(), sizes.tolist())])
    return gathered, np.cumsum(sizes) - sizes


def _scan_long_stream(buf, first, size, count, value_first, visit):
    """:func:`_scan_segments` of one stream longer than a pass, piece by piece; returns its
    status.

    A piece's blocks are followed in a window of bytes: if they all end inside it, the walk
    is exact (every tag vector it read lies inside); if the last one ends past it, the
    window was too short, and the piece is walked again in a window long enough for every
    block raw (or, at the stream's end, the stream is truncated). The first window is the
    size of the piece before it, with a margin, so that compressible streams are not
    walked over 34 bytes per block.
    """
    piece_blocks = max(1, _PASS_VALUES // LANES)
    position, done = 0, 0   # where the next piece starts (bytes, values)
    previous_bytes_per_block = _MAX_BLOCK_BYTES
    while True:
        values = min(count - done, LANES * piece_blocks)
        blocks_in_piece = -(-values // LANES)
        longest = min(size - position, _MAX_BLOCK_BYTES * blocks_in_piece)
        window = min(longest, int(1.25 * previous_bytes_per_block * blocks_in_piece) + 64)
        while True:
            low = first + position
            blocks = _find_blocks(buf[low:low + window], np.zeros(1, dtype=np.int64),
                                  np.array([window], dtype=np.int64),
                                  np.array([values], dtype=np.int64))
            piece_bytes = int(blocks.ends[0])
            if piece_bytes <= window or window == longest:
                break
            window = longest
        # The status is the whole stream's (its padding counts from the stream's start).
        end = position + piece_bytes
        if end > size:
            return STREAM_TRUNCATED
        done += values
        if done == count and size > 4 * -(-end // 4):
            return STREAM_OVERLONG
        visit(blocks, value_first + done - values)
        if done == count:
            return STREAM_OK
        position = end
        previous_bytes_per_block = piece_bytes / blocks_in_piece


def _decode_segments(buf, first, sizes, counts, k):
    """Decode independent bitstreams stored in ``buf`` (uint8): stream ``i`` occupies bytes
    ``first[i] .. first[i] + sizes[i]`` (in increasing order, not overlapping) and holds
    ``counts[i]`` values.

    Returns ``(words, status)``: the decoded fp32 words of all streams, concatenated (the
    words of a stream whose status is not ``STREAM_OK`` are meaningless), and one status per
    stream (``STREAM_OK``, ``STREAM_TRUNCATED``, ``STREAM_OVERLONG``). The work is done in
    passes of about ``_PASS_VALUES`` values (:func:`_scan_segments`), so that besides the
    words nothing grows with the streams' length.
    """
    counts = np.asarray(counts, dtype=np.int64).reshape(-1)
    words = np.zeros(int(counts.sum()), dtype=np.uint32)

    def decode_pass(blocks, value_first):
        values = int(blocks.counts.sum())
        words[value_first:value_first + values] = _decode_blocks(blocks, k)

    status = _scan_segments(buf, first, sizes, counts, decode_pass)
    return words, status


def _decode_blocks(blocks, k):
    """The fp32 words of one pass's blocks (:class:`_Blocks`), lanes past ``count`` left
    out."""
    starts, tag_vector = blocks.starts, blocks.tag_vector
    words = np.zeros(starts.size * LANES, dtype=np.uint32)
    windows = np.lib.stride_tricks.sliding_window_view(blocks.padded, 4)
    step = _PASS_VALUES // LANES or 1
    for b in range(0, starts.size, step):   # bounds the temporaries of a pass
        _decode_lanes(words[b * LANES:(b + step) * LANES], starts[b:b + step],
                      tag_vector[b:b + step], windows, blocks.size, k)
    if np.any(blocks.lanes_in_last != LANES):
        lane_valid = np.ones((starts.size, LANES), dtype=bool)
        lane_valid[blocks.last_block] = np.arange(LANES) < blocks.lanes_in_last[:, None]
        words = words[lane_valid.reshape(-1)]
    return words


def _decode_lanes(out, starts, tag_vector, windows, size, k):
    """Decode the lanes of blocks starting at byte ``starts`` with these tag vectors into
    ``out`` (zeros on entry; lanes with tag 00 stay +0.0). ``windows[p]`` is the 4 bytes at
    ``p``; reads past ``size`` (truncated streams) are clipped there."""
    lane_tags = ((tag_vector[:, None] >> _TAG_SHIFTS) & 3).astype(np.uint8).reshape(-1)
    carrying = np.flatnonzero(lane_tags)
    block_of, lane_of = carrying >> 3, carrying & 7   # LANES == 8
    carried_tags = lane_tags[carrying]
    field_at = starts[block_of] + _LANE_OFFSETS[tag_vector[block_of].astype(np.intp) * LANES
                                                 + lane_of]
    read = np.ascontiguousarray(windows[np.minimum(field_at, size)]).view("<u4").reshape(-1)
    out[carrying] = _words_from_codes(carried_tags, read & _CODE_MASK[carried_tags], k)


def _byte_array(data):
    """``data`` (bytes-like, or a sequence of byte values) as a uint8 array, without a copy
    where it is a contiguous buffer."""
    try:
        return np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    except TypeError:
        return np.frombuffer(bytes(data), dtype=np.uint8)


def decode(data, count, k) -> np.ndarray:
    """Decode a section-3 bitstream of ``count`` values (float32 array of ``count``).

    Works in passes of about 2^18 values whatever ``count`` is: besides ``data`` and the
    result, the memory it takes does not grow with the stream.

    Raises
    ------
    StreamError
        The stream ends before ``count`` values (``cause == "drop_truncated"``) or carries
        32-bit words after its padded end (``"drop_overlong"``); the padding bits' values
        are not checked.
    ValueError
        ``k`` or ``count`` invalid.
    """
    k = check_k(k)
    count = _check_count("count", count)
    buf = _byte_array(data)
    if buf.size < _minimum_bytes(count):   # also spares huge allocations for absurd counts
        _raise_for_status(STREAM_TRUNCATED, buf.size, count, k)
    words, status = _decode_segments(buf, [0], [buf.size], [count], k)
    _raise_for_status(int(status[0]), buf.size, count, k)
    return words.view(np.float32)


def _minimum_bytes(count):
    """Fewest bytes a stream of ``count`` values can take: its tag vectors."""
    return 2 * -(-count // LANES)


def _raise_for_status(status, size, count, k=None):
    if status == STREAM_TRUNCATED:
        raise StreamError("drop_truncated", f"bitstream of {size} bytes is truncated: it ends "
                                            f"before {count} values"
                                            + (f" (k={k})" if k is not None else ""))
    if status == STREAM_OVERLONG:
        raise StreamError("drop_overlong", f"bitstream of {size} bytes is over-long: 32-bit "
                                           f"words follow the padded end of {count} values")


def _gather_streams(payloads, counts, k=None):
    """``(buf, first, sizes, counts)`` of many payloads, or raise :class:`StreamError` for
    the first that is shorter than its count's tag vectors (before anything is allocated
    for the counts)."""
    payloads = [bytes(p) for p in payloads]
    counts = [_check_count("count", c) for c in counts]
    if len(payloads) != len(counts):
        raise ValueError(f"{len(payloads)} payloads but {len(counts)} counts")
    sizes = np.array([len(p) for p in payloads], dtype=np.int64)
    for i, (size, count) in enumerate(zip(sizes.tolist(), counts)):
        if size < _minimum_bytes(count):
            _raise_for_stream(i, STREAM_TRUNCATED, size, count, k)
    first = np.cumsum(sizes) - sizes
    buf = np.frombuffer(b"".join(payloads), dtype=np.uint8)
    return buf, first, sizes, np.array(counts, dtype=np.int64)


def _raise_for_stream(i, status, size, count, k=None):
    try:
        _raise_for_status(status, size, count, k)
    except StreamError as exc:
        raise StreamError(exc.cause, f"stream {i}: {exc}") from None


def _raise_for_first_bad(status, sizes, counts, k=None):
    bad = np.flatnonzero(status)
    if bad.size:
        i = int(bad[0])
        _raise_for_stream(i, int(status[i]), int(sizes[i]), int(counts[i]), k)


def decode_many(payloads, counts, k) -> list:
    """Decode many independent bitstreams at once (``payloads[i]`` holds ``counts[i]``
    values); returns one float32 array per stream. Raises :class:`StreamError` (naming
    the first bad stream's index) if any stream is malformed."""
    k = check_k(k)
    buf, first, sizes, counts = _gather_streams(payloads, counts, k)
    words, status = _decode_segments(buf, first, sizes, counts, k)
    _raise_for_first_bad(status, sizes, counts, k)
    ends = np.cumsum(counts).tolist()
    values = words.view(np.float32)
    return [values[a:b] for a, b in zip([0] + ends[:-1], ends)]


@functools.lru_cache(maxsize=None)
def _tags_of_vector():
    """How many lanes of each tag a tag vector holds, at ``[tag_vector, tag]`` (uint8)."""
    vectors = np.arange(1 << 16, dtype=np.uint32)
    table = np.zeros((1 << 16, 4), dtype=np.uint8)
    for lane in range(LANES):
        table[vectors, (vectors >> (2 * lane)) & 3] += 1
    table.flags.writeable = False
    return table


def tag_histogram(payloads, counts) -> np.ndarray:
    """How many values of each class (tag 00, 01, 10, 11) the bitstreams ``payloads``
    (``payloads[i]`` holding ``counts[i]`` values) carry, read from their tag vectors alone:
    no value is decoded. An int64 array of 4.

    The streams are checked like :func:`decode_many` checks them (raising the same
    :class:`StreamError`), in the same bounded passes. The tags are the stream's own: a
    code with a zero magnitude (which the encoder never writes) counts under its tag,
    though it decodes to a zero.
    """
    buf, first, sizes, counts = _gather_streams(payloads, counts)
    histogram = np.zeros(4, dtype=np.int64)

    def count_pass(blocks, _value_first):
        histogram[:] += _tags_of_vector()[blocks.tag_vector].sum(axis=0, dtype=np.int64)
        # The cleared lanes past `count` read as tag 00 but hold no value.
        histogram[TAG_ZERO] -= int((LANES - blocks.lanes_in_last).sum())

    status = _scan_segments(buf, first, sizes, counts, count_pass)
    _raise_for_first_bad(status, sizes, counts)
    return histogram



# -- packets (docs/nic-contract.md) -----------------------------------------------------

def tensor_to_packets(values, k=K_DEFAULT, *, compress=False, packet_values=MAX_COUNT,
                      job=0, worker=0, seq=0, offset=0) -> list:
    """Split a tensor (flattened, C order) into packets of at most ``packet_values`` values.

    Packet ``i`` has ``seq = seq + i`` and ``offset`` = element offset of its first value
    (plus the ``offset`` argument, for pieces of a larger tensor). With ``compress=False`` the
    packets are ``RAW_F32`` with the ``COMPRESS`` flag and ``k`` (what the host feeds the NIC
    transmit path); with ``compress=True`` they are what the transmit path emits: ``INC_F32``,
    same header otherwise, payload = the bitstream. An empty tensor gives no packets.
    """
    k = check_k(k)
    if isinstance(packet_values, bool) or not isinstance(packet_values, numbers.Integral) \
            or packet_values < 1:
        raise ValueError(f"packet_values must be a positive integer, not {packet_values!r}")
    bits = _as_bits(values)
    lengths = _segment_lengths(bits.size, packet_values)
    if compress:
        payloads = encode_many(bits, k, packet_values)
        kind = PacketType.INC_F32
    else:
        data = bits.astype("<u4").tobytes()
        payloads = [data[4 * i:4 * (i + n)] for i, n in
                    zip(range(0, bits.size, packet_values), lengths.tolist())]
        kind = PacketType.RAW_F32
    return [Packet(Header(type=kind, flags=Flags.COMPRESS, k=k, job=job, worker=worker,
                          count=n, seq=seq + i, offset=offset + i * packet_values), payload)
            for i, (n, payload) in enumerate(zip(lengths.tolist(), payloads))]


def packets_to_tensor(packets, n=None, *, offset=0) -> np.ndarray:
    """Reassemble a tensor (flat float32) from ``RAW_F32`` and/or ``INC_F32`` packets in any
    order, placing each by its header ``offset``.

    Returns elements ``offset .. offset + n`` of the tensor (``n`` defaults to the end of the
    last packet). Raises :class:`ReassemblyError` on a bad header, a ``RAW_F32`` payload that
    is not ``count`` words, an ``INC_F32`` payload that does not decode, or gaps/overlaps.
    """
    packets = list(packets)
    headers = [p.header for p in packets]
    for i, h in enumerate(headers):
        if h.magic != MAGIC or h.version != VERSION:
            raise ReassemblyError(f"packet {i}: bad magic/version ({h.magic:#04x}/{h.version})")
        if h.type not in (PacketType.RAW_F32, PacketType.INC_F32):
            raise ReassemblyError(f"packet {i}: type {h.type} carries no fp32 values")
        if h.type == PacketType.INC_F32 and not K_MIN <= h.k <= K_MAX:
            raise ReassemblyError(f"packet {i}: INC_F32 with k={h.k} outside {K_MIN}..{K_MAX}")
        if h.type == PacketType.INC_F32 and len(packets[i].payload) < _minimum_bytes(h.count):
            raise ReassemblyError(f"packet {i}: INC_F32 payload of {len(packets[i].payload)} "
                                  f"bytes is truncated: {h.count} values take at least "
                                  f"{_minimum_bytes(h.count)}")
        if h.type == PacketType.RAW_F32 and len(packets[i].payload) != 4 * h.count:
            raise ReassemblyError(f"packet {i}: RAW_F32 payload is {len(packets[i].payload)} "
                                  f"bytes for count={h.count}")
    offsets = np.array([h.offset for h in headers], dtype=np.int64)
    counts = np.array([h.count for h in headers], dtype=np.int64)
    if n is None:
        n = int((offsets + counts).max()) - offset if packets else 0
    n = _check_count("n", n)
    order = np.argsort(offsets, kind="stable")
    begin, end = offsets[order], (offsets + counts)[order]
    expected_begin = np.concatenate([[offset], end[:-1]])
    wrong = np.flatnonzero(begin != expected_begin)
    if wrong.size:
        i = int(wrong[0])
        what = "gap" if begin[i] > expected_begin[i] else "overlap"
        raise ReassemblyError(f"{what} at element {min(begin[i], expected_begin[i])}: packet "
                              f"{int(order[i])} starts at offset {int(begin[i])}, expected "
                              f"{int(expected_begin[i])}")
    covered_to = int(end[-1]) if packets else offset
    if covered_to != offset + n:
        raise ReassemblyError(f"packets cover elements {offset}..{covered_to}, "
                              f"expected {offset}..{offset + n}")

    out = np.empty(n, dtype=np.uint32)
    for i, h in enumerate(headers):
        if h.type == PacketType.RAW_F32:
            start = int(offsets[i]) - offset
            out[start:start + h.count] = np.frombuffer(packets[i].payload, dtype="<u4")
    # INC_F32 packets: one vectorised decode per distinct k.
    for k in sorted({h.k for h in headers if h.type == PacketType.INC_F32}):
        chosen = [i for i, h in enumerate(headers) if h.type == PacketType.INC_F32 and h.k == k]
        try:
            decoded = decode_many([packets[i].payload for i in chosen],
                                  counts[chosen].tolist(), k)
        except StreamError as exc:
            raise ReassemblyError(f"INC_F32 packets with k={k}: {exc}") from exc
        for i, values in zip(chosen, decoded):
            start = int(offsets[i]) - offset
            out[start:start + values.size] = values.view(np.uint32)
    return out.view(np.float32)


def nic_tx(packet):
    """The NIC transmit path (compressor) on one packet: ``(packet_out, cause)``.

    ``cause`` is the ``NIC_TX_COUNTERS`` name the packet is counted under, besides
    ``"packets"`` (each packet has exactly one): ``"compressed"``, ``"length_mismatch"``
    (compressed anyway: the payload's own words are encoded, the header keeps its ``count``),
    ``"bad_k"`` (passed through untouched), ``"too_large"`` (``count`` above
    :data:`MAX_COUNT`, which no receive path decompresses: passed through untouched, spec
    section 4) or ``"bypassed"``.
    """
    h = packet.header
    if not (h.magic == MAGIC and h.version == VERSION and h.type == PacketType.RAW_F32
            and h.flags & Flags.COMPRESS):
        return packet, "bypassed"
    if not K_MIN <= h.k <= K_MAX:
        return packet, "bad_k"
    if h.count > MAX_COUNT:
        return packet, "too_large"
    words = np.frombuffer(packet.payload, dtype="<u4")
    out = Packet(h.replace(type=PacketType.INC_F32), encode(words, h.k))
    return out, "compressed" if words.size == h.count else "length_mismatch"


def nic_rx(packet, max_count=MAX_COUNT):
    """The NIC receive path (decompressor) on one packet: ``(packet_out or None, cause)``.

    ``cause`` is the ``NIC_RX_COUNTERS`` name the packet is counted under besides
    ``"packets"``: ``"decompressed"``, ``"bypassed"``, or a drop cause (then the packet is
    ``None``), checked in the counters' priority order: ``drop_bad_header``, (non-``INC_F32``
    bypass), ``drop_bad_k``, ``drop_too_large``, ``drop_truncated``, ``drop_overlong``.
    """
    max_count = _check_count("max_count", max_count)
    h = packet.header
    if h.magic != MAGIC or h.version != VERSION:
        return None, "drop_bad_header"
    if h.type != PacketType.INC_F32:
        return packet, "bypassed"
    if not K_MIN <= h.k <= K_MAX:
        return None, "drop_bad_k"
    if h.count > max_count:
        return None, "drop_too_large"
    buf = np.frombuffer(packet.payload, dtype=np.uint8)
    words, status = _decode_segments(buf, [0], [buf.size], [h.count], h.k)
    if status[0] != STREAM_OK:
        return None, _STATUS_CAUSE[int(status[0])]
    return Packet(h.replace(type=PacketType.RAW_F32), words.astype("<u4").tobytes()), \
        "decompressed"
