"""The virtual board: a board backend behind real UDP sockets on 127.0.0.1.

:class:`VirtualBoard` binds the four service ports (``contract.network.service_ports``),
turns every datagram that arrives into a :class:`~host.board.backend.Datagram` for its
backend (with the sender's real address and port), and sends what the backend answers from
the socket of the service port it names, to the address it names. From the host's side it
is a board on 127.0.0.1, apart from speed; ``gradwire board serve`` runs one.

Optionally a seeded :class:`~host.board.link_faults.WireFaults` sits on its wire, both ways.

The socket side translates ports: datagrams to socket port ``port_base + i`` reach the
backend at ``backend.port_base + i``, and a datagram the backend sends from
``backend.port_base + i`` leaves from socket ``port_base + i`` (the gateware's ports are
fixed when it is built; the golden backend is simply built with the sockets' ports). The
board's own address is the backend's ``ip``; replies go to loopback addresses only (any
other destination is counted as ``undeliverable`` and not sent), and results to a job's
result group (``docs/protocol/network.md`` section 3) to its IPv4 multicast address: the
switch socket sends those with ``IP_MULTICAST_TTL`` 1 (``GROUP_TTL``: the group stays on
the segment), ``IP_MULTICAST_LOOP`` on and ``IP_MULTICAST_IF`` the board's address, so that
the kernel sends them on loopback (not along the route for 224.0.0.0/4, out of the host)
and loops them back to the group's members on the same host (or network namespace), which
join it on 127.0.0.1.
"""
from __future__ import annotations

import heapq
import ipaddress
import itertools
import random
import secrets
import selectors
import socket
import sys
import threading
import time
import traceback

from contract.network import GROUP_TTL, PORT_BASE, SERVICE_OFFSETS, Service, is_multicast

from .backend import BoardBackend, Datagram, open_board_backend
from .link_faults import INBOUND, OUTBOUND, WireFaults

__all__ = ["VirtualBoard", "LOOPBACK", "free_port_base"]

LOOPBACK = "127.0.0.1"
_SERVICES = sorted(SERVICE_OFFSETS, key=SERVICE_OFFSETS.get)
_CTRL, _SWITCH = SERVICE_OFFSETS[Service.CTRL], SERVICE_OFFSETS[Service.SWITCH]
#: socket buffers: several windows of jumbo datagrams from several hosts
_BUFFER_BYTES = 4 << 20
#: datagrams read from one socket before the others get a turn
_DRAIN = 256
#: longest sleep of the loop (it also wakes on every datagram and on stop)
_IDLE = 0.5
#: free port bases are drawn below Linux's ephemeral range (32768 up), where clients live
_FREE_BASES = (20000, 32000)
_BIND_ATTEMPTS = 64
_IN, _OUT = 0, 1


def free_port_base() -> int:
    """A base of four consecutive UDP ports that are free on 127.0.0.1 right now (for a
    board started in another process; another program may take them in between)."""
    board = VirtualBoard("golden", port_base=None)
    board._bind()
    board._close_sockets()
    return board.port_base


class VirtualBoard:
    """A board backend served on 127.0.0.1 behind real UDP sockets.

    Parameters
    ----------
    backend : str or BoardBackend
        A name of ``host.board.backend.BOARD_BACKENDS`` (built with ``key``, ``port_base``
        and ``params``) or a backend object.
    port_base : int or None
        First of the four UDP ports; None picks four free consecutive ports.
    key : int, bytes or None
        The control key for a named backend; None draws a random one (64 bits). 16 bytes
        are section 7's 128-bit key (authenticated control: the golden backend only, for
        now).
    faults : WireFaults or None
        Fault injector on the wire.
    params
        The named backend's parameters (``slots``, ``lanes``, ``max_count``, ...).

    Use as a context manager (``with VirtualBoard() as board:``), or :meth:`start` and
    :meth:`stop`; :meth:`serve_forever` runs the loop in the calling thread instead.
    """

    def __init__(self, backend: str | BoardBackend = "golden", *, port_base: int | None = PORT_BASE,
                 key: int | bytes | None = None, faults: WireFaults | None = None, **params):
        if isinstance(backend, BoardBackend) and (params or key is not None):
            raise ValueError("key and backend parameters go to a named backend, not to a "
                             "backend object")
        self._backend_spec, self._params = backend, params
        self.backend: BoardBackend | None = backend if isinstance(backend, BoardBackend) else None
        self.key = key if key is not None or self.backend else secrets.randbits(64)
        self.faults = faults if faults is not None and faults.active else None
        self.host = LOOPBACK
        self._requested_base = port_base
        self.port_base: int | None = None
        self._sockets: list[socket.socket] = []
        self._wake_r = self._wake_w = None
        self._stop = threading.Event()
        self._thread = None
        self._heap = []
        self._order = itertools.count()
        self.stats = dict.fromkeys(("received", "delivered", "sent", "undeliverable",
                                    "send_errors", "backend_errors", "bad_source_port",
                                    "multicast"), 0)

    # -- life cycle ----------------------------------------------------------------------

    @property
    def ports(self) -> dict[Service, int]:
        return {s: self.port_base + SERVICE_OFFSETS[s] for s in _SERVICES}

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port_base)`` to give a transport."""
        return self.host, self.port_base

    def open(self) -> "VirtualBoard":
        """Bind the sockets and build the backend (the loop does not run yet)."""
        if self._sockets:
            return self
        self._bind()
        try:
            if self.backend is None:
                self.backend = open_board_backend(self._backend_spec, key=self.key,
                                                  port_base=self.port_base, **self._params)
            elif self.key is None:
                self.key = self.backend.key
            self._wake_r, self._wake_w = socket.socketpair()
            self._wake_r.setblocking(False)
            self._wake_w.setblocking(False)
        except BaseException:
            self._close_sockets()
            raise
        return self

    def start(self) -> "VirtualBoard":
        """Bind, then serve from a background thread."""
        self.open()
        if self._thread is None:
            self._thread = threading.Thread(target=self.serve_forever, daemon=True,
                                            name=f"virtual-board-{self.port_base}")
            self._thread.start()
        return self

    def request_stop(self) -> None:
        """Ask the loop to stop (safe from a signal handler)."""
        self._stop.set()
        if self._wake_w is not None:
            try:
                self._wake_w.send(b"\0")
            except OSError:
                pass

    def stop(self) -> None:
        """Stop serving, close every socket and the backend."""
        self.request_stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
            if self._thread.is_alive():
                raise RuntimeError("the virtual board's loop did not stop within 10 s")
        self._thread = None
        self._close_sockets()
        if self.backend is not None:
            self.backend.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def transport(self, **options):
        """A :class:`~host.driver.udp.UdpTransport` to this board (with its key and its
        backend's ``transport_options``; unless given, resends enough for the loss its wire
        injects)."""
        from host.driver.rtt import retries_for_loss
        from host.driver.udp import UdpTransport
        options = {**getattr(self.backend, "transport_options", {}), **options}
        if "retries" not in options:
            options["retries"] = retries_for_loss(self.faults.loss if self.faults else 0.0)
        return UdpTransport(self.host, port_base=self.port_base, key=self.key, **options)

    def describe(self) -> str:
        text = (f"{self.backend.describe()}; serving {self.host} ports {self.port_base}-"
                f"{self.port_base + len(_SERVICES) - 1}")
        if self.faults is not None:
            f = self.faults
            text += (f"; wire faults loss {f.loss:g} dup {f.dup:g} reorder {f.reorder:g} "
                     f"(seed {f.seed})")
        return text

    def _bind(self):
        if self._requested_base is not None:
            self._sockets = self._bind_at(self._requested_base)
            self.port_base = self._requested_base
            return
        rng = random.Random()
        for _ in range(_BIND_ATTEMPTS):
            base = rng.randrange(*_FREE_BASES)
            try:
                self._sockets = self._bind_at(base)
            except OSError:
                continue
            self.port_base = base
            return
        raise OSError(f"found no four free consecutive UDP ports on {self.host} after "
                      f"{_BIND_ATTEMPTS} tries")

    def _bind_at(self, base):
        if not 1 <= base <= 0xFFFF - len(_SERVICES) + 1:
            raise ValueError(f"port_base {base} leaves no room for four ports below 65536")
        sockets = []
        try:
            for offset in range(len(_SERVICES)):
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                sockets.append(s)
                for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
                    s.setsockopt(socket.SOL_SOCKET, option, _BUFFER_BYTES)
                try:
                    s.bind((self.host, base + offset))
                except OSError as exc:
                    raise OSError(exc.errno, f"cannot bind UDP {self.host}:{base + offset}: "
                                             f"{exc.strerror} (another board serving there? "
                                             f"choose another port base)") from None
                s.setblocking(False)
            self._multicast_from(sockets[_SWITCH])
        except BaseException:
            for s in sockets:
                s.close()
            raise
        return sockets

    def _multicast_from(self, s):
        """The switch socket sends results to a job's result group: TTL 1, looped back to
        this host's members, out of the interface of the board's address."""
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, GROUP_TTL)
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(self.host))

    def _close_sockets(self):
        for s in self._sockets + [self._wake_r, self._wake_w]:
            if s is not None:
                s.close()
        self._sockets, self._wake_r, self._wake_w = [], None, None

    # -- the loop ------------------------------------------------------------------------

    def serve_forever(self) -> None:
        """Serve until :meth:`request_stop` (or :meth:`stop`)."""
        self.open()
        selector = selectors.DefaultSelector()
        try:
            for offset, s in enumerate(self._sockets):
                selector.register(s, selectors.EVENT_READ, offset)
            selector.register(self._wake_r, selectors.EVENT_READ, None)
            while not self._stop.is_set():
                timeout = _IDLE
                if self._heap:
                    timeout = min(_IDLE, max(0.0, self._heap[0][0] - time.monotonic()))
                # a backend that holds replies (host.board.slow.SlowBoard) says when
                due = getattr(self.backend, "next_due", None)
                if due is not None:
                    timeout = min(timeout, max(0.0, due - time.monotonic()))
                for key, _ in selector.select(timeout):
                    if key.data is None:
                        self._drain_wake()
                    else:
                        self._receive(key.data, key.fileobj)
                self._release(time.monotonic())
                self._schedule_out(self._call(self.backend.poll), time.monotonic())
                self._release(time.monotonic())
        finally:
            selector.close()

    def _drain_wake(self):
        try:
            while self._wake_r.recv(64):
                pass
        except (BlockingIOError, OSError):
            pass

    def _receive(self, offset, sock):
        for _ in range(_DRAIN):
            try:
                data, (ip, port) = sock.recvfrom(1 << 16)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:   # e.g. an ICMP error queued on the socket: nothing to read
                return
            self.stats["received"] += 1
            now = time.monotonic()
            datagram = Datagram(ip, port, self.backend.ip, self.backend.port_base + offset, data)
            if self.faults is None:
                self._push(now, _IN, datagram)
                continue
            barrier = offset == _CTRL
            if barrier:
                self._release(float("inf"))     # everything on the wire arrives first
            for t in self.faults.schedule(INBOUND, (ip, port), data, now, barrier=barrier,
                                          switch=offset == _SWITCH):
                self._push(t, _IN, datagram)

    def _push(self, due, kind, item):
        heapq.heappush(self._heap, (due, next(self._order), kind, item))

    def _release(self, now):
        """Deliver everything due by ``now`` in order: runs of inbound datagrams go to the
        backend as one batch; what it answers is scheduled (and sent, if due) in turn."""
        while self._heap and self._heap[0][0] <= now:
            batch = []
            while self._heap and self._heap[0][0] <= now and self._heap[0][2] == _IN:
                batch.append(heapq.heappop(self._heap)[3])
            if batch:
                self.stats["delivered"] += len(batch)
                self._schedule_out(self._call(self.backend.deliver, batch),
                                   min(now, time.monotonic()))
                continue
            _, _, _, (offset, payload, address) = heapq.heappop(self._heap)
            self._send(offset, payload, address)

    def _call(self, method, *args):
        try:
            return method(*args)
        except Exception:         # a backend bug: report it, keep serving
            self.stats["backend_errors"] += 1
            print(f"virtual board: the backend failed:\n{traceback.format_exc()}",
                  file=sys.stderr, flush=True)
            return []

    def _schedule_out(self, datagrams, now):
        for d in datagrams:
            offset = d.src_port - self.backend.port_base
            if not 0 <= offset < len(self._sockets):
                self.stats["bad_source_port"] += 1
                continue
            try:
                destination = ipaddress.IPv4Address(d.dst_ip)
                # loopback, or a result group's multicast address from the switch socket
                loopback = destination.is_loopback or (destination.is_multicast
                                                       and offset == _SWITCH)
            except ValueError:
                loopback = False
            if not loopback or not 0 < d.dst_port <= 0xFFFF:
                self.stats["undeliverable"] += 1
                continue
            item = (offset, d.payload, (d.dst_ip, d.dst_port))
            if self.faults is None:
                self._push(now, _OUT, item)
                continue
            for t in self.faults.schedule(OUTBOUND, (d.src_ip, d.src_port), d.payload, now):
                self._push(t, _OUT, item)

    def _send(self, offset, payload, address):
        try:
            self._sockets[offset].sendto(payload, address)
            self.stats["sent"] += 1
            if is_multicast(address[0]):
                self.stats["multicast"] += 1      # one datagram to a job's result group
        except OSError:     # full buffer or an unreachable port: the datagram is lost
            self.stats["send_errors"] += 1
