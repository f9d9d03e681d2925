"""``gradwire compress | decompress | info`` and the ``.gwz`` container."""
import re
import secrets
import struct
import zlib

import numpy as np
import pytest

from host import container
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
