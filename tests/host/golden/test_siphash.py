"""SipHash-2-4 (``host/golden/siphash.py``) against the reference implementation's vectors,
and section 7's derived quantities (tags, job keys, wrapped words) against their definitions."""
import random
import struct

import pytest

from host.golden.siphash import (
    REFERENCE_KEY,
    REFERENCE_TAGS,
    check_tag,
    job_key,
    message_blocks,
    reference_message,
    siphash,
    siphash24,
    tag_datagram,
    wrap_word,
)


@pytest.mark.parametrize("n", range(64))
def test_reference_vectors(n):
    assert siphash24(REFERENCE_KEY, reference_message(n)) == REFERENCE_TAGS[n]
    assert siphash(REFERENCE_KEY, reference_message(n), 2, 4) == REFERENCE_TAGS[n]


def test_the_c_implementation_is_the_python_transcription_bit_for_bit():
    """siphash24 runs siphashc's C code: on random keys and every length to 300 bytes,
    then datagram sizes to a jumbo frame, it is the plain transcription's result."""
    from host.golden import siphash as module

    assert module._siphash24_c is not None, "siphashc (a dependency) is not installed"
    rng = random.Random(24)
    lengths = list(range(301)) + [rng.randrange(301, 9001) for _ in range(20)] + [8972]
    for n in lengths:
        key, message = rng.randbytes(16), rng.randbytes(n)
        assert siphash24(key, message) == siphash(key, message, 2, 4), n


def test_the_protocol_check_values():
    """docs/protocol/network.md section 7's check values, and the paper's appendix."""
    assert siphash24(bytes(range(16)), b"") == 0x726FDB47DD0E0E31
    assert siphash24(bytes(range(16)), bytes(range(15))) == 0xA129CA6149BE45E5
    assert siphash24(bytes(range(16)), bytes(range(15))).to_bytes(8, "little") \
        == bytes.fromhex("e545be4961ca29a1")


def test_blocks_carry_the_length_mod_256():
    assert message_blocks(b"") == [0]
    assert message_blocks(bytes(range(8))) == [0x0706050403020100, 8 << 56]
    assert message_blocks(bytes(range(9))) == [0x0706050403020100, 9 << 56 | 0x08]
    blocks = message_blocks(bytes(300))
    assert len(blocks) == 300 // 8 + 1 and blocks[-1] == (300 % 256) << 56
    assert message_blocks(bytes(256))[-1] == 0      # 256 mod 256: the length byte is 0


def test_the_key_is_k0_then_k1_little_endian():
    """Swapping k0 and k1 changes the tag; the key's byte order is the reference's."""
    rng = random.Random(5)
    key = rng.randbytes(16)
    message = rng.randbytes(21)
    assert siphash24(key, message) != siphash24(key[8:] + key[:8], message)
    k0, k1 = struct.unpack("<QQ", key)
    assert struct.pack("<QQ", k0, k1) == key


def test_other_round_counts_differ_and_bad_parameters_are_refused():
    assert siphash(REFERENCE_KEY, b"abc", 1, 3) != siphash24(REFERENCE_KEY, b"abc")
    with pytest.raises(ValueError, match="16 bytes, got 15"):
        siphash24(bytes(15), b"")
    with pytest.raises(ValueError, match="c .rounds. must be a positive integer, not 0"):
        siphash(REFERENCE_KEY, b"", 0, 4)
    with pytest.raises(ValueError, match="d .rounds. must be a positive integer"):
        siphash(REFERENCE_KEY, b"", 2, 2.0)


def test_tag_datagram_round_trip_and_every_bit_counts():
    rng = random.Random(7)
    key = rng.randbytes(16)
    payload = rng.randbytes(32 + 40)
    tagged = tag_datagram(key, payload)
    assert tagged[:24] == payload[:24] and tagged[32:] == payload[32:]
    # the tag is over the payload with bytes 24..31 zeroed, little-endian in 24..31
    zeroed = payload[:24] + bytes(8) + payload[32:]
    assert tagged[24:32] == siphash24(key, zeroed).to_bytes(8, "little")
    # whatever bytes 24..31 held before does not matter
    assert tag_datagram(key, zeroed) == tagged
    assert check_tag(key, tagged)
    assert not check_tag(key, payload)
    for bit in rng.sample(range(8 * len(tagged)), 40):
        flipped = bytearray(tagged)
        flipped[bit // 8] ^= 1 << bit % 8
        assert not check_tag(key, bytes(flipped)), f"bit {bit} flipped and still accepted"
    assert not check_tag(rng.randbytes(16), tagged)


def test_a_datagram_shorter_than_a_header_has_no_tag():
    key = bytes(16)
    assert check_tag(key, tag_datagram(key, bytes(32)))
    assert not check_tag(key, bytes(31))
    with pytest.raises(ValueError, match="32-byte header, got 31 bytes"):
        tag_datagram(key, bytes(31))


def test_job_key_is_its_definition():
    control = bytes(range(0x40, 0x50))
    m0 = b"gwjobkey" + bytes([3, 0]) + (0x01020304).to_bytes(4, "little") + bytes(2)
    m1 = b"gwjobkey" + bytes([3, 1]) + (0x01020304).to_bytes(4, "little") + bytes(2)
    want = b"".join(siphash24(control, m).to_bytes(8, "little") for m in (m0, m1))
    assert job_key(control, 3, 0x01020304) == want
    keys = {job_key(control, job, epoch) for job in (0, 1, 255) for epoch in (0, 1, 2**32 - 1)}
    assert len(keys) == 9, "a new job or epoch gives a new key"
    # pinned (computed by this module): a change here changes every board's job keys
    assert job_key(REFERENCE_KEY, 1, 7).hex() == "e5858e6c83cf2003a2ce8ab8843e9e85"
    with pytest.raises(ValueError, match="job must be an integer in 0..255, not 256"):
        job_key(control, 256, 0)
    with pytest.raises(ValueError, match="epoch must be an unsigned 32-bit integer"):
        job_key(control, 0, -1)


def test_wrap_word_is_its_definition_and_its_own_inverse():
    control = bytes(range(0x40, 0x50))
    counter, address, word = 0x1_2345_6789_ABCD, 0x0000_0130, 0xDEADBEEF
    label = (b"gwwrap\0\0" + (counter & 0xFFFFFFFF).to_bytes(4, "little")
             + address.to_bytes(4, "little"))
    pad = siphash24(control, label) & 0xFFFFFFFF
    wrapped = wrap_word(control, counter, address, word)
    assert wrapped == word ^ pad
    assert wrap_word(control, counter, address, wrapped) == word
    # only the counter's low 32 bits enter; the address and the counter both do
    assert wrap_word(control, counter & 0xFFFFFFFF, address, word) == wrapped
    assert wrap_word(control, counter + 1, address, word) != wrapped
    assert wrap_word(control, counter, address + 1, word) != wrapped
    assert wrap_word(REFERENCE_KEY, 1, 0, 0) == 0xE25C90C0     # pinned, as job_key's
    with pytest.raises(ValueError, match="address must be an unsigned 32-bit integer"):
        wrap_word(control, 0, 1 << 32, 0)
    with pytest.raises(ValueError, match="counter must be an unsigned 64-bit integer"):
        wrap_word(control, -1, 0, 0)
