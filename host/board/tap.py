"""The Verilated network top on a Linux TAP interface: a board to rehearse bring-up with.

``gradwire board serve --backend verilator --tap NAME`` puts the gateware of a board (the
Verilated network top of :mod:`sim.harness.network`: LiteEth, the clock crossing, the front
end, the NIC and switch engines; the same sources as the bitstream) on the TAP interface
``NAME``. The host's own network stack then talks to it as to a board on a cable: the
kernel's ARP resolves it, ``ping`` reaches its ICMP echo, ordinary UDP sockets (``gradwire
board status``, a training run with ``backend="udp"``) reach its services, and its own ARP
requests for the hosts it answers reach the kernel.

How the bridge works (:class:`TapBoard`):

- :class:`TapDevice` opens ``/dev/net/tun`` with ``TUNSETIFF`` (``IFF_TAP | IFF_NO_PI``):
  every read is one whole Ethernet frame without FCS, every write sends one. That is
  exactly what the PHY harness takes and gives (it adds and checks preamble and FCS
  itself), so frames pass unchanged both ways.
- The harness only advances simulated time inside a request, so the loop drives it: the
  frames the kernel sent go in a few at a time (``CHUNK_BYTES``), each run lasting
  until the gateware is quiet (``RUN_IDLE`` cycles), until it sent an ARP frame (which
  goes to the kernel at once, so that its answer goes in with the next run), or, for a
  chunk of NIC and control requests only, until it sent one reply per request. Whatever
  the gateware sent goes to the TAP as soon as the run returns; short runs without input
  follow while it still sends.
- While no frame arrives the loop still runs the gateware now and then (``idle ticks``,
  from ``MIN_TICK`` doubling to ``MAX_TICK`` seconds apart), so that its timers
  progress and anything it sends on its own reaches the wire.

Simulated time runs some thousands of times slower than wall time (50,000-90,000 engine
cycles per second): a ping or a control read takes milliseconds to tens of
milliseconds, but the kernel and the host tools see nothing else different from a board.

The interface is the user's: create it (``ip tuntap add dev NAME mode tap user USER``, so
that ``serve`` needs no root), give the host its address (``ip addr add 192.168.77.1/24 dev
NAME``) and bring it up (``ip link set NAME up``). Attaching to a name that does not exist
creates a transient interface (that needs ``CAP_NET_ADMIN``), gone when ``serve`` stops.
"""
from __future__ import annotations

import errno
import fcntl
import ipaddress
import os
import select
import socket
import struct
import sys
import threading
import time

__all__ = ["TapBoard", "TapDevice", "TapError", "interface_state", "MIN_TICK", "MAX_TICK",
           "CHUNK_BYTES", "RUN_IDLE"]

TUN_DEVICE = "/dev/net/tun"
_TUNSETIFF = 0x400454CA
# (linux/if_tun.h; written as shifts: the hex spelling reads as a register address)
_IFF_TAP, _IFF_NO_PI = 1 << 1, 1 << 12
_SIOCGIFFLAGS, _SIOCGIFADDR, _SIOCGIFNETMASK = 0x8913, 0x8915, 0x891B
_IFF_UP = 0x1
_IFNAMSIZ = 16
#: the largest frame read from the TAP: a jumbo frame and then some (9000-byte IP MTU)
_READ_BYTES = 1 << 16
#: frames read from the TAP ahead of the gateware at most (the kernel queues the rest)
MAX_PENDING = 256
#: bytes of frames into one run of the gateware at most (and at least one frame): about
#: four full-size frames, so that replies stream back (a full-size frame is about 1,500
#: engine cycles of wire time, some 30 ms of simulation), or a window of small ones
CHUNK_BYTES = 6144
#: quiet engine cycles that end a run with input: short, since a drain run follows (the
#: default run of the harness waits out IDLE_CYCLES = 2000, the longest silence inside
#: the gateware with a margin; a run ended early loses nothing here)
RUN_IDLE = 250
#: seconds between idle ticks: right after traffic, then doubling while the wire is quiet
#: (each tick costs the CPU some 20 ms of simulation, so a quiet board costs a few %)
MIN_TICK = 0.005
MAX_TICK = 0.5


class TapError(OSError):
    """The TAP interface cannot be opened (the message says why and what to do)."""

    def __str__(self):          # the message alone: it is the CLI's one line
        return self.strerror or super().__str__()


def interface_state(name: str) -> tuple[bool, ipaddress.IPv4Interface | None]:
    """``(up, address)`` of interface ``name``: whether it is administratively up, and its
    primary IPv4 address with its netmask (None without one). Needs no privilege."""
    request = struct.pack(f"{_IFNAMSIZ}s24x", name.encode())
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack_from("H", fcntl.ioctl(s, _SIOCGIFFLAGS, request), _IFNAMSIZ)[0]
        try:
            address = socket.inet_ntoa(fcntl.ioctl(s, _SIOCGIFADDR, request)[20:24])
            mask = socket.inet_ntoa(fcntl.ioctl(s, _SIOCGIFNETMASK, request)[20:24])
        except OSError:         # EADDRNOTAVAIL: no IPv4 address on it
            return bool(flags & _IFF_UP), None
    return bool(flags & _IFF_UP), ipaddress.IPv4Interface(f"{address}/{mask}")


class TapDevice:
    """A Linux TAP interface, frames in and out (``IFF_TAP | IFF_NO_PI``: no packet
    information header, each read or write one Ethernet frame without FCS).

    Parameters
    ----------
    name : str
        The interface's name (an existing TAP, or a new transient one).

    Raises
    ------
    TapError
        Not Linux, no ``/dev/net/tun``, no permission, the name taken by another kind of
        interface or another process: one line that says so and what to do.
    """

    def __init__(self, name: str):
        if not name or len(name.encode()) >= _IFNAMSIZ or "/" in name or name.strip() != name:
            raise TapError(errno.EINVAL, f"bad interface name {name!r} (1-15 characters, "
                                         f"no '/' or spaces)")
        if not sys.platform.startswith("linux"):
            raise TapError(errno.ENOSYS, f"--tap needs Linux's TUN/TAP driver (this is "
                                         f"{sys.platform})")
        self.name = name
        try:
            self.fd = os.open(TUN_DEVICE, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            raise TapError(errno.ENOENT, f"no {TUN_DEVICE}: the TUN/TAP driver is not loaded "
                                         f"(modprobe tun), or this container has no access "
                                         f"to it") from None
        except PermissionError:
            raise TapError(errno.EACCES, f"cannot open {TUN_DEVICE}: permission denied (run "
                                         f"as root, or have root open it to users, mode 0666 "
                                         f"as most distributions ship it, and create the "
                                         f"interface for you: ip tuntap add dev {name} mode "
                                         f"tap user $USER)") from None
        try:
            fcntl.ioctl(self.fd, _TUNSETIFF,
                        struct.pack(f"{_IFNAMSIZ}sH22x", name.encode(), _IFF_TAP | _IFF_NO_PI))
        except OSError as exc:
            os.close(self.fd)
            self.fd = None
            raise TapError(exc.errno, self._why(exc)) from None

    def _why(self, exc):
        name = self.name
        if exc.errno == errno.EPERM:
            return (f"cannot attach to TAP {name}: operation not permitted (creating an "
                    f"interface needs CAP_NET_ADMIN: run as root, or have root create it "
                    f"for you first: ip tuntap add dev {name} mode tap user $USER)")
        if exc.errno == errno.EBUSY:
            return (f"cannot attach to TAP {name}: it is busy (another process has it open: "
                    f"another gradwire board serve?)")
        if exc.errno == errno.EINVAL:
            return (f"cannot attach to {name}: it exists and is not a TAP interface (a TUN "
                    f"one, or another kind): choose another name")
        return f"cannot attach to TAP {name}: {exc.strerror}"

    def fileno(self) -> int:
        return self.fd

    def read_frames(self, limit: int = MAX_PENDING) -> list[bytes]:
        """The frames waiting on the interface, up to ``limit`` (none: an empty list)."""
        frames = []
        while len(frames) < limit:
            try:
                frames.append(os.read(self.fd, _READ_BYTES))
            except (BlockingIOError, InterruptedError):
                break
        return frames

    def write(self, frame: bytes) -> bool:
        """Send ``frame``; False when the kernel refused it (interface down: as a board's
        frame on a cable nobody listens to, it is lost)."""
        try:
            os.write(self.fd, frame)
            return True
        except OSError:
            return False

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _classify(frames, ip: str, expected_ports) -> int | None:
    """How many replies the batch ``frames`` brings at most, if it holds only UDP requests
    to ``ip`` at ``expected_ports`` (NIC and control: one reply each, none when dropped);
    None for anything else (ARP, ICMP, the switch's any number of results, frames for
    other hosts), whose run waits out the gateware's idle time instead."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    for raw in frames:
        packet = Ether(raw)
        if IP not in packet or UDP not in packet or packet[IP].dst != ip \
                or packet[UDP].dport not in expected_ports:
            return None
    return len(frames)


class TapBoard:
    """The Verilated network top behind a TAP interface (see the module docstring).

    Parameters
    ----------
    tap : str
        The TAP interface's name.
    key : int, optional
        The control key of the build (default ``hdl.net.top.SIMULATION_KEY``, the build the
        tests share; another key is another Verilator build, minutes the first time).
    board : str
        Network configuration of the gateware (``constraints/network.toml``).
    idle : int, optional
        Quiet engine cycles that end a run (``sim.harness.network.IDLE_CYCLES``).
    device, backend : optional
        Stand-ins for the TAP device and the Verilated board backend (for tests of the
        loop: ``device`` needs ``name``, ``fileno``, ``read_frames``, ``write`` and
        ``close``; ``backend`` a ``harness`` and the backend's ``key``, ``ip``, ``mac``,
        ``port_base``, ``idle``, ``describe`` and ``close``).

    The TAP is opened first (a wrong name or missing permission fails at once), then the
    harness is built or taken from the cache. Use :meth:`serve_forever` in the calling
    thread and :meth:`request_stop` (signal-safe) to end it, then :meth:`close`.
    """

    def __init__(self, tap: str, *, key: int | None = None, board: str = "ecpix5",
                 idle: int | None = None, device=None, backend=None):
        self.tap = TapDevice(tap) if device is None else device
        try:
            if backend is None:
                from host.board.backend import open_board_backend
                # the Verilated board backend builds the harness and knows the built
                # identity (IP, MAC, ports); its datagram side is not used here
                backend = open_board_backend("verilator", key=key, board=board,
                                             **({} if idle is None else {"idle": idle}))
            self.backend = backend
        except BaseException:
            self.tap.close()
            raise
        self.harness = self.backend.harness
        self.key, self.ip, self.mac = self.backend.key, self.backend.ip, self.backend.mac
        self.port_base = self.backend.port_base
        from contract.network import SERVICE_OFFSETS, Service
        self._one_reply_ports = {self.port_base + SERVICE_OFFSETS[s]
                                 for s in (Service.NIC_TX, Service.NIC_RX, Service.CTRL)}
        self._wake_r, self._wake_w = os.pipe()
        for fd in (self._wake_r, self._wake_w):
            os.set_blocking(fd, False)
        self._stop = threading.Event()
        self.stats = dict.fromkeys(("frames_in", "frames_out", "arp_out", "runs", "ticks",
                                    "write_errors", "cycles"), 0)
        self.sim_seconds = 0.0

    @property
    def name(self) -> str:
        return self.tap.name

    def describe(self) -> str:
        return f"{self.backend.describe()}; on TAP {self.name}"

    def request_stop(self) -> None:
        """Ask :meth:`serve_forever` to return (safe from a signal handler)."""
        self._stop.set()
        try:
            os.write(self._wake_w, b"\0")
        except OSError:
            pass

    def step(self, frames=(), *, idle: int | None = None) -> list[bytes]:
        """One run of the gateware with ``frames`` from the wire, ended after ``idle`` quiet
        engine cycles (default the backend's); what it sent, in order, written to the TAP
        and returned."""
        frames = list(frames)
        expect = _classify(frames, self.ip, self._one_reply_ports) if frames else None
        result = self.harness.run(frames, idle=self.backend.idle if idle is None else idle,
                                  stop_on_arp=True, expect=expect)
        self.stats["runs"] += 1
        self.stats["frames_in"] += len(frames)
        self.stats["cycles"] += result.cycles
        self.sim_seconds += result.loop_seconds
        for frame in result.frames:
            self.stats["frames_out"] += 1
            if frame[12:14] == b"\x08\x06":
                self.stats["arp_out"] += 1
            if not self.tap.write(frame):
                self.stats["write_errors"] += 1
        return result.frames

    def serve_forever(self, *, deadline: float | None = None) -> None:
        """Bridge until :meth:`request_stop` (or, for tests, until ``time.monotonic()``
        passes ``deadline``).

        Frames go in ``CHUNK_BYTES`` at a time, each chunk's run ending ``RUN_IDLE`` quiet
        cycles after its input (or once it answered every request of a chunk of NIC and
        control requests): the replies then reach the kernel while later requests are
        still queued, as they would from a board, instead of all at once after a whole
        window (a window of 30 full-size NIC packets is over a second of simulation, which
        the host's transports would take for loss and resend). Short runs without input
        follow while the gateware still sends; then idle ticks (``backend.idle`` quiet
        cycles each) keep its clock going."""
        tick = MIN_TICK
        busy = False          # the last run had input or output: the gateware may have more
        pending: list[bytes] = []
        fds = [self.tap.fileno(), self._wake_r]
        while not self._stop.is_set():
            if deadline is not None and time.monotonic() > deadline:
                break
            ready, _, _ = select.select(fds, [], [], 0 if pending or busy else tick)
            if self._wake_r in ready:
                try:
                    os.read(self._wake_r, 64)
                except OSError:
                    pass
                continue
            if ready:
                pending += self.tap.read_frames(max(1, MAX_PENDING - len(pending)))
            if pending:
                size, count = len(pending[0]), 1
                while count < len(pending) and size + len(pending[count]) <= CHUNK_BYTES:
                    size += len(pending[count])
                    count += 1
                chunk, pending = pending[:count], pending[count:]
                self.step(chunk, idle=RUN_IDLE)
                busy, tick = True, MIN_TICK
            elif busy:
                # drain in short runs too, so that new frames from the kernel go in soon;
                # a silence inside the gateware longer than RUN_IDLE only delays its next
                # frames to the idle tick after
                busy = bool(self.step(idle=RUN_IDLE))
            else:
                # a quiet wire: run the gateware on its own, so that its timers progress
                # and what it sends unprompted (ARP) reaches the kernel; then wait longer
                sent = self.step()
                self.stats["ticks"] += 1
                busy = bool(sent)
                tick = MIN_TICK if sent else min(2 * tick, MAX_TICK)

    def close(self) -> None:
        self.request_stop()
        self.backend.close()
        self.tap.close()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._wake_r = self._wake_w = -1
