"""One worker of an in-network all-reduce, in its own process, over its own UDP socket.

:class:`~host.driver.udp.UdpTransport` carries *every* worker of a job from one host (it
runs the reference aggregator beside the board to know which packet completes a round).
A training job has one process per worker instead, and each process only knows its own
packets: it sends them, and waits for the switch's results. :class:`UdpSwitchWorker` is
that side of the aggregator protocol (``docs/protocol/aggregator-protocol.md`` section 3,
``network.md`` sections 3 and 5):

- the socket is the worker's entry in the board's worker table (:func:`configure_job`
  writes the table, for every worker of the job, from one process that has the control
  key); the switch accepts the worker's packets only from it and multicasts results to it;
- a message (one vector of 32-bit words) is one
  :class:`~host.switchml.window.SwitchWorkerWindow`: chunks of ``lanes`` words, chunk ``g`` on
  slot ``slot_base + g % slot_count``, version ``(g // slot_count) % 2``, ``seq = g``, at most
  one outstanding packet per slot; ``g`` keeps counting over all messages of the job, so
  versions keep alternating. The window decides what to send; this module owns the socket
  and the clock;
- a packet whose result does not come within its timeout, while no other result comes
  either, is sent again, the same bytes; the switch drops a resend of a round still waiting
  for other workers and answers one of a complete round with a unicast result (a multicast copy that was lost). Timeouts follow
  the measured time from a packet to its result (RFC 6298, Karn: first attempts only), which
  includes the wait for the slowest worker, and double while the switch is silent; while
  it is silent only the oldest expired packet is resent (a probe), once it answers every
  expired one;
- results are matched by ``seq`` and checked against the packet they answer; duplicates and
  results of earlier messages are discarded and counted;
- a job with a result group (``network.md`` section 3; :func:`configure_job`'s ``group``,
  carried by :attr:`JobLayout.group`): the board sends each multicast result once, to the
  group, and the worker receives on a second socket bound to the group that joins it on the
  interface that reaches the board (``IP_ADD_MEMBERSHIP``); unicast answers to resends still
  come to its own socket. Both sockets take results from the board's switch port only, and
  the group socket multicast results of the worker's own job only (a job sharing the group
  address and port is counted as foreign);
- at most as many packets are outstanding as the switch's result buffer holds results
  (:mod:`host.driver.pacing`; every worker of a job sends the same rounds, and a round's
  result is stored once whatever its workers, so the job's results never overflow it;
  ``share`` jobs at once split it): the window's other packets wait for results;
- a message that makes no progress (no new result) for ``timeout`` seconds, and at least
  :data:`~host.driver.pacing.GIVE_UP_RTTS` measured round trips, raises
  :class:`~host.driver.transport.NoReplyError`: a stopped board, a job that is not
  configured, or a worker of the job that does not send;
- a job with authentication (``network.md`` section 7, **Jobs**; :func:`configure_job`'s
  ``epoch``, carried by :attr:`JobLayout.epoch`): the worker tags every datagram under the
  job key (:meth:`UdpSwitchWorker.set_layout`'s ``job_key``, derived by the controller with
  :func:`job_key_for`) and takes only results whose tag is right (the others are counted
  in :attr:`WorkerStats.bad_tag`); chunks are numbered as that section says already.
"""
from __future__ import annotations

import collections
import dataclasses
import select
import time

import numpy as np

from contract.header import HEADER_BYTES, WORKER_MULTICAST, Flags, Header, PacketType
from contract.network import (MAX_JOBS_IN_TABLE, MAX_WORKERS_IN_TABLE, NET_REGISTERS, PORT_BASE,
                              Service, ip_to_int, network_address, service_ports)
from contract.packet import Packet
from contract.registers import (AUTH_FEATURE_JOBS, AUTH_FEATURE_UPSTREAM,
                                AUTH_REGISTERS)

from ..golden.siphash import check_tag, job_key, tag_datagram
from ..switchml.window import ProtocolError, SwitchWorkerWindow
from .pacing import board_buffers, give_up_after
from .rtt import ResendTimer, RttEstimator
from .sockets import (drain, local_address_towards, open_group_socket, open_udp_socket,
                      parse_group)
from .transport import NoReplyError, TransportError

__all__ = ["UdpSwitchWorker", "WorkerStats", "JobLayout", "configure_job", "write_group",
           "read_group", "write_job_auth", "write_upstream_key", "job_key_for",
           "DEFAULT_TIMEOUT"]

#: seconds a message may go without any new result before the worker gives up
DEFAULT_TIMEOUT = 30.0
_WORKER_TABLE = NET_REGISTERS["worker"]
_GROUP_TABLE = NET_REGISTERS["group"]
_JOB_AUTH = AUTH_REGISTERS["job_auth"]
_UPSTREAM_KEY = AUTH_REGISTERS["upstream_key"]
_OPS = (PacketType.AGG_ADD_I32, PacketType.AGG_OR32)


@dataclasses.dataclass(frozen=True)
class JobLayout:
    """Where a job's rounds go on the switch (the same on every worker of the job), its
    result group: ``(ip, port)`` or None (results come one datagram per worker), and the
    epoch of its job key where it has authentication (None: none). The layout holds
    nothing secret: the job key travels apart (:func:`job_key_for`)."""
    job: int
    workers: int
    slot_base: int
    slot_count: int
    lanes: int
    group: tuple[str, int] | None = None
    epoch: int | None = None

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class WorkerStats:
    """What one worker's traffic with the switch cost (counted by the worker)."""
    messages: int = 0          # vectors aggregated
    packets: int = 0           # chunks sent (first transmissions)
    resends: int = 0           # packets sent again after a timeout
    results: int = 0           # results taken (one per chunk)
    multicast: int = 0         # ... of them multicast copies
    unicast: int = 0           # ... of them unicast answers to resends
    discarded: int = 0         # duplicates, results of earlier messages
    foreign: int = 0           # datagrams from another address than the switch port (or,
                               # on the group, not a multicast result of this job)
    bytes_out: int = 0
    bytes_in: int = 0
    seconds: float = 0.0       # wall time inside aggregate()
    group: int = 0             # results taken from the job's result group (multicast ones)
    bad_tag: int = 0           # datagrams of an authenticated job with a wrong tag (dropped)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _check_int(name, value, low, high):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
            or not low <= value <= high:
        raise ValueError(f"{name} must be an integer in {low}..{high}, not {value!r}")
    return int(value)


class UdpSwitchWorker:
    """Worker ``worker`` of ``job`` on the switch of the board at ``host``.

    Parameters
    ----------
    host : str
        The board's IPv4 address.
    port_base : int
        UDP port of the board's first service (the switch is ``port_base + 2``).
    job, worker : int
        The job and this worker's number in it (its worker table entry).
    timeout : float
        Seconds a message may go without a new result before :class:`NoReplyError`.
    rto, min_rto, max_rto : float
        First packet timeout, and the bounds of every timeout (seconds).
    board : str or None
        The board whose switch result buffer bounds the packets outstanding
        (:func:`host.driver.pacing.board_buffers`; default every board's).
    share : int
        Jobs that use the switch at once: each keeps to its ``1/share`` part of the buffer.

    The socket is bound when the worker is made (:attr:`address` is what the worker table
    must hold); :meth:`set_layout` tells it the job's slots and lanes before the first
    :meth:`aggregate`, and its result group if it has one (then it joins the group). One
    worker serves one thread.
    """

    def __init__(self, host: str = "127.0.0.1", *, port_base: int = PORT_BASE, job: int = 0,
                 worker: int = 0, timeout: float = DEFAULT_TIMEOUT, rto: float = 0.2,
                 min_rto: float = 0.02, max_rto: float = 1.0, board: str | None = None,
                 share: int = 1):
        import socket

        self.job = _check_int("job", job, 0, MAX_JOBS_IN_TABLE - 1)
        self.worker = _check_int("worker", worker, 0, MAX_WORKERS_IN_TABLE - 1)
        if not timeout > 0 or not 0 < min_rto <= max_rto or not rto > 0:
            raise ValueError(f"timeouts must be positive with min_rto <= max_rto, got "
                             f"timeout={timeout}, rto={rto}, min_rto={min_rto}, max_rto={max_rto}")
        self.timeout = float(timeout)
        self.share = _check_int("share", share, 1, 1024)
        self._result_buffer = board_buffers(board)[Service.SWITCH]
        try:
            self.host = socket.gethostbyname(host)
        except OSError as exc:
            raise TransportError(f"cannot resolve the board's address {host!r}: {exc}") from None
        self.port_base = port_base
        self.switch_address = (self.host, service_ports(port_base)[Service.SWITCH])
        self.sock = open_udp_socket(local_address_towards(self.switch_address))
        self.stats = WorkerStats()
        self.layout: JobLayout | None = None
        #: the socket that receives the job's result group (None: the job has none)
        self.group_sock = None
        self.next_chunk = 0
        #: the job key of a job with authentication (None: datagrams go untagged)
        self._job_key: bytes | None = None
        self._rtt = RttEstimator(rto, min_rto, max_rto)
        self._heard = float("-inf")
        self._closed = False

    def result_window(self, lanes: int) -> int:
        """Packets of ``lanes`` words this worker keeps outstanding at most: its part of the
        switch's result buffer, in results of that size."""
        return self._result_buffer.replies(HEADER_BYTES + 4 * lanes, self.share)

    @property
    def address(self) -> tuple[str, int]:
        """``(ip, port)`` of the worker's socket: its worker table entry."""
        return self.sock.getsockname()

    def set_layout(self, layout: JobLayout, first_chunk: int = 0, *,
                   job_key: bytes | None = None) -> None:
        """The job's slots and lanes (after its commit: chunk numbers start at
        ``first_chunk``), and its result group: with one, the worker joins it on the
        interface of its own socket (the one that reaches the board). A job with
        authentication (``layout.epoch`` set) needs its 16-byte ``job_key``
        (:func:`job_key_for`); one without takes none."""
        if layout.job != self.job or not 0 <= self.worker < layout.workers:
            raise ValueError(f"job {self.job} worker {self.worker} is not a worker of {layout}")
        if layout.epoch is not None:
            if not isinstance(job_key, (bytes, bytearray)) or len(job_key) != 16:
                raise ValueError(f"job {self.job} has authentication (epoch {layout.epoch}): "
                                 f"set_layout needs its 16-byte job key, not {job_key!r:.20}")
        elif job_key is not None:
            raise ValueError(f"job {self.job} has no authentication (its layout has no "
                             f"epoch): it takes no job key")
        group = parse_group(layout.group)
        if self._closed:
            raise TransportError("the switch worker is closed")
        self._leave_group()
        if group is not None:
            self.group_sock = open_group_socket(group, self.address[0])
        self.layout = layout
        self._job_key = None if job_key is None else bytes(job_key)
        self.next_chunk = int(first_chunk)

    def _leave_group(self) -> None:
        if self.group_sock is not None:
            self.group_sock.close()          # the kernel leaves the group with it
            self.group_sock = None

    # -- one message ---------------------------------------------------------------------

    def aggregate(self, words, op, *, exponent: int = 0, name: str = "message"):
        """OR (``AGG_OR32``) or wrap-around ADD (``AGG_ADD_I32``) ``words`` with the other
        workers' vectors of the same length through the switch.

        Returns ``(vector, exponent)``: the aggregated uint32 vector and the MAX of the
        workers' ``exponent`` bytes (None for an empty vector, which sends nothing).
        """
        if self._closed:
            raise TransportError("the switch worker is closed")
        if self.layout is None:
            raise RuntimeError("set_layout() first: the worker does not know its job's slots")
        if op not in _OPS:
            raise ValueError(f"op must be AGG_ADD_I32 or AGG_OR32, not {op!r}")
        started = time.perf_counter()
        layout = self.layout
        words = np.ascontiguousarray(words).reshape(-1)
        if words.dtype.itemsize != 4 or words.dtype.kind not in "iu":
            raise TypeError(f"expected 32-bit integer words, not {words.dtype}")
        window = SwitchWorkerWindow(words, op=op, job=self.job, worker=self.worker,
                                    slot_base=layout.slot_base, slot_count=layout.slot_count,
                                    lanes=layout.lanes, first_chunk=self.next_chunk,
                                    exponent=exponent)
        self.next_chunk = window.end_chunk
        self.stats.messages += 1
        try:
            self._run(window, name)
        finally:
            self.stats.seconds += time.perf_counter() - started
        return window.result()

    def _run(self, window: SwitchWorkerWindow, name: str) -> None:
        """Drive ``window`` over the socket until every result is in: the window says what
        to send; this loop owns the clock (a resend timer per outstanding ``seq``)."""
        timers: dict[int, ResendTimer] = {}          # by seq; item: the datagram
        progress = time.monotonic()
        # the window's packets beyond what the switch's result buffer holds wait here
        limit = self.result_window(window.lanes)
        held: collections.deque = collections.deque()

        def send_new(packets, now):
            held.extend(packets)
            while held and len(timers) < limit:
                packet = held.popleft()
                data = packet.to_bytes()
                if self._job_key is not None:      # a resend sends the same bytes
                    data = tag_datagram(self._job_key, data)
                timers[packet.header.seq] = ResendTimer(data, now, now, self._rtt.rto)
                self.stats.packets += 1
                self._send(data)

        send_new(window.start(), progress)
        while not window.done:
            # A packet is overdue at its deadline, but not while results still come: a
            # busy switch answers a window of packets one after the other, and the last of
            # them waits its turn (a lost packet stalls only its slot, and shows when the
            # other slots are done).
            patience = give_up_after(self._rtt.srtt, self.timeout)
            due = max(min(timer.deadline for timer in timers.values()),
                      self._heard + self._rtt.rto)
            wait = min(max(due - time.monotonic(), 0.0),
                       max(progress + patience - time.monotonic(), 0.0))
            sockets = [self.sock] if self.group_sock is None else [self.sock, self.group_sock]
            ready, _, _ = select.select(sockets, [], [], wait)
            for sock in ready:
                on_group = sock is self.group_sock
                for data, source in drain(sock):
                    packet = self._datagram_packet(data, source, on_group)
                    if packet is None:
                        continue
                    seq = packet.header.seq
                    try:
                        accepted, following = window.on_result(packet)
                    except ProtocolError as exc:
                        raise TransportError(str(exc)) from None
                    if not accepted:
                        self.stats.discarded += 1
                        continue
                    timer = timers.pop(seq)
                    self._heard = progress = time.monotonic()
                    if timer.attempt == 0:           # Karn: first attempts only
                        self._rtt.sample(self._heard - timer.sent)
                    self._count_result(packet, len(data), on_group)
                    send_new(following, progress)
            now = time.monotonic()
            if not window.done and now - progress >= patience:
                missing = sorted(timers)[:8]
                raise NoReplyError(Service.SWITCH,
                    f"no result from the board's switch at {self.switch_address[0]}:"
                    f"{self.switch_address[1]} for {len(timers)} packet(s) of "
                    f"{name} (job {self.job} worker {self.worker}, seq {missing}) within "
                    f"{patience:g} s: is the board running, is job {self.job} configured "
                    f"with this worker's address, and do all {self.layout.workers} workers "
                    f"of the job send?")
            if now < self._heard + self._rtt.rto:
                continue
            expired = sorted(((seq, timer) for seq, timer in timers.items()
                              if timer.deadline <= now), key=lambda item: item[1].deadline)
            silent = bool(expired) and self._heard < min(t.last_sent for _, t in expired)
            if silent:
                self._rtt.backoff()          # nothing came back at all: slow or gone
            for position, (seq, timer) in enumerate(expired):
                if self._heard > timer.last_sent:
                    timer.timeout = self._rtt.rto
                else:
                    timer.timeout = min(timer.timeout * 2, self._rtt.maximum)
                timer.last_sent = now
                # While the switch is silent (the other workers are late, or the board is
                # slow or gone) one resend probes it; once it answers, every expired packet
                # goes again. A flood of resends would only slow a busy board further.
                if silent and position:
                    continue
                if window.resend(seq) is None:
                    continue
                timer.attempt += 1
                self.stats.resends += 1
                self._send(timer.item)

    def _datagram_packet(self, data: bytes, source, on_group: bool = False) -> Packet | None:
        """``data`` as a packet if it came from the switch and parses, else None (counted
        as foreign or discarded). On the result group only a multicast result of this
        worker's job counts: the group's address and port may be another job's too."""
        if source != self.switch_address:
            self.stats.foreign += 1
            return None
        if len(data) < HEADER_BYTES or (len(data) - HEADER_BYTES) % 4:
            self.stats.discarded += 1
            return None
        if self._job_key is not None and not check_tag(self._job_key, data):
            self.stats.bad_tag += 1          # forged, or of another epoch: never taken
            return None
        header = Header.parse(data)
        if on_group and not (header.flags & Flags.RESULT and header.job == self.job
                             and header.worker == WORKER_MULTICAST):
            self.stats.foreign += 1
            return None
        return Packet(header, data[HEADER_BYTES:])

    def _count_result(self, packet: Packet, size: int, on_group: bool = False) -> None:
        self.stats.results += 1
        self.stats.bytes_in += size
        self.stats.group += on_group
        if packet.header.worker == WORKER_MULTICAST:
            self.stats.multicast += 1
        else:
            self.stats.unicast += 1

    def _send(self, data: bytes) -> None:
        self.stats.bytes_out += len(data)
        try:
            self.sock.sendto(data, self.switch_address)
        except (BlockingIOError, InterruptedError):
            pass                 # a full send buffer loses it, like the wire: resent later
        except OSError as exc:
            raise TransportError(f"cannot send to the board's switch at "
                                 f"{self.switch_address[0]}:{self.switch_address[1]}: "
                                 f"{exc}") from None

    @property
    def rto_ms(self) -> float:
        return self._rtt.rto * 1e3

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._leave_group()
            self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def configure_job(transport, layout_job: int, addresses, *, slot_base: int = 0,
                  slot_count: int | None = None, group=None, upstream=None,
                  epoch: int | None = None, upstream_key: bytes | None = None) -> JobLayout:
    """Write ``addresses`` (worker w's ``(ip, port)``, in worker order) into the board's
    worker table for ``layout_job`` and (re)configure the job for that many workers over
    ``[slot_base, slot_base + slot_count)`` (default: the rest of the switch's pool), which
    clears its slots. ``transport`` is a :class:`~host.driver.udp.UdpTransport` with the
    board's key and ``region="switch"``. Returns the job's :class:`JobLayout`.

    ``group`` is the job's result group (``network.md`` section 3): ``(ip, port)`` or
    ``"IP:PORT"`` with an IPv4 multicast address (239.0.0.0/8, administratively scoped, is
    the one to use) and a port in 1..65535; None or 0: no group. It is written with the
    worker table, before the commit, either way (no group writes 0, so a job configured
    again without one loses its old group). The layout carries it to the workers
    (:meth:`UdpSwitchWorker.set_layout` joins it).

    ``upstream`` (a :class:`host.golden.aggregator.Upstream`, or None) makes the job a leaf
    of a parent aggregator's job (``aggregator-protocol.md`` section 4): its four
    registers are written before the commit either way, None writing zeros, so a job
    configured again without one loses its old upstream
    (:meth:`~host.driver.switch.SwitchInterface.configure_job`). The workers see no
    difference: the layout does not carry it.

    ``epoch`` (0..2**32-1, or None) gives the job authentication (``network.md`` section
    7): its ``job_auth`` registers are written before the commit (None writes 0: a job
    configured again without one loses it), the layout carries the epoch, and the job key
    is :func:`job_key_for` ``(key, layout)``, for the controller to hand to the workers.
    Only a board with a 128-bit control key has the registers: any other stops here, with
    one line, before the commit.

    ``upstream_key`` (16 bytes, with ``upstream``) is the job key of the parent's job where
    that job has authentication: written wrapped before the commit (a board with a 128-bit
    key gets zeros for None), after which the leaf tags what it sends up under it and takes
    only the parent's results that carry its tag.
    """
    from .switch import SwitchInterface

    workers = len(addresses)
    job = _check_int("job", layout_job, 0, MAX_JOBS_IN_TABLE - 1)
    _check_int("workers", workers, 1, MAX_WORKERS_IN_TABLE)
    group = parse_group(group)
    if epoch is not None:
        epoch = _check_int("epoch", epoch, 0, 0xFFFF_FFFF)
    switch = SwitchInterface(transport)
    if slot_count is None:
        slot_count = switch.slots - slot_base
    if not (0 <= slot_base and 1 <= slot_count and slot_base + slot_count <= switch.slots):
        raise ValueError(f"slots {slot_base}..{slot_base + slot_count - 1} are not inside the "
                         f"board's switch pool of {switch.slots}")
    writes = []
    for worker, (ip, port) in enumerate(addresses):
        entry = job * MAX_WORKERS_IN_TABLE + worker
        writes += [(network_address("net", _WORKER_TABLE.address(entry, "ip")), ip_to_int(ip)),
                   (network_address("net", _WORKER_TABLE.address(entry, "port")), int(port))]
    transport.write_many(writes, full=True)
    write_group(transport, job, group)
    write_job_auth(transport, job, epoch)
    write_upstream_key(transport, job, upstream_key if upstream is not None else None)
    switch.configure_job(job, workers, slot_base, slot_count, upstream=upstream)
    return JobLayout(job=job, workers=workers, slot_base=slot_base, slot_count=slot_count,
                     lanes=switch.lanes, group=group, epoch=epoch)


def write_job_auth(transport, job: int, epoch: int | None) -> None:
    """Write ``job``'s ``job_auth`` registers (section 7): ``epoch`` with authentication,
    or none (None: 0 and 0, on a board with a 128-bit key; a board with section 4's key
    has nothing to clear), and check the read-back. Before the job's commit, which applies
    them."""
    from ..golden.ctrl_auth import is_authenticated

    if epoch is None and not is_authenticated(getattr(transport, "key", None)):
        return          # a board with section 4's key has no such registers to clear
    enable = int(epoch is not None)
    pairs = [(network_address("net", _JOB_AUTH.address(job, "enable")), enable),
             (network_address("net", _JOB_AUTH.address(job, "epoch")), epoch or 0)]
    _write_registers(transport, pairs, epoch is not None,
                     f"the board does not authenticate job {job} (section 7's authenticated "
                     f"jobs need a board with a 128-bit control key whose front end serves "
                     f"them, and job {job} within its switch's jobs)")


def auth_features(transport) -> int:
    """``auth_features`` of the board behind ``transport`` (``contract.registers``'
    ``AUTH_FEATURE_*`` bits: what of section 7 it does), 0 for a board with section 4's
    64-bit key (which has no such register)."""
    from ..golden.ctrl_auth import is_authenticated

    if not is_authenticated(getattr(transport, "key", None)):
        return 0
    address = network_address("net", AUTH_REGISTERS["auth_features"].address)
    return transport.read_many([address], full=True)[0]


def authenticates_jobs(transport, job: int) -> bool:
    """Whether the board behind ``transport`` serves section 7's authenticated jobs (for
    ``job``: every job of a board that does): its ``auth_features`` has
    ``AUTH_FEATURE_JOBS`` (the golden and virtual boards, and the network top built with a
    128-bit key)."""
    del job                  # a board authenticates all of its jobs or none
    return bool(auth_features(transport) & AUTH_FEATURE_JOBS)


def authenticates_trees(transport) -> bool:
    """Whether the board behind ``transport`` serves section 7's upstream keys too
    (``AUTH_FEATURE_UPSTREAM``: wrapped writes, a tree's aggregates and results tagged),
    which an authenticated tree needs on every board (the golden and virtual boards; the
    gateware has none yet)."""
    return bool(auth_features(transport) & AUTH_FEATURE_UPSTREAM)


def write_upstream_key(transport, job: int, key: bytes | None) -> None:
    """Write ``job``'s upstream key (section 7, wrapped by the transport: the words never
    travel in clear and read back 0), or zeros for None on a board with a 128-bit key (a
    board with section 4's key has no such registers: nothing to clear, and a key is
    refused). Before the job's commit, which applies it."""
    from ..golden.ctrl_auth import is_authenticated

    if not is_authenticated(getattr(transport, "key", None)):
        if key is None:
            return
        raise TransportError(f"job {job}'s upstream key goes to a board with a 128-bit "
                             f"control key (section 7) only")
    if key is not None and (not isinstance(key, (bytes, bytearray)) or len(key) != 16):
        raise ValueError(f"an upstream key is 16 bytes, not {key!r:.20}")
    words = [0] * 4 if key is None else \
        [int.from_bytes(bytes(key)[4 * i:4 * i + 4], "little") for i in range(4)]
    transport.write_many([(network_address("net", _UPSTREAM_KEY.address(job, f"word{i}")),
                           words[i]) for i in range(4)], full=True)


def job_key_for(key, layout: JobLayout) -> bytes:
    """The job key of ``layout``'s job (section 7): derived from the board's 128-bit
    control ``key`` (16 bytes), the job and the layout's epoch. What the controller hands
    to the job's workers over its own channel; it never travels to or from the board."""
    from ..golden.ctrl_auth import control_key, is_authenticated

    key = control_key(key)
    if layout.epoch is None:
        raise ValueError(f"job {layout.job} has no authentication (its layout has no epoch)")
    if not is_authenticated(key):
        raise ValueError("a job key derives from section 7's 128-bit control key (32 hex "
                         "digits), not a 64-bit one")
    return job_key(key, layout.job, layout.epoch)


def write_group(transport, job: int, group) -> tuple[str, int] | None:
    """Write ``job``'s result group registers (``group`` as :func:`configure_job` takes it;
    None or 0 writes 0/0: no group) and check the read-back; the group as ``(ip, port)``
    or None. Before the job's commit, as the worker table."""
    group = parse_group(group)
    ip, port = (ip_to_int(group[0]), group[1]) if group is not None else (0, 0)
    pairs = [(network_address("net", _GROUP_TABLE.address(job, "ip")), ip),
             (network_address("net", _GROUP_TABLE.address(job, "port")), port)]
    _write_registers(transport, pairs, group is not None,
                     f"the board does not hold a result group for job {job} (its network "
                     f"front end predates result groups, or job {job} is beyond its "
                     f"switch's jobs)")
    return group


def _write_registers(transport, pairs, wanted: bool, missing: str) -> None:
    """Write ``pairs`` (full addresses) and check the read-back; where something was
    ``wanted`` and a register does not read back (a board without it), the error says
    ``missing`` first. Writing zeros to registers a board lacks is no error."""
    try:
        transport.write_many(pairs, full=True)
    except TransportError as exc:
        if not wanted or "reads back" not in str(exc):
            raise
        raise TransportError(f"{missing}: {exc}") from None


def read_group(transport, job: int) -> tuple[str, int] | None:
    """``job``'s result group as the board holds it: ``(ip, port)``, or None (no group)."""
    from contract.network import group_active

    ip, port = transport.read_many(
        [network_address("net", _GROUP_TABLE.address(job, field)) for field in ("ip", "port")],
        full=True)
    if not group_active(ip, port):
        return None
    return ".".join(str(ip >> shift & 0xFF) for shift in (24, 16, 8, 0)), port
