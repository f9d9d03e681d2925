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
12      4      packet_values     values per packet, 1..2048 (the last packet may hold fewer)
16      8      value_count       number of values (product of the shape), < 2^32
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

Every size a file claims is checked against the file's real size before anything is
allocated for it (a forged header cannot make a reader allocate more than the file
holds): :class:`ContainerReader` reads a file in bounded pieces, :class:`ContainerWriter`
writes one packet after another.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import os
import struct
import zlib

import numpy as np

from contract.header import HEADER_BYTES, K_MAX, K_MIN, LANES

__all__ = ["MAGIC", "VERSION", "DTYPE_FLOAT32_LE", "MAX_NDIM", "MAX_PACKET_VALUES",
           "MAX_VALUES", "FIXED_HEADER_BYTES", "ContainerError", "ContainerHeader",
           "Container", "ContainerReader", "ContainerWriter", "pack_container",
           "parse_container", "write_container", "read_container", "open_container",
           "image_size_bounds"]

MAGIC = b"GWZ1"
VERSION = 1
#: dtype code 1: little-endian IEEE-754 binary32.
DTYPE_FLOAT32_LE = 1
MAX_NDIM = 32
#: Most values per packet: the NIC's packet size limit (``inceptionn-format.md`` section 4).
MAX_PACKET_VALUES = 2048
#: Most values in a file: a packet's ``offset`` is 32 bits.
MAX_VALUES = 2 ** 32 - 1
_FIXED = struct.Struct("<4sHHBBBBIQIIQQ")
FIXED_HEADER_BYTES = _FIXED.size
assert FIXED_HEADER_BYTES == 48
_CRC_OFFSET = 28
#: Bytes read at a time when checking the CRC.
_READ_BYTES = 1 << 20


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

    def packet_counts(self, first=0, stop=None) -> np.ndarray:
        """Values held by packets ``first .. stop - 1`` (int64)."""
        stop = self.packet_count if stop is None else stop
        start = np.arange(first, stop, dtype=np.int64) * self.packet_values
        return np.minimum(self.packet_values, self.value_count - start)

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


# -- checks ------------------------------------------------------------------------------

def image_size_bounds(counts):
    """``(fewest, most)`` bytes of the packet images holding ``counts`` values each: the
    32-byte header plus a bitstream of only tag vectors (every value below the bound) or
    of only raw values, padded to 32 bits (int64 arrays)."""
    counts = np.asarray(counts, dtype=np.int64)
    tag_vector_bytes = 2 * -(-counts // LANES)
    fewest = HEADER_BYTES + 4 * -(-tag_vector_bytes // 4)
    most = HEADER_BYTES + 4 * -(-(tag_vector_bytes + 4 * counts) // 4)
    return fewest, most


def _check_fields(k, shape, packet_values, value_count=None):
    """Check the header fields that do not depend on the packets; returns
    ``(value_count, packet_count)``."""
    if not K_MIN <= k <= K_MAX:
        raise ContainerError(f"k={k} is outside {K_MIN}..{K_MAX}")
    if len(shape) > MAX_NDIM:
        raise ContainerError(f"{len(shape)} dimensions, at most {MAX_NDIM} are supported")
    if not 1 <= packet_values <= MAX_PACKET_VALUES:
        raise ContainerError(f"packet_values={packet_values} is outside "
                             f"1..{MAX_PACKET_VALUES} (the NIC's largest packet)")
    # The dimensions multiply to the value count; the non-zero ones are bounded too, so
    # that an empty tensor's shape is one NumPy can represent.
    nonzero = math.prod(d for d in shape if d)
    if nonzero > MAX_VALUES:
        raise ContainerError(f"shape {shape} has more than {MAX_VALUES} values (a packet "
                             f"offset is 32 bits)")
    product = math.prod(shape)
    if value_count is not None and value_count != product:
        raise ContainerError(f"value count {value_count} does not match shape {shape}")
    return product, -(-product // packet_values)


def _check_image_sizes(header, sizes, first=0):
    """Check the byte lengths of packet images ``first ..`` against their value counts."""
    sizes = np.asarray(sizes, dtype=np.int64)
    fewest, most = image_size_bounds(header.packet_counts(first, first + sizes.size))
    for bad, message in ((sizes % 4 != 0, "not a header plus whole 32-bit words"),
                         (sizes < fewest, "too short for its {count} values (at least "
                                          "{fewest})"),
                         (sizes > most, "more than its {count} values can take (at most "
                                        "{most})")):
        where = np.flatnonzero(bad)
        if where.size:
            i = int(where[0])
            count = int(header.packet_counts(first + i, first + i + 1)[0])
            raise ContainerError(f"packet {first + i} is {int(sizes[i])} bytes: " + message
                                 .format(count=count, fewest=int(fewest[i]), most=int(most[i])))


def _checked_header(k, shape, packet_values, image_sizes):
    shape = tuple(int(d) for d in shape)
    value_count, packet_count = _check_fields(k, shape, packet_values)
    if len(image_sizes) != packet_count:
        raise ContainerError(f"{len(image_sizes)} packets for {value_count} values of "
                             f"{packet_values} per packet")
    header = ContainerHeader(k=k, shape=shape, packet_values=packet_values,
                             packet_count=packet_count, packets_bytes=int(sum(image_sizes)),
                             value_count=value_count)
    _check_image_sizes(header, image_sizes)
    return header


# -- writing -----------------------------------------------------------------------------

def _pack(images, k, shape, packet_values):
    images = [bytes(image) for image in images]
    header = _checked_header(k, shape, packet_values, [len(i) for i in images])
    index = np.array([len(i) for i in images], dtype="<u4").tobytes()
    crc = zlib.crc32(index, zlib.crc32(header.pack(crc32=0)))
    for image in images:
        crc = zlib.crc32(image, crc)
    header = dataclasses.replace(header, crc32=crc)
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


class ContainerWriter:
    """Write a ``.gwz`` file packet by packet, holding only the index in memory.

    ``file`` is a seekable binary file open for reading and writing (``"w+b"``), empty.
    Give the images in order with :meth:`write`, then call :meth:`finish`: it fills in the
    index and the header, whose CRC is computed by reading the file back in pieces.
    """

    def __init__(self, file, *, k, shape, packet_values):
        self._file = file
        self._shape = tuple(int(d) for d in shape)
        self._k, self._packet_values = k, packet_values
        value_count, packet_count = _check_fields(k, self._shape, packet_values)
        self._layout = ContainerHeader(k=k, shape=self._shape, packet_values=packet_values,
                                       packet_count=packet_count, packets_bytes=0,
                                       value_count=value_count)
        self._sizes = np.zeros(packet_count, dtype="<u4")
        self._written = 0
        # The header and the index are written last; their place is kept.
        file.write(bytes(self._layout.header_bytes + 4 * packet_count))

    def write(self, images):
        """Append the next packet images (``bytes`` each)."""
        sizes = [len(image) for image in images]
        if self._written + len(sizes) > self._sizes.size:
            raise ContainerError(f"more than {self._sizes.size} packets for "
                                 f"{self._layout.value_count} values of "
                                 f"{self._packet_values} per packet")
        _check_image_sizes(self._layout, sizes, self._written)
        for image in images:
            self._file.write(image)
        self._sizes[self._written:self._written + len(sizes)] = sizes
        self._written += len(sizes)

    def finish(self) -> ContainerHeader:
        """Write the index and the header; returns the header."""
        if self._written != self._sizes.size:
            raise ContainerError(f"{self._written} packets for {self._layout.value_count} "
                                 f"values of {self._packet_values} per packet")
        header = dataclasses.replace(self._layout, packets_bytes=int(self._sizes.sum(
            dtype=np.int64)))
        index = self._sizes.tobytes()
        crc = zlib.crc32(index, zlib.crc32(header.pack(crc32=0)))
        crc = _crc_of_range(self._file, header.header_bytes + len(index), header.file_bytes,
                            crc)
        header = dataclasses.replace(header, crc32=crc)
        self._file.seek(0)
        self._file.write(header.pack())
        self._file.write(index)
        self._file.seek(0, io.SEEK_END)
        return header


def _crc_of_range(file, start, stop, crc=0):
    """zlib CRC-32 of bytes ``start .. stop`` of ``file`` (continuing ``crc``), read in
    pieces; raises :class:`ContainerError` if the file ends early."""
    file.seek(start)
    buffer = bytearray(min(_READ_BYTES, max(stop - start, 0)))
    view = memoryview(buffer)
    position = start
    while position < stop:
        got = file.readinto(view[:min(len(buffer), stop - position)])
        if not got:
            raise ContainerError(f"file ends at byte {position}, before byte {stop}")
        crc = zlib.crc32(view[:got], crc)
        position += got
    return crc


# -- reading -----------------------------------------------------------------------------

class ContainerReader:
    """A ``.gwz`` file open for reading: checked completely on opening (header fields,
    every size against the file's real size, CRC, index), then read packet by packet.

    ``file`` is a seekable binary file; ``size`` its length in bytes (``os.fstat`` of it
    by default). Raises :class:`ContainerError` (or ``OSError``).
    """

    def __init__(self, file, size=None):
        self._file = file
        if size is None:
            size = os.fstat(file.fileno()).st_size
        file.seek(0)
        fixed = file.read(FIXED_HEADER_BYTES)
        if len(fixed) < FIXED_HEADER_BYTES:
            raise ContainerError(f"file is {size} bytes, shorter than the "
                                 f"{FIXED_HEADER_BYTES}-byte header")
        (magic, version, header_bytes, k, dtype, ndim, _reserved, packet_values, value_count,
         packet_count, crc32, packets_bytes, _reserved2) = _FIXED.unpack(fixed)
        if magic != MAGIC:
            raise ContainerError(f"not a .gwz file (magic {bytes(magic)!r}, expected "
                                 f"{MAGIC!r})")
        if version != VERSION:
            raise ContainerError(f"unsupported .gwz version {version} (this reader knows "
                                 f"version {VERSION})")
        if dtype != DTYPE_FLOAT32_LE:
            raise ContainerError(f"unknown dtype code {dtype}")
        if ndim > MAX_NDIM:
            raise ContainerError(f"{ndim} dimensions, at most {MAX_NDIM} are supported")
        if header_bytes != FIXED_HEADER_BYTES + 8 * ndim:
            raise ContainerError(f"inconsistent header size {header_bytes} for {ndim} "
                                 f"dimensions")
        # The sizes the header claims must add up to the file's: this bounds the index
        # and every packet by bytes that exist.
        expected = header_bytes + 4 * packet_count + packets_bytes
        if size != expected:
            raise ContainerError(f"file is {size} bytes but its header describes {expected} "
                                 f"({'truncated' if size < expected else 'trailing data'})")
        prefix = bytearray(fixed + file.read(header_bytes - FIXED_HEADER_BYTES))
        prefix[_CRC_OFFSET:_CRC_OFFSET + 4] = bytes(4)
        actual_crc = _crc_of_range(file, header_bytes, size, zlib.crc32(prefix))
        if actual_crc != crc32:
            raise ContainerError(f"CRC mismatch (stored {crc32:#010x}, computed "
                                 f"{actual_crc:#010x}): the file is corrupt")
        shape = struct.unpack_from(f"<{ndim}Q", prefix, FIXED_HEADER_BYTES)
        if value_count > MAX_VALUES:
            raise ContainerError(f"value count {value_count} is more than {MAX_VALUES} (a "
                                 f"packet offset is 32 bits)")
        _, expected_packets = _check_fields(k, shape, packet_values, value_count)
        if packet_count != expected_packets:
            raise ContainerError(f"{packet_count} packets for {value_count} values of "
                                 f"{packet_values} per packet")
        # Fewest bytes the claimed values take, before reading an index entry for them.
        fewest = int(image_size_bounds([packet_values])[0][0]) * (value_count // packet_values)
        if value_count % packet_values:
            fewest += int(image_size_bounds([value_count % packet_values])[0][0])
        if packets_bytes < fewest:
            raise ContainerError(f"{value_count} values take at least {fewest} bytes of "
                                 f"packets, the file holds {packets_bytes}")
        file.seek(header_bytes)
        sizes = np.frombuffer(file.read(4 * packet_count), dtype="<u4").astype(np.int64)
        if int(sizes.sum()) != packets_bytes:
            raise ContainerError(f"packet index adds up to {int(sizes.sum())} bytes, the "
                                 f"header says {packets_bytes}")
        self.header = ContainerHeader(k=k, shape=shape, packet_values=packet_values,
                                      packet_count=packet_count, packets_bytes=packets_bytes,
                                      value_count=value_count, crc32=crc32, version=version)
        _check_image_sizes(self.header, sizes)
        #: Byte length of every packet image.
        self.sizes = sizes
        self._starts = header_bytes + 4 * packet_count + np.concatenate(
            [[0], np.cumsum(sizes)])

    def images(self, first, stop) -> list:
        """The images of packets ``first .. stop - 1`` (read-only ``memoryview`` each)."""
        first, stop = max(0, first), min(stop, self.header.packet_count)
        if stop <= first:
            return []
        start = int(self._starts[first])
        self._file.seek(start)
        data = memoryview(self._file.read(int(self._starts[stop]) - start))
        bounds = (self._starts[first:stop + 1] - start).tolist()
        return [data[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


@contextlib.contextmanager
def open_container(path):
    """``with open_container(path) as reader``: a :class:`ContainerReader` of the file."""
    with open(path, "rb") as f:
        yield ContainerReader(f)


def parse_container(data) -> Container:
    """Check and split the bytes of a ``.gwz`` file. Raises :class:`ContainerError`."""
    data = bytes(data)
    reader = ContainerReader(io.BytesIO(data), len(data))
    return Container(reader.header, reader.images(0, reader.header.packet_count))


def read_container(path) -> Container:
    """Read and check a whole ``.gwz`` file. Raises ``OSError`` or :class:`ContainerError`."""
    with open_container(path) as reader:
        return Container(reader.header, reader.images(0, reader.header.packet_count))
