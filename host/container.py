"""The ``.gwz`` container: a compressed tensor stored as the NIC's own ``INC_F32`` packets.

Layout (all integers little-endian; ``docs/container-format.md`` is the reference):

======  =====  ================  ==========================================================
offset  size   field             meaning
======  =====  ================  ==========================================================
0       4      magic             ``b"GWZ1"``
4       2      version           1
6       2      header_bytes      48 + 8 * ndim (where the packet index starts)
8       1      k                 error-bound exponent of every packet (1..15)
9       1      dtype             1 = little-endian float32 (the only one)
10      1      ndim              number of dimensions of the tensor (0..32)
11      1      reserved          written 0, ignored
12      4      packet_values     values per packet (the last packet may hold fewer)
16      8      value_count       number of values (product of the shape)
24      4      packet_count      ``ceil(value_count / packet_values)``
28      4      crc32             zlib CRC-32 of the whole file with this field set to 0
32      8      packets_bytes     total bytes of the packet images
40      8      reserved          written 0, ignored
48      8*nd   shape             one uint64 per dimension, C order
...     4*P    index             byte length of each packet image (header + payload)
...            packets           the packet images back to back, in ``offset`` order
======  =====  ================  ==========================================================

Each packet image is exactly what crosses the NIC's AXI-Stream (``Packet.to_bytes``: the
32-byte header beat, then the section-3 bitstream); the index supplies the ``tlast``
positions that a file does not otherwise have.
"""
from __future__ import annotations

import dataclasses
import math
import struct
import zlib

import numpy as np

from contract.header import HEADER_BYTES, K_MAX, K_MIN

__all__ = ["MAGIC", "VERSION", "DTYPE_FLOAT32_LE", "MAX_NDIM", "FIXED_HEADER_BYTES",
           "ContainerError", "ContainerHeader", "Container", "pack_container",
           "parse_container", "write_container", "read_container"]

MAGIC = b"GWZ1"
VERSION = 1
#: dtype code 1: little-endian IEEE-754 binary32.
DTYPE_FLOAT32_LE = 1
MAX_NDIM = 32
_FIXED = struct.Struct("<4sHHBBBBIQIIQQ")
FIXED_HEADER_BYTES = _FIXED.size
assert FIXED_HEADER_BYTES == 48
_CRC_OFFSET = 28


class ContainerError(ValueError):
    """A ``.gwz`` file is malformed, truncated, corrupt or of an unsupported version."""


@dataclasses.dataclass(frozen=True)
class ContainerHeader:
    k: int
    shape: tuple
    packet_values: int
    packet_count: int
    packets_bytes: int
    value_count: int
    crc32: int = 0
    version: int = VERSION

    @property
    def header_bytes(self) -> int:
        return FIXED_HEADER_BYTES + 8 * len(self.shape)

    @property
    def file_bytes(self) -> int:
        return self.header_bytes + 4 * self.packet_count + self.packets_bytes

    def pack(self, crc32=None) -> bytes:
        return _FIXED.pack(MAGIC, self.version, self.header_bytes, self.k, DTYPE_FLOAT32_LE,
                           len(self.shape), 0, self.packet_values, self.value_count,
                           self.packet_count, self.crc32 if crc32 is None else crc32,
                           self.packets_bytes, 0) \
            + struct.pack(f"<{len(self.shape)}Q", *self.shape)


@dataclasses.dataclass(frozen=True)
class Container:
    header: ContainerHeader
    #: One read-only ``memoryview`` per packet image, in file order.
    images: list


def _checked_header(k, shape, packet_values, image_sizes):
    if not K_MIN <= k <= K_MAX:
        raise ContainerError(f"k={k} is outside {K_MIN}..{K_MAX}")
    shape = tuple(int(d) for d in shape)
    if len(shape) > MAX_NDIM:
        raise ContainerError(f"{len(shape)} dimensions, at most {MAX_NDIM} are supported")
    if not 1 <= packet_values < 2 ** 32:
        raise ContainerError(f"packet_values={packet_values} must be in 1..2^32-1")
    value_count = math.prod(shape)
    if len(image_sizes) != -(-value_count // packet_values):
        raise ContainerError(f"{len(image_sizes)} packets for {value_count} values of "
                             f"{packet_values} per packet")
    for i, size in enumerate(image_sizes):
        if size < HEADER_BYTES or size % 4 or size >= 2 ** 32:
            raise ContainerError(f"packet {i} is {size} bytes: not a header plus whole "
                                 f"32-bit words")
    return ContainerHeader(k=k, shape=shape, packet_values=packet_values,
                           packet_count=len(image_sizes), packets_bytes=sum(image_sizes),
                           value_count=value_count)


def _crc(header_without_crc, index, images):
    crc = zlib.crc32(header_without_crc)
    crc = zlib.crc32(index, crc)
    for image in images:
        crc = zlib.crc32(image, crc)
    return crc


def _pack(images, k, shape, packet_values):
    images = [bytes(image) for image in images]
    header = _checked_header(k, shape, packet_values, [len(i) for i in images])
    index = np.array([len(i) for i in images], dtype="<u4").tobytes()
    header = dataclasses.replace(header, crc32=_crc(header.pack(crc32=0), index, images))
    return header, b"".join([header.pack(), index, *images])


def pack_container(images, *, k, shape, packet_values) -> bytes:
    """The bytes of a ``.gwz`` file holding these packet images (``bytes`` each)."""
    return _pack(images, k, shape, packet_values)[1]


def write_container(path, images, *, k, shape, packet_values) -> ContainerHeader:
    """Write a ``.gwz`` file; returns its header."""
    header, data = _pack(images, k, shape, packet_values)
    with open(path, "wb") as f:
        f.write(data)
    return header


def parse_container(data) -> Container:
    """Check and split the bytes of a ``.gwz`` file. Raises :class:`ContainerError`."""
    view = memoryview(data).cast("B")
    if len(view) < FIXED_HEADER_BYTES:
        raise ContainerError(f"file is {len(view)} bytes, shorter than the "
                             f"{FIXED_HEADER_BYTES}-byte header")
    (magic, version, header_bytes, k, dtype, ndim, _reserved, packet_values, value_count,
     packet_count, crc32, packets_bytes, _reserved2) = _FIXED.unpack_from(view)
    if magic != MAGIC:
        raise ContainerError(f"not a .gwz file (magic {bytes(magic)!r}, expected {MAGIC!r})")
    if version != VERSION:
        raise ContainerError(f"unsupported .gwz version {version} (this reader knows "
                             f"version {VERSION})")
    if dtype != DTYPE_FLOAT32_LE:
        raise ContainerError(f"unknown dtype code {dtype}")
    if ndim > MAX_NDIM or header_bytes != FIXED_HEADER_BYTES + 8 * ndim:
        raise ContainerError(f"inconsistent header size {header_bytes} for {ndim} dimensions")
    expected = header_bytes + 4 * packet_count + packets_bytes
    if len(view) != expected:
        raise ContainerError(f"file is {len(view)} bytes but its header describes {expected} "
                             f"({'truncated' if len(view) < expected else 'trailing data'})")
    zeroed = bytearray(view[:header_bytes])
    zeroed[_CRC_OFFSET:_CRC_OFFSET + 4] = bytes(4)
    actual_crc = zlib.crc32(view[header_bytes:], zlib.crc32(zeroed))
    if actual_crc != crc32:
        raise ContainerError(f"CRC mismatch (stored {crc32:#010x}, computed "
                             f"{actual_crc:#010x}): the file is corrupt")
    index_end = header_bytes + 4 * packet_count
    sizes = np.frombuffer(view[header_bytes:index_end], dtype="<u4").astype(np.int64)
    starts = index_end + np.concatenate([[0], np.cumsum(sizes)])
    if int(starts[-1]) != len(view):
        raise ContainerError(f"packet index adds up to {int(starts[-1]) - index_end} bytes, "
                             f"the header says {packets_bytes}")
    images = [view[a:b] for a, b in zip(starts[:-1].tolist(), starts[1:].tolist())]
    shape = struct.unpack_from(f"<{ndim}Q", view, FIXED_HEADER_BYTES)
    header = _checked_header(k, shape, packet_values, sizes.tolist())
    if header.value_count != value_count:
        raise ContainerError(f"value count {value_count} does not match shape {shape}")
    return Container(dataclasses.replace(header, crc32=crc32, version=version), images)


def read_container(path) -> Container:
    """Read and check a ``.gwz`` file. Raises ``OSError`` or :class:`ContainerError`."""
    with open(path, "rb") as f:
        return parse_container(f.read())
