"""The board transport: the :class:`~host.driver.transport.Transport` API over UDP sockets.

:class:`UdpTransport` talks to a board (a real one, or a virtual one:
``host.board.VirtualBoard``) at an IPv4 address, one UDP port per service
(``docs/protocol/network.md`` section 2). Streams map to services: ``tx`` to the NIC
transmit port, ``rx`` to the NIC receive port, ``agg`` to the switch port; ``read`` and
``write`` are ``CTRL`` packets to the control port. It recovers from loss, duplication and
reordering as spec section 5 says:

- **NIC** (request/reply): every request carries a fresh ``seq``, and so does every resend
  of it, so that a reply says which attempt it answers (the caller's ``seq`` is put back
  into the reply: the packets returned are the engine's); at most ``window`` requests are
  outstanding, and never more replies than the board's output buffer for the service holds
  (:mod:`host.driver.pacing`: every attempt, resends included, is charged the beats of its
  largest possible reply until a reply to it or to a later attempt comes; ``share``
  transports at once split the buffer); a request unanswered for its timeout is resent;
  replies nobody waits for any more (duplicates, late ones) are discarded. Timeouts follow
  the measured round trip (RFC 6298: smoothed RTT plus four deviations; every reply is a
  sample, since it names its attempt) and back off exponentially while the board is silent
  (nothing at all came back since the request was sent: a slow or gone board); a board
  that answers other requests meanwhile is losing datagrams, and the request is resent on
  the measured timeout. A request is given up (:class:`NoReplyError`) only after
  ``retries`` timeouts in a row with nothing at all from the service between them, and at
  least ``give_up`` seconds and :data:`~host.driver.pacing.GIVE_UP_RTTS` smoothed round
  trips without a reply: a slow board that answers is waited for, never failed.
- **Switch**: every worker of a job on a socket of its own
  (:class:`~host.driver.udp_switch.SwitchWorkerSockets`).
- **Control**: ``CTRL`` packets with the board's key, up to 64 (address, value) pairs each
  (:meth:`UdpTransport.read_many`, :meth:`UdpTransport.write_many`); writes go one packet at
  a time, in order, are resent on a timeout (a write sets values, so a resend is harmless)
  and are checked against the values the board reads back. After a job's commit the
  transport discards whatever its workers' sockets still hold for that job.
- **Authenticated control** (section 7; the gateware follows): with a 128-bit key (16
  ``bytes``, 32 hex digits) no key byte is sent; every request carries a 64-bit counter
  (the host's clock in microseconds, :func:`host.driver.ctrl_counter.next_counter`; a
  resend takes a new one) and a SipHash-2-4 tag, and every reply's tag is checked: a wrong
  one is a :class:`~host.driver.transport.BadTagError`. A 64-bit key (an ``int``) is
  section 4's, sent in clear, as the gateware expects today.

Packet sizes come from the MTU (:func:`host.driver.settings.nic_packet_values`): 1500 by
default, up to 9000 (jumbo frames); a datagram that would not fit, either way, is refused
before it is sent. :func:`host.driver.settings.board_settings` reads a board's address, key
and MTU from the environment.
"""
from __future__ import annotations

import dataclasses
import secrets
import select
import socket
import struct
import time

import numpy as np

from contract.header import HEADER_BYTES, HEADER_FIELDS, NIC_MAX_COUNT, Flags, Header, PacketType
from contract.network import (CTRL_MAX_PAIRS, CTRL_OP_OFFSET,
                              CTRL_SEQ_OFFSET, IP_UDP_HEADER_BYTES, MTU_DEFAULT, MTU_JUMBO,
                              PORT_BASE, CtrlOp, Service, decode_network_address,
                              network_address, service_ports)
from contract.registers import COMMIT, DATA_BITS, SWITCH_REGISTERS

from host.golden.ctrl_auth import (control_key, counter_of, is_authenticated, is_wrapped,
                                   seal, with_counter, wrapped_request)
from host.golden.siphash import check_tag

from .ctrl_counter import next_counter
from .pacing import ReplyBudget, board_buffers, give_up_after, reply_beats
from .rtt import ResendTimer, RttEstimator
from .settings import ENV_KEY, MTU_MIN, inc_max_bytes, nic_packet_values
from .sockets import drain, local_address_towards, open_udp_socket
from .transport import BadTagError, NoReplyError, Transport, TransportError
from .udp_switch import SwitchWorkerSockets

__all__ = ["UdpTransport", "ServiceStats"]

_FIELD = {f.name: f for f in HEADER_FIELDS}
_SEQ = _FIELD["seq"]
assert _SEQ.offset == CTRL_SEQ_OFFSET      # one seq field for every packet type
_FLAGS = _FIELD["flags"].offset
_WORD = (1 << DATA_BITS) - 1
_STREAMS = {"tx": Service.NIC_TX, "rx": Service.NIC_RX, "agg": Service.SWITCH}
_JOB_REGS = SWITCH_REGISTERS["job"]
#: options of other transports' exchanges that mean nothing on a network (no clock)
_CLOCK_OPTIONS = {"idle"}


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
    deferred: int = 0          # sends held back because the board's reply buffer was full
    peak_outstanding: int = 0  # most attempts whose replies could still come, at once
    peak_beats: int = 0        # ... and the most reply-buffer beats they could take
    rebuilt: int = 0           # multicast results whose every copy was lost (unicasts had them)
    bytes_out: int = 0
    bytes_in: int = 0
    srtt_ms: float | None = None
    rto_ms: float | None = None

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _seq_of(data: bytes) -> int:
    return int.from_bytes(data[_SEQ.offset:_SEQ.offset + _SEQ.size], "little")


def _with_seq(data: bytes, seq: int) -> bytes:
    return data[:_SEQ.offset] + seq.to_bytes(_SEQ.size, "little") + data[_SEQ.offset + _SEQ.size:]


class UdpTransport(SwitchWorkerSockets, Transport):
    """The Transport API to a board over UDP (see the module docstring).

    Parameters
    ----------
    host : str
        The board's IPv4 address (or name).
    port_base : int
        UDP port of its first service.
    key : int, bytes or None
        The control key (needed for ``read``/``write`` only): a 64-bit ``int`` (section 4,
        sent in clear) or 16 ``bytes`` (section 7: tags and counters, never sent).
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
        Timeouts in a row, with nothing from the board between them, before a request is
        given up (NIC and CTRL; the resends of one awaited switch result).
    board : str or None
        The board (``constraints/network.toml``) whose reply buffers bound the window
        (:func:`host.driver.pacing.board_buffers`; default: every board's common sizes).
    share : int
        Transports that use the board's services at once (ranks on one board): each keeps
        to its ``1/share`` part of every reply buffer.
    give_up : float
        Seconds without any reply from a service before a request to it may be given up
        (at least; :func:`host.driver.pacing.give_up_after` adds the measured round trip).
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
                 max_timeout: float = 1.0, retries: int = 8, board: str | None = None,
                 share: int = 1, give_up: float = 0.0, owns=None):
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
        if not isinstance(share, int) or not 1 <= share <= 1024:
            raise ValueError(f"share must be an integer in 1..1024, not {share!r}")
        if not give_up >= 0:
            raise ValueError(f"give_up must be a time in seconds >= 0, not {give_up!r}")
        if region is not None:
            network_address(region, 0)          # a KeyError names the regions
        if key is not None:
            key = control_key(key)
        self.owns = owns
        try:
            self.host = socket.gethostbyname(host)
        except OSError as exc:
            raise TransportError(f"cannot resolve the board's address {host!r}: {exc}") from None
        self.port_base = port_base
        self.ports = service_ports(port_base)
        self.key = key
        #: section 7's authenticated control (a 128-bit key): tagged requests and replies
        self.authenticated = key is not None and is_authenticated(key)
        self.mtu = mtu
        self.max_datagram = mtu - IP_UDP_HEADER_BYTES
        self.max_packet_values = nic_packet_values(mtu)
        self.region = region
        self.window, self.retries = window, retries
        self.board, self.share, self.give_up = board, share, float(give_up)
        self._buffers = board_buffers(board)
        self._budgets = {service: ReplyBudget(self._buffers[service], share)
                         for service in Service}
        self.timeout, self.min_timeout, self.max_timeout = timeout, min_timeout, max_timeout
        self.network = {service: ServiceStats() for service in Service}
        self._rtt = {service: RttEstimator(timeout, min_timeout, max_timeout)
                     for service in Service}
        self._heard = dict.fromkeys(Service, float("-inf"))   # last reply per service
        self._sockets: dict[Service, socket.socket] = {}
        self._seq = secrets.randbits(32)
        # the address the board sees us at (what its worker table must hold)
        self._local_ip = local_address_towards((self.host, self.ports[Service.CTRL]))
        self._init_switch_workers()
        self._closed = False

    # -- plumbing ------------------------------------------------------------------------

    def _new_socket(self) -> socket.socket:
        if self._closed:
            raise TransportError("the transport is closed")
        return open_udp_socket(self._local_ip)

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
                  describe=None, reply_bytes=None):
        """Send ``requests`` (datagrams with their ``seq``) to ``service`` with at most
        ``window`` outstanding, and never more replies coming than the board's reply buffer
        holds (``reply_bytes``: each request's largest reply, default its own size); return
        the reply bytes per request (None: given up, with ``allow_missing``)."""
        sock = self._socket(service)
        address = self._address(service)
        est, stats = self._rtt[service], self.network[service]
        budget = self._budgets[service]
        beats = [reply_beats(n) for n in (reply_bytes if reply_bytes is not None
                                          else map(len, requests))]
        replies = [None] * len(requests)
        pending: dict[int, ResendTimer] = {}     # by request index
        # seq of every attempt -> (index, sent, its ticket in the reply budget)
        attempts: dict[int, tuple[int, float, int]] = {}
        # authenticated control: seq of every attempt -> its whole 64-bit counter, which
        # the (tagged) reply must echo
        tagged = service is Service.CTRL and self.authenticated
        counters: dict[int, int] = {}
        next_index, remaining = 0, len(requests)
        while remaining:
            now = time.monotonic()
            while next_index < len(requests) and len(pending) < window:
                if not budget.fits(beats[next_index]) and pending:
                    break             # the board holds no more: wait for a reply
                self._send(sock, requests[next_index], service)
                attempts[_seq_of(requests[next_index])] = \
                    (next_index, now, budget.charge(beats[next_index]))
                if tagged:
                    counters[_seq_of(requests[next_index])] = counter_of(requests[next_index])
                pending[next_index] = ResendTimer(next_index, now, now, est.rto)
                next_index += 1
            self._note_budget(stats, budget)
            wait = min(entry.deadline for entry in pending.values()) - time.monotonic()
            ready, _, _ = select.select([sock], [], [], max(wait, 0.0))
            if ready:
                for data, source in drain(sock):
                    if source != address:
                        stats.foreign += 1
                        continue
                    if tagged:
                        self._check_reply_tag(service, data)
                        if counters.get(_seq_of(data)) != counter_of(data):
                            stats.discarded += 1   # tagged, but no counter of ours
                            continue
                    index, sent, ticket = attempts.get(_seq_of(data), (None, None, None)) \
                        if len(data) >= HEADER_BYTES else (None, None, None)
                    if ticket is not None:
                        budget.answered(ticket)    # in order: earlier attempts are done
                        self._heard[service] = time.monotonic()   # the board answers
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
            probed = False
            for index, entry in self._expired(service, pending):
                now = time.monotonic()
                if allow_missing:
                    # the engine drops what it cannot take, and says nothing: a request
                    # unanswered after its resends is taken as dropped
                    give_up = entry.attempt >= self.retries
                else:
                    # silence from the whole board (its services share one transmit
                    # path), against the round trip measured on any of its services
                    quiet = now - max(entry.sent, *self._heard.values())
                    # (no retries: one attempt, and its timeout is all there is)
                    give_up = entry.strikes >= self.retries and (
                        not self.retries
                        or quiet >= give_up_after(self._board_srtt(), self.give_up))
                if give_up:
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
                        f"attempts in {now - entry.sent:.1f} s"
                        f"{self._hint(service)}")
                # The board's buffer may be full of replies still to come: a resend waits for
                # room. While the service is silent one probe goes at a time (a flood of
                # resends would only queue behind a slow board's replies), even without
                # room once the service stayed silent through a timeout already and for
                # longer than a round trip measured on the board, or ``give_up`` before
                # any (what it held is gone then, and only a probe can tell).
                silent = self._heard[service] <= entry.last_sent
                if silent:
                    gone = entry.strikes and \
                        now - max(self._heard[service], entry.sent) >= self._board_measured()
                    may_send = not probed and (gone or budget.fits(beats[index]))
                else:
                    may_send = budget.fits(beats[index])
                if not may_send:
                    self._resend_timer(service, entry, send=False)
                    stats.deferred += 1
                    continue
                probed = probed or silent
                self._resend_timer(service, entry)
                # every attempt has a seq of its own, so a reply says which one it answers
                # (an authenticated request: a new counter, and a new tag over it)
                requests[index] = self._renumbered(service, requests[index])
                seq = _seq_of(requests[index])
                attempts[seq] = (index, entry.last_sent, budget.charge(beats[index]))
                if tagged:
                    counters[seq] = counter_of(requests[index])
                self._send(sock, requests[index], service)
        self._note_budget(stats, budget)
        self._update_rtt_stats(service)
        return replies

    def _renumbered(self, service: Service, request: bytes) -> bytes:
        """``request`` for its next attempt: a fresh ``seq``; for authenticated control a
        new counter (section 7: never a write's old one) and the tag over it."""
        if service is Service.CTRL and self.authenticated:
            renewed = with_counter(request, next_counter())
            return seal(self.key, wrapped_request(self.key, renewed, counter_of(request)))
        return _with_seq(request, self._fresh_seq())

    def _check_reply_tag(self, service: Service, data: bytes) -> None:
        """Raise :class:`BadTagError` unless ``data`` carries its tag under the key."""
        if not check_tag(self.key, data):
            raise BadTagError(service,
                f"the control reply from the board at {self.host}:{self.ports[service]} has "
                f"a wrong SipHash tag ({len(data)} bytes): forged, corrupted, or from a board "
                f"with another control key; nothing in it was taken")

    def _board_srtt(self):
        """The largest smoothed round trip measured on any of the board's services."""
        measured = [est.srtt for est in self._rtt.values() if est.srtt is not None]
        return max(measured) if measured else None

    def _board_measured(self):
        """The longest a reply from the board may take and be merely slow: the largest
        measured RTT plus four deviations of its services (``give_up`` before any)."""
        measured = [est.measured for est in self._rtt.values() if est.measured is not None]
        return max(measured) if measured else self.give_up

    @staticmethod
    def _note_budget(stats, budget):
        stats.peak_outstanding = max(stats.peak_outstanding, budget.peak_packets)
        stats.peak_beats = max(stats.peak_beats, budget.peak_beats)

    def reply_window(self, service: Service, reply_bytes: int) -> int:
        """Requests with replies of ``reply_bytes`` each that may be outstanding at once to
        ``service`` (the smaller of ``window`` and this transport's part of the board's
        reply buffer)."""
        return min(self.window, self._buffers[service].replies(reply_bytes, self.share))

    def _expired(self, service, pending):
        """The entries whose timeout has passed. When nothing at all came back from the
        service since they were sent, the board is slow or gone rather than losing
        datagrams: later requests then start from a doubled timeout too."""
        now = time.monotonic()
        expired = [(key, entry) for key, entry in pending.items() if entry.deadline <= now]
        if expired and self._heard[service] < min(entry.last_sent for _, entry in expired):
            self._rtt[service].backoff()
        return expired

    def _resend_timer(self, service, entry, send=True):
        """Count a resend (``send``; else a resend held back) and set its timeout: doubled
        while the service is silent (a slow or busy board: one more strike against the
        request), the measured timeout again if it answered anything since the last attempt
        (it is losing datagrams, and waiting longer would not help; the strikes start
        again)."""
        now = time.monotonic()
        if self._heard[service] > entry.last_sent:
            entry.timeout = self._rtt[service].rto
            entry.strikes = 0
        else:
            entry.timeout = min(entry.timeout * 2, self.max_timeout)
            entry.strikes += 1
        entry.last_sent = now
        if send:
            entry.attempt += 1
            self.network[service].resends += 1

    def _hint(self, service):
        if service is Service.CTRL:
            return (": is the board running and reachable, and is the control key right? (a "
                    "board ignores control requests with a wrong key or tag, and a 128-bit "
                    "key needs a board built for section 7's authenticated control)")
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
        requests, caller_seqs, reply_bytes = [], [], []
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
            reply_bytes.append(reply)
        self.network[service].requests += len(packets)
        replies = self._transact(service, requests, window=self.window,
                                 allow_missing=allow_drops, reply_bytes=reply_bytes,
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
        header = bytearray(Header(type=PacketType.CTRL, count=len(pairs)).pack())
        header[CTRL_OP_OFFSET] = op
        words = [w for pair in pairs for w in pair]
        packet = bytes(header) + struct.pack(f"<{len(words)}I", *words)
        if self.authenticated:
            # section 7: the counter in bytes 16..23 (its low half the seq), key words
            # wrapped under it, then the tag
            packet = wrapped_request(self.key, with_counter(packet, next_counter()))
        else:
            packet = wrapped_request(self.key, _with_seq(packet, self._fresh_seq()))
        return seal(self.key, packet)

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
        check_read_back(writes, read_back, verify=verify, committed=self._after_commit)
        return read_back

    def read(self, addr):
        return self.read_many([addr])[0]

    def write(self, addr, value):
        self.write_many([(addr, value)])

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
        self._sockets.clear()
        self._close_switch_workers()
        if self.owns is not None:
            self.owns.stop()


def check_read_back(writes, read_back, *, verify=True, committed=None) -> None:
    """Check what a ``CTRL`` write read back: each register the value written (with
    ``verify``), but a job's ``commit``, which reads back the job's status;
    ``committed(job)`` is called for each job committed."""
    for (address, value), got in zip(writes, read_back):
        if is_wrapped(address):
            continue                    # a key word (section 7): reads 0, by design
        commit_job = _commit_job(address)
        if commit_job is not None:
            if committed is not None and value == COMMIT:
                committed(commit_job)
            continue
        if verify and got != value:
            raise TransportError(f"the board's register {_describe_address(address)} reads "
                                 f"back {got:#x} after a write of {value:#x} (read-only, "
                                 f"unmapped, or narrower than the value)")


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
