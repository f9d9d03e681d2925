"""Messages of gradient datagrams over a lossy network, without I/O: spec section 5 for
hosts that talk through NICs in the wire (``docs/protocol/network.md`` section 6).

The wire boards keep no state from one datagram to the next, so the hosts recover losses
themselves. A **message** is one ring step's chunk from one host to its neighbour, cut
into ``RAW_F32`` datagrams of at most an MTU:

- **Identity.** Every datagram of a message carries the message's number in the header's
  ``seq`` and the element offset of its first value (within the whole tensor) in
  ``offset``; ``(seq, offset)`` names a datagram. The header's ``worker`` is the sender's
  rank. The receiver knows from the ring's schedule which element range ``[start, stop)``
  message ``seq`` covers, so it knows when it holds all of it.
- **Acknowledgement.** The receiver answers with an *ack datagram* saying which value
  ranges of the message it holds (below). It acks every ``ack_every``-th new datagram of a
  message, the datagram that completes it, and every duplicate (a duplicate means the
  sender is resending: it has not heard what the receiver holds).
- **Resends.** The sender keeps the datagrams nobody has acknowledged; when a message's
  timer expires it sends them again (the same bytes) and doubles the message's timeout (up
  to ``max_timeout``). An ack that covers something new resets the timeout. A message that
  times out ``max_tries`` times in a row without progress is a :class:`DeliveryError`.
- **Duplicates** (copies the network made, resends of what had arrived) are discarded
  by ``(seq, offset)``, and answered with an ack.

**The ack datagram.** A plain UDP datagram to :data:`ACK_PORT` (the gradient port + 1, so
the boards pass it unchanged as any other traffic: a datagram to the gradient port that is
not a protocol packet would be dropped by the receive path), little-endian like the packet
header::

    offset 0   4 bytes   magic b"GWAK"
    offset 4   u32       seq: the message acknowledged
    offset 8   u32       r: number of ranges, 0..MAX_ACK_RANGES
    offset 12  r x (u32 start, u32 stop)   value ranges [start, stop) held, ascending,
                                           disjoint, not adjacent

A datagram is acknowledged when its values ``[offset, offset + count)`` lie inside one
range. Ranges beyond :data:`MAX_ACK_RANGES` (one 1500-byte MTU) are left out: what they
would have acknowledged is simply resent, a duplicate that the receiver discards.
"""
from __future__ import annotations

import bisect
import dataclasses
import struct

import numpy as np

from contract.header import PacketType
from contract.network import IP_UDP_HEADER_BYTES, MTU_DEFAULT, WIRE_GRADIENT_PORT
from contract.packet import Packet

from ..golden.inceptionn import ReassemblyError, packets_to_tensor

__all__ = ["ACK_PORT", "ACK_MAGIC", "MAX_ACK_RANGES", "AckError", "DeliveryError", "pack_ack",
           "parse_ack", "MessageSender", "MessageReceiver"]

#: UDP port of ack datagrams (both ends); the boards pass it through untouched.
ACK_PORT = WIRE_GRADIENT_PORT + 1
ACK_MAGIC = b"GWAK"
_ACK_HEAD = struct.Struct("<4sII")
_RANGE = struct.Struct("<II")
#: ranges one ack carries in a 1500-byte MTU
MAX_ACK_RANGES = (MTU_DEFAULT - IP_UDP_HEADER_BYTES - _ACK_HEAD.size) // _RANGE.size


class AckError(ValueError):
    """Bytes that are not an ack datagram."""


class DeliveryError(RuntimeError):
    """A message made no progress through ``max_tries`` timeouts in a row."""


def pack_ack(seq: int, ranges) -> bytes:
    """The ack datagram's payload for message ``seq`` holding ``ranges`` (the first
    :data:`MAX_ACK_RANGES` of them)."""
    ranges = list(ranges)[:MAX_ACK_RANGES]
    return _ACK_HEAD.pack(ACK_MAGIC, seq, len(ranges)) + b"".join(
        _RANGE.pack(a, b) for a, b in ranges)


def parse_ack(data: bytes) -> tuple[int, list[tuple[int, int]]]:
    """``(seq, [(start, stop), ...])`` of an ack datagram's payload; :class:`AckError` for
    anything else (bad magic, a length that disagrees with the range count, an empty or
    reversed range, ranges out of order, overlapping or adjacent)."""
    if len(data) < _ACK_HEAD.size:
        raise AckError(f"an ack is at least {_ACK_HEAD.size} bytes, got {len(data)}")
    magic, seq, count = _ACK_HEAD.unpack_from(data)
    if magic != ACK_MAGIC:
        raise AckError(f"bad ack magic {magic!r}")
    if count > MAX_ACK_RANGES or len(data) != _ACK_HEAD.size + count * _RANGE.size:
        raise AckError(f"an ack of {count} ranges is {_ACK_HEAD.size + count * _RANGE.size} "
                       f"bytes, got {len(data)}")
    ranges = [_RANGE.unpack_from(data, _ACK_HEAD.size + i * _RANGE.size) for i in range(count)]
    if any(a >= b for a, b in ranges):
        raise AckError(f"empty or reversed range in {ranges}")
    if any(b >= c for (_, b), (c, _) in zip(ranges, ranges[1:])):
        raise AckError(f"ranges not ascending and apart: {ranges}")
    return seq, ranges


def _positive(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number, not {value!r}")
    return value


def _inside(ranges, a: int, b: int) -> bool:
    """Whether ``[a, b)`` lies inside one of ``ranges`` (sorted by start, disjoint)."""
    i = bisect.bisect_right(ranges, (a, float("inf"))) - 1
    return i >= 0 and b <= ranges[i][1]


# ---------------------------------------------------------------------------------------
# sender

@dataclasses.dataclass
class _Outgoing:
    unacked: dict           # offset -> Packet
    deadline: float
    timeout: float
    tries: int = 0


class MessageSender:
    """The sending side: a host's messages until its neighbour holds every datagram.

    Parameters
    ----------
    timeout : float
        First resend timeout of a message, in (simulated) seconds.
    max_timeout : float
        Cap of the doubled timeout.
    max_tries : int
        Timeouts in a row without progress after which :meth:`on_timer` raises
        :class:`DeliveryError`.

    Attributes
    ----------
    stats : dict
        ``datagrams`` (first sends), ``resends``, ``timeouts``, ``acks``, ``stale_acks``
        (for a message already acknowledged, or covering nothing new).
    """

    def __init__(self, *, timeout: float, max_timeout: float | None = None,
                 max_tries: int = 16):
        self.timeout = _positive("timeout", timeout)
        self.max_timeout = _positive("max_timeout", 64 * timeout if max_timeout is None
                                     else max_timeout)
        if self.max_timeout < self.timeout:
            raise ValueError(f"max_timeout {max_timeout} is below timeout {timeout}")
        if isinstance(max_tries, bool) or not isinstance(max_tries, int) or max_tries < 1:
            raise ValueError(f"max_tries must be a positive integer, not {max_tries!r}")
        self.max_tries = max_tries
        self._messages: dict[int, _Outgoing] = {}
        self._sent: set[int] = set()
        self.stats = dict.fromkeys(("datagrams", "resends", "timeouts", "acks", "stale_acks"), 0)

    @property
    def outstanding(self) -> bool:
        """Whether some datagram still waits for its ack."""
        return bool(self._messages)

    def send(self, seq: int, packets, now: float) -> list[Packet]:
        """Start message ``seq`` (its datagrams, distinct offsets); returns what to send now.
        A message with no datagrams (an empty chunk) is delivered at once."""
        if seq in self._sent:
            raise ValueError(f"message {seq} was sent already")
        self._sent.add(seq)
        packets = list(packets)
        unacked = {p.header.offset: p for p in packets}
        if len(unacked) != len(packets) or any(p.header.seq != seq for p in packets):
            raise ValueError(f"message {seq}: datagrams need distinct offsets and seq {seq}")
        self.stats["datagrams"] += len(packets)
        if unacked:
            self._messages[seq] = _Outgoing(unacked, now + self.timeout, self.timeout)
        return packets

    def on_ack(self, seq: int, ranges, now: float) -> None:
        """An ack for message ``seq`` holding the value ``ranges``."""
        self.stats["acks"] += 1
        message = self._messages.get(seq)
        if message is None:
            self.stats["stale_acks"] += 1
            return
        covered = [offset for offset, p in message.unacked.items()
                   if _inside(ranges, offset, offset + p.header.count)]
        if not covered:
            self.stats["stale_acks"] += 1
            return
        for offset in covered:
            del message.unacked[offset]
        if not message.unacked:
            del self._messages[seq]
            return
        # progress: the network delivers again, start over from the first timeout
        message.timeout, message.tries = self.timeout, 0
        message.deadline = now + self.timeout

    def next_deadline(self) -> float | None:
        """When :meth:`on_timer` next has something to do, or None."""
        return min((m.deadline for m in self._messages.values()), default=None)

    def on_timer(self, now: float) -> list[Packet]:
        """The datagrams to resend at ``now``: every unacknowledged datagram of every
        message whose timeout has expired."""
        out = []
        for seq, message in self._messages.items():
            if message.deadline > now:
                continue
            message.tries += 1
            self.stats["timeouts"] += 1
            if message.tries > self.max_tries:
                raise DeliveryError(f"message {seq}: {len(message.unacked)} datagrams still "
                                    f"unacknowledged after {self.max_tries} timeouts")
            message.timeout = min(2 * message.timeout, self.max_timeout)
            message.deadline = now + message.timeout
            out += message.unacked.values()
        self.stats["resends"] += len(out)
        return out


# ---------------------------------------------------------------------------------------
# receiver

@dataclasses.dataclass
class _Incoming:
    start: int
    stop: int
    held: dict = dataclasses.field(default_factory=dict)    # offset -> Packet
    ranges: list = dataclasses.field(default_factory=list)  # coalesced [start, stop)
    values: int = 0
    new_since_ack: int = 0
    taken: bool = False


def _add_range(ranges: list, a: int, b: int) -> list:
    """``ranges`` (sorted, disjoint, not adjacent) with ``[a, b)`` merged in."""
    out, placed = [], False
    for lo, hi in ranges:
        if hi < a or placed:
            out.append((lo, hi))
        elif lo > b:
            out += [(a, b), (lo, hi)]
            placed = True
        else:
            a, b = min(a, lo), max(b, hi)
    if not placed:
        out.append((a, b))
    return out


class MessageReceiver:
    """The receiving side: datagrams from one neighbour, assembled into messages.

    Parameters
    ----------
    messages : dict
        ``{seq: (start, stop)}``: the element range every message the neighbour sends
        covers (from the ring's schedule).
    ack_every : int
        Ack every this many new datagrams of a message (besides the one that completes it
        and every duplicate); 1 acks every datagram.

    Attributes
    ----------
    stats : dict
        ``datagrams`` (new ones), ``duplicates``, ``dropped`` (an unknown ``seq``, values
        outside the message, not ``RAW_F32``, overlapping another datagram, a payload that
        is not ``count`` values), ``acks``.
    """

    def __init__(self, messages: dict, *, ack_every: int = 8):
        if isinstance(ack_every, bool) or not isinstance(ack_every, int) or ack_every < 1:
            raise ValueError(f"ack_every must be a positive integer, not {ack_every!r}")
        self.ack_every = ack_every
        self._messages = {}
        for seq, (start, stop) in messages.items():
            if not 0 <= start <= stop:
                raise ValueError(f"message {seq}: bad element range [{start}, {stop})")
            self._messages[seq] = _Incoming(start, stop)
        self.stats = dict.fromkeys(("datagrams", "duplicates", "dropped", "acks"), 0)

    def complete(self, seq: int) -> bool:
        m = self._messages[seq]
        return m.values == m.stop - m.start

    def accept(self, packet: Packet) -> bytes | None:
        """One datagram's packet; returns the ack datagram's payload to send back, or None
        (nothing to say now, or a datagram that is dropped)."""
        h = packet.header
        m = self._messages.get(h.seq)
        if m is None or h.type != PacketType.RAW_F32 or len(packet.payload) != 4 * h.count \
                or h.count == 0 or not m.start <= h.offset <= m.stop - h.count:
            self.stats["dropped"] += 1
            return None
        if m.taken or h.offset in m.held:
            # (seq, offset) names a datagram: a copy of one it holds, or of a message it
            # has assembled already (every offset inside it is held)
            self.stats["duplicates"] += 1
            return self._ack(h.seq, m)
        if any(a < h.offset + h.count and h.offset < b for a, b in m.ranges):
            self.stats["dropped"] += 1         # overlaps what it holds, not a copy of it
            return None
        m.held[h.offset] = packet
        m.ranges = _add_range(m.ranges, h.offset, h.offset + h.count)
        m.values += h.count
        m.new_since_ack += 1
        self.stats["datagrams"] += 1
        if m.new_since_ack >= self.ack_every or self.complete(h.seq):
            return self._ack(h.seq, m)
        return None

    def _ack(self, seq: int, m: _Incoming) -> bytes:
        m.new_since_ack = 0
        self.stats["acks"] += 1
        return pack_ack(seq, m.ranges)

    def take(self, seq: int) -> np.ndarray:
        """The ``stop - start`` float32 values of complete message ``seq``, once (the
        datagrams are then let go; the ranges stay, to answer late duplicates)."""
        m = self._messages[seq]
        if not self.complete(seq):
            raise ValueError(f"message {seq} holds {m.values} of {m.stop - m.start} values")
        if m.taken:
            raise ValueError(f"message {seq} was taken already")
        try:
            values = packets_to_tensor(m.held.values(), m.stop - m.start, offset=m.start)
        except ReassemblyError as exc:      # cannot happen for what accept() let in
            raise AssertionError(f"message {seq}: {exc}") from exc
        m.held.clear()
        m.taken = True
        return values

