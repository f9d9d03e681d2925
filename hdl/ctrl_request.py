"""The checks on a ``CTRL`` request (``docs/protocol/network.md`` section 4), in one place for
both control services: the network top's (:class:`hdl.net.front_end.ctrl_service.CtrlService`,
which sees the whole 32-byte header in one beat) and the wire's
(:class:`hdl.wire.ctrl.CtrlResponder`, which sees it a 32-bit word at a time, and so checks
each field as its word passes and keeps one bit).

A request is answered only with the bitstream's key (:func:`key_matches`) and a whole header
(:func:`whole_header`); it is carried out when its fields (:func:`magic_ok` and
:func:`request_ok`), its pair count (:func:`count_ok`) and its length (:func:`length_ok`)
agree, and refused otherwise, with the header alone flagged :func:`reply_flags`.

Each check is a function of the fields it reads (Amaranth values), so that each service
applies it where the field is in hand (a word, a beat, registered or not) and the netlist is
what each service had.
"""
from amaranth import Const, Mux

from contract.header import HEADER_BYTES, MAGIC, VERSION, Flags
from contract.network import CTRL_KEY_BYTES, CTRL_MAX_PAIRS, CTRL_TYPE, CtrlOp

__all__ = ["PAIR_BYTES", "check_key", "key_matches", "whole_header", "magic_ok", "request_ok",
           "count_ok", "length_ok", "reply_flags"]

#: An (address, value) pair: two little-endian 32-bit words
PAIR_BYTES = 8
#: bits of a pair count that the length check uses (counts above 64 fail ``count_ok``)
_COUNT_BITS = CTRL_MAX_PAIRS.bit_length()


def check_key(key):
    """``key`` if it is a control key (a 64-bit integer), else ``ValueError`` (the key
    itself is never in the message)."""
    if isinstance(key, bool) or not isinstance(key, int) \
            or not 0 <= key < 1 << (8 * CTRL_KEY_BYTES):
        raise ValueError(f"The control key must be a {8 * CTRL_KEY_BYTES}-bit integer")
    return key


def key_matches(field, key):
    """The request's ``key`` field (64 bits, as its bytes sit in the lanes) is ``key``."""
    return field == Const(key, 8 * CTRL_KEY_BYTES)


def whole_header(length, *, before=0):
    """The request holds a whole header: ``length`` counts its bytes and ``before`` bytes
    in front of it (the wire: the IPv4 total length counts the IPv4 and UDP headers)."""
    return length >= before + HEADER_BYTES


def magic_ok(magic, version):
    """The header's first two bytes are the protocol's magic and version."""
    return (magic == MAGIC) & (version == VERSION)


def request_ok(fields_ok, type_, op):
    """``fields_ok`` (the fields checked before, such as :func:`magic_ok`), and a ``CTRL``
    packet (header ``type``) that reads or writes (its ``op`` byte). The checks are chained
    onto ``fields_ok`` one by one, as both services always had them."""
    return fields_ok & (type_ == CTRL_TYPE) & ((op == CtrlOp.READ) | (op == CtrlOp.WRITE))


def count_ok(count):
    """``count`` (the header's 32-bit pair count) is 1..64."""
    return (count >= 1) & (count <= CTRL_MAX_PAIRS)


def length_ok(length, count, *, before=0):
    """The request is a header and ``count`` pairs long, nothing more or less (``before``:
    as for :func:`whole_header`). Only the bits of ``count`` that a good count has are
    used: a longer count fails :func:`count_ok`."""
    return length == before + HEADER_BYTES + PAIR_BYTES * count[:_COUNT_BITS]


def reply_flags(refused):
    """The reply header's ``flags``: ``RESULT``, and ``ERROR`` when the request was
    refused."""
    return Mux(refused, Flags.RESULT | Flags.ERROR, Flags.RESULT)
