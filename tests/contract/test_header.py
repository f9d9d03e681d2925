"""The packet header: one definition, packed and parsed the same by host and gateware."""
import random

import pytest
from amaranth.lib import data

from contract.header import (
    HEADER_BYTES,
    HEADER_FIELDS,
    MAGIC,
    Flags,
    Header,
    HeaderError,
    PacketType,
)
from contract.packet import Packet, PacketError
from hdl.header import HeaderLayout


def random_header(rng):
    return Header(type=rng.randrange(4), flags=rng.randrange(8), k=rng.randrange(256),
                  job=rng.randrange(256), worker=rng.randrange(256),
                  exponent=rng.randrange(-128, 128), count=rng.getrandbits(32),
                  slot=rng.getrandbits(16), slot_version=rng.randrange(2),
                  seq=rng.getrandbits(32), offset=rng.getrandbits(32))


def test_byte_offsets_follow_the_spec():
    h = Header(type=PacketType.INC_F32, flags=Flags.COMPRESS | Flags.ERROR, k=10, job=3,
               worker=5, exponent=-2, count=0x11223344, slot=0xBEEF, slot_version=1,
               seq=0xA1B2C3D4, offset=0x01020304)
    raw = h.pack()
    assert len(raw) == HEADER_BYTES
    assert raw.hex() == ("47" "01" "01" "05" "0a" "03" "05" "fe" "44332211" "efbe" "01" "00"
                         "d4c3b2a1" "04030201" + "00" * 8)


def test_round_trip_random():
    rng = random.Random(1)
    for _ in range(500):
        h = random_header(rng)
        assert Header.parse(h.pack()) == h
        assert Header.from_int(h.to_int()) == h


def test_gateware_layout_matches_host_definition():
    """The Amaranth view of a header beat reads every field as the host packs it."""
    rng = random.Random(2)
    assert HeaderLayout.size == 8 * HEADER_BYTES
    for _ in range(200):
        h = random_header(rng)
        view = data.Const(HeaderLayout, h.to_int())
        for f in HEADER_FIELDS:
            if f.name.startswith("reserved"):
                assert view[f.name] == 0
            else:
                assert view[f.name] == getattr(h, f.name), f.name
        # and each field sits at the spec's bit offset
    offsets = {name: field.offset for name, field in HeaderLayout}
    for f in HEADER_FIELDS:
        assert offsets[f.name] == 8 * f.offset, f.name


@pytest.mark.parametrize("field,value", [
    ("count", -1), ("count", 1 << 32), ("slot", 1 << 16), ("exponent", 128), ("exponent", -129),
    ("worker", 256), ("k", 300), ("seq", 1.5),
])
def test_pack_names_the_bad_field(field, value):
    with pytest.raises(HeaderError) as info:
        Header(**{field: value}).pack()
    assert info.value.field == field
    assert field in str(info.value)


@pytest.mark.parametrize("changes,field", [
    ({"magic": 0x48}, "magic"), ({"version": 2}, "version"), ({"type": 9}, "type"),
    ({"type": PacketType.INC_F32, "k": 0}, "k"), ({"type": PacketType.INC_F32, "k": 16}, "k"),
    ({"slot_version": 2}, "slot_version"),
])
def test_validate_names_the_bad_field(changes, field):
    with pytest.raises(HeaderError) as info:
        Header(**changes).validate()
    assert info.value.field == field


def test_parse_ignores_reserved_bytes_and_rejects_short_input():
    raw = bytearray(Header(count=7).pack())
    raw[15] = 0xAA
    raw[24:32] = b"\xff" * 8
    assert Header.parse(raw) == Header(count=7)
    with pytest.raises(HeaderError) as info:
        Header.parse(raw[:31])
    assert info.value.field == "length"
    assert Header.parse(raw).magic == MAGIC


def test_packet_beats():
    p = Packet(Header(count=9), bytes(range(36)))
    beats = p.to_beats()
    assert len(beats) == p.beats == 3
    assert beats[0] == (Header(count=9).to_int(), (1 << 32) - 1, False)
    assert beats[2][1] == 0xF and beats[2][2]
    assert Packet.from_bytes(p.to_bytes()) == p
    with pytest.raises(PacketError):
        Packet(Header(), b"abc")
    with pytest.raises(PacketError):
        Packet.from_bytes(b"\x47" * 10)
