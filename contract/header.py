"""The 32-byte packet header shared by every AXI-Stream packet (NIC and switch traffic).

This module is the single source of truth for the header layout of
``docs/protocol/packet-header.md`` section 2. :data:`HEADER_FIELDS` lists every field
with its byte offset, size and signedness; :class:`Header` packs and parses it, and
``hdl/header.py`` builds the Amaranth ``data.StructLayout`` from the same list, so the two
cannot drift (``tests/contract/test_header.py`` checks the equivalence bit for bit).

Byte 0 travels in ``tdata[7:0]`` of the header beat; multi-byte fields are little-endian,
so the header bytes read as one little-endian 256-bit integer are exactly the beat's
``tdata``.
"""
from __future__ import annotations

import dataclasses
import enum
import operator
import struct
from typing import NamedTuple

__all__ = [
    "MAGIC", "VERSION", "HEADER_BYTES", "BEAT_BYTES", "LANES", "K_MIN", "K_MAX",
    "WORKER_MULTICAST", "NIC_MAX_COUNT",
    "PacketType", "Flags", "Field", "HEADER_FIELDS", "HeaderError", "Header",
]

MAGIC = 0x47
VERSION = 1
HEADER_BYTES = 32
#: One AXI-Stream beat: 256 bits, eight fp32 lanes.
BEAT_BYTES = 32
LANES = 8
K_MIN, K_MAX = 1, 15
#: Worker number of a multicast result.
WORKER_MULTICAST = 0xFF
#: Largest ``count`` of a packet the NIC compresses or decompresses
#: (``docs/protocol/inceptionn-format.md`` section 4: 8 KiB of fp32 and the header fit one
#: 9000-byte jumbo frame).
NIC_MAX_COUNT = 2048


class PacketType(enum.IntEnum):
    RAW_F32 = 0
    INC_F32 = 1
    AGG_ADD_I32 = 2
    AGG_OR32 = 3
    CTRL = 4          # control over the network (``docs/protocol/network.md`` section 4)


class Flags(enum.IntFlag):
    NONE = 0
    COMPRESS = 1 << 0   # NIC TX: compress this packet
    RESULT = 1 << 1     # sent by the switch
    ERROR = 1 << 2      # marked bad by an engine


class Field(NamedTuple):
    name: str
    offset: int   # bytes
    size: int     # bytes
    signed: bool = False

    @property
    def bits(self):
        return 8 * self.size

    @property
    def range(self):
        if self.signed:
            return -(1 << (self.bits - 1)), (1 << (self.bits - 1)) - 1
        return 0, (1 << self.bits) - 1


#: Every byte of the header, in order, reserved bytes included (they are sent as zero).
HEADER_FIELDS = (
    Field("magic",        0, 1),
    Field("version",      1, 1),
    Field("type",         2, 1),
    Field("flags",        3, 1),
    Field("k",            4, 1),
    Field("job",          5, 1),
    Field("worker",       6, 1),
    Field("exponent",     7, 1, signed=True),
    Field("count",        8, 4),
    Field("slot",        12, 2),
    Field("slot_version", 14, 1),
    Field("reserved0",   15, 1),
    Field("seq",         16, 4),
    Field("offset",      20, 4),
    Field("reserved1",   24, 8),
)

assert sum(f.size for f in HEADER_FIELDS) == HEADER_BYTES
assert all(a.offset + a.size == b.offset for a, b in zip(HEADER_FIELDS, HEADER_FIELDS[1:]))

_FIELDS_BY_NAME = {f.name: f for f in HEADER_FIELDS}
_RESERVED = ("reserved0", "reserved1")
_CODES = {(1, False): "B", (1, True): "b", (2, False): "H", (4, False): "I", (8, False): "Q"}
#: The header as one struct: parse() and the fast path of pack() (pack() falls back to its
#: field loop, which names the offending field, for anything the struct cannot take).
_STRUCT = struct.Struct("<" + "".join("x" * f.size if f.name in _RESERVED
                                      else _CODES[f.size, f.signed] for f in HEADER_FIELDS))
_PACKED_NAMES = tuple(f.name for f in HEADER_FIELDS if f.name not in _RESERVED)
_PACKED_VALUES = operator.attrgetter(*_PACKED_NAMES)
#: field types the fast path takes as they are (anything else goes through the checks)
_PLAIN_INTS = frozenset({int, PacketType, Flags})
assert _STRUCT.size == HEADER_BYTES


class HeaderError(ValueError):
    """A header field holds a value the protocol does not allow.

    Attributes
    ----------
    field : str
        Name of the offending field (one of :data:`HEADER_FIELDS`), or ``"length"``.
    """

    def __init__(self, field, message):
        self.field = field
        super().__init__(f"header field {field!r}: {message}")


@dataclasses.dataclass(frozen=True)
class Header:
    """One packet header. Construct with keywords; defaults make a valid ``RAW_F32`` header.

    ``pack()`` checks that every field fits its width and raises :class:`HeaderError` naming
    the field otherwise. ``parse()`` reads any 32 bytes; ``validate()`` then checks the
    protocol-level rules (magic, version, type, ``k`` for ``INC_F32``).
    """

    type: int = PacketType.RAW_F32
    flags: int = Flags.NONE
    k: int = 0
    job: int = 0
    worker: int = 0
    exponent: int = 0
    count: int = 0
    slot: int = 0
    slot_version: int = 0
    seq: int = 0
    offset: int = 0
    magic: int = MAGIC
    version: int = VERSION

    # -- conversion --------------------------------------------------------------------

    def pack(self) -> bytes:
        """The 32 header bytes. Raises :class:`HeaderError` if a field does not fit."""
        values = _PACKED_VALUES(self)
        if _PLAIN_INTS.issuperset(map(type, values)):
            try:
                return _STRUCT.pack(*values)
            except struct.error:
                pass   # out of range: the loop below names the field
        out = bytearray(HEADER_BYTES)
        for f in HEADER_FIELDS:
            if f.name in _RESERVED:
                continue
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise HeaderError(f.name, f"must be an integer, not {value!r}")
            lo, hi = f.range
            if not lo <= value <= hi:
                raise HeaderError(f.name, f"{value} does not fit in {f.bits} "
                                          f"{'signed' if f.signed else 'unsigned'} bits "
                                          f"({lo}..{hi})")
            out[f.offset:f.offset + f.size] = int(value).to_bytes(f.size, "little",
                                                                  signed=f.signed)
        return bytes(out)

    @classmethod
    def parse(cls, data) -> "Header":
        """Read a header from the first 32 bytes of ``data`` (reserved bytes are ignored)."""
        data = bytes(data)
        if len(data) < HEADER_BYTES:
            raise HeaderError("length", f"a header is {HEADER_BYTES} bytes, got {len(data)}")
        values = zip(_PACKED_NAMES, _STRUCT.unpack_from(data))
        if cls is Header:
            # What the dataclass __init__ would store, without its 13 frozen setattr calls
            # (packets come back from the gateware by the thousand).
            header = object.__new__(cls)
            header.__dict__.update(values)
            return header
        return cls(**dict(values))

    def to_int(self) -> int:
        """The header beat's 256-bit ``tdata`` as an integer."""
        return int.from_bytes(self.pack(), "little")

    @classmethod
    def from_int(cls, tdata: int) -> "Header":
        return cls.parse(int(tdata).to_bytes(HEADER_BYTES, "little"))

    # -- checks ------------------------------------------------------------------------

    def validate(self) -> "Header":
        """Check the protocol rules; return ``self`` or raise :class:`HeaderError`."""
        self.pack()   # widths
        if self.magic != MAGIC:
            raise HeaderError("magic", f"0x{self.magic:02x} is not 0x{MAGIC:02x}")
        if self.version != VERSION:
            raise HeaderError("version", f"{self.version} is not {VERSION}")
        if self.type not in PacketType._value2member_map_:
            raise HeaderError("type", f"{self.type} is not a known packet type "
                                      f"({', '.join(f'{t.value} {t.name}' for t in PacketType)})")
        if self.type == PacketType.INC_F32 and not K_MIN <= self.k <= K_MAX:
            raise HeaderError("k", f"{self.k} is outside {K_MIN}..{K_MAX}")
        if self.slot_version not in (0, 1):
            raise HeaderError("slot_version", f"{self.slot_version} is not 0 or 1")
        return self

    def replace(self, **changes) -> "Header":
        return dataclasses.replace(self, **changes)

    def __str__(self):
        try:
            kind = PacketType(self.type).name
        except ValueError:
            kind = f"type{self.type}"
        return (f"{kind} flags={Flags(self.flags & 7)!s} k={self.k} job={self.job} "
                f"worker={self.worker} exp={self.exponent} count={self.count} "
                f"slot={self.slot}.{self.slot_version} seq={self.seq} offset={self.offset}")
