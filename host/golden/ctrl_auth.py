"""The two kinds of control key, and what each does to a ``CTRL`` packet.

``docs/protocol/network.md`` section 4's key is 64 bits and travels in clear in header
bytes 24..31; section 7's is 128 bits, never travels, and those bytes carry a SipHash-2-4
tag (:func:`host.golden.siphash.tag_datagram`) instead, with a 64-bit counter in header
bytes 16..23. The gateware implements section 4 only for now; the host (the driver, the
golden and virtual boards) implements both, told apart by the key's type:

- an ``int`` in 0..2**64-1: section 4's key (16 hex digits);
- 16 ``bytes``: section 7's key (32 hex digits: its bytes in order, first byte first).

:func:`seal` is the one place a ``CTRL`` packet receives its key field: the key itself, or
the tag under it.
"""
from __future__ import annotations

import struct

from contract.header import HEADER_BYTES
from contract.network import (CTRL_AUTH_KEY_BYTES, CTRL_COUNT_OFFSET, CTRL_COUNTER_BYTES,
                              CTRL_COUNTER_OFFSET, CTRL_KEY_BYTES, CTRL_KEY_OFFSET,
                              CTRL_OP_OFFSET, CtrlOp, decode_network_address)
from contract.registers import AUTH_REGISTERS

from .siphash import check_tag, tag_datagram, wrap_word

__all__ = ["control_key", "is_authenticated", "seal", "unsealed", "counter_of",
           "with_counter", "key_fragments", "is_wrapped", "wrapped_request"]


def control_key(key):
    """``key`` checked: a 64-bit ``int`` (section 4) or 16 ``bytes`` (section 7; a
    ``bytearray`` becomes ``bytes``). Anything else is a ValueError."""
    if isinstance(key, (bytes, bytearray, memoryview)):
        key = bytes(key)
        if len(key) == CTRL_AUTH_KEY_BYTES:
            return key
    elif isinstance(key, int) and not isinstance(key, bool) and 0 <= key < 1 << 64:
        return key
    raise ValueError(f"the control key must be a 64-bit unsigned integer (section 4) or "
                     f"{CTRL_AUTH_KEY_BYTES} bytes (section 7's 128-bit key), not {key!r}")


def is_authenticated(key) -> bool:
    """Whether ``key`` is section 7's 128-bit key (tags) rather than section 4's (clear)."""
    return isinstance(key, bytes)


def seal(key, packet: bytes) -> bytes:
    """``packet`` (a whole ``CTRL`` datagram, header first) with its key field filled: the
    64-bit key in clear, or the tag under the 128-bit key over the rest of it."""
    packet = bytes(packet)
    if is_authenticated(key):
        return tag_datagram(key, packet)
    return (packet[:CTRL_KEY_OFFSET] + key.to_bytes(CTRL_KEY_BYTES, "little")
            + packet[CTRL_KEY_OFFSET + CTRL_KEY_BYTES:])


def unsealed(key, packet: bytes) -> bool:
    """Whether ``packet``'s key field is right for ``key``: the key itself, or its tag.
    A packet shorter than a header has neither: False."""
    if len(packet) < HEADER_BYTES:
        return False
    if is_authenticated(key):
        return check_tag(key, packet)
    return int.from_bytes(packet[CTRL_KEY_OFFSET:CTRL_KEY_OFFSET + CTRL_KEY_BYTES],
                          "little") == key


def counter_of(packet: bytes) -> int:
    """The 64-bit counter of a section 7 ``CTRL`` packet (header bytes 16..23)."""
    return int.from_bytes(packet[CTRL_COUNTER_OFFSET:CTRL_COUNTER_OFFSET + CTRL_COUNTER_BYTES],
                          "little")


def with_counter(packet: bytes, counter: int) -> bytes:
    """``packet`` with ``counter`` in header bytes 16..23 (re-seal it afterwards)."""
    if not 0 <= counter < 1 << 64:
        raise ValueError(f"a CTRL counter is 64 bits, not {counter!r}")
    return (packet[:CTRL_COUNTER_OFFSET] + counter.to_bytes(CTRL_COUNTER_BYTES, "little")
            + packet[CTRL_COUNTER_OFFSET + CTRL_COUNTER_BYTES:])


def key_fragments(key) -> list[bytes]:
    """Byte strings of ``key`` that no section 7 packet may hold: its 16 bytes and each
    8-byte half, also each half as the little-endian ``k0``/``k1`` word reversed (for the
    tests that search captured datagrams)."""
    key = control_key(key)
    if not is_authenticated(key):
        raw = key.to_bytes(CTRL_KEY_BYTES, "little")
        return [raw, raw[::-1]]
    halves = [key[:8], key[8:]]
    return [key, key[::-1]] + halves + [h[::-1] for h in halves]


def is_wrapped(address: int) -> bool:
    """Whether the 32-bit ``CTRL`` address ``address`` is a register written wrapped
    (section 7: a word of a key, ``contract.registers.AUTH_REGISTERS`` ``upstream_key``)."""
    where = decode_network_address(address)
    if where is None or where[0].name != "net":
        return False
    decoded = AUTH_REGISTERS.decode(where[1])
    return decoded is not None and decoded.entry is AUTH_REGISTERS["upstream_key"]


def wrapped_request(key, packet: bytes, old_counter: int | None = None) -> bytes:
    """A ``CTRL`` write request ``packet`` (counter in place, not sealed yet) with every
    value at a wrapped address wrapped under its counter: from clear values, or, with
    ``old_counter``, from values wrapped under that one (a resend's new counter). Other
    requests come back unchanged. A section 4 key cannot wrap: ValueError."""
    if packet[CTRL_OP_OFFSET] != CtrlOp.WRITE:
        return packet
    count = int.from_bytes(packet[CTRL_COUNT_OFFSET:CTRL_COUNT_OFFSET + 4], "little")
    words = list(struct.unpack_from(f"<{2 * count}I", packet, HEADER_BYTES))
    addresses = words[0::2]
    if not any(is_wrapped(a) for a in addresses):
        return packet
    if not is_authenticated(key):
        raise ValueError("a key register is written wrapped under section 7's 128-bit "
                         "control key; a board with a 64-bit key has none")
    counter = counter_of(packet)
    for i, address in enumerate(addresses):
        if is_wrapped(address):
            value = words[2 * i + 1]
            if old_counter is not None:
                value = wrap_word(key, old_counter, address, value)    # unwrap
            words[2 * i + 1] = wrap_word(key, counter, address, value)
    return packet[:HEADER_BYTES] + struct.pack(f"<{2 * count}I", *words) \
        + packet[HEADER_BYTES + 8 * count:]
