"""One SwitchML worker's side of the aggregator protocol, without I/O: packetisation and
the window of outstanding slots.

``docs/protocol/aggregator-protocol.md`` section 3:

- a worker's vector of 32-bit words is cut into chunks of ``lanes`` words (the last one
  padded with zeros); chunk ``g`` goes to slot ``slot_base + g % slot_count``, version
  ``(g // slot_count) % 2``, with ``seq = g`` and ``offset`` = the word offset of the chunk
  within its message; ``g`` counts on over a job's messages, so versions keep alternating
  (a message that restarted at version 0 could be taken for a retransmission of the last
  round on that slot);
- a worker keeps at most one outstanding packet per slot: it sends chunk ``g + slot_count``
  only once the result of chunk ``g`` is in (the result of a round is proof that every
  worker's packet of that round reached the switch, so the next version cannot overtake a
  stale copy);
- a worker resends an outstanding packet (same bytes) when its timeout expires; the switch
  answers a retransmission of a complete round with a unicast result and drops one of an
  incomplete round;
- results (multicast or unicast) are matched by ``seq`` and checked against what was sent;
  duplicates and stale results are ignored.

:class:`SwitchWorkerWindow` is that worker for one message. It has no socket and no clock:
its driver feeds it results and timer expiries, and sends the packets it returns. Three
drivers share it: the simulated network (``host.switchml.network.run_jobs``, integer ticks),
the UDP transport carrying every worker of a job (through ``run_jobs``), and the per-rank
UDP worker (``host.driver.udp_worker.UdpSwitchWorker``, wall-clock timers).
"""
from __future__ import annotations

import dataclasses
from typing import Iterable

import numpy as np

from contract.header import WORKER_MULTICAST, Flags, Header, PacketType
from contract.packet import Packet

__all__ = ["ProtocolError", "SwitchWorkerWindow", "OutstandingChunk", "chunk_slot",
           "make_packets", "collect_results", "as_words", "check_layout", "chunk_packet"]

_OPS = (PacketType.AGG_ADD_I32, PacketType.AGG_OR32)


class ProtocolError(RuntimeError):
    """The switch answered something inconsistent, or the exchange made no progress."""


# ---------------------------------------------------------------------------------------
# packetisation

def chunk_slot(chunk: int, slot_base: int, slot_count: int) -> tuple[int, int]:
    """``(slot, version)`` of message chunk ``chunk``."""
    return slot_base + chunk % slot_count, (chunk // slot_count) % 2


def as_words(words) -> np.ndarray:
    words = np.ascontiguousarray(words).reshape(-1)
    if words.dtype.itemsize != 4 or words.dtype.kind not in "iu":
        raise TypeError(f"expected 32-bit integer words, got dtype {words.dtype}")
    return words.view(np.uint32)


def check_layout(op, job, worker, slot_base, slot_count, lanes):
    if op not in _OPS:
        raise ValueError(f"op must be AGG_ADD_I32 or AGG_OR32, got {op!r}")
    for name, value, lo, hi in (("job", job, 0, 255), ("worker", worker, 0, 254),
                                ("slot_base", slot_base, 0, 0xFFFF),
                                ("slot_count", slot_count, 1, 0x10000),
                                ("lanes", lanes, 8, 0xFFFF)):
        if isinstance(value, bool) or int(value) != value or not lo <= value <= hi:
            raise ValueError(f"{name} must be an integer in {lo}..{hi}, got {value!r}")
    if slot_base + slot_count > 0x10000:
        raise ValueError("slot range goes beyond the 16-bit slot field")
    if lanes % 8:
        raise ValueError(f"lanes must be a multiple of 8, got {lanes}")


def chunk_packet(words, index, *, op, job, worker, slot_base, slot_count, lanes,
                  first_chunk, exponent) -> Packet:
    g = first_chunk + index
    if g >= 2**32:
        raise ValueError("chunk number exceeds the 32-bit seq field")
    slot, version = chunk_slot(g, slot_base, slot_count)
    lane_values = np.zeros(lanes, dtype="<u4")
    piece = words[index * lanes:(index + 1) * lanes]
    lane_values[:piece.size] = piece
    header = Header(type=int(op), job=job, worker=worker, exponent=int(exponent), count=lanes,
                    slot=slot, slot_version=version, seq=g, offset=index * lanes)
    return Packet(header, lane_values.tobytes())


def make_packets(words, *, op, job: int, worker: int, slot_base: int, slot_count: int,
                 lanes: int, first_chunk: int = 0, exponent: int = 0) -> list[Packet]:
    """One worker's vector of 32-bit words as aggregator packets, chunk by chunk.

    Parameters
    ----------
    words : array_like of 32-bit integers
        uint32 index words or int32 sketch / fallback values (sent as their bits).
    op : PacketType
        ``AGG_OR32`` or ``AGG_ADD_I32``.
    job, worker : int
        Header fields.
    slot_base, slot_count : int
        The job's slot pool (absolute slot numbers).
    lanes : int
        P, words per packet; the last chunk is zero padded.
    first_chunk : int
        Message chunk number of the first chunk (versions and seq continue from there).
    exponent : int
        Exponent byte of every packet (the worker's ``e_w`` in phase A).
    """
    words = as_words(words)
    check_layout(op, job, worker, slot_base, slot_count, lanes)
    count = -(-words.size // lanes)
    return [chunk_packet(words, i, op=op, job=job, worker=worker, slot_base=slot_base,
                          slot_count=slot_count, lanes=lanes, first_chunk=first_chunk,
                          exponent=exponent) for i in range(count)]


def collect_results(results: Iterable[Packet], n_words: int, *, lanes: int,
                    first_chunk: int = 0) -> tuple[np.ndarray, int | None]:
    """Assemble RESULT packets into the aggregated vector (uint32, ``n_words`` long).

    Results are placed by ``seq`` (chunk ``seq - first_chunk``); the ``offset`` must agree.
    Duplicates must carry identical payloads. Returns the vector and the MAX of the result
    exponents (None if ``n_words`` is 0). Raises ProtocolError for a missing, foreign or
    inconsistent result.
    """
    count = -(-n_words // lanes)
    buffer = np.zeros(count * lanes, dtype=np.uint32)
    have = np.zeros(count, dtype=bool)
    exponent = None
    for packet in results:
        h = packet.header
        index = h.seq - first_chunk
        if not h.flags & Flags.RESULT or not 0 <= index < count:
            raise ProtocolError(f"not a result of this message: {packet}")
        if h.offset != index * lanes or len(packet.payload) != 4 * lanes:
            raise ProtocolError(f"result with inconsistent offset or length: {packet}")
        values = np.frombuffer(packet.payload, dtype="<u4")
        piece = buffer[index * lanes:(index + 1) * lanes]
        if have[index] and not np.array_equal(piece, values):
            raise ProtocolError(f"two different results for chunk {h.seq}")
        piece[:] = values
        have[index] = True
        exponent = h.exponent if exponent is None else max(exponent, h.exponent)
    if not have.all():
        raise ProtocolError(f"missing results for chunks "
                            f"{(np.flatnonzero(~have) + first_chunk).tolist()[:10]}")
    return buffer[:n_words], exponent


@dataclasses.dataclass
class OutstandingChunk:
    """A packet of the window whose result is not in yet, and how often it was resent."""
    packet: Packet
    attempt: int = 0


class SwitchWorkerWindow:
    """One worker's message through the switch, as a state machine without I/O.

    Parameters
    ----------
    words : array_like of 32-bit integers
        The worker's vector (uint32 index words or int32 values, sent as their bits).
    op : PacketType
        ``AGG_OR32`` or ``AGG_ADD_I32``.
    job, worker : int
        Header fields; results for another job, or unicast to another worker, are not this
        window's.
    slot_base, slot_count : int
        The job's slot pool (absolute slot numbers); ``slot_count`` is the window.
    lanes : int
        Words per packet.
    first_chunk : int
        Chunk number of the message's first chunk (versions and ``seq`` continue from
        there).
    exponent : int
        Exponent byte of every packet.

    Notes
    -----
    The driver calls :meth:`start` once and sends what it returns; then, for every
    datagram from the switch, :meth:`on_result` (and sends the packets it returns), and for
    every expired timer :meth:`resend` (and sends the packet, if any). :attr:`done` says
    when every result is in; :meth:`result` gives the aggregated vector.
    """

    def __init__(self, words, *, op, job: int, worker: int, slot_base: int, slot_count: int,
                 lanes: int, first_chunk: int = 0, exponent: int = 0):
        self.words = as_words(words)
        check_layout(op, job, worker, slot_base, slot_count, lanes)
        self.op, self.job, self.worker = op, job, worker
        self.slot_base, self.slot_count, self.lanes = slot_base, slot_count, lanes
        self.first_chunk, self.exponent = first_chunk, exponent
        self.chunks = -(-self.words.size // lanes)
        #: chunk number (= seq) -> the packet still waiting for its result
        self.outstanding: dict[int, OutstandingChunk] = {}
        self.remaining = self.chunks
        self._buffer = np.zeros(self.chunks * lanes, dtype=np.uint32)
        self._result_exponent = None
        self._started = False

    @property
    def end_chunk(self) -> int:
        """The chunk number after the message's last: where the next message starts."""
        return self.first_chunk + self.chunks

    @property
    def done(self) -> bool:
        return self.remaining == 0

    def _send(self, g: int) -> Packet:
        packet = chunk_packet(self.words, g - self.first_chunk, op=self.op, job=self.job,
                              worker=self.worker, slot_base=self.slot_base,
                              slot_count=self.slot_count, lanes=self.lanes,
                              first_chunk=self.first_chunk, exponent=self.exponent)
        self.outstanding[g] = OutstandingChunk(packet)
        return packet

    def start(self) -> list[Packet]:
        """The first packets: one per slot of the window (fewer for a short message)."""
        if self._started:
            raise RuntimeError("the window has started already")
        self._started = True
        return [self._send(g) for g in range(self.first_chunk,
                                             self.first_chunk + min(self.slot_count,
                                                                    self.chunks))]

    def is_for_me(self, header: Header) -> bool:
        """Whether ``header`` is a result addressed to this worker of this job (multicast
        or unicast); other datagrams are none of the window's business."""
        return bool(header.flags & Flags.RESULT) and header.job == self.job \
            and header.worker in (WORKER_MULTICAST, self.worker)

    def on_result(self, packet: Packet) -> tuple[bool, list[Packet]]:
        """Take a datagram from the switch.

        Returns
        -------
        accepted : bool
            True if it was the result of an outstanding packet; False for a duplicate, a
            result of an earlier message, or a datagram that is not a result for this
            worker (ignored).
        to_send : list of Packet
            The packets the result frees a slot for (the chunk ``slot_count`` further on).

        Raises
        ------
        ProtocolError
            A result for an outstanding ``seq`` that does not answer the packet sent (other
            type, slot, version, offset or length).
        """
        h = packet.header
        entry = self.outstanding.get(h.seq)
        if entry is None or not self.is_for_me(h):
            return False, []
        sent = entry.packet.header
        if (h.type != sent.type or h.slot != sent.slot or h.slot_version != sent.slot_version
                or h.offset != sent.offset or h.count != self.lanes
                or len(packet.payload) != 4 * self.lanes):
            raise ProtocolError(f"job {self.job} worker {self.worker}: the switch's result "
                                f"{h} does not answer the packet {sent}")
        del self.outstanding[h.seq]
        index = h.seq - self.first_chunk
        self._buffer[index * self.lanes:(index + 1) * self.lanes] = \
            np.frombuffer(packet.payload, dtype="<u4")
        self._result_exponent = h.exponent if self._result_exponent is None \
            else max(self._result_exponent, h.exponent)
        self.remaining -= 1
        following = h.seq + self.slot_count
        if following < self.end_chunk:
            return True, [self._send(following)]
        return True, []

    def resend(self, seq: int, attempt: int | None = None) -> Packet | None:
        """The packet to send again for chunk ``seq`` when its timer expires, or None if
        its result is in already (or, with ``attempt``, if the timer belongs to an earlier
        attempt than the last one sent: a later timer is running)."""
        entry = self.outstanding.get(seq)
        if entry is None or (attempt is not None and entry.attempt != attempt):
            return None
        entry.attempt += 1
        return entry.packet

    def result(self) -> tuple[np.ndarray, int | None]:
        """The aggregated uint32 vector (as long as the message) and the MAX of the result
        exponents (None for an empty message)."""
        if not self.done:
            raise ProtocolError(f"job {self.job} worker {self.worker}: "
                                f"{self.remaining} chunk(s) still without a result")
        return self._buffer[:self.words.size].copy(), self._result_exponent
