"""``gradwire compress | decompress | info``: INCEPTIONN-compressed tensors in ``.gwz`` files.

``compress`` splits a float32 ``.npy`` tensor into the ``INC_F32`` packets the NIC would send
(``host.golden.inceptionn.tensor_to_packets(compress=True)``) and stores them in a ``.gwz``
container (``host/commands/container.py``, ``docs/container-format.md``); ``decompress`` decodes them
back into a ``.npy`` of the same shape; ``info`` describes a ``.gwz`` file.

Only float32 is compressed. Other float dtypes are refused unless ``--cast`` is given, which
rounds them to float32 first (the error bound then holds against the float32 values).

Work is done in chunks of about a million values, read from the input and written to the
output one after another, so that memory does not grow with the tensor (a progress bar on
stderr for large inputs, when stderr is a terminal). An output is written to a temporary
file next to it and renamed over it only when complete: a failure or an interrupt leaves
the old output (if any) untouched and nothing else behind. An output that is the input
(the same file under any name) is refused before anything is written.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile

import numpy as np
from tqdm import tqdm

from ..cli import CliError
from .container import ContainerError, ContainerWriter, open_container
from ..golden import inceptionn as inc
from contract.header import HEADER_BYTES, PacketType
from contract.packet import Packet, PacketError

__all__ = ["add_compress_arguments", "run_compress", "add_decompress_arguments",
           "run_decompress", "add_info_arguments", "run_info", "CHUNK_VALUES"]

#: Values handled per step (the progress bar advances by this much).
CHUNK_VALUES = 1 << 18
#: Inputs with at least this many values get a progress bar (if stderr is a terminal).
PROGRESS_MIN_VALUES = 1 << 22


# -- arguments ---------------------------------------------------------------------------

def _k(text):
    try:
        return inc.check_k(int(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer in {inc.K_MIN}..{inc.K_MAX}, "
                                         f"got {text!r}") from None


def _packet_values(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not 1 <= value <= inc.MAX_COUNT:
        raise argparse.ArgumentTypeError(f"must be in 1..{inc.MAX_COUNT} (the NIC receive "
                                         f"engine drops larger packets), got {value}")
    return value


def add_compress_arguments(parser):
    parser.add_argument("input", metavar="IN.npy", help="float32 tensor (.npy)")
    parser.add_argument("output", metavar="OUT.gwz", help="compressed file to write")
    parser.add_argument("-k", type=_k, default=inc.K_DEFAULT,
                        help=f"error bound 2^-k, k in {inc.K_MIN}..{inc.K_MAX} "
                             f"(default {inc.K_DEFAULT})")
    parser.add_argument("--packet-values", type=_packet_values,
                        default=inc.MAX_COUNT,
                        help=f"values per packet, 1..{inc.MAX_COUNT} (default {inc.MAX_COUNT})")
    parser.add_argument("--cast", action="store_true",
                        help="accept float64/float16 input, rounding it to float32 first")


def add_decompress_arguments(parser):
    parser.add_argument("input", metavar="IN.gwz", help="compressed file")
    parser.add_argument("output", metavar="OUT.npy", help="float32 tensor to write (.npy)")


def add_info_arguments(parser):
    parser.add_argument("input", metavar="IN.gwz", help="compressed file")


# -- input and output files ---------------------------------------------------------------

def _cannot_read(path, exc):
    if isinstance(exc, FileNotFoundError):
        return CliError(f"{path}: no such file")
    if isinstance(exc, IsADirectoryError):
        return CliError(f"{path}: is a directory")
    return CliError(f"{path}: cannot read: {exc.strerror or exc}")


def _check_output(input_path, output_path):
    """Refuse an output that is the input (the same file, through any hard or symbolic
    link) or an existing directory, before anything is read or written."""
    try:
        same = os.path.samefile(input_path, output_path)
    except OSError:   # one of them does not exist (or cannot be looked at): not the same
        same = False
    if same:
        raise CliError(f"{output_path}: is the input file {input_path} (the same file); "
                       f"write the output under another name")
    if os.path.isdir(output_path):
        raise CliError(f"{output_path}: is a directory")


def _umask():
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def _replacing(path):
    """``with _replacing(path) as f``: a new binary file (``"w+b"``) in ``path``'s directory
    that replaces ``path`` when the block completes. On any failure (an error, a full
    disk, a rename refused, an interrupt) it is removed and ``path`` is left as it was.
    Raises :class:`CliError` for an ``OSError``."""
    directory, name = os.path.split(os.path.abspath(path))
    temporary = None
    try:
        # A fresh name (not `path.part`): an existing file of that name is never touched.
        fd, temporary = tempfile.mkstemp(prefix=f"{name}.", suffix=".part", dir=directory)
        with os.fdopen(fd, "w+b") as f:
            yield f
            os.fchmod(f.fileno(), 0o666 & ~_umask())   # mkstemp makes it private
        os.replace(temporary, path)
        temporary = None
    except OSError as exc:
        raise CliError(f"{path}: cannot write: {exc.strerror or exc}") from None
    finally:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)


class _NpyInput:
    """A ``.npy`` tensor checked on opening, then read in chunks of flat C-order values
    (as little-endian float32), so that it is never held in memory whole."""

    def __init__(self, path, cast):
        self.path = path
        try:
            with open(path, "rb") as f:
                magic = f.read(6)
            if magic[:2] == b"PK":
                raise CliError(f"{path}: an .npz archive; give a single .npy array")
            if magic != b"\x93NUMPY":
                raise CliError(f"{path}: not a .npy file (it does not start with the NumPy "
                               f"magic)")
            # A memory map checks the header and the file's length, and reads nothing else.
            self._array = np.load(path, mmap_mode="r", allow_pickle=False)
        except OSError as exc:
            raise _cannot_read(path, exc) from None
        except (ValueError, EOFError) as exc:
            raise CliError(f"{path}: not a readable .npy array ({exc})") from None
        dtype = self._array.dtype
        self.shape, self.size = self._array.shape, self._array.size
        self.note = None
        if not (dtype.kind == "f" and (dtype.itemsize == 4 or cast)):
            hint = " (pass --cast to round it to float32)" if dtype.kind == "f" else ""
            raise CliError(f"{path}: holds {dtype} values; gradwire compresses float32 "
                           f"only{hint}")
        if dtype.itemsize != 4:
            self.note = (f"converted {dtype} to float32 (rounded to nearest) before "
                         f"compressing")

    def _float32(self, chunk):
        if chunk.dtype.itemsize == 4:
            return np.ascontiguousarray(chunk, dtype="<f4")   # any byte order, bits kept
        return np.asarray(chunk, dtype=np.float64).astype("<f4")

    def chunks(self, values):
        """``(first value, float32 chunk)`` of at most ``values`` values each."""
        if self.size == 0:
            return
        if not self._array.flags.c_contiguous:
            # A Fortran-order file: C-order pieces come from the memory map.
            flat = self._array.flat
            for base in range(0, self.size, values):
                yield base, self._float32(flat[base:base + values])
            return
        try:
            with open(self.path, "rb") as f:
                f.seek(self._array.offset)
                for base in range(0, self.size, values):
                    chunk = np.fromfile(f, dtype=self._array.dtype,
                                        count=min(values, self.size - base))
                    if chunk.size != min(values, self.size - base):
                        raise CliError(f"{self.path}: the file shrank while being read")
                    yield base, self._float32(chunk)
        except OSError as exc:
            raise _cannot_read(self.path, exc) from None


@contextlib.contextmanager
def _open_gwz(path):
    try:
        with open_container(path) as reader:
            yield reader
    except OSError as exc:
        raise _cannot_read(path, exc) from None
    except ContainerError as exc:
        raise CliError(f"{path}: {exc}") from None


def _write_npy_header(f, shape):
    np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False,
                                             "shape": tuple(shape)})


# -- helpers -----------------------------------------------------------------------------

def _progress(total, description):
    return tqdm(total=total, desc=description, unit="val", unit_scale=True, file=sys.stderr,
                leave=False, disable=True if total < PROGRESS_MIN_VALUES else None)


def _chunk_packets(packet_values):
    return max(1, CHUNK_VALUES // packet_values)


def _packet_chunks(reader, path, description):
    """``(first packet index, packets)`` of a container, a chunk at a time, each packet's
    header checked against the container's (type, ``k``, and the values it holds)."""
    header = reader.header
    n, per_packet = header.value_count, header.packet_values
    step = _chunk_packets(per_packet)
    with _progress(n, description) as bar:
        for first in range(0, header.packet_count, step):
            images = reader.images(first, first + step)
            expected_counts = header.packet_counts(first, first + len(images)).tolist()
            packets = []
            for i, (image, count) in enumerate(zip(images, expected_counts), first):
                try:
                    packet = Packet.from_bytes(image)
                except PacketError as exc:
                    raise CliError(f"{path}: packet {i}: {exc}") from None
                h = packet.header
                if h.type != PacketType.INC_F32 or h.k != header.k:
                    raise CliError(f"{path}: packet {i} is not an INC_F32 packet with "
                                   f"k={header.k} ({h})")
                if h.offset != i * per_packet or h.count != count:
                    raise CliError(f"{path}: packet {i} holds values {h.offset}.."
                                   f"{h.offset + h.count}, expected {i * per_packet}.."
                                   f"{i * per_packet + count} (packets overlap or leave a "
                                   f"gap)")
                packets.append(packet)
            yield first, packets
            bar.update(sum(expected_counts))


def _max_error(values, k, step=1 << 16):
    """Largest ``abs(x - quantize(x))`` over the finite values (0.0 if none), computed in
    float64 (exact) a few values at a time (the float64 temporaries stay small)."""
    largest = 0.0
    for first in range(0, values.size, step):
        x = values[first:first + step]
        finite = x[np.isfinite(x)]
        if finite.size:
            error = np.abs(finite.astype(np.float64) - inc.quantize(finite, k).astype(np.float64))
            largest = max(largest, float(error.max()))
    return largest


def _histogram_lines(tag_counts):
    total = int(tag_counts.sum())
    cells = []
    for tag, count in enumerate(tag_counts.tolist()):
        share = 100.0 * count / total if total else 0.0
        cells.append(f"{tag:02b}: {count:,} ({share:.2f}%)")
    return "  ".join(cells)


def _ratio(raw, compressed):
    return f"{raw / compressed:.2f}x" if compressed else "n/a"


# -- commands ----------------------------------------------------------------------------

def _software_encode(k, per_packet):
    def encode(chunk, base):
        return inc.tensor_to_packets(chunk, k, compress=True, packet_values=per_packet,
                                     seq=base // per_packet, offset=base)
    return encode


def _software_decode(packets, count, base):
    return inc.packets_to_tensor(packets, count, offset=base)


def compress_file(input_path, output_path, *, k, packet_values, cast=False, encode=None,
                  command="compress"):
    """Compress a ``.npy`` file into a ``.gwz`` container, a chunk at a time: the output is
    refused if it is the input, written next to itself and renamed into place when complete
    (nothing is left behind on a failure). ``encode(chunk, base) -> packets`` turns the
    float32 values from index ``base`` into ``INC_F32`` packets (default: the golden codec;
    ``gradwire board compress`` passes the board's NIC).

    Returns ``(container header, source, class counts, max error)``."""
    source = _NpyInput(input_path, cast)
    _check_output(input_path, output_path)
    if source.note:
        print(f"gradwire {command}: note: {source.note}", file=sys.stderr)
    encode = encode or _software_encode(k, packet_values)
    n = source.size
    if n >= 2 ** 32:
        raise CliError(f"{input_path}: {n} values; a packet offset is 32 bits")
    tag_counts, max_error = np.zeros(4, dtype=np.int64), 0.0
    step = _chunk_packets(packet_values) * packet_values
    with _replacing(output_path) as f:
        try:
            writer = ContainerWriter(f, k=k, shape=source.shape, packet_values=packet_values)
        except ContainerError as exc:
            raise CliError(f"{input_path}: {exc}") from None
        with _progress(n, command) as bar:
            for base, chunk in source.chunks(step):
                writer.write([p.to_bytes() for p in encode(chunk, base)])
                tag_counts += np.bincount(inc.classify(chunk, k), minlength=4)
                max_error = max(max_error, _max_error(chunk, k))
                bar.update(chunk.size)
        header = writer.finish()
    return header, source, tag_counts, max_error


def decompress_file(input_path, output_path, *, decode=None, check=None,
                    command="decompress"):
    """Decompress a ``.gwz`` container into a ``.npy`` file, a chunk of packets at a time,
    with the same output guarantees as :func:`compress_file`. ``decode(packets, count,
    base) -> float32 values`` (default: the golden codec); ``check(header)`` may refuse the
    container (raising :class:`CliError`) before anything is written. Returns the header."""
    decode = decode or _software_decode
    _check_output(input_path, output_path)
    with _open_gwz(input_path) as reader:
        h = reader.header
        if check is not None:
            check(h)
        with _replacing(output_path) as f:
            _write_npy_header(f, h.shape)
            for first, packets in _packet_chunks(reader, input_path, command):
                base = first * h.packet_values
                count = sum(p.header.count for p in packets)
                try:
                    values = decode(packets, count, base)
                except inc.ReassemblyError as exc:
                    raise CliError(f"{input_path}: packets {first}..{first + len(packets) - 1}"
                                   f": {exc}") from None
                f.write(values.astype("<f4", copy=False).data)
    return h


def run_compress(args) -> int:
    k, per_packet = args.k, args.packet_values
    header, source, tag_counts, max_error = compress_file(
        args.input, args.output, k=k, packet_values=per_packet, cast=args.cast)
    n = source.size
    payload = header.packets_bytes - HEADER_BYTES * header.packet_count
    input_bytes = os.path.getsize(args.input)
    bound = 2.0 ** -k
    print(f"{args.input} -> {args.output}")
    print(f"  values      {n:,} float32, shape {tuple(source.shape)}")
    print(f"  packets     {header.packet_count:,} INC_F32 of <= {per_packet} values, k={k}")
    print(f"  payload     {4 * n:,} B raw -> {payload:,} B compressed "
          f"(ratio {_ratio(4 * n, payload)}, {8 * payload / n if n else 0:.2f} bits/value)")
    print(f"  file        {input_bytes:,} B .npy -> {header.file_bytes:,} B .gwz "
          f"(ratio {_ratio(input_bytes, header.file_bytes)})")
    print(f"  classes     {_histogram_lines(tag_counts)}")
    print(f"  max error   {max_error:.9g} over finite values "
          f"(bound 2^-{k} = {bound:.9g}: {'holds' if max_error < bound else 'VIOLATED'})")
    return 0


def run_decompress(args) -> int:
    h = decompress_file(args.input, args.output)
    print(f"{args.input} -> {args.output}: {h.value_count:,} float32 values, "
          f"shape {h.shape}, k={h.k}")
    return 0


def run_info(args) -> int:
    with _open_gwz(args.input) as reader:
        h = reader.header
        # Every packet is checked; the class histogram comes from the tag vectors alone
        # (nothing is decoded).
        tag_counts = np.zeros(4, dtype=np.int64)
        for first, packets in _packet_chunks(reader, args.input, "info"):
            try:
                tag_counts += inc.tag_histogram([p.payload for p in packets],
                                                [p.header.count for p in packets])
            except inc.StreamError as exc:
                raise CliError(f"{args.input}: INC_F32 packets "
                               f"{first}..{first + len(packets) - 1}: {exc}") from None
    payload = h.packets_bytes - HEADER_BYTES * h.packet_count
    file_bytes = h.file_bytes
    print(f"{args.input}: gradwire container version {h.version}, CRC-32 {h.crc32:#010x} ok")
    print(f"  tensor      float32, shape {h.shape}, {h.value_count:,} values")
    print(f"  codec       INCEPTIONN k={h.k} (error bound 2^-{h.k} = {2.0 ** -h.k:.6g})")
    print(f"  packets     {h.packet_count:,} INC_F32 of <= {h.packet_values} values")
    print(f"  payload     {payload:,} B (ratio {_ratio(4 * h.value_count, payload)} vs "
          f"{4 * h.value_count:,} B raw)")
    print(f"  file        {file_bytes:,} B (ratio {_ratio(4 * h.value_count, file_bytes)})")
    print(f"  classes     {_histogram_lines(tag_counts)}")
    if h.value_count:
        print(f"  bits/value  {8 * payload / h.value_count:.3f}")
    return 0
