"""``gradwire compress | decompress | info`` and the ``.gwz`` container."""
import math
import os
import re
import secrets
import shutil
import stat
import struct
import subprocess
import zlib

import numpy as np
import pytest

from host.commands import container
from host.cli import main
from host.golden import inceptionn as inc
from contract.packet import Packet


def fresh_rng():
    seed = secrets.randbits(64)
    return np.random.default_rng(seed), seed


def gradient_tensor(rng, shape):
    x = rng.normal(0, 1e-3, shape).astype(np.float32)
    flat = x.reshape(-1)
    if flat.size >= 8:
        flat[:4] = [np.inf, -np.inf, 0.3, -5.0]
        flat.view(np.uint32)[4] = 0x7FC0BEEF   # NaN with a payload
        flat.view(np.uint32)[5] = 0x80000000   # -0.0
        flat[6] = 0.05                          # a 16-bit code at k=10
    return x


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and \
        np.array_equal(a.view(np.uint32), b.view(np.uint32))


def run(capsys, *argv):
    status = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize("shape, k, per_packet", [((37, 53), 10, 2048), ((5000,), 3, 100),
                                                  ((2, 3, 4), 15, 7), ((), 10, 2048),
                                                  ((0, 4), 10, 2048)])
def test_round_trip_is_bit_exact(tmp_path, capsys, shape, k, per_packet):
    rng, seed = fresh_rng()
    x = gradient_tensor(rng, shape)
    np.save(tmp_path / "x.npy", x)
    status, out, _ = run(capsys, "compress", tmp_path / "x.npy", tmp_path / "x.gwz", "-k", k,
                         "--packet-values", per_packet)
    assert status == 0, seed
    status, _, _ = run(capsys, "decompress", tmp_path / "x.gwz", tmp_path / "y.npy")
    assert status == 0
    y = np.load(tmp_path / "y.npy")
    assert same_bits(y, inc.quantize(x, k)), seed
    finite = np.isfinite(x)
    assert np.all(np.abs(x[finite].astype(np.float64) - y[finite]) < 2.0 ** -k)


def test_file_is_the_nic_packets(tmp_path, capsys):
    """The container holds exactly tensor_to_packets(compress=True), laid out as documented."""
    rng, seed = fresh_rng()
    x = gradient_tensor(rng, (30, 100))
    np.save(tmp_path / "x.npy", x)
    assert run(capsys, "compress", tmp_path / "x.npy", tmp_path / "x.gwz", "-k", 9,
               "--packet-values", 256)[0] == 0
    data = (tmp_path / "x.gwz").read_bytes()
    expected = inc.tensor_to_packets(x, 9, compress=True, packet_values=256)
    (magic, version, header_bytes, k, dtype, ndim, _, per_packet, values, packets, crc,
     packets_bytes, _) = struct.unpack_from("<4sHHBBBBIQIIQQ", data)
    assert (magic, version, header_bytes, k, dtype, ndim) == (b"GWZ1", 1, 48 + 16, 9, 1, 2)
    assert (per_packet, values, packets) == (256, 3000, len(expected))
    assert struct.unpack_from("<2Q", data, 48) == (30, 100)
    zeroed = data[:28] + bytes(4) + data[32:]
    assert crc == zlib.crc32(zeroed)
    sizes = struct.unpack_from(f"<{packets}I", data, header_bytes)
    assert list(sizes) == [len(p.to_bytes()) for p in expected]
    assert packets_bytes == sum(sizes)
    assert data[header_bytes + 4 * packets:] == b"".join(p.to_bytes() for p in expected)
    assert len(data) == header_bytes + 4 * packets + packets_bytes
    parsed = container.parse_container(data)
    assert [Packet.from_bytes(i) for i in parsed.images] == expected


def test_summary_and_info(tmp_path, capsys):
    rng, seed = fresh_rng()
    x = gradient_tensor(rng, (64, 64))
    np.save(tmp_path / "x.npy", x)
    status, out, _ = run(capsys, "compress", tmp_path / "x.npy", tmp_path / "x.gwz")
    assert status == 0
    tags = np.bincount(inc.classify(x, 10).reshape(-1), minlength=4)
    histogram = "  ".join(f"{t:02b}: {c:,} ({100 * c / x.size:.2f}%)" for t, c in enumerate(tags))
    payload = sum(len(p.payload) for p in inc.tensor_to_packets(x, 10, compress=True))
    finite = np.isfinite(x)
    max_error = np.abs(x[finite].astype(np.float64) - inc.quantize(x, 10)[finite]).max()
    assert histogram in out
    assert f"{4 * x.size:,} B raw -> {payload:,} B compressed (ratio {4 * x.size / payload:.2f}x" in out
    assert f"max error   {max_error:.9g} over finite values" in out and "holds" in out
    assert "shape (64, 64)" in out

    status, info, _ = run(capsys, "info", tmp_path / "x.gwz")
    assert status == 0
    assert histogram in info
    assert "shape (64, 64)" in info and "k=10" in info and f"{x.size:,} values" in info
    assert re.search(r"packets\s+2 INC_F32 of <= 2048 values", info)
    assert f"payload     {payload:,} B" in info


def test_cast_and_byte_order(tmp_path, capsys):
    rng, _ = fresh_rng()
    x64 = rng.normal(0, 0.1, 100)
    np.save(tmp_path / "d.npy", x64)
    status, _, err = run(capsys, "compress", tmp_path / "d.npy", tmp_path / "d.gwz")
    assert status == 2 and "float64" in err and "--cast" in err
    status, _, err = run(capsys, "compress", tmp_path / "d.npy", tmp_path / "d.gwz", "--cast")
    assert status == 0 and "converted float64 to float32" in err
    run(capsys, "decompress", tmp_path / "d.gwz", tmp_path / "d2.npy")
    assert same_bits(np.load(tmp_path / "d2.npy"), inc.quantize(x64.astype(np.float32), 10))
    # Big-endian float32 is float32: accepted, bits kept (NaN payload included).
    big = gradient_tensor(rng, (40,)).astype(">f4")
    np.save(tmp_path / "b.npy", big)
    assert run(capsys, "compress", tmp_path / "b.npy", tmp_path / "b.gwz")[0] == 0
    run(capsys, "decompress", tmp_path / "b.gwz", tmp_path / "b2.npy")
    assert same_bits(np.load(tmp_path / "b2.npy"), inc.quantize(big.astype("<f4"), 10))


def test_bad_inputs(tmp_path, capsys):
    (tmp_path / "junk.npy").write_bytes(b"not numpy at all")
    np.save(tmp_path / "ints.npy", np.arange(5))
    np.savez(tmp_path / "arch.npz", a=np.zeros(3, np.float32))
    np.save(tmp_path / "x.npy", np.zeros(10, np.float32))
    cases = [
        (("compress", tmp_path / "missing.npy", tmp_path / "o.gwz"), "no such file"),
        (("compress", tmp_path / "junk.npy", tmp_path / "o.gwz"), "not a .npy file"),
        (("compress", tmp_path / "ints.npy", tmp_path / "o.gwz"), "int64"),
        (("compress", tmp_path / "arch.npz", tmp_path / "o.gwz"), ".npz"),
        (("compress", tmp_path, tmp_path / "o.gwz"), "directory"),
        (("compress", tmp_path / "x.npy", tmp_path / "no" / "o.gwz"), "cannot write"),
        (("decompress", tmp_path / "missing.gwz", tmp_path / "o.npy"), "no such file"),
        (("decompress", tmp_path / "junk.npy", tmp_path / "o.npy"), "header"),
        (("info", tmp_path / "x.npy"), "not a .gwz file"),
    ]
    for argv, message in cases:
        status, out, err = run(capsys, *argv)
        assert status == 2, argv
        assert message in err and err.startswith(f"gradwire {argv[0]}: error: "), (argv, err)
    for option in (("-k", "0"), ("-k", "16"), ("-k", "x"), ("--packet-values", "0"),
                   ("--packet-values", "2049")):
        with pytest.raises(SystemExit) as exit_info:
            main(["compress", str(tmp_path / "x.npy"), str(tmp_path / "o.gwz"), *option])
        assert exit_info.value.code == 2
        assert option[0] in capsys.readouterr().err


def test_corrupt_containers(tmp_path, capsys):
    rng, _ = fresh_rng()
    np.save(tmp_path / "x.npy", gradient_tensor(rng, (500,)))
    run(capsys, "compress", tmp_path / "x.npy", tmp_path / "x.gwz", "--packet-values", 64)
    good = (tmp_path / "x.gwz").read_bytes()

    def check(data, message):
        (tmp_path / "bad.gwz").write_bytes(data)
        for command in (("info",), ("decompress", tmp_path / "out.npy")):
            status, _, err = run(capsys, command[0], tmp_path / "bad.gwz", *command[1:])
            assert status == 2 and message in err, (message, err)
        assert not (tmp_path / "out.npy").exists()

    def with_crc(data):
        data = bytearray(data)
        data[28:32] = bytes(4)
        data[28:32] = struct.pack("<I", zlib.crc32(bytes(data)))
        return bytes(data)

    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 0x10
    check(bytes(flipped), "CRC mismatch")
    check(good[:-4], "truncated")
    check(good[:20], "shorter than")
    check(good + bytes(4), "trailing data")
    check(b"GWZ2" + good[4:], "not a .gwz file")
    check(with_crc(good[:4] + struct.pack("<H", 9) + good[6:]), "unsupported .gwz version 9")
    check(with_crc(good[:8] + bytes([0]) + good[9:]), "k=0")
    # A consistent container whose packet carries a bad bitstream: found when decoding.
    parsed = container.parse_container(good)
    images = [bytes(i) for i in parsed.images]
    packet = Packet.from_bytes(images[2])
    images[2] = Packet(packet.header, packet.payload + bytes(4)).to_bytes()
    check(container.pack_container(images, k=10, shape=(500,), packet_values=64), "over-long")
    images = [bytes(i) for i in parsed.images]
    packet = Packet.from_bytes(images[3])
    images[3] = Packet(packet.header.replace(k=4), packet.payload).to_bytes()
    check(container.pack_container(images, k=10, shape=(500,), packet_values=64),
          "packet 3 is not an INC_F32 packet with k=10")
    images = [bytes(i) for i in parsed.images]
    packet = Packet.from_bytes(images[1])
    images[1] = Packet(packet.header.replace(offset=0), packet.payload).to_bytes()
    check(container.pack_container(images, k=10, shape=(500,), packet_values=64), "overlap")
    with pytest.raises(container.ContainerError, match="packets for"):
        container.pack_container(images[:-1], k=10, shape=(500,), packet_values=64)


# -- outputs: never the input, nothing left behind ---------------------------------------

def listing(directory):
    return sorted(p.name for p in directory.iterdir())


def one_line_error(err, command):
    return err.startswith(f"gradwire {command}: error: ") and err.count("\n") == 1 \
        and "Traceback" not in err


def test_output_that_is_the_input_is_refused(tmp_path, capsys):
    """compress s.npy s.npy (and decompress x.gwz x.gwz) would replace the input by the
    output: refused before anything is written, whatever name (hard link, symbolic link,
    another path) the output is reached by."""
    rng, _ = fresh_rng()
    np.save(tmp_path / "s.npy", gradient_tensor(rng, (300,)))
    assert run(capsys, "compress", tmp_path / "s.npy", tmp_path / "x.gwz")[0] == 0
    (tmp_path / "d").mkdir()
    for name in ("s.npy", "x.gwz"):
        stem, suffix = name.split(".")
        os.link(tmp_path / name, tmp_path / f"{stem}-hard.{suffix}")
        os.symlink(tmp_path / name, tmp_path / f"{stem}-sym.{suffix}")
        os.symlink(os.path.join("..", name), tmp_path / "d" / name)   # relative, elsewhere
    before = {name: (tmp_path / name).read_bytes() for name in ("s.npy", "x.gwz")}
    names = listing(tmp_path)
    for command, source in (("compress", "s"), ("decompress", "x")):
        suffix = "npy" if source == "s" else "gwz"
        original = tmp_path / f"{source}.{suffix}"
        outputs = [original, tmp_path / f"{source}-hard.{suffix}",
                   tmp_path / f"{source}-sym.{suffix}", tmp_path / "d" / f"{source}.{suffix}",
                   tmp_path / "d" / ".." / f"{source}.{suffix}"]
        for input_path in (original, tmp_path / f"{source}-sym.{suffix}"):
            for output in outputs:
                status, out, err = run(capsys, command, input_path, output)
                assert status == 2 and one_line_error(err, command), (command, output, err)
                assert "is the input file" in err and str(output) in err, err
                assert listing(tmp_path) == names and listing(tmp_path / "d") == \
                    ["s.npy", "x.gwz"]
                assert {n: (tmp_path / n).read_bytes() for n in before} == before
    # A copy is another file: accepted.
    (tmp_path / "copy.gwz").write_bytes(before["x.gwz"])
    assert run(capsys, "decompress", tmp_path / "x.gwz", tmp_path / "copy.gwz")[0] == 0


def test_output_that_is_a_directory_is_refused(tmp_path, capsys):
    rng, _ = fresh_rng()
    np.save(tmp_path / "s.npy", gradient_tensor(rng, (300,)))
    assert run(capsys, "compress", tmp_path / "s.npy", tmp_path / "x.gwz")[0] == 0
    (tmp_path / "out").mkdir()
    names = listing(tmp_path)
    for argv in (("compress", tmp_path / "s.npy", tmp_path / "out"),
                 ("decompress", tmp_path / "x.gwz", tmp_path / "out")):
        status, _, err = run(capsys, *argv)
        assert status == 2 and one_line_error(err, argv[0]) and "is a directory" in err, err
        assert listing(tmp_path) == names and listing(tmp_path / "out") == []


def _set_up_outputs(tmp_path, capsys):
    """An input of each kind, an existing output of each kind (to be kept as it is) and a
    stray `OUT.part` of the user's (never touched)."""
    rng, _ = fresh_rng()
    np.save(tmp_path / "s.npy", gradient_tensor(rng, (5000,)))
    assert run(capsys, "compress", tmp_path / "s.npy", tmp_path / "x.gwz",
               "--packet-values", 64)[0] == 0
    for name in ("old.gwz", "old.npy", "old.gwz.part", "old.npy.part"):
        (tmp_path / name).write_bytes(b"the user's own " + name.encode())
    return [(("compress", tmp_path / "s.npy", tmp_path / "old.gwz", "--packet-values", 64),
             tmp_path / "old.gwz"),
            (("decompress", tmp_path / "x.gwz", tmp_path / "old.npy"), tmp_path / "old.npy")]


def _check_nothing_changed(tmp_path, names, contents):
    assert listing(tmp_path) == names
    assert {n: (tmp_path / n).read_bytes() for n in contents} == contents


@pytest.mark.parametrize("failure", [PermissionError(1, "Operation not permitted"),
                                     KeyboardInterrupt()])
def test_failed_rename_leaves_nothing(tmp_path, capsys, monkeypatch, failure):
    """The output is written to a temporary file renamed over it at the end: when that
    rename fails (or is interrupted), the temporary file is removed (no full-size OUT.part
    is left) and the old output is kept."""
    cases = _set_up_outputs(tmp_path, capsys)
    names = listing(tmp_path)
    contents = {n: (tmp_path / n).read_bytes() for n in names}

    def refuse(source, destination):
        raise failure

    monkeypatch.setattr(os, "replace", refuse)
    for argv, _ in cases:
        status, _, err = run(capsys, *argv)
        if isinstance(failure, KeyboardInterrupt):
            assert status == 130
        else:
            assert status == 2 and one_line_error(err, argv[0]), err
            assert "cannot write: Operation not permitted" in err, err
        _check_nothing_changed(tmp_path, names, contents)


def test_immutable_output_leaves_nothing(tmp_path, capsys):
    """A real refused rename: the output is immutable (chattr +i; needs root)."""
    if shutil.which("chattr") is None:
        pytest.skip("no chattr")
    cases = _set_up_outputs(tmp_path, capsys)
    made = []
    try:
        for _, output in cases:
            if subprocess.run(["chattr", "+i", str(output)], capture_output=True).returncode:
                pytest.skip("chattr +i is not permitted here")
            made.append(output)
        names = listing(tmp_path)
        contents = {n: (tmp_path / n).read_bytes() for n in names}
        for argv, _ in cases:
            status, _, err = run(capsys, *argv)
            assert status == 2 and one_line_error(err, argv[0]) and "cannot write" in err, err
            _check_nothing_changed(tmp_path, names, contents)
    finally:
        for output in made:
            subprocess.run(["chattr", "-i", str(output)], check=True)


@pytest.mark.parametrize("where", ["compress", "decompress"])
def test_interrupt_leaves_nothing(tmp_path, capsys, monkeypatch, where):
    """KeyboardInterrupt (exit status 130) in the middle of writing: nothing is left and
    the old output is kept."""
    from host.commands import codec

    cases = dict((argv[0], argv) for argv, _ in _set_up_outputs(tmp_path, capsys))
    names = listing(tmp_path)
    contents = {n: (tmp_path / n).read_bytes() for n in names}
    monkeypatch.setattr(codec, "CHUNK_VALUES", 1024)
    calls = []
    target = "tensor_to_packets" if where == "compress" else "packets_to_tensor"
    real = getattr(inc, target)

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:   # after two chunks have been written
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(inc, target, interrupted)
    assert run(capsys, *cases[where])[0] == 130
    assert len(calls) == 3
    _check_nothing_changed(tmp_path, names, contents)


def test_output_permissions_follow_the_umask(tmp_path, capsys):
    rng, _ = fresh_rng()
    np.save(tmp_path / "s.npy", gradient_tensor(rng, (300,)))
    old = os.umask(0o027)
    try:
        assert run(capsys, "compress", tmp_path / "s.npy", tmp_path / "x.gwz")[0] == 0
        assert run(capsys, "decompress", tmp_path / "x.gwz", tmp_path / "y.npy")[0] == 0
    finally:
        os.umask(old)
    for name in ("x.gwz", "y.npy"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o640


# -- forged containers -------------------------------------------------------------------

def forge(shape, images, *, k=10, packet_values=2048, value_count=None, packet_count=None,
          packets_bytes=None, index=None, version=1, dtype=1, ndim=None, header_bytes=None,
          magic=b"GWZ1"):
    """A .gwz file with these fields, whatever they say, and a correct CRC."""
    ndim = len(shape) if ndim is None else ndim
    header_bytes = 48 + 8 * ndim if header_bytes is None else header_bytes
    index = [len(i) for i in images] if index is None else index
    fixed = struct.pack("<4sHHBBBBIQIIQQ", magic, version, header_bytes, k, dtype, ndim, 0,
                        packet_values, math.prod(shape) if value_count is None else value_count,
                        len(index) if packet_count is None else packet_count, 0,
                        sum(index) if packets_bytes is None else packets_bytes, 0)
    data = bytearray(fixed + struct.pack(f"<{len(shape)}Q", *shape)
                     + struct.pack(f"<{len(index)}I", *index) + b"".join(images))
    data[28:32] = struct.pack("<I", zlib.crc32(bytes(data)))
    return bytes(data)


def images_of(x, k=10, packet_values=2048):
    return [p.to_bytes() for p in inc.tensor_to_packets(x, k, compress=True,
                                                        packet_values=packet_values)]


def check_refused(tmp_path, capsys, data, message, trace=True):
    """info and decompress refuse the file with a one-line error (exit 2), having
    allocated next to nothing, and leave no output."""
    import tracemalloc

    path = tmp_path / "forged.gwz"
    path.write_bytes(data)
    for argv in (("info", path), ("decompress", path, tmp_path / "out.npy")):
        peak = 0
        if trace:
            tracemalloc.start()
        try:
            status, _, err = run(capsys, *argv)
            if trace:
                _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert status == 2 and one_line_error(err, argv[0]), (message, err)
        assert message in err, (message, err)
        assert peak < 4 * len(data) + (4 << 20), (message, peak)
        assert not (tmp_path / "out.npy").exists()
        assert listing(tmp_path) == ["forged.gwz"]


def check_accepted(tmp_path, capsys, data, expected):
    path = tmp_path / "forged.gwz"
    path.write_bytes(data)
    assert run(capsys, "info", path)[0] == 0
    status, _, err = run(capsys, "decompress", path, tmp_path / "out.npy")
    assert status == 0, err
    assert same_bits(np.load(tmp_path / "out.npy"), expected)
    (tmp_path / "out.npy").unlink()


def test_forged_huge_counts_are_refused_before_allocating(tmp_path, capsys):
    """A 6 KB file whose header claims 2^33 values (and variants): every size the header
    claims is checked against the file's real size first."""
    rng, _ = fresh_rng()
    x = gradient_tensor(rng, (3000,))
    images = images_of(x)
    # The file: 2^33 values in 3 packets of 2^32 - 1 values (a reader that
    # believes it allocates 32 GiB).
    data = forge((2 ** 33,), images + images_of(x[:8]), packet_values=2 ** 32 - 1)
    assert len(data) < 8000
    check_refused(tmp_path, capsys, data, "value count 8589934592 is more than 4294967295")
    # 2^33 values of 2048 per packet: an index of 2^22 entries that the file does not hold.
    check_refused(tmp_path, capsys, forge((2 ** 33,), images, packet_count=2 ** 22),
                  "truncated")
    # Counts that disagree with the payload: packets too short for the values claimed.
    tiny = images_of(np.zeros(8, np.float32)) * 49   # 36 bytes each
    fewest = 48 * len(images_of(np.zeros(2048, np.float32))[0]) + \
        len(images_of(np.zeros(100_000 - 48 * 2048, np.float32))[0])
    check_refused(tmp_path, capsys, forge((100_000,), tiny),
                  f"100000 values take at least {fewest} bytes of packets, the file holds 1764")
    check_refused(tmp_path, capsys, forge((5000,), images, packet_count=2),
                  "2 packets for 5000 values of 2048 per packet")
    check_refused(tmp_path, capsys, forge((3000,), images, packets_bytes=sum(map(len, images))
                                          + 8, index=[len(images[0]) + 8, len(images[1])])
                  [:-8], "truncated")
    check_refused(tmp_path, capsys, forge((3000,), images, index=[len(images[0]) + 4,
                                                                  len(images[1]) - 4]),
                  "packet 1 is not an INC_F32 packet with k=10")   # index and images disagree


def test_forged_field_limits(tmp_path, capsys):
    """Every field of the container at its limit (accepted) and one past it (refused)."""
    rng, seed = fresh_rng()
    x = gradient_tensor(rng, (3000,))
    images = images_of(x)
    good = forge((3000,), images)
    check_accepted(tmp_path, capsys, good, inc.quantize(x, 10))
    # version, dtype, magic, header_bytes, ndim
    check_refused(tmp_path, capsys, forge((3000,), images, version=2), "unsupported .gwz version 2")
    check_refused(tmp_path, capsys, forge((3000,), images, version=0), "unsupported .gwz version 0")
    for code in (0, 2):
        check_refused(tmp_path, capsys, forge((3000,), images, dtype=code),
                      f"unknown dtype code {code}")
    check_refused(tmp_path, capsys, forge((3000,), images, magic=b"GWZ0"), "not a .gwz file")
    check_refused(tmp_path, capsys, forge((3000,), images, header_bytes=64),
                  "inconsistent header size 64")
    shape32 = (1,) * 29 + (3, 1000, 1)
    check_accepted(tmp_path, capsys, forge(shape32, images), inc.quantize(x, 10).reshape(shape32))
    shape33 = (1,) * 30 + (3, 1000, 1)
    check_refused(tmp_path, capsys, forge(shape33, images), "33 dimensions, at most 32")
    # k: 1 and 15 accepted, 0 and 16 refused
    for k in (1, 15):
        check_accepted(tmp_path, capsys, forge((3000,), images_of(x, k), k=k), inc.quantize(x, k))
    for k in (0, 16):
        packets = [Packet(p.header.replace(k=k), p.payload).to_bytes()
                   for p in inc.tensor_to_packets(x, 10, compress=True)]
        check_refused(tmp_path, capsys, forge((3000,), packets, k=k), f"k={k} is outside 1..15")
    # packet_values: 1 and 2048 accepted, 0 and 2049 refused
    small = x[:40]
    check_accepted(tmp_path, capsys, forge((40,), images_of(small, 10, 1), packet_values=1),
                   inc.quantize(small, 10))
    check_accepted(tmp_path, capsys, forge((3000,), images_of(x, 10, 2048)), inc.quantize(x, 10))
    check_refused(tmp_path, capsys, forge((3000,), images_of(x, 10, 2049), packet_values=2049),
                  "packet_values=2049 is outside 1..2048")
    check_refused(tmp_path, capsys, forge((0,), [], packet_values=0),
                  "packet_values=0 is outside 1..2048")
    # value_count: 2^32 - 1 passes its own check (and then fails on the packets), 2^32 not
    check_refused(tmp_path, capsys, forge((2 ** 32 - 1,), images),
                  "2 packets for 4294967295 values of 2048 per packet")
    check_refused(tmp_path, capsys, forge((2 ** 32,), images),
                  "value count 4294967296 is more than 4294967295")
    check_refused(tmp_path, capsys, forge((3000,), images, value_count=3001),
                  "value count 3001 does not match shape (3000,)")
    # An empty tensor: the other dimensions may be up to 2^32 - 1, not more.
    check_accepted(tmp_path, capsys, forge((0, 2 ** 32 - 1), []),
                   np.zeros((0, 2 ** 32 - 1), np.float32))
    check_refused(tmp_path, capsys, forge((0, 2 ** 32), []), "has more than 4294967295 values")
    # packet_count, packets_bytes and the index
    check_refused(tmp_path, capsys, forge((3000,), images + images[1:], packet_count=3),
                  "3 packets for 3000 values")
    sizes = [len(i) for i in images]
    check_refused(tmp_path, capsys, forge((3000,), images, index=[sizes[0] - 4, sizes[1] + 4],
                                          packets_bytes=sum(sizes)),
                  "packet 1 is not an INC_F32 packet with k=10")
    check_refused(tmp_path, capsys, forge((3000,), images, index=[sizes[0] + 4, sizes[1]],
                                          packets_bytes=sum(sizes) + 4)[:-4], "truncated")
    check_refused(tmp_path, capsys, forge((3000,), images, index=[sizes[0], sizes[1] + 2],
                                          packets_bytes=sum(sizes)),
                  "packet index adds up to")
    # Each packet's length: its fewest and most bytes accepted, one word past refused.
    for count in (1, 7, 8, 9, 2048):
        fewest, most = (int(b[0]) for b in container.image_size_bounds([count]))
        zeros, raw = np.zeros(count, np.float32), np.full(count, np.float32(2.5))
        assert len(images_of(zeros)[0]) == fewest and len(images_of(raw)[0]) == most
        check_accepted(tmp_path, capsys, forge((count,), images_of(zeros)), zeros)
        check_accepted(tmp_path, capsys, forge((count,), images_of(raw)), raw)
        # (a second, raw packet keeps the file as long as its values need in all)
        short = images_of(zeros)[0][:-4]
        raw2 = np.full(2 * count, np.float32(2.5))
        check_refused(tmp_path, capsys, forge((2 * count,), [short, images_of(raw2, 10, count)[1]],
                                              packet_values=count),
                      f"packet 0 is {fewest - 4} bytes: too short for its {count} values")
        check_refused(tmp_path, capsys, forge((count,), [images_of(raw)[0] + bytes(4)]),
                      f"packet 0 is {most + 4} bytes: more than its {count} values can take")


def test_truncated_anywhere_is_refused(tmp_path, capsys):
    rng, _ = fresh_rng()
    data = forge((2, 50), images_of(gradient_tensor(rng, (100,)), 10, 32), packet_values=32)
    # Every byte of the header and the index, then every 5th of the packets.
    for cut in [*range(48 + 16 + 16), *range(48 + 16 + 16, len(data), 5), len(data) - 1]:
        check_refused(tmp_path, capsys, data[:cut],
                      "shorter than" if cut < 48 else "truncated", trace=False)


# -- memory: chunks, not the whole tensor ------------------------------------------------

def test_chunking_does_not_change_the_bytes(tmp_path, capsys, monkeypatch):
    """Any chunk size gives the same .gwz and .npy bytes (np.save's), for C- and
    Fortran-order inputs, and info the same histogram."""
    from host.commands import codec

    rng, seed = fresh_rng()
    x = gradient_tensor(rng, (37, 111))
    np.save(tmp_path / "c.npy", x)
    np.save(tmp_path / "f.npy", np.asfortranarray(x))
    outputs = {}
    for chunk in (1 << 20, 1000, 64, 1):
        monkeypatch.setattr(codec, "CHUNK_VALUES", chunk)
        for order in "cf":
            gwz, npy = tmp_path / f"{order}{chunk}.gwz", tmp_path / f"{order}{chunk}.npy"
            assert run(capsys, "compress", tmp_path / f"{order}.npy", gwz,
                       "--packet-values", 64)[0] == 0
            assert run(capsys, "decompress", gwz, npy)[0] == 0
            status, info, _ = run(capsys, "info", gwz)
            assert status == 0
            outputs.setdefault("gwz", set()).add(gwz.read_bytes())
            outputs.setdefault("npy", set()).add(npy.read_bytes())
            outputs.setdefault("info", set()).add(info.replace(str(gwz), "F"))
    assert all(len(v) == 1 for v in outputs.values()), seed
    saved = tmp_path / "saved.npy"
    np.save(saved, inc.quantize(x, 10))
    assert outputs["npy"] == {saved.read_bytes()}


def test_commands_work_in_bounded_memory(tmp_path, capsys, monkeypatch):
    """compress, decompress and info hold a chunk at a time, not the tensor, its file or
    its packets: with small chunks and passes, the peak allocation (tracemalloc) of each
    on 2^21 all-raw values stays far below the tensor's 8 MiB."""
    import tracemalloc

    from host.commands import codec

    monkeypatch.setattr(codec, "CHUNK_VALUES", 1 << 14)
    monkeypatch.setattr(inc, "_PASS_VALUES", 1 << 12)
    monkeypatch.setattr(container, "_READ_BYTES", 1 << 16, raising=False)
    rng, seed = fresh_rng()
    n = 1 << 21
    x = rng.integers(0x3F800000, 0x7F800000, n, dtype=np.uint32).view(np.float32)
    np.save(tmp_path / "x.npy", x)
    peaks = {}
    for argv in (("compress", tmp_path / "x.npy", tmp_path / "x.gwz"),
                 ("decompress", tmp_path / "x.gwz", tmp_path / "y.npy"),
                 ("info", tmp_path / "x.gwz")):
        tracemalloc.start()
        try:
            assert run(capsys, *argv)[0] == 0
            peaks[argv[0]] = tracemalloc.get_traced_memory()[1] / (4 * n)
        finally:
            tracemalloc.stop()
    assert same_bits(np.load(tmp_path / "y.npy"), x), seed
    assert all(peak < 0.25 for peak in peaks.values()), peaks
