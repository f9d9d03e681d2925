"""SipHash-2-4 and the quantities ``docs/protocol/network.md`` section 7 derives from it.

SipHash (Aumasson and Bernstein, 2012) is a keyed 64-bit ARX function: four 64-bit state
words, additions modulo 2**64, rotations and XORs. :func:`siphash` is a plain transcription
of the reference implementation (``siphash.c`` of the SipHash repository) for any number of
compression (``c``) and finalization (``d``) rounds; :func:`siphash24` is the ``c = 2``,
``d = 4`` instance the protocol uses, and the gateware (``hdl/crypto/siphash.py``) is
checked bit-exactly against it. :func:`siphash24` computes it with the C implementation of
``siphashc`` (130 times faster: a host tags and checks every datagram of an authenticated
job), which the tests hold to :func:`siphash` on the reference vectors and random inputs;
where that package is missing it is :func:`siphash` itself.

On top of it, section 7's derived quantities:

- :func:`tag_datagram` / :func:`check_tag`: a datagram's tag, over its whole UDP payload
  with header bytes 24..31 zeroed, written little-endian into bytes 24..31;
- :func:`job_key`: a job's 128-bit key, derived from the control key, the job and its epoch;
- :func:`wrap_word`: the 32-bit value a wrapped write sends for one word of a key.
"""
from __future__ import annotations

import struct

try:                       # the reference implementation in C (PyPI ``siphashc``)
    from siphashc import siphash as _siphash24_c
except ImportError:        # pragma: no cover (a dependency of the project)
    _siphash24_c = None

from contract.header import HEADER_BYTES
from contract.network import CTRL_KEY_OFFSET, JOB_KEY_LABEL, WRAP_LABEL

__all__ = ["KEY_BYTES", "TAG_OFFSET", "TAG_BYTES", "siphash", "siphash24", "sipround",
           "initial_state", "message_blocks", "tag_datagram", "check_tag", "job_key",
           "wrap_word", "WRAP_LABEL", "JOB_KEY_LABEL", "REFERENCE_KEY", "REFERENCE_TAGS",
           "reference_message"]

_MASK = (1 << 64) - 1
#: A SipHash key is 16 bytes: ``k0`` is bytes 0..7, ``k1`` bytes 8..15, each little-endian.
KEY_BYTES = 16
#: The tag takes the place of section 4's control key: header bytes 24..31, little-endian.
TAG_OFFSET = CTRL_KEY_OFFSET
TAG_BYTES = 8
#: (the 8-byte labels that open a wrapped write's and a job key's SipHash input,
#: WRAP_LABEL and JOB_KEY_LABEL, are contract.network's: the gateware derives job keys too)

# "somepseudorandomlygeneratedbytes", the constants v0..v3 start from (XORed with the key).
_INIT = (0x736F6D6570736575, 0x646F72616E646F6D, 0x6C7967656E657261, 0x7465646279746573)

#: The reference implementation's test vectors (``vectors_sip64`` of ``vectors.h`` in the
#: SipHash repository, github.com/veorq/SipHash, there as 8 little-endian bytes each):
#: ``REFERENCE_TAGS[n]`` is SipHash-2-4 under :data:`REFERENCE_KEY` of
#: :func:`reference_message` ``(n)``. Entry 15 is the paper's appendix example.
REFERENCE_KEY = bytes(range(16))
REFERENCE_TAGS = (
    0x726fdb47dd0e0e31, 0x74f839c593dc67fd, 0x0d6c8009d9a94f5a, 0x85676696d7fb7e2d,
    0xcf2794e0277187b7, 0x18765564cd99a68d, 0xcbc9466e58fee3ce, 0xab0200f58b01d137,
    0x93f5f5799a932462, 0x9e0082df0ba9e4b0, 0x7a5dbbc594ddb9f3, 0xf4b32f46226bada7,
    0x751e8fbc860ee5fb, 0x14ea5627c0843d90, 0xf723ca908e7af2ee, 0xa129ca6149be45e5,
    0x3f2acc7f57c29bdb, 0x699ae9f52cbe4794, 0x4bc1b3f0968dd39c, 0xbb6dc91da77961bd,
    0xbed65cf21aa2ee98, 0xd0f2cbb02e3b67c7, 0x93536795e3a33e88, 0xa80c038ccd5ccec8,
    0xb8ad50c6f649af94, 0xbce192de8a85b8ea, 0x17d835b85bbb15f3, 0x2f2e6163076bcfad,
    0xde4daaaca71dc9a5, 0xa6a2506687956571, 0xad87a3535c49ef28, 0x32d892fad841c342,
    0x7127512f72f27cce, 0xa7f32346f95978e3, 0x12e0b01abb051238, 0x15e034d40fa197ae,
    0x314dffbe0815a3b4, 0x027990f029623981, 0xcadcd4e59ef40c4d, 0x9abfd8766a33735c,
    0x0e3ea96b5304a7d0, 0xad0c42d6fc585992, 0x187306c89bc215a9, 0xd4a60abcf3792b95,
    0xf935451de4f21df2, 0xa9538f0419755787, 0xdb9acddff56ca510, 0xd06c98cd5c0975eb,
    0xe612a3cb9ecba951, 0xc766e62cfcadaf96, 0xee64435a9752fe72, 0xa192d576b245165a,
    0x0a8787bf8ecb74b2, 0x81b3e73d20b49b6f, 0x7fa8220ba3b2ecea, 0x245731c13ca42499,
    0xb78dbfaf3a8d83bd, 0xea1ad565322a1a0b, 0x60e61c23a3795013, 0x6606d7e446282b93,
    0x6ca4ecb15c5f91e1, 0x9f626da15c9625f3, 0xe51b38608ef25f57, 0x958a324ceb064572,
)


def reference_message(n: int) -> bytes:
    """The message of the reference vectors of length ``n``: the bytes 00, 01, .. n-1."""
    return bytes(range(n))


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _MASK


def sipround(v0: int, v1: int, v2: int, v3: int) -> tuple[int, int, int, int]:
    """One SipRound on the four state words (section 7's listing)."""
    v0 = (v0 + v1) & _MASK
    v1 = _rotl(v1, 13) ^ v0
    v0 = _rotl(v0, 32)
    v2 = (v2 + v3) & _MASK
    v3 = _rotl(v3, 16) ^ v2
    v0 = (v0 + v3) & _MASK
    v3 = _rotl(v3, 21) ^ v0
    v2 = (v2 + v1) & _MASK
    v1 = _rotl(v1, 17) ^ v2
    v2 = _rotl(v2, 32)
    return v0, v1, v2, v3


def _check_key(key) -> bytes:
    key = bytes(key)
    if len(key) != KEY_BYTES:
        raise ValueError(f"a SipHash key is {KEY_BYTES} bytes, got {len(key)}")
    return key


def initial_state(key) -> tuple[int, int, int, int]:
    """``v0 .. v3`` before the first block: the key's ``k0``/``k1`` XOR the constants."""
    k0, k1 = struct.unpack("<QQ", _check_key(key))
    return _INIT[0] ^ k0, _INIT[1] ^ k1, _INIT[2] ^ k0, _INIT[3] ^ k1


def message_blocks(message) -> list[int]:
    """The 64-bit blocks SipHash compresses: the message's whole 8-byte little-endian words,
    then one final block holding the 0..7 remaining bytes and, in its top byte, the length
    modulo 256 (so a message of ``n`` bytes has ``n // 8 + 1`` blocks)."""
    message = bytes(message)
    n = len(message)
    whole = n - n % 8
    blocks = [int.from_bytes(message[i:i + 8], "little") for i in range(0, whole, 8)]
    blocks.append(int.from_bytes(message[whole:], "little") | (n & 0xFF) << 56)
    return blocks


def siphash(key, message, c: int = 2, d: int = 4) -> int:
    """SipHash-``c``-``d`` of ``message`` under the 16-byte ``key``, as a 64-bit integer.

    Parameters
    ----------
    key : bytes-like
        16 bytes; ``k0`` is bytes 0..7 and ``k1`` bytes 8..15, each read little-endian.
    message : bytes-like
        Any length.
    c, d : int
        Compression rounds per block and finalization rounds (2 and 4 for SipHash-2-4).

    Returns
    -------
    int
        The tag; its 8 bytes as the reference implementation writes them are
        ``tag.to_bytes(8, "little")``.
    """
    for name, rounds in (("c", c), ("d", d)):
        if not isinstance(rounds, int) or rounds < 1:
            raise ValueError(f"{name} (rounds) must be a positive integer, not {rounds!r}")
    v0, v1, v2, v3 = initial_state(key)
    for m in message_blocks(message):
        v3 ^= m
        for _ in range(c):
            v0, v1, v2, v3 = sipround(v0, v1, v2, v3)
        v0 ^= m
    v2 ^= 0xFF
    for _ in range(d):
        v0, v1, v2, v3 = sipround(v0, v1, v2, v3)
    return v0 ^ v1 ^ v2 ^ v3


def siphash24(key, message) -> int:
    """SipHash-2-4 of ``message`` under the 16-byte ``key`` (see :func:`siphash`)."""
    if _siphash24_c is not None:
        return _siphash24_c(_check_key(key), bytes(message))
    return siphash(key, message, 2, 4)


# -- section 7's derived quantities ---------------------------------------------------------

def _check_datagram(payload) -> bytes:
    payload = bytes(payload)
    if len(payload) < HEADER_BYTES:
        raise ValueError(f"a tagged datagram holds at least a {HEADER_BYTES}-byte header, "
                         f"got {len(payload)} bytes")
    return payload


def _tag_of(key, payload: bytes) -> int:
    zeroed = payload[:TAG_OFFSET] + bytes(TAG_BYTES) + payload[TAG_OFFSET + TAG_BYTES:]
    return siphash24(key, zeroed)


def tag_datagram(key, payload) -> bytes:
    """``payload`` (a whole UDP payload, header first) with its tag under ``key`` in header
    bytes 24..31: SipHash-2-4 over the payload with those bytes zeroed, little-endian."""
    payload = _check_datagram(payload)
    tag = _tag_of(key, payload).to_bytes(TAG_BYTES, "little")
    return payload[:TAG_OFFSET] + tag + payload[TAG_OFFSET + TAG_BYTES:]


def check_tag(key, payload) -> bool:
    """Whether the tag in header bytes 24..31 of ``payload`` is its tag under ``key``.
    A payload too short to hold a header has no tag: False."""
    payload = bytes(payload)
    if len(payload) < HEADER_BYTES:
        return False
    sent = int.from_bytes(payload[TAG_OFFSET:TAG_OFFSET + TAG_BYTES], "little")
    return sent == _tag_of(key, payload)


def job_key(control_key, job: int, epoch: int) -> bytes:
    """A job's 16-byte key: ``SipHash-2-4(control key, m0) || SipHash-2-4(control key, m1)``,
    each 8 bytes little-endian, where ``mi`` is ``"gwjobkey"``, the job (1 byte), ``i``
    (1 byte), ``epoch`` (4 bytes little-endian) and 2 zero bytes."""
    if not isinstance(job, int) or not 0 <= job <= 0xFF:
        raise ValueError(f"job must be an integer in 0..255, not {job!r}")
    if not isinstance(epoch, int) or not 0 <= epoch <= 0xFFFFFFFF:
        raise ValueError(f"epoch must be an unsigned 32-bit integer, not {epoch!r}")
    halves = (siphash24(control_key, JOB_KEY_LABEL + struct.pack("<BBIxx", job, i, epoch))
              for i in (0, 1))
    return b"".join(h.to_bytes(8, "little") for h in halves)


def wrap_word(control_key, counter: int, address: int, key_word: int) -> int:
    """The 32-bit value sent at ``address`` for one 32-bit word of a key, in a write with
    counter ``counter``: ``key_word`` XOR the low 32 bits of SipHash-2-4(control key,
    ``"gwwrap\\0\\0"``, the low 32 bits of ``counter`` and ``address``, each 4 bytes
    little-endian). The same function unwraps (XOR is its own inverse)."""
    if not isinstance(counter, int) or not 0 <= counter < 1 << 64:
        raise ValueError(f"counter must be an unsigned 64-bit integer, not {counter!r}")
    for name, value in (("address", address), ("key_word", key_word)):
        if not isinstance(value, int) or not 0 <= value <= 0xFFFFFFFF:
            raise ValueError(f"{name} must be an unsigned 32-bit integer, not {value!r}")
    pad = siphash24(control_key, WRAP_LABEL + struct.pack("<II", counter & 0xFFFFFFFF, address))
    return key_word ^ (pad & 0xFFFFFFFF)
