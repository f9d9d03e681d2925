"""``gradwire compress | decompress | info``: INCEPTIONN-compressed tensors in ``.gwz`` files.

``compress`` splits a float32 ``.npy`` tensor into the ``INC_F32`` packets the NIC would send
(``host.golden.inceptionn.tensor_to_packets(compress=True)``) and stores them in a ``.gwz``
container (``host/container.py``, ``docs/container-format.md``); ``decompress`` decodes them
back into a ``.npy`` of the same shape; ``info`` describes a ``.gwz`` file.

Only float32 is compressed. Other float dtypes are refused unless ``--cast`` is given, which
rounds them to float32 first (the error bound then holds against the float32 values).
Work is done in chunks of about a million values, with a progress bar on stderr for large
inputs (when stderr is a terminal).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
from tqdm import tqdm

from ..cli import CliError
from ..container import ContainerError, read_container, write_container
from ..golden import inceptionn as inc
from contract.header import HEADER_BYTES, PacketType
from contract.packet import Packet, PacketError

__all__ = ["add_compress_arguments", "run_compress", "add_decompress_arguments",
           "run_decompress", "add_info_arguments", "run_info", "CHUNK_VALUES"]

#: Values handled per step (the progress bar advances by this much).
CHUNK_VALUES = 1 << 20
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


# -- helpers -----------------------------------------------------------------------------

def _load_tensor(path, cast):
    try:
        with open(path, "rb") as f:
            magic = f.read(6)
        if magic[:2] == b"PK":
            raise CliError(f"{path}: an .npz archive; give a single .npy array")
        if magic != b"\x93NUMPY":
            raise CliError(f"{path}: not a .npy file (it does not start with the NumPy magic)")
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise CliError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise CliError(f"{path}: is a directory") from None
    except OSError as exc:
        raise CliError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except (ValueError, EOFError) as exc:
        raise CliError(f"{path}: not a readable .npy array ({exc})") from None
    if array.dtype.kind == "f" and array.dtype.itemsize == 4:
        return np.asarray(array, dtype="<f4"), None   # any byte order, bits preserved
    if array.dtype.kind == "f" and cast:
        note = f"converted {array.dtype} to float32 (rounded to nearest) before compressing"
        return np.asarray(array, dtype=np.float64).astype("<f4"), note
    hint = " (pass --cast to round it to float32)" if array.dtype.kind == "f" else ""
    raise CliError(f"{path}: holds {array.dtype} values; gradwire compresses float32 "
                   f"only{hint}")


def _read_gwz(path):
    try:
        return read_container(path)
    except FileNotFoundError:
        raise CliError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise CliError(f"{path}: is a directory") from None
    except OSError as exc:
        raise CliError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except ContainerError as exc:
        raise CliError(f"{path}: {exc}") from None


def _progress(total, description):
    return tqdm(total=total, desc=description, unit="val", unit_scale=True, file=sys.stderr,
                leave=False, disable=True if total < PROGRESS_MIN_VALUES else None)


def _chunk_packets(packet_values):
    return max(1, CHUNK_VALUES // packet_values)


def _decode_container(container, path, description):
    """Decode every packet of a container into a flat float32 array (checking each header
    against the container's)."""
    header = container.header
    n, per_packet = header.value_count, header.packet_values
    out = np.empty(n, dtype=np.float32)
    step = _chunk_packets(per_packet)
    with _progress(n, description) as bar:
        for first in range(0, header.packet_count, step):
            images = container.images[first:first + step]
            packets = []
            for i, image in enumerate(images, first):
                try:
                    packet = Packet.from_bytes(image)
                except PacketError as exc:
                    raise CliError(f"{path}: packet {i}: {exc}") from None
                h = packet.header
                if h.type != PacketType.INC_F32 or h.k != header.k:
                    raise CliError(f"{path}: packet {i} is not an INC_F32 packet with "
                                   f"k={header.k} ({h})")
                packets.append(packet)
            base = first * per_packet
            count = min(n - base, len(images) * per_packet)
            try:
                out[base:base + count] = inc.packets_to_tensor(packets, count, offset=base)
            except inc.ReassemblyError as exc:
                raise CliError(f"{path}: packets {first}..{first + len(images) - 1}: "
                               f"{exc}") from None
            bar.update(count)
    return out


def _histogram_lines(tag_counts):
    total = int(tag_counts.sum())
    cells = []
    for tag, count in enumerate(tag_counts.tolist()):
        share = 100.0 * count / total if total else 0.0
        cells.append(f"{tag:02b}: {count:,} ({share:.2f}%)")
    return "  ".join(cells)


def _ratio(raw, compressed):
    return f"{raw / compressed:.2f}x" if compressed else "n/a"


def _write_npy(path, array):
    temporary = f"{path}.part"
    try:
        with open(temporary, "wb") as f:
            np.save(f, array, allow_pickle=False)
        os.replace(temporary, path)
    except OSError as exc:
        raise CliError(f"{path}: cannot write: {exc.strerror or exc}") from None


# -- commands ----------------------------------------------------------------------------

def run_compress(args) -> int:
    tensor, note = _load_tensor(args.input, args.cast)
    if note:
        print(f"gradwire compress: note: {note}", file=sys.stderr)
    k, per_packet = args.k, args.packet_values
    flat = tensor.reshape(-1)
    n = flat.size
    if n >= 2 ** 32:
        raise CliError(f"{args.input}: {n} values; a packet offset is 32 bits")
    images, tag_counts, max_error = [], np.zeros(4, dtype=np.int64), 0.0
    step = _chunk_packets(per_packet) * per_packet
    with _progress(n, "compress") as bar:
        for base in range(0, n, step):
            chunk = np.ascontiguousarray(flat[base:base + step])
            packets = inc.tensor_to_packets(chunk, k, compress=True, packet_values=per_packet,
                                            seq=base // per_packet, offset=base)
            images.extend(p.to_bytes() for p in packets)
            tag_counts += np.bincount(inc.classify(chunk, k), minlength=4)
            finite = np.isfinite(chunk)
            if finite.any():
                error = np.abs(chunk[finite].astype(np.float64)
                               - inc.quantize(chunk[finite], k).astype(np.float64))
                max_error = max(max_error, float(error.max()))
            bar.update(chunk.size)
    temporary = f"{args.output}.part"
    try:
        header = write_container(temporary, images, k=k, shape=tensor.shape,
                                 packet_values=per_packet)
        os.replace(temporary, args.output)
    except OSError as exc:
        raise CliError(f"{args.output}: cannot write: {exc.strerror or exc}") from None

    payload = header.packets_bytes - HEADER_BYTES * header.packet_count
    input_bytes = os.path.getsize(args.input)
    bound = 2.0 ** -k
    print(f"{args.input} -> {args.output}")
    print(f"  values      {n:,} float32, shape {tuple(tensor.shape)}")
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
    container = _read_gwz(args.input)
    values = _decode_container(container, args.input, "decompress")
    _write_npy(args.output, values.reshape(container.header.shape))
    h = container.header
    print(f"{args.input} -> {args.output}: {h.value_count:,} float32 values, "
          f"shape {h.shape}, k={h.k}")
    return 0


def run_info(args) -> int:
    container = _read_gwz(args.input)
    h = container.header
    # Decoding checks every packet; by idempotence the decoded values classify exactly
    # like the original ones, which gives the class histogram.
    values = _decode_container(container, args.input, "info")
    tag_counts = np.bincount(inc.classify(values, h.k), minlength=4) if values.size \
        else np.zeros(4, dtype=np.int64)
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
