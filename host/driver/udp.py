"""The board transport: the :class:`~host.driver.transport.Transport` API over UDP sockets.

:class:`UdpTransport` talks to a board (a real one, or a virtual one:
``host.board.VirtualBoard``) at an IPv4 address, one UDP port per service
(``../shared/spec/network.md`` section 2). Streams map to services: ``tx`` to the NIC
transmit port, ``rx`` to the NIC receive port, ``agg`` to the switch port; ``read`` and
``write`` are ``CTRL`` packets to the control port. It recovers from loss, duplication and
reordering as spec section 5 says:

- **NIC** (request/reply): every request carries a fresh ``seq``, and so does every resend
  of it, so that a reply says which attempt it answers (the caller's ``seq`` is put back
  into the reply: the packets returned are the engine's); at most ``window`` requests are
  outstanding; a request unanswered for its timeout is resent, up to ``retries`` times,
  then :class:`NoReplyError`; replies nobody waits for any more (duplicates, late ones) are
  discarded. Timeouts follow the measured round trip (RFC 6298: smoothed RTT plus four
  deviations; every reply is a sample, since it names its attempt) and back off
  exponentially while the board is silent (nothing at all came back since the request was
  sent: a slow or gone board); a board that answers other requests meanwhile is losing
  datagrams, and the request is resent on the measured timeout.
- **Switch**: the worker side of ``aggregator-protocol.md`` section 3. Every worker of a job
  is a socket of its own, registered in the board's worker table (the first time the
  transport sends for that (job, worker)); results come back to those sockets (multicast:
  one datagram per worker). ``exchange("agg", packets)`` sends each packet from its worker's
  socket and returns what the engine emits for them, as an engine transport does: it knows
  which packets complete a round because it runs the reference aggregator on the same
  packets (``host.aggregator.AggregatorModel``, configured from the board's job registers)
  and waits until every worker that the board sends a result to has received its copy. A
  worker keeps one outstanding packet per (slot, version); a worker still waiting for a
  result on its timeout resends its outstanding packet, and the switch answers a resend of
  a complete round with a unicast result (a multicast whose every copy was lost comes back
  as unicasts, and is returned as the multicast the engine emitted). The transport must
  carry every worker of a job (one host running N workers uses N sockets).
- **Control**: ``CTRL`` packets with the board's key, up to 64 (address, value) pairs each
  (:meth:`UdpTransport.read_many`, :meth:`UdpTransport.write_many`); writes go one packet at
  a time, in order, are resent on a timeout (a write sets values, so a resend is harmless)
  and are checked against the values the board reads back. After a job's commit the
  transport discards whatever its workers' sockets still hold for that job.

Packet sizes come from the MTU (:func:`nic_packet_values`): 1500 by default, up to 9000
(jumbo frames); a datagram that would not fit, either way, is refused before it is sent.

The board's address, port base, key and MTU can come from the environment
(:func:`board_settings`): ``GRADWIRE_BOARD`` (``HOST`` or ``HOST:PORT_BASE``),
``GRADWIRE_PORT_BASE``, ``GRADWIRE_KEY`` (16 hex digits) and ``GRADWIRE_MTU``.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import secrets
import select
import socket
import struct
import time

import numpy as np

from contract.header import (HEADER_BYTES, HEADER_FIELDS, LANES, NIC_MAX_COUNT,
                             WORKER_MULTICAST, Flags, Header, PacketType)
from contract.network import (CTRL_KEY_BYTES, CTRL_KEY_OFFSET, CTRL_MAX_PAIRS, CTRL_OP_OFFSET,
                              CTRL_SEQ_OFFSET, IP_UDP_HEADER_BYTES, MAX_JOBS_IN_TABLE,
                              MAX_WORKERS_IN_TABLE, MTU_DEFAULT, MTU_JUMBO, NET_REGISTERS,
                              PORT_BASE, CtrlOp, Service, decode_network_address,
                              network_address, nic_values_for_mtu, service_ports, ip_to_int)
from contract.packet import Packet
from contract.registers import (COMMIT, DATA_BITS, SWITCH_REGISTERS, JobStatus,
                                decode_switch_params)

from .transport import Transport, TransportError

__all__ = ["UdpTransport", "NoReplyError", "RttEstimator", "retries_for_loss", "ServiceStats", "nic_packet_values",
           "inc_max_bytes", "board_settings", "parse_key", "format_key", "open_top",
           "ENV_BOARD", "ENV_PORT_BASE", "ENV_KEY", "ENV_MTU", "MTU_MIN"]

ENV_BOARD = "GRADWIRE_BOARD"
ENV_PORT_BASE = "GRADWIRE_PORT_BASE"
ENV_KEY = "GRADWIRE_KEY"
ENV_MTU = "GRADWIRE_MTU"
#: the smallest IPv4 MTU every host must accept
MTU_MIN = 576

_FIELD = {f.name: f for f in HEADER_FIELDS}
_SEQ = _FIELD["seq"]
assert _SEQ.offset == CTRL_SEQ_OFFSET      # one seq field for every packet type
_FLAGS = _FIELD["flags"].offset
_WORD = (1 << DATA_BITS) - 1
_STREAMS = {"tx": Service.NIC_TX, "rx": Service.NIC_RX, "agg": Service.SWITCH}
_JOB_REGS = SWITCH_REGISTERS["job"]
_WORKER_TABLE = NET_REGISTERS["worker"]
#: options of other transports' exchanges that mean nothing on a network (no clock)
_CLOCK_OPTIONS = {"idle"}
_BUFFER_BYTES = 4 << 20
_DRAIN = 512
#: status reads while a commit is busy, before the job's state is read anyway
_BUSY_POLLS = 1024


class NoReplyError(TransportError):
    """A request (or an awaited result) stayed unanswered after the retry limit.

    Attributes
    ----------
    service : contract.network.Service
    """

    def __init__(self, service, message):
        self.service = service
        super().__init__(message)


# -- settings ----------------------------------------------------------------------------

def parse_key(text: str) -> int:
    """A control key from its hex digits (``"0x"`` and ``_``/``:`` separators allowed)."""
    digits = str(text).strip().lower().removeprefix("0x").replace("_", "").replace(":", "")
    if not 1 <= len(digits) <= 2 * CTRL_KEY_BYTES or any(c not in "0123456789abcdef"
                                                         for c in digits):
        raise ValueError(f"a control key is 1 to {2 * CTRL_KEY_BYTES} hex digits, not {text!r}")
    return int(digits, 16)


def format_key(key: int) -> str:
    return f"{key:0{2 * CTRL_KEY_BYTES}x}"


def _port_base(value, source) -> int:
    try:
        base = int(value)
        service_ports(base)
    except (TypeError, ValueError):
        raise ValueError(f"{source}: the port base must be an integer in 1..65532, "
                         f"not {value!r}") from None
    return base


def board_settings(board=None, *, port_base=None, key=None, mtu=None, environ=None) -> dict:
    """``{"host", "port_base", "key", "mtu"}`` from the arguments, else the environment
    (:data:`ENV_BOARD`, :data:`ENV_PORT_BASE`, :data:`ENV_KEY`, :data:`ENV_MTU`), else
    the defaults (127.0.0.1, 47570, no key, 1500). ``board`` is ``HOST`` or
    ``HOST:PORT_BASE``."""
    env = os.environ if environ is None else environ
    text = board if board is not None else env.get(ENV_BOARD) or "127.0.0.1"
    host, _, base_text = str(text).partition(":")
    if not host:
        raise ValueError(f"board address {text!r} has no host")
    if port_base is None and base_text:
        port_base = _port_base(base_text, f"board address {text!r}")
    if port_base is None:
        port_base = _port_base(env.get(ENV_PORT_BASE, PORT_BASE), ENV_PORT_BASE)
    if key is None and env.get(ENV_KEY):
        try:
            key = parse_key(env[ENV_KEY])
        except ValueError as exc:
            raise ValueError(f"{ENV_KEY}: {exc}") from None
    elif isinstance(key, str):
        key = parse_key(key)
    if mtu is None:
        mtu = env.get(ENV_MTU, MTU_DEFAULT)
    try:
        mtu = int(mtu)
    except (TypeError, ValueError):
        raise ValueError(f"the MTU must be an integer, not {mtu!r}") from None
    return {"host": host, "port_base": port_base, "key": key, "mtu": mtu}


# -- sizes -------------------------------------------------------------------------------

@functools.lru_cache(maxsize=4096)
def inc_max_bytes(values: int) -> int:
    """Largest ``INC_F32`` packet (header included) the NIC emits for ``values`` values:
    every value raw (tag 11), so 272 bits per 8 values, padded to 32 bits."""
    from host.golden.inceptionn import stream_bytes
    return HEADER_BYTES + stream_bytes(np.full(values, 3, dtype=np.uint8))


def nic_packet_values(mtu: int) -> int:
    """Values per NIC packet at an IP MTU of ``mtu`` bytes: the most (whole 8-value beats,
    at most 2048) for which the raw request and the worst-case compressed reply both fit one
    datagram. 336 at 1500 (a raw packet of 360 values fits, but its compressed form may
    take 1562 bytes), 2048 at 9000."""
    limit = mtu - IP_UDP_HEADER_BYTES
    values = nic_values_for_mtu(mtu)
    values -= values % LANES
    while values > LANES and inc_max_bytes(values) > limit:
        values -= LANES
    if inc_max_bytes(values) > limit:
        raise ValueError(f"an MTU of {mtu} bytes leaves no room for a NIC packet")
    return min(values, NIC_MAX_COUNT)


# -- timing ------------------------------------------------------------------------------

class RttEstimator:
    """Retransmission timeout from measured round trips (RFC 6298): smoothed RTT plus four
    deviations, within ``[minimum, maximum]``, doubled by :meth:`backoff`."""

    def __init__(self, initial: float, minimum: float, maximum: float):
        self.minimum, self.maximum = minimum, maximum
        self.rto = min(max(initial, minimum), maximum)
        self.srtt = self.rttvar = None

    def sample(self, rtt: float) -> None:
        if self.srtt is None:
            self.srtt, self.rttvar = rtt, rtt / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - rtt)
            self.srtt = 0.875 * self.srtt + 0.125 * rtt
        self.rto = min(max(self.srtt + 4 * self.rttvar, self.minimum), self.maximum)

    def backoff(self) -> None:
        self.rto = min(self.rto * 2, self.maximum)


def retries_for_loss(loss: float, *, failure: float = 1e-12, least: int = 8) -> int:
    """Resends that make a request fail with probability below ``failure`` when each
    datagram is lost with probability ``loss`` (the request or its reply: two chances)."""
    if not 0.0 <= loss < 1.0:
        raise ValueError(f"loss must be in [0, 1), not {loss!r}")
    attempt_fails = 1.0 - (1.0 - loss) ** 2
    if attempt_fails == 0.0:
        return least
    return max(least, math.ceil(math.log(failure) / math.log(attempt_fails)) - 1)


@dataclasses.dataclass
class ServiceStats:
    """What one service's traffic cost (counted by the transport)."""
    requests: int = 0          # requests (NIC, CTRL) or packets (switch) the caller gave
    datagrams: int = 0         # datagrams sent, resends included
    resends: int = 0           # datagrams sent again after a timeout
    replies: int = 0           # replies (results) taken
    discarded: int = 0         # duplicates, late or stale replies
    foreign: int = 0           # datagrams from another address than the board's service
    unanswered: int = 0        # requests given up as dropped by the engine (allow_drops)
    rebuilt: int = 0           # multicast results whose every copy was lost (unicasts had them)
    bytes_out: int = 0
    bytes_in: int = 0
    srtt_ms: float | None = None
    rto_ms: float | None = None

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class _Pending:
    """A request waiting for its reply, or a worker waiting for a result: its resend timer."""
    item: object              # the request's index, or the packet the worker resends
    sent: float               # first attempt
    last_sent: float
    timeout: float
    attempt: int = 0
    need: int = 1             # copies still to come (a worker may await two results)

    @property
    def deadline(self) -> float:
        return self.last_sent + self.timeout


class _Endpoint:
    """One worker of a job: its socket and its outstanding packet per (slot, version)."""

    def __init__(self, job, worker, sock):
        self.job, self.worker, self.sock = job, worker, sock
        self.outstanding: dict[tuple[int, int], Packet] = {}

    @property
    def address(self):
        return self.sock.getsockname()


def _udp_socket(bind_ip: str) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            s.setsockopt(socket.SOL_SOCKET, option, _BUFFER_BYTES)
        s.bind((bind_ip, 0))
        s.setblocking(False)
    except BaseException:
        s.close()
        raise
    return s


def _drain(sock):
    out = []
    for _ in range(_DRAIN):
        try:
            out.append(sock.recvfrom(1 << 16))
        except (BlockingIOError, InterruptedError):
            break
        except OSError:        # an ICMP error queued on the socket: nothing to read
            break
    return out


def _seq_of(data: bytes) -> int:
    return int.from_bytes(data[_SEQ.offset:_SEQ.offset + _SEQ.size], "little")


def _with_seq(data: bytes, seq: int) -> bytes:
    return data[:_SEQ.offset] + seq.to_bytes(_SEQ.size, "little") + data[_SEQ.offset + _SEQ.size:]


# -- the transport -----------------------------------------------------------------------

class UdpTransport(Transport):
    """The Transport API to a board over UDP (see the module docstring).

    Parameters
    ----------
    host : str
        The board's IPv4 address (or name).
    port_base : int
        UDP port of its first service.
    key : int or None
        The control key (needed for ``read``/``write`` only).
    mtu : int
        IP MTU of the path to the board, 576..9000 (default 1500).
    region : str or None
        ``"nic"``, ``"switch"`` or ``"net"``: ``read``/``write`` take that region's local
        register addresses (what ``NicInterface`` and ``SwitchInterface`` use); None: full
        32-bit ``CTRL`` addresses (``contract.network.network_address``).
    window : int
        Requests outstanding at once per NIC stream.
    timeout : float
        First timeout in seconds, before any round trip is measured.
    min_timeout, max_timeout : float
        Bounds of every timeout in seconds.
    retries : int
        Resends of one request (or one awaited result) before a TransportError.
    owns : object with ``stop()``, optional
        Stopped when the transport closes (a virtual board started for it).

    Notes
    -----
    One transport serves one thread (two jobs at once: two transports). Its worker table
    entries stay on the board after ``close()``, until something writes them again.
    """

    clocked = False
    #: a board counts every copy of a datagram that reaches it (resends, duplicates), so
    #: its counters are not comparable with a reference model's (``LockstepTransport``)
    exact_counters = False

    def __init__(self, host: str = "127.0.0.1", *, port_base: int = PORT_BASE,
                 key: int | None = None, mtu: int = MTU_DEFAULT, region: str | None = None,
                 window: int = 16, timeout: float = 0.1, min_timeout: float = 0.02,
                 max_timeout: float = 1.0, retries: int = 8, owns=None):
        super().__init__()
        if not MTU_MIN <= mtu <= MTU_JUMBO:
            raise ValueError(f"the MTU must be in {MTU_MIN}..{MTU_JUMBO} bytes, not {mtu!r}")
        if not isinstance(window, int) or not 1 <= window <= 1024:
            raise ValueError(f"window must be an integer in 1..1024, not {window!r}")
        if not isinstance(retries, int) or not 0 <= retries <= 64:
            raise ValueError(f"retries must be an integer in 0..64, not {retries!r}")
        if not 0 < min_timeout <= max_timeout or timeout <= 0:
            raise ValueError(f"timeouts must be positive with min_timeout <= max_timeout, got "
                             f"{timeout}, {min_timeout}, {max_timeout}")
        if region is not None:
            network_address(region, 0)          # a KeyError names the regions
        if key is not None and (isinstance(key, bool) or not isinstance(key, int)
                                or not 0 <= key < 1 << (8 * CTRL_KEY_BYTES)):
            raise ValueError(f"the control key must be a 64-bit unsigned integer, not {key!r}")
        self.owns = owns
        try:
            self.host = socket.gethostbyname(host)
        except OSError as exc:
            raise TransportError(f"cannot resolve the board's address {host!r}: {exc}") from None
        self.port_base = port_base
        self.ports = service_ports(port_base)
        self.key = key
        self.mtu = mtu
        self.max_datagram = mtu - IP_UDP_HEADER_BYTES
        self.max_packet_values = nic_packet_values(mtu)
        self.region = region
        self.window, self.retries = window, retries
        self.timeout, self.min_timeout, self.max_timeout = timeout, min_timeout, max_timeout
        self.network = {service: ServiceStats() for service in Service}
        self._rtt = {service: RttEstimator(timeout, min_timeout, max_timeout)
                     for service in Service}
        self._heard = dict.fromkeys(Service, float("-inf"))   # last reply per service
        self._sockets: dict[Service, socket.socket] = {}
        self._endpoints: dict[tuple[int, int], _Endpoint] = {}
        self._seq = secrets.randbits(32)
        self._local_ip = self._route_to_board()
        self._shadow = None                 # reference aggregator (knows what completes)
        self._synced_jobs: set[int] = set()
        self._closed = False

    # -- plumbing ------------------------------------------------------------------------

    def _route_to_board(self) -> str:
        """The local address the board sees us at (what the worker table must hold)."""
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            probe.connect((self.host, self.ports[Service.CTRL]))
            return probe.getsockname()[0]
        except OSError as exc:
            raise TransportError(f"no route to the board at {self.host}: {exc}") from None
        finally:
            probe.close()

    def _new_socket(self) -> socket.socket:
        if self._closed:
            raise TransportError("the transport is closed")
        return _udp_socket(self._local_ip)

    def _socket(self, service: Service) -> socket.socket:
        sock = self._sockets.get(service)
        if sock is None:
            sock = self._sockets[service] = self._new_socket()
        return sock

    def _address(self, service: Service):
        return self.host, self.ports[service]

    def _fresh_seq(self) -> int:
        self._seq = (self._seq + 1) & _WORD
        return self._seq

    def _send(self, sock, data: bytes, service: Service) -> None:
        stats = self.network[service]
        stats.datagrams += 1
        stats.bytes_out += len(data)
        try:
            sock.sendto(data, self._address(service))
        except (BlockingIOError, InterruptedError):
            pass                 # a full send buffer loses it, like the wire: resent later
        except OSError as exc:
            raise TransportError(f"cannot send to the board's {service.value} service at "
                                 f"{self.host}:{self.ports[service]}: {exc}") from None

    def _check_size(self, size: int, what) -> None:
        """Refuse a datagram larger than the MTU allows; ``what()`` names it."""
        if size > self.max_datagram:
            raise ValueError(
                f"{what()} of {size} bytes does not fit one datagram at an MTU of {self.mtu} "
                f"({self.max_datagram} bytes of UDP payload): use packets of at most "
                f"{self.max_packet_values} values, or a larger MTU (jumbo frames: "
                f"{MTU_JUMBO})")

    def _update_rtt_stats(self, service):
        est, stats = self._rtt[service], self.network[service]
        stats.srtt_ms = None if est.srtt is None else est.srtt * 1e3
        stats.rto_ms = est.rto * 1e3

    # -- request / reply (NIC and CTRL) ----------------------------------------------------

    def _transact(self, service: Service, requests, *, window: int, allow_missing=False,
                  describe=None):
        """Send ``requests`` (datagrams with their ``seq``) to ``service`` with at most
        ``window`` outstanding; return the reply bytes per request (None: given up, with
        ``allow_missing``)."""
        sock = self._socket(service)
        address = self._address(service)
        est, stats = self._rtt[service], self.network[service]
        replies = [None] * len(requests)
        pending: dict[int, _Pending] = {}     # by request index
        attempts: dict[int, tuple[int, float]] = {}   # seq of every attempt -> (index, sent)
        next_index, remaining = 0, len(requests)
        while remaining:
            now = time.monotonic()
            while next_index < len(requests) and len(pending) < window:
                self._send(sock, requests[next_index], service)
                attempts[_seq_of(requests[next_index])] = (next_index, now)
                pending[next_index] = _Pending(next_index, now, now, est.rto)
                next_index += 1
            wait = min(entry.deadline for entry in pending.values()) - time.monotonic()
            ready, _, _ = select.select([sock], [], [], max(wait, 0.0))
            if ready:
                for data, source in _drain(sock):
                    if source != address:
                        stats.foreign += 1
                        continue
                    index, sent = attempts.get(_seq_of(data), (None, None)) \
                        if len(data) >= HEADER_BYTES else (None, None)
                    if index not in pending:
                        stats.discarded += 1       # a duplicate, or a late attempt's reply
                        continue
                    self._heard[service] = time.monotonic()
                    est.sample(self._heard[service] - sent)   # the attempt it answers
                    del pending[index]
                    stats.replies += 1
                    stats.bytes_in += len(data)
                    replies[index] = data
                    remaining -= 1
            for index, entry in self._expired(service, pending):
                if entry.attempt >= self.retries:
                    if allow_missing:
                        del pending[index]
                        stats.unanswered += 1
                        remaining -= 1
                        continue
                    self._update_rtt_stats(service)
                    what = describe(index) if describe else f"request {index}"
                    raise NoReplyError(service,
                        f"no reply from the board's {service.value} service at "
                        f"{address[0]}:{address[1]} to {what} after {entry.attempt + 1} "
                        f"attempts in {time.monotonic() - entry.sent:.1f} s"
                        f"{self._hint(service)}")
                self._resend_timer(service, entry)
                # every attempt has a seq of its own, so a reply says which one it answers
                seq = self._fresh_seq()
                requests[index] = _with_seq(requests[index], seq)
                attempts[seq] = (index, entry.last_sent)
                self._send(sock, requests[index], service)
        self._update_rtt_stats(service)
        return replies

    def _expired(self, service, pending):
        """The entries whose timeout has passed. When nothing at all came back from the
        service since they were sent, the board is slow or gone rather than losing
        datagrams: later requests then start from a doubled timeout too."""
        now = time.monotonic()
        expired = [(key, entry) for key, entry in pending.items() if entry.deadline <= now]
        if expired and self._heard[service] < min(entry.last_sent for _, entry in expired):
            self._rtt[service].backoff()
        return expired

    def _resend_timer(self, service, entry):
        """Count a resend and set its timeout: doubled while the service is silent (a slow
        or busy board), the measured timeout again if it answered anything since the last
        attempt (it is losing datagrams, and waiting longer would not help)."""
        now = time.monotonic()
        if self._heard[service] > entry.last_sent:
            entry.timeout = self._rtt[service].rto
        else:
            entry.timeout = min(entry.timeout * 2, self.max_timeout)
        entry.attempt += 1
        entry.last_sent = now
        self.network[service].resends += 1

    def _hint(self, service):
        if service is Service.CTRL:
            return (": is the board running and reachable, and is the control key right? (a "
                    "board ignores control requests with a wrong key)")
        if service is Service.NIC_RX:
            return (": is the board running and reachable? (the receive path sends nothing "
                    "for a packet it drops: pass allow_drops=True to take that as a drop)")
        return ": is the board running and reachable, and built with this service?"

    # -- streams -------------------------------------------------------------------------

    def _exchange(self, stream, packets, options):
        service = _STREAMS.get(stream)
        if service is None:
            raise ValueError(f"a board has streams {', '.join(map(repr, _STREAMS))}, not "
                             f"{stream!r}")
        options = dict(options)
        allow_drops = bool(options.pop("allow_drops", False))
        unknown = set(options) - _CLOCK_OPTIONS
        if unknown:
            raise ValueError(f"UdpTransport.exchange has no option(s) {sorted(unknown)} "
                             f"(it takes allow_drops; {sorted(_CLOCK_OPTIONS)} mean nothing "
                             f"without a clock and are ignored)")
        if service is Service.SWITCH:
            frames = self._exchange_agg(packets)
        else:
            frames = self._exchange_nic(service, packets, allow_drops)
        return {"frames": frames, "in_beats": 0, "out_beats": 0, "stall_in": 0,
                "first_in": None, "first_out": None, "last_out": None}

    def _exchange_nic(self, service, packets, allow_drops):
        requests, caller_seqs = [], []
        compress, raw, inc = int(Flags.COMPRESS), int(PacketType.RAW_F32), \
            int(PacketType.INC_F32)
        for i, packet in enumerate(packets):
            data = packet.to_bytes()
            self._check_size(len(data), lambda: f"packet {i} ({packet.header})")
            h = packet.header
            if service is Service.NIC_RX and h.type == inc and h.count <= NIC_MAX_COUNT:
                reply = HEADER_BYTES + 4 * h.count       # (a larger one is dropped)
            elif service is Service.NIC_TX and h.type == raw and h.flags & compress:
                reply = max(len(data), inc_max_bytes(len(packet.payload) // 4))
            else:
                reply = len(data)
            self._check_size(reply, lambda: f"the reply to packet {i} ({packet.header})")
            requests.append(_with_seq(data, self._fresh_seq()))
            caller_seqs.append(h.seq)
        self.network[service].requests += len(packets)
        replies = self._transact(service, requests, window=self.window,
                                 allow_missing=allow_drops,
                                 describe=lambda i: f"packet {i} ({packets[i].header})")
        return [_with_seq(reply, seq) for reply, seq in zip(replies, caller_seqs)
                if reply is not None]

    # -- control -------------------------------------------------------------------------

    def _full_address(self, address: int, full: bool = False) -> int:
        if isinstance(address, bool) or not isinstance(address, (int, np.integer)):
            raise ValueError(f"a register address is an integer, not {address!r}")
        if self.region is not None and not full:
            return network_address(self.region, int(address))
        if not 0 <= address <= _WORD:
            raise ValueError(f"a CTRL address is 32 bits, not {address:#x}")
        return int(address)

    def _ctrl_packet(self, op: CtrlOp, pairs) -> bytes:
        if self.key is None:
            raise TransportError("no control key: give the board's key (gradwire board serve "
                                 f"prints it; --key or {ENV_KEY})")
        seq = self._fresh_seq()
        header = bytearray(Header(type=PacketType.CTRL, count=len(pairs), seq=seq).pack())
        header[CTRL_OP_OFFSET] = op
        header[CTRL_KEY_OFFSET:CTRL_KEY_OFFSET + CTRL_KEY_BYTES] = \
            self.key.to_bytes(CTRL_KEY_BYTES, "little")
        words = [w for pair in pairs for w in pair]
        return bytes(header) + struct.pack(f"<{len(words)}I", *words)

    def _ctrl(self, op: CtrlOp, pairs, *, window: int):
        """Run ``pairs`` (full addresses) through the control service; the values read."""
        for address, value in pairs:
            if not 0 <= value <= _WORD:
                raise ValueError(f"a register value is 32 bits, not {value!r}")
        chunks = [pairs[i:i + CTRL_MAX_PAIRS] for i in range(0, len(pairs), CTRL_MAX_PAIRS)]
        requests = [self._ctrl_packet(op, chunk) for chunk in chunks]
        self.network[Service.CTRL].requests += len(requests)
        replies = self._transact(
            Service.CTRL, requests, window=window,
            describe=lambda i: f"a {op.name.lower()} of {len(chunks[i])} register(s) from "
                               f"{chunks[i][0][0]:#010x}")
        values = []
        for chunk, reply in zip(chunks, replies):
            values.extend(self._ctrl_values(chunk, reply))
        return values

    def _ctrl_values(self, pairs, reply: bytes):
        flags = reply[_FLAGS]
        if flags & Flags.ERROR:
            raise TransportError(f"the board refused a control request of {len(pairs)} pairs "
                                 f"(ERROR in its reply): it is malformed for this board")
        count = int.from_bytes(reply[_FIELD["count"].offset:_FIELD["count"].offset + 4],
                               "little")
        if not flags & Flags.RESULT or count != len(pairs) \
                or len(reply) != HEADER_BYTES + 8 * count:
            raise TransportError(f"malformed control reply ({len(reply)} bytes, count {count}, "
                                 f"flags {flags:#x}) to a request of {len(pairs)} pairs")
        words = struct.unpack(f"<{2 * count}I", reply[HEADER_BYTES:])
        if list(words[0::2]) != [address for address, _ in pairs]:
            raise TransportError("the board's control reply names other addresses than the "
                                 "request")
        return list(words[1::2])

    def read_many(self, addresses, *, full: bool = False) -> list[int]:
        """Read registers, 64 per packet: addresses local to ``region``, or full 32-bit
        ``CTRL`` addresses if the transport has no region or ``full`` is True."""
        pairs = [(self._full_address(a, full), 0) for a in addresses]
        return self._ctrl(CtrlOp.READ, pairs, window=self.window) if pairs else []

    def write_many(self, pairs, *, verify: bool = True, full: bool = False) -> list[int]:
        """Write ``(address, value)`` pairs in order (64 per packet, one packet at a time;
        addresses as :meth:`read_many`); return the values read back. With ``verify`` a
        register that reads back another value than written (read-only, unmapped, too
        narrow) raises TransportError; a job's ``commit`` register reads back the job's
        status and is not compared."""
        writes = [(self._full_address(a, full), int(v)) for a, v in pairs]
        if not writes:
            return []
        read_back = self._ctrl(CtrlOp.WRITE, writes, window=1)
        for (address, value), got in zip(writes, read_back):
            commit_job = _commit_job(address)
            if commit_job is not None:
                if value == COMMIT:
                    self._after_commit(commit_job)
                continue
            if verify and got != value:
                raise TransportError(f"the board's register {_describe_address(address)} reads "
                                     f"back {got:#x} after a write of {value:#x} (read-only, "
                                     f"unmapped, or narrower than the value)")
        return read_back

    def read(self, addr):
        return self.read_many([addr])[0]

    def write(self, addr, value):
        self.write_many([(addr, value)])

    # -- switch --------------------------------------------------------------------------

    def _switch_read(self, locals_):
        return self._ctrl(CtrlOp.READ, [(network_address("switch", a), 0) for a in locals_],
                          window=self.window)

    def _ensure_shadow(self):
        if self._shadow is None:
            from host.aggregator import AggregatorModel
            word, = self._switch_read([SWITCH_REGISTERS["params"].address])
            params = decode_switch_params(word)
            if not params["slots"] or not params["lanes"] or params["lanes"] % LANES:
                raise TransportError(f"the board's switch reports {params['slots']} slots of "
                                     f"{params['lanes']} lanes: is it built with a switch?")
            self._shadow = AggregatorModel(slots=params["slots"], lanes=params["lanes"],
                                           max_workers=MAX_WORKERS_IN_TABLE,
                                           jobs=MAX_JOBS_IN_TABLE)
        return self._shadow

    def _sync_job(self, job: int) -> None:
        """Configure the reference aggregator's ``job`` as the board has it (its slots
        start fresh: a commit cleared the board's)."""
        shadow = self._ensure_shadow()
        fields = ("workers", "slot_base", "slot_count", "commit")
        for _ in range(_BUSY_POLLS):
            values = dict(zip(fields, self._switch_read([_JOB_REGS.address(job, f)
                                                         for f in fields])))
            if not values["commit"] & JobStatus.BUSY:
                break
        else:
            raise TransportError(f"the board's switch stays busy with job {job}'s commit")
        shadow.clear_job(job)
        if values["workers"] and not values["commit"] & JobStatus.REJECTED:
            try:
                shadow.configure_job(job, values["workers"], values["slot_base"],
                                     values["slot_count"])
            except ValueError:
                # another job of ours moved on the board since we read it: read them again
                for other in list(self._synced_jobs):
                    shadow.clear_job(other)
                self._synced_jobs.clear()
                shadow.configure_job(job, values["workers"], values["slot_base"],
                                     values["slot_count"])
        self._synced_jobs.add(job)

    def _after_commit(self, job: int) -> None:
        """A commit cleared the job's slots on the board: forget its state here and discard
        what its workers' sockets still hold (the board has answered the commit, so every
        earlier result is in the buffers by now)."""
        self._synced_jobs.discard(job)
        for (j, _), endpoint in self._endpoints.items():
            if j == job:
                endpoint.outstanding.clear()
                self.network[Service.SWITCH].discarded += len(_drain(endpoint.sock))

    def worker_address(self, job: int, worker: int) -> tuple[str, int]:
        """The address of (job, worker)'s socket, registered in the board's worker table
        (created and registered on first use)."""
        self._register_workers([(job, worker)])
        return self._endpoints[(job, worker)].address

    def _register_workers(self, pairs) -> None:
        new = sorted({p for p in pairs if p not in self._endpoints})
        if not new:
            return
        for job, worker in new:
            if not (0 <= job < MAX_JOBS_IN_TABLE and 0 <= worker < MAX_WORKERS_IN_TABLE):
                raise ValueError(f"job {job} worker {worker} has no worker table entry (jobs "
                                 f"< {MAX_JOBS_IN_TABLE}, workers < {MAX_WORKERS_IN_TABLE})")
        created = {p: _Endpoint(*p, self._new_socket()) for p in new}
        writes = []
        for (job, worker), endpoint in created.items():
            entry = job * MAX_WORKERS_IN_TABLE + worker
            ip, port = endpoint.address
            writes += [(network_address("net", _WORKER_TABLE.address(entry, "ip")), ip_to_int(ip)),
                       (network_address("net", _WORKER_TABLE.address(entry, "port")), port)]
        try:
            read_back = self._ctrl(CtrlOp.WRITE, writes, window=1)
        except BaseException:
            for endpoint in created.values():
                endpoint.sock.close()
            raise
        if read_back != [value for _, value in writes]:
            for endpoint in created.values():
                endpoint.sock.close()
            raise TransportError(f"the board's worker table does not hold entries for "
                                 f"{', '.join(f'job {j} worker {w}' for j, w in new)} (a board "
                                 f"holds its switch's jobs and workers only)")
        self._endpoints.update(created)

    def _exchange_agg(self, packets):
        if not packets:
            return []
        stats = self.network[Service.SWITCH]
        stats.requests += len(packets)
        shadow = self._ensure_shadow()
        for job in sorted({p.header.job for p in packets} - self._synced_jobs):
            if job < MAX_JOBS_IN_TABLE:
                self._sync_job(job)
        self._register_workers((p.header.job, p.header.worker) for p in packets)
        est = self._rtt[Service.SWITCH]
        predictions = []       # (predicted result, kind): kind "m" (multicast) or a worker
        waiting = {}           # (job, worker, slot, version, seq) -> _Pending
        for packet in packets:
            h = packet.header
            data = packet.to_bytes()
            self._check_size(len(data), lambda: f"packet ({h})")
            endpoint = self._endpoints[(h.job, h.worker)]
            slot_key = (h.slot, h.slot_version & 1)
            old = endpoint.outstanding.get(slot_key)
            if old is not None and old.header.seq != h.seq:
                raise TransportError(
                    f"job {h.job} worker {h.worker} sends seq {h.seq} on slot {h.slot} "
                    f"version {h.slot_version & 1} while seq {old.header.seq} is still "
                    f"outstanding there (one outstanding packet per slot and version: a "
                    f"worker reuses a slot only after its result)")
            before = shadow.counters["accepted"]
            results = shadow.process(packet)
            if shadow.counters["accepted"] != before:           # a new contribution
                endpoint.outstanding[slot_key] = packet
            self._send(endpoint.sock, data, Service.SWITCH)
            now = time.monotonic()
            for result in results:
                rh = result.header
                if rh.worker == WORKER_MULTICAST:
                    kind, targets = "m", range(shadow.job_config(rh.job).workers)
                else:
                    kind, targets = rh.worker, (rh.worker,)
                predictions.append((result, kind))
                for w in targets:
                    key = (rh.job, w, rh.slot, rh.slot_version & 1, rh.seq)
                    entry = waiting.get(key)
                    if entry is not None:
                        entry.need += 1
                        continue
                    resend = packet if kind != "m" else \
                        self._endpoints[(rh.job, w)].outstanding.get(slot_key)
                    if resend is None:
                        raise TransportError(f"job {rh.job} worker {w} completes slot "
                                             f"{rh.slot} without a packet of this transport's")
                    waiting[key] = _Pending(resend, now, now, est.rto)
        copies = self._await_results(waiting, {(r.header.job, r.header.slot,
                                                r.header.slot_version & 1, r.header.seq)
                                               for r, _ in predictions})
        frames = []
        for result, kind in predictions:
            rh = result.header
            round_key = (rh.job, rh.slot, rh.slot_version & 1, rh.seq)
            data = copies.get(round_key + (kind,))
            if data is None:
                # every copy of this kind was lost; the other kind carries the same lanes
                other = next(v for k, v in copies.items() if k[:4] == round_key)
                received = Packet.from_bytes(other)
                data = Packet(rh.replace(exponent=received.header.exponent),
                              received.payload).to_bytes()
                stats.rebuilt += 1
            frames.append(data)
        stats.replies += len(frames)
        self._update_rtt_stats(Service.SWITCH)
        return frames

    def _await_results(self, waiting, rounds):
        """Receive results until every waiting worker has its copy; resend on timeouts.
        Returns the first copy of each (job, slot, version, seq, kind) of ``rounds``."""
        stats, est = self.network[Service.SWITCH], self._rtt[Service.SWITCH]
        address = self._address(Service.SWITCH)
        copies = {}
        by_socket = {e.sock: e for e in self._endpoints.values()
                     if any(k[0] == e.job for k in rounds)}
        while waiting:
            wait = min(e.deadline for e in waiting.values()) - time.monotonic()
            ready, _, _ = select.select(list(by_socket), [], [], max(wait, 0.0))
            for sock in ready:
                endpoint = by_socket[sock]
                for data, source in _drain(sock):
                    if source != address:
                        stats.foreign += 1
                        continue
                    if len(data) < HEADER_BYTES:
                        stats.discarded += 1
                        continue
                    rh = Header.parse(data)
                    version = rh.slot_version & 1
                    round_key = (endpoint.job, rh.slot, version, rh.seq)
                    if (not rh.flags & Flags.RESULT or rh.job != endpoint.job
                            or rh.worker not in (WORKER_MULTICAST, endpoint.worker)):
                        stats.discarded += 1
                        continue
                    kind = "m" if rh.worker == WORKER_MULTICAST else rh.worker
                    if round_key in rounds:
                        first = copies.setdefault(round_key + (kind,), data)
                        if first != data:
                            raise TransportError(f"the board sent two different results for "
                                                 f"job {rh.job} slot {rh.slot} version "
                                                 f"{version} seq {rh.seq}")
                    key = (endpoint.job, endpoint.worker, rh.slot, version, rh.seq)
                    entry = waiting.get(key)
                    if entry is None:
                        stats.discarded += 1
                        continue
                    stats.bytes_in += len(data)
                    self._heard[Service.SWITCH] = time.monotonic()
                    if entry.attempt == 0:
                        est.sample(self._heard[Service.SWITCH] - entry.sent)
                    entry.need -= 1
                    if entry.need == 0:
                        del waiting[key]
                        endpoint.outstanding.pop((rh.slot, version), None)
            for key, entry in self._expired(Service.SWITCH, waiting):
                job, worker, slot, version, seq = key
                if entry.attempt >= self.retries:
                    missing = sorted(k[1] for k in waiting if k[0] == job and k[2:] == key[2:])
                    raise NoReplyError(Service.SWITCH,
                        f"no result from the board's switch at {address[0]}:{address[1]} for "
                        f"job {job} slot {slot} version {version} (seq {seq}) at worker(s) "
                        f"{missing} after {entry.attempt + 1} attempts in "
                        f"{time.monotonic() - entry.sent:.1f} s: is the board running, is job "
                        f"{job} configured for these workers, and does this transport carry "
                        f"all of them?")
                self._resend_timer(Service.SWITCH, entry)
                self._send(self._endpoints[(job, worker)].sock, entry.item.to_bytes(),
                           Service.SWITCH)
        return copies

    # -- reports and life cycle ----------------------------------------------------------

    def network_stats(self) -> dict:
        """Per service: requests, datagrams, resends, replies, discarded, ... and the
        round-trip estimate; with the wire's fault counts of a virtual board it owns."""
        out = {service.value: stats.as_dict() for service, stats in self.network.items()
               if stats.datagrams}
        faults = getattr(self.owns, "faults", None)
        if faults is not None:
            out["wire_faults"] = faults.stats()
        return out

    def close(self):
        if self._closed:
            return
        self._closed = True
        for sock in self._sockets.values():
            sock.close()
        for endpoint in self._endpoints.values():
            endpoint.sock.close()
        self._sockets.clear()
        self._endpoints.clear()
        if self.owns is not None:
            self.owns.stop()


def _commit_job(address: int):
    """The job whose ``commit`` register ``address`` is, else None."""
    where = decode_network_address(address)
    if where is None or where[0].name != "switch":
        return None
    decoded = SWITCH_REGISTERS.decode(where[1])
    if decoded is None or decoded.entry is not _JOB_REGS or decoded.register.name != "commit":
        return None
    return decoded.index


def _describe_address(address: int) -> str:
    where = decode_network_address(address)
    if where is None:
        return f"{address:#010x} (outside every region)"
    region, local = where
    decoded = region.registers.decode(local)
    if decoded is None:
        return f"{address:#010x} (nothing mapped in {region.name})"
    name = decoded.register.name
    if decoded.index is not None:
        name = f"{decoded.entry.name}[{decoded.index}].{name}"
    elif decoded.counter is not None:
        name = f"{decoded.entry.name}.{name}"
    return f"{region.name}.{name} ({address:#010x})"


# -- the backend seam --------------------------------------------------------------------

_TOP_REGIONS = {"nic_top": "nic", "switch_top": "switch"}
_TOP_PARAMS = {"nic_top": ("max_count",), "switch_top": ("slots", "lanes", "max_workers", "jobs")}


def open_top(top, *, waves=None, board=None, key=None, mtu=None, port_base=None,
             fault_rate=0.0, fault_seed=0, board_backend="golden", **params):
    """A :class:`UdpTransport` for ``top``'s region: ``host.driver.backends``'s ``"udp"``.

    With ``board`` (``HOST[:PORT_BASE]``) or :data:`ENV_BOARD` set, it talks to that board
    (key from ``key`` or :data:`ENV_KEY`); otherwise it starts a virtual board with the
    ``board_backend`` of ``host.board.BOARD_BACKENDS`` (``"golden"``, or ``"verilator"``:
    the Verilated network top, with the simulation key unless ``key`` is given) and
    ``params`` on free ports of 127.0.0.1, with ``fault_rate`` / ``fault_seed`` on its wire,
    and stops it on ``close()``.
    """
    if top not in _TOP_REGIONS:
        raise ValueError(f"the udp backend serves {', '.join(_TOP_REGIONS)}, not {top!r}")
    if waves:
        raise ValueError("a board over UDP records no waveforms (use backend 'verilator')")
    unknown = set(params) - set(_TOP_PARAMS[top])
    if unknown:
        raise ValueError(f"{top} has no parameter(s) {sorted(unknown)}")
    if board is not None or os.environ.get(ENV_BOARD):
        if fault_rate:
            raise ValueError("faults are injected on a virtual board's wire; a board given "
                             "by address has its own network")
        settings = board_settings(board, port_base=port_base, key=key, mtu=mtu)
        return UdpTransport(settings["host"], port_base=settings["port_base"],
                            key=settings["key"], mtu=settings["mtu"], region=_TOP_REGIONS[top])
    from host.board import VirtualBoard, WireFaults, open_board_backend
    faults = WireFaults(fault_rate, seed=fault_seed) if fault_rate else None
    if board_backend == "golden":
        virtual = VirtualBoard("golden", port_base=port_base, key=key, faults=faults, **params)
    else:
        # built here so that its own default key (a simulation build's) is the board's
        backend = open_board_backend(board_backend, key=key, port_base=port_base, **params)
        virtual = VirtualBoard(backend, port_base=port_base, faults=faults)
    virtual.start()
    try:
        options = dict(getattr(virtual.backend, "transport_options", {}))
        return UdpTransport(virtual.host, port_base=virtual.port_base, key=virtual.key,
                            mtu=mtu or MTU_DEFAULT, region=_TOP_REGIONS[top], owns=virtual,
                            retries=retries_for_loss(faults.loss if faults else 0.0), **options)
    except BaseException:
        virtual.stop()
        raise
