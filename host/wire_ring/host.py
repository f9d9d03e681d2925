"""One host of the ring: INCEPTIONN's ring all-reduce as gradient datagrams through its
wire board, without I/O.

The algorithm is :mod:`host.golden.ring`'s, step for step; what differs is where the codec
runs. The host sends each step's chunk as ``RAW_F32`` datagrams with the ``COMPRESS`` flag
and ``k`` (at most :func:`contract.network.nic_values_for_mtu` values each: 360 on a
1500-byte MTU) to its right neighbour's addresses and UDP port
:data:`~contract.network.WIRE_GRADIENT_PORT`; its board compresses them on the way out and
the neighbour's board decompresses them on the way in
(``docs/protocol/network.md`` section 6), so the neighbour reads ``RAW_F32`` datagrams.
Message ``seq`` of the ring (0 .. 2N-3: N-1 reduce-scatter steps, then N-1 all-gather
steps) travels as :mod:`host.wire_ring.reliable` says.

**Why the host quantizes before it sends** (``quantize=True``, the default). A board
passes a datagram raw when its compressed packet would be longer (values that do not
compress, spec section 6), and the neighbour then reads the values as they were sent,
where :mod:`host.golden.ring` (whose NIC always compresses) has ``q(x)``. So that the
result does not depend on which datagrams happened to compress, the host sends ``q(x)``
(:func:`host.golden.inceptionn.quantize`): ``q`` is idempotent and keeps every value's
class, so the compressed packets are the same bytes as those of ``x``, a datagram that
passes raw carries ``q(x)`` too, and the ring ends bit for bit where the golden ring ends.

**Addresses.** The host knows its neighbours' MAC and IPv4 addresses from a static table
(no ARP: the learning switch learns the stations from their first frames, and floods until
then).
"""
from __future__ import annotations

import itertools

import numpy as np

from contract.header import Flags, PacketType
from contract.network import WIRE_GRADIENT_PORT, nic_values_for_mtu
from contract.packet import Packet, PacketError

from ..golden import inceptionn
from ..golden.ring import ring_chunk_bounds
from .frames import Endpoint, parse_udp_frame, udp_frame
from .reliable import ACK_PORT, AckError, MessageReceiver, MessageSender, parse_ack

__all__ = ["RingHost", "ring_schedule", "HOST_COUNTERS"]

#: what :attr:`RingHost.counters` counts of the frames a host receives
HOST_COUNTERS = ("frames_in", "gradient", "acks", "not_for_me", "bad_frame", "bad_datagram")


def ring_schedule(rank: int, workers: int):
    """``(send, receive)``: for every message ``seq`` of the ring, the chunk ``rank`` sends
    to ``rank + 1`` and the chunk it receives from ``rank - 1`` (``{seq: chunk}`` each), as
    :func:`host.golden.ring.ring_allreduce` orders them. Messages ``0 .. N-2`` are the
    reduce-scatter (the receiver adds), ``N-1 .. 2N-3`` the all-gather (it stores)."""
    def chunk(w, seq):
        if seq < workers - 1:
            return (w - seq) % workers
        return (w + 1 - (seq - workers + 1)) % workers

    seqs = range(2 * (workers - 1))
    return ({seq: chunk(rank, seq) for seq in seqs},
            {seq: chunk(rank - 1, seq) for seq in seqs})


class RingHost:
    """One host of the ring behind its wire board's port 0.

    Parameters
    ----------
    rank : int
        The host's place in the ring, ``0 .. workers - 1``.
    values : numpy.ndarray
        Its float32 vector (flattened); every host's is the same length.
    k : int
        The codec's error bound ``2^-k``, 1..15.
    workers : int
        Hosts in the ring, 2..255 (the header's ``worker`` byte).
    me, left, right : Endpoint
        The host's addresses and its neighbours' (the static neighbour table).
    mtu : int
        IP MTU of the host's link: the datagram size.
    timeout, max_tries, ack_every :
        :class:`~host.wire_ring.reliable.MessageSender` and
        :class:`~host.wire_ring.reliable.MessageReceiver` settings.
    quantize : bool
        Send ``q(x)`` rather than ``x`` (module docstring: keeps the result bit for bit
        that of the golden ring when a datagram passes raw).

    Attributes
    ----------
    acc : numpy.ndarray
        The vector as the ring leaves it so far; the result once :attr:`finished`.
    counters : dict
        :data:`HOST_COUNTERS`.
    """

    def __init__(self, rank: int, values, k: int, *, workers: int, me: Endpoint,
                 left: Endpoint, right: Endpoint, mtu: int = 1500, timeout: float = 1e-3,
                 max_tries: int = 16, ack_every: int = 8, quantize: bool = True):
        if isinstance(workers, bool) or not isinstance(workers, int) or not 2 <= workers <= 255:
            raise ValueError(f"a ring has 2..255 hosts, not {workers!r}")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < workers:
            raise ValueError(f"rank must be in 0..{workers - 1}, not {rank!r}")
        values = np.asarray(values)
        if values.dtype != np.float32:
            raise ValueError(f"host {rank}: the ring carries float32 values, not {values.dtype}")
        self.rank, self.workers, self.k = rank, workers, inceptionn.check_k(k)
        self.me, self.left, self.right = me, left, right
        self.packet_values = nic_values_for_mtu(mtu)
        self.quantize = bool(quantize)
        self.acc = values.ravel().copy()
        self.chunks = ring_chunk_bounds(self.acc.size, workers)
        self._send_chunk, receive_chunk = ring_schedule(rank, workers)
        self._receive_chunk = receive_chunk
        self.sender = MessageSender(timeout=timeout, max_tries=max_tries)
        self.receiver = MessageReceiver({seq: self.chunks[c] for seq, c in receive_chunk.items()},
                                        ack_every=ack_every)
        self.messages = len(receive_chunk)
        self.applied = 0            # messages folded into acc so far, in seq order
        self._ident = itertools.count()
        self.counters = dict.fromkeys(HOST_COUNTERS, 0)

    @property
    def finished(self) -> bool:
        """Every message received and folded in: :attr:`acc` is the result."""
        return self.applied == self.messages

    @property
    def quiet(self) -> bool:
        """Finished, and every message it sent acknowledged."""
        return self.finished and not self.sender.outstanding

    # -- sans-I/O entry points: frames out ------------------------------------------------

    def start(self, now: float) -> list[bytes]:
        """The frames of the first message (the host's own chunk)."""
        return self._send(0, now) + self._fold(now)

    def receive(self, frame: bytes, now: float) -> list[bytes]:
        """One frame from the board's port 0; the frames the host sends in answer."""
        self.counters["frames_in"] += 1
        d = parse_udp_frame(frame)
        if d is None:
            self.counters["bad_frame"] += 1
            return []
        if d.dst_mac != self.me.mac_bytes or d.dst_ip != self.me.ip_bytes:
            self.counters["not_for_me"] += 1         # flooded by the switch to everyone
            return []
        if d.dst_port == WIRE_GRADIENT_PORT and d.src_ip == self.left.ip_bytes:
            return self._gradient(d.payload, now)
        if d.dst_port == ACK_PORT and d.src_ip == self.right.ip_bytes:
            try:
                seq, ranges = parse_ack(d.payload)
            except AckError:
                self.counters["bad_datagram"] += 1
                return []
            self.counters["acks"] += 1
            self.sender.on_ack(seq, ranges, now)
            return []
        self.counters["not_for_me"] += 1
        return []

    def next_deadline(self) -> float | None:
        return self.sender.next_deadline()

    def on_timer(self, now: float) -> list[bytes]:
        """Resends whose time has come."""
        return [self._frame(p) for p in self.sender.on_timer(now)]

    # -- the ring ------------------------------------------------------------------------

    def _gradient(self, payload: bytes, now: float) -> list[bytes]:
        try:
            packet = Packet.from_bytes(payload)
        except PacketError:
            self.counters["bad_datagram"] += 1
            return []
        self.counters["gradient"] += 1
        ack = self.receiver.accept(packet)
        out = [] if ack is None else [udp_frame(self.me, self.left, ACK_PORT, ACK_PORT, ack,
                                                ident=next(self._ident))]
        return out + self._fold(now)

    def _fold(self, now: float) -> list[bytes]:
        """Fold in every message that is complete, in order (an empty chunk's message is
        complete from the start); each lets the host's next message go out."""
        out = []
        while not self.finished and self.receiver.complete(self.applied):
            seq = self.applied
            a, b = self.chunks[self._receive_chunk[seq]]
            received = self.receiver.take(seq)
            if seq < self.workers - 1:
                with np.errstate(invalid="ignore", over="ignore"):   # Inf - Inf, overflow:
                    self.acc[a:b] += received   # values like any other; float32, to even
            else:
                self.acc[a:b] = received
            self.applied += 1
            if seq == self.workers - 2:
                # the host owns chunk rank + 1 now: it keeps what the wire carries of it
                a, b = self.chunks[(self.rank + 1) % self.workers]
                self.acc[a:b] = inceptionn.quantize(self.acc[a:b], self.k)
            if self.applied < self.messages:
                out += self._send(self.applied, now)
        return out

    def _send(self, seq: int, now: float) -> list[bytes]:
        a, b = self.chunks[self._send_chunk[seq]]
        values = self.acc[a:b]
        if self.quantize:
            values = inceptionn.quantize(values, self.k)
        packets = [Packet(p.header.replace(seq=seq), p.payload) for p in
                   inceptionn.tensor_to_packets(values, self.k, compress=False,
                                                packet_values=self.packet_values,
                                                worker=self.rank, offset=a)]
        return [self._frame(p) for p in self.sender.send(seq, packets, now)]

    def _frame(self, packet: Packet) -> bytes:
        assert packet.header.type == PacketType.RAW_F32 and packet.header.flags & Flags.COMPRESS
        return udp_frame(self.me, self.right, WIRE_GRADIENT_PORT, WIRE_GRADIENT_PORT,
                         packet.to_bytes(), ident=next(self._ident))
