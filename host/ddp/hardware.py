"""The hardware paths of the DDP hooks: every rank's NIC, and the switch shared by the job.

:class:`host.ddp.InceptionnHook` and :class:`host.ddp.LhcHook` compute through the golden
models by default. With ``backend=`` they compute through the gateware instead, and the
training sees the gateware's bits:

``InceptionnHook(k, backend="verilator")``
    Every rank process owns a NIC: the Verilated ``nic_top`` behind the compiled harness
    (``host.driver.nic.open_nic("verilator")``, a child process of the rank), opened at the
    first bucket and closed with the hook. Every ring hop goes through the sender's NIC
    transmit path (compressor) and the receiver's NIC receive path (decompressor): the
    sender's wire packets (``INC_F32``, header and compressed payload) are what travels
    between the ranks over gloo. The owner of a finished chunk keeps what its receivers
    decode: it passes its own transmitted packets through its receive path.
``InceptionnHook(k, backend="udp", board=ADDR)``
    The same through a board's NIC over :class:`~host.driver.udp.UdpTransport` (one board
    for all ranks, or one per rank: ``board=[ADDR_0, ADDR_1, ...]``).
``LhcHook(backend="udp", board=ADDR, key=KEY)``
    The index (``AGG_OR32``, the exponent in its headers, MAX-aggregated by the switch),
    sketch and fallback rounds (``AGG_ADD_I32``) go as packets from every rank's own socket
    (:class:`~host.driver.udp_worker.UdpSwitchWorker`) to the board's switch, which sums
    them and multicasts the results back; gloo carries only what the switch does not do.
``LhcHook(backend="udp", boards=[ADDR_0, ADDR_1, ...], key=KEY)``
    The same job over ``B`` boards (``docs/protocol/network.md`` section 3): every board
    holds the job, every rank has a socket on each
    (:class:`~host.driver.striped.StripedSwitchWorker`) and sends chunk ``c`` of every round
    to board ``c mod B``; the boards aggregate at the same time and the rank puts their
    results back together, bit for bit one board's.
``LhcHook(backend="udp", tree=Tree(root, leaves, workers), key=KEY)``
    The job on a tree of aggregators (``docs/protocol/aggregator-protocol.md`` section 4,
    :mod:`host.switchml.tree`): rank ``r`` is worker :meth:`~host.switchml.tree.Tree.worker`
    of its leaf board and talks to that board alone, exactly as to one board; the leaves
    send their completed slots up to the root, and the root's results come back down. Group
    rank 0 configures every board (root first, each with its key) and releases the tree's
    jobs when the hook closes; the process group must have one rank per worker of the tree,
    whose count is also the LHC scale's ``n``.

What gloo still carries, and why:

- the preflight all-gather of every call (bucket lengths and parameters: the same clear
  error on every rank as with the golden models, before anything reaches the hardware);
- at the first bucket, the start-up agreement: every rank opens its hardware and the
  ranks exchange the outcome (and, for the switch, each rank's socket address), so that a
  backend that cannot start (no Verilator build, no board at ADDR, a wrong key) raises one
  :class:`HookBackendError` on every rank instead of a hang or a rank that computes alone;
- for the switch, its job configuration: group rank 0 alone holds the control key's
  work: it writes every rank's address into the job's worker table and commits the job
  (which clears its slots), then broadcasts the job's layout (slots, lanes); the other
  ranks wait for that broadcast, so no rank sends before the job is configured;
- the ring's messages (the NICs' wire packets, as INCEPTIONN's NICs would send them to
  each other) and, after every call on a hardware backend, one status word per rank
  (all-reduce MAX), so that a failure on one rank in the middle of a call (a harness that
  dies, a board that stops answering) is raised on every rank with the same message. A rank
  whose NIC failed keeps the ring's schedule and sends a "failed" length word instead of
  its packets, so its neighbours never wait for a message that will not come.

Nothing falls back to the golden models: a hardware failure is an error, and a hook that
failed raises the same error at every later call. Everything the hardware does is counted
per call (``CallStats.details``) and per hook (:attr:`hardware_stats`): packets and bytes
into and out of the gateware, resends, clock cycles where there is a clock, and the time
spent in the hardware path.
"""
from __future__ import annotations

import dataclasses
import os
import secrets
import struct
import time
import weakref

import numpy as np
import torch
import torch.distributed as dist

from contract.header import HEADER_BYTES, Header, PacketType
from contract.packet import Packet


__all__ = ["HookBackendError", "INCEPTIONN_BACKENDS", "LHC_BACKENDS", "NicRingCodec",
           "UdpSwitch", "RING_FAILED", "frame_packets", "unframe_packets", "check_board",
           "check_boards", "check_tree"]

#: backends of InceptionnHook and LhcHook ("golden": the NumPy models and gloo)
INCEPTIONN_BACKENDS = ("golden", "verilator", "udp")
LHC_BACKENDS = ("golden", "udp")
#: seconds of silence after which a control request at start-up is given up
_CONTROL_SECONDS = 3.0
_FRAME = struct.Struct("<I")


class _RingFailedType:
    """The ring message that stands for "the sender's NIC failed" (sent as a length word
    of -1, without bytes)."""

    def __repr__(self):
        return "RING_FAILED"


RING_FAILED = _RingFailedType()


class HookBackendError(RuntimeError):
    """A hook's hardware backend could not start or failed in a call (raised with the same
    message on every rank of the group)."""


class _PeerFailed(Exception):
    """A ring neighbour's NIC failed (it sent the failure marker instead of its packets)."""


# -- arguments -----------------------------------------------------------------------------

def check_backend(who: str, backend, choices) -> str:
    if backend not in choices:
        raise ValueError(f"{who}: backend must be one of {', '.join(map(repr, choices))}, "
                         f"not {backend!r}")
    return backend


def check_board(who: str, board, key, mtu, *, per_rank: bool, need_key: bool):
    """The board settings of a ``"udp"`` backend: a list of ``board_settings`` dicts (one,
    or one per rank where ``per_rank``), checked now, where the caller can see the error."""
    from ..driver.settings import ENV_BOARD, board_settings

    if board is None and not os.environ.get(ENV_BOARD):
        raise ValueError(f"{who}: backend 'udp' needs board=HOST[:PORT_BASE] (or "
                         f"{ENV_BOARD}): a board, or a virtual one (gradwire board serve)")
    boards = [board] if board is None or isinstance(board, str) else list(board)
    if not per_rank and len(boards) != 1:
        raise ValueError(f"{who}: one board serves the whole job, not {len(boards)}")
    if not boards:
        raise ValueError(f"{who}: board is an empty list")
    settings = []
    for one in boards:
        try:
            settings.append(board_settings(one, key=key, mtu=mtu))
        except ValueError as exc:
            raise ValueError(f"{who}: {exc}") from None
    if need_key and settings[0]["key"] is None:
        raise ValueError(f"{who}: backend 'udp' needs the board's control key (key=HEX or "
                         f"GRADWIRE_KEY) to configure the job on its switch")
    return settings


def check_boards(who: str, board, boards, key):
    """The board settings of a job over several boards (``boards=[ADDR, ...]``, the forms
    ``board=`` takes, each board with its key: ``key`` one for all, or one per board),
    checked now. Two boards at the same address and port base are one board twice."""
    if board is not None:
        raise ValueError(f"{who}: give board= (one board) or boards= (a job over several "
                         f"boards), not both")
    if isinstance(boards, str) or not hasattr(boards, "__len__") or not len(boards):
        raise ValueError(f"{who}: boards must be a non-empty list of board addresses "
                         f"HOST[:PORT_BASE], not {boards!r}")
    boards = list(boards)
    if isinstance(key, (list, tuple)):
        if len(key) != len(boards):
            raise ValueError(f"{who}: {len(key)} keys for {len(boards)} boards: give one key "
                             f"for every board, or one per board")
        keys = list(key)
    else:
        keys = [key] * len(boards)
    settings = []
    for one, one_key in zip(boards, keys):
        if not isinstance(one, str):
            raise ValueError(f"{who}: a board address is HOST[:PORT_BASE], not {one!r}")
        settings += check_board(who, one, one_key, None, per_rank=False, need_key=True)
    seen = {}
    for b, s in enumerate(settings):
        where = (s["host"], s["port_base"])
        if where in seen:
            raise ValueError(f"{who}: boards {seen[where]} and {b} are the same board "
                             f"({_where(s)}): every board of a job has its own address or "
                             f"port base")
        seen[where] = b
    return settings


def check_tree(who: str, tree, key):
    """The tree of a job over a tree of aggregators and every board's control key, checked
    now: ``(Tree, {BoardAddress: key})``.

    ``tree`` is a :class:`host.switchml.tree.Tree` or a mapping of its arguments
    (``{"root": ..., "leaves": [...], "workers": ...}``). ``key`` is one key for every
    board (an int or hex digits; default: ``GRADWIRE_KEY``), a list with one per board in
    the order of :attr:`Tree.boards <host.switchml.tree.Tree.boards>` (the root, then the
    leaves), or a mapping from a board (``"HOST:PORT_BASE"`` or a BoardAddress) to its key.
    """
    import collections.abc

    from ..driver.settings import ENV_KEY
    from ..switchml.tree import Tree, tree_keys

    if isinstance(tree, collections.abc.Mapping):
        try:
            tree = Tree(**tree)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{who}: tree: {exc}") from None
    elif not isinstance(tree, Tree):
        raise TypeError(f"{who}: tree must be a host.switchml.tree.Tree or a mapping of its "
                        f"arguments (root, leaves, workers, ...), not {type(tree).__name__}")
    if key is None:
        key = os.environ.get(ENV_KEY) or None
        if key is None:
            raise ValueError(f"{who}: a tree needs its boards' control keys (key=HEX for "
                             f"every board, one per board, or GRADWIRE_KEY) to configure "
                             f"its jobs")
    if isinstance(key, (list, tuple)):
        if len(key) != len(tree.boards):
            raise ValueError(f"{who}: {len(key)} keys for the tree's {len(tree.boards)} "
                             f"boards: give one key for every board, or one per board (the "
                             f"root first, then the leaves)")
        key = dict(zip(tree.boards, key))
    try:
        keys = tree_keys(tree, key)
    except ValueError as exc:
        raise ValueError(f"{who}: {exc}") from None
    return tree, keys


def _where(settings) -> str:
    base = settings["port_base"]
    return f"{settings['host']} ports {base}-{base + 3}"


def _describe(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if isinstance(exc, (HookBackendError, _PeerFailed)) \
        else f"{type(exc).__name__}: {text}"


# -- agreement between the ranks -------------------------------------------------------------

def _group_rank_zero(group):
    return dist.get_global_rank(group, 0) if group is not dist.group.WORLD else 0


def _joined_errors(who, what, errors, to_global) -> str | None:
    """One message naming every rank's error (identical errors named once, with their ranks),
    or None if no rank failed."""
    by_message = {}
    for r, error in enumerate(errors):
        if error is not None:
            by_message.setdefault(error, []).append(str(to_global(r)))
    if not by_message:
        return None
    parts = [f"rank{'s' if len(ranks) > 1 else ''} {', '.join(ranks)}: {message}"
             for message, ranks in by_message.items()]
    return (f"{who}: {what} ({'; '.join(parts)}); every rank of the group raises this "
            f"error")


def agree(who, what, error, group, world, to_global, *, status_first: bool):
    """Raise one :class:`HookBackendError` on every rank if any rank's ``error`` (a string
    or None) is set. With ``status_first`` a one-word all-reduce decides whether the
    messages are gathered at all (the cheap common case: nobody failed). Returns the
    control bytes this rank sent."""
    sent = 0
    if world > 1 and status_first:
        flag = torch.tensor([int(error is not None)], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        sent += 8 * (world - 1)
        if not flag.item():
            return sent
    if world > 1:
        errors = [None] * world
        dist.all_gather_object(errors, error, group=group)
    else:
        errors = [error]
    message = _joined_errors(who, what, errors, to_global)
    if message is not None:
        raise HookBackendError(message)
    return sent


class _Backend:
    """What both hardware paths share: the start-up agreement, failure, the finalizer."""

    hardware = True

    def __init__(self, who: str):
        self.who = who
        self.broken: str | None = None        # the error every later call raises
        self.failure: str | None = None       # this call's own failure on this rank
        self.startup_seconds = 0.0
        self._group_key = None

    def start(self, group, rank, world, to_global) -> None:
        """At the first call: open the hardware on every rank and agree on the outcome.
        Later calls: check it is the same group. Raises HookBackendError on every rank."""
        if self.broken is not None:
            raise HookBackendError(self.broken)
        key = (id(group), world)
        if self._group_key is not None:
            if key != self._group_key:
                raise ValueError(f"{self.who}: the hook's hardware serves the process group "
                                 f"it started with; make one hook per group")
            return
        started = time.perf_counter()
        error = None
        try:
            self._open(group, rank, world, to_global)
        except Exception as exc:              # noqa: BLE001 (every rank reports it)
            error = _describe(exc)
        try:
            agree(self.who, "the hardware backend could not start", error, group, world,
                  to_global, status_first=False)
            self._after_open(group, rank, world, to_global)
        except HookBackendError as exc:
            self.broken = str(exc)
            self.close()
            raise
        self._group_key = key
        self.startup_seconds += time.perf_counter() - started

    def _open(self, group, rank, world, to_global):
        raise NotImplementedError

    def _after_open(self, group, rank, world, to_global):
        """A second agreement step (the switch's job configuration); raises
        HookBackendError on every rank."""

    def fail(self, exc) -> None:
        if self.failure is None:
            self.failure = _describe(exc)

    @property
    def failed(self) -> bool:
        return self.failure is not None

    def finish(self, group, world, to_global) -> int:
        """After a call's data moved: raise on every rank if any rank failed. Returns the
        control bytes this rank sent."""
        failure, self.failure = self.failure, None
        try:
            return agree(self.who, "the hardware failed in this call", failure, group,
                         world, to_global, status_first=True)
        except HookBackendError as exc:
            self.broken = str(exc)
            self.close()
            raise

    def close(self) -> None:
        raise NotImplementedError


# -- the NIC of one rank (INCEPTIONN ring) ----------------------------------------------------

def frame_packets(packets) -> bytes:
    """Wire packets as one ring message: per packet a 4-byte length, then its bytes."""
    parts = []
    for p in packets:
        data = p.to_bytes()
        parts += [_FRAME.pack(len(data)), data]
    return b"".join(parts)


def unframe_packets(message: bytes) -> list:
    """The packets of a ring message (:func:`frame_packets`); ValueError if it is cut."""
    packets, at = [], 0
    view = memoryview(message)
    while at < len(view):
        if at + _FRAME.size > len(view):
            raise ValueError(f"ring message cut inside a length word at byte {at}")
        size, = _FRAME.unpack_from(view, at)
        at += _FRAME.size
        if size < HEADER_BYTES or at + size > len(view):
            raise ValueError(f"ring message holds a packet of {size} bytes at byte {at} "
                             f"(message of {len(view)} bytes)")
        packets.append(Packet.from_bytes(bytes(view[at:at + size])))
        at += size
    return packets


@dataclasses.dataclass
class NicCounts:
    """What went through one rank's NIC (this hook): per path, packets and bytes in and out."""
    tx_packets_in: int = 0
    tx_packets_out: int = 0
    rx_packets_in: int = 0
    rx_packets_out: int = 0
    tx_bytes_in: int = 0
    tx_bytes_out: int = 0
    rx_bytes_in: int = 0
    rx_bytes_out: int = 0
    seconds: float = 0.0

    def as_dict(self):
        return dataclasses.asdict(self)


class NicRingCodec(_Backend):
    """The codec of the INCEPTIONN ring through one rank's NIC (``backend`` ``"verilator"``
    or ``"udp"``): the interface :func:`host.ddp.inceptionn_ring_allreduce` calls.

    ``encode`` compresses through the transmit path and returns the ring message (the wire
    packets, framed); ``decode`` decompresses a neighbour's message through the receive
    path; ``own`` is the chunk owner's "keep what the others decode": transmit, then
    receive its own packets (which ``encode`` then sends, not compressing them again).
    After a failure on this rank (``failed``) they do nothing: ``encode`` returns
    :data:`RING_FAILED` and the ring goes on with its schedule.
    """

    def __init__(self, who: str, backend: str, settings=None):
        super().__init__(who)
        self.backend = backend
        self.settings = settings              # board settings (udp), one or one per rank
        self.transport = None
        self.nic = None
        self.counts = NicCounts()
        self.rank = 0
        self._seq = 0
        self._owned = None                    # (k, owned values, their packets)
        self._last = None                     # (last message, its payload bytes)
        self._finalizer = None

    def describe(self) -> str:
        if self.backend == "udp" and self.settings:
            return f"udp ({', '.join(_where(s) for s in self.settings)})"
        return self.backend

    def _open(self, group, rank, world, to_global):
        from ..driver.nic import NicInterface, open_nic

        self.rank = rank
        if self.backend == "verilator":
            transport = open_nic("verilator", check=False)
        else:
            settings = self.settings[rank] if len(self.settings) > 1 else self.settings[0]
            if len(self.settings) not in (1, world):
                raise ValueError(f"{len(self.settings)} boards for {world} ranks: give one "
                                 f"board, or one per rank")
            # the ranks that share one board share its reply buffers
            transport = _open_board_nic(settings, share=world if len(self.settings) == 1
                                        else 1)
        self.transport = transport
        self._finalizer = weakref.finalize(self, transport.close)
        self.nic = NicInterface(transport)

    def own(self, values, k):
        if self.failed or not values.size:
            return values
        try:
            packets = self._transmit(values, k)
            owned = self._receive(packets, values.size)
        except Exception as exc:              # noqa: BLE001 (agreed on in finish)
            self.fail(exc)
            return values
        self._owned = (k, owned.copy(), packets)
        return owned

    def encode(self, values, k):
        if self.failed:
            return RING_FAILED
        try:
            owned = self._owned
            self._owned = None
            if owned is not None and owned[0] == k and owned[1].size == values.size \
                    and np.array_equal(owned[1].view(np.uint32), values.view(np.uint32)):
                packets = owned[2]
            else:
                packets = self._transmit(values, k)
            message = frame_packets(packets)
            self._last = (message, sum(len(p.payload) for p in packets))
            return message
        except Exception as exc:              # noqa: BLE001
            self.fail(exc)
            return RING_FAILED

    def decode(self, message, n, k):
        if message is RING_FAILED:
            self.fail(_PeerFailed("its ring neighbour's NIC failed"))
        if self.failed:
            return np.zeros(n, dtype=np.float32)
        try:
            packets = unframe_packets(message)
            for p in packets:
                if p.header.type != PacketType.INC_F32 or p.header.k != k:
                    raise ValueError(f"a ring message holds {p.header} (expected INC_F32 "
                                     f"packets at k={k})")
            return self._receive(packets, n)
        except Exception as exc:              # noqa: BLE001
            self.fail(exc)
            return np.zeros(n, dtype=np.float32)

    def payload_bytes(self, message) -> int:
        """Compressed payload bytes of a ring message this codec made (its packets' headers
        and length words are framing, :meth:`framing_bytes`)."""
        if message is RING_FAILED:
            return 0
        if self._last is not None and self._last[0] is message:
            return self._last[1]
        return sum(len(p.payload) for p in unframe_packets(message))

    def framing_bytes(self, message) -> int:
        if message is RING_FAILED:
            return 0
        return len(message) - self.payload_bytes(message)

    def _transmit(self, values, k):
        started = time.perf_counter()
        try:
            self._seq = (self._seq + 1) & 0xFFFFFFFF
            packets = self.nic.transmit(np.ascontiguousarray(values, dtype=np.float32), k,
                                        worker=self.rank & 0xFF, seq=self._seq)
        finally:
            self.counts.seconds += time.perf_counter() - started
        c = self.counts
        c.tx_packets_out += len(packets)
        c.tx_packets_in += -(-values.size // self.nic.packet_values)
        c.tx_bytes_in += values.size * 4 + HEADER_BYTES * -(-values.size // self.nic.packet_values)
        c.tx_bytes_out += sum(HEADER_BYTES + len(p.payload) for p in packets)
        return packets

    def _receive(self, packets, n):
        started = time.perf_counter()
        try:
            values = self.nic.receive(packets, n)
        finally:
            self.counts.seconds += time.perf_counter() - started
        c = self.counts
        c.rx_packets_in += len(packets)
        c.rx_packets_out += len(packets)
        c.rx_bytes_in += sum(HEADER_BYTES + len(p.payload) for p in packets)
        c.rx_bytes_out += n * 4 + HEADER_BYTES * len(packets)
        return values

    def stats(self) -> dict:
        """Totals of this hook's NIC: packets and bytes per path, seconds in the NIC calls,
        and the transport's own figures (clock cycles, or datagrams and resends)."""
        out = {"backend": self.describe(), **self.counts.as_dict(),
               "startup_seconds": self.startup_seconds}
        transport = self.transport
        if transport is None:
            return out
        if hasattr(transport, "network_stats"):
            network = transport.network_stats()
            out["datagrams"] = sum(v.get("datagrams", 0) for v in network.values()
                                   if isinstance(v, dict) and "datagrams" in v)
            out["resends"] = sum(v.get("resends", 0) for v in network.values()
                                 if isinstance(v, dict) and "resends" in v)
            out["network"] = network
        else:
            for stream in ("tx", "rx"):
                s = transport.stats.get(stream)
                if s is not None:
                    out[f"{stream}_cycles"] = s.cycles
                    out[f"{stream}_busy_cycles"] = s.busy_cycles
            out["resends"] = 0
        if self.backend == "verilator" or transport.key is not None:
            # The gateware's own counters (a board's count every rank that uses it).
            out["device_counters"] = self.nic.counters()
        return out

    def totals(self) -> dict:
        """The figures every hardware path reports alike: packets and bytes into and out of
        the gateware, resends, seconds in the hardware calls."""
        c, stats = self.counts, self.stats()
        out = {"packets_in": c.tx_packets_in + c.rx_packets_in,
               "packets_out": c.tx_packets_out + c.rx_packets_out,
               "bytes_in": c.tx_bytes_in + c.rx_bytes_in,
               "bytes_out": c.tx_bytes_out + c.rx_bytes_out,
               "resends": stats.get("resends", 0), "seconds": c.seconds,
               "startup_seconds": self.startup_seconds}
        if "tx_cycles" in stats:
            # simulated clock cycles of the exchanges (idle tails included)
            out["cycles"] = stats["tx_cycles"] + stats.get("rx_cycles", 0)
        return out

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
        self.transport = self.nic = None


def _open_board_nic(settings, share=1):
    """A UdpTransport to a board's NIC, checked with one packet (and, with a key, one control
    read), each given up after about three seconds of silence. ``share`` ranks use the
    board at once: each keeps to its part of the board's reply buffers."""
    from ..driver.transport import NoReplyError
    from ..driver.udp import UdpTransport

    # Every rank's bursts (one ring hop: a window of 16 packets per rank, all at once) queue
    # at a shared board, and a reply late in a burst waits for the whole queue: with the
    # transport's usual 20 ms floor under the timeout, 4 ranks on one virtual board resent
    # 16 % of their packets for nothing (and ran 25 % slower); with 100 ms, none.
    transport = UdpTransport(settings["host"], port_base=settings["port_base"],
                             key=settings["key"], mtu=settings["mtu"], region="nic",
                             min_timeout=0.1, share=share)
    retries = transport.retries
    try:
        transport.retries = 4                 # 0.1 + 0.2 + 0.4 + 0.8 + 1 + ... about 2.5 s
        try:
            # a RAW_F32 packet without COMPRESS passes the transmit path unchanged
            transport.exchange("tx", [Packet(Header(type=PacketType.RAW_F32))])
        except NoReplyError:
            raise HookBackendError(f"no reply from the board's NIC at {_where(settings)}: is "
                                   f"it running (gradwire board serve for a virtual one), are "
                                   f"the address and port base right, and is it built with "
                                   f"its NIC?") from None
        if settings["key"] is not None:
            from contract.registers import NIC_REGISTERS
            try:
                transport.read(dict(NIC_REGISTERS["tx"].items())["packets"])
            except NoReplyError:
                raise HookBackendError(f"the board at {_where(settings)} answers on its NIC "
                                       f"port but not to control requests: the control key "
                                       f"is wrong") from None
    except BaseException:
        transport.close()
        raise
    transport.retries = retries
    return transport


# -- the switch, shared by the job (LHC) ------------------------------------------------------

class UdpSwitch(_Backend):
    """The LHC phases through a board's switch (:class:`~host.driver.udp_worker.
    UdpSwitchWorker` on every rank): the interface :func:`host.ddp.lhc_allreduce` calls.

    ``index(words, exponent)`` is phase A (OR of the index bitmap, or of the dense path's
    one non-zero word, MAX of the exponent in the packets' headers), ``add(values, name)``
    phases B and C or the dense round (wrap-around int32 SUM).
    """

    def __init__(self, who: str, settings, *, job=0, slot_base=0, slot_count=None,
                 timeout=None, group=None, tree=None, keys=None):
        from ..driver.sockets import parse_group
        from ..driver.udp_worker import DEFAULT_TIMEOUT

        super().__init__(who)
        self.backend = "udp"
        # A tree of aggregators (host.switchml.tree.Tree, with ``keys`` every board's
        # control key, host.switchml.tree.tree_keys): ``settings`` is None, the jobs, slots
        # and result groups are the tree's.
        self.tree, self.keys = tree, keys
        self.plan = None                      # a tree: this rank's TreeWorker
        self.tree_layout = None               # a tree: every board's layout
        if tree is not None:
            if settings is not None or group is not None:
                raise ValueError(f"{who}: a tree takes its boards and result groups from "
                                 f"the Tree, not from settings or group")
            settings = []
            job, slot_base, slot_count = tree.leaf_job, tree.slot_base, tree.slot_count
        # One board (a settings dict), or a job striped over several (a list of them).
        self.boards = [settings] if isinstance(settings, dict) else list(settings)
        if not self.boards and tree is None:
            raise ValueError(f"{who}: no board")
        self.settings = self.boards[0] if self.boards else None
        self.job, self.slot_base, self.slot_count = job, slot_base, slot_count
        # the job's result group ((ip, port) or None): rank 0 writes it with the worker
        # table, the layout it broadcasts carries it, and every rank joins it. Over several
        # boards, board b's results go to the group's address at port + b: each of a rank's
        # per-board workers hears its own board's results only.
        self.group = parse_group(group)
        if self.group is not None and self.group[1] + len(self.boards) - 1 > 0xFFFF:
            raise ValueError(f"{who}: the result group's ports {self.group[1]}.."
                             f"{self.group[1] + len(self.boards) - 1} (one per board) do not "
                             f"fit 16 bits")
        self.timeout = DEFAULT_TIMEOUT if timeout is None else float(timeout)
        self.worker = None
        self.layout = None
        self.layouts = None                   # several boards: each board's layout
        self._finalizer = None
        self._address_error = None

    def describe(self) -> str:
        if self.tree is not None:
            where = "" if self.plan is None else \
                f"; this rank: leaf {self.plan.leaf}, worker {self.plan.worker}"
            return f"udp ({self.tree.describe()}{where})"
        if len(self.boards) > 1:
            return (f"udp (switch of {len(self.boards)} boards: "
                    f"{'; '.join(_where(s) for s in self.boards)}, job {self.job})")
        return f"udp (switch of {_where(self.settings)}, job {self.job})"

    def _open(self, group, rank, world, to_global):
        from ..driver.udp_worker import UdpSwitchWorker

        if self.tree is not None:
            from ..switchml.tree import open_tree_worker

            # checks that the group is the whole tree (up to 32 workers per leaf)
            self.plan, self.worker = open_tree_worker(self.tree, rank, world,
                                                      timeout=self.timeout)
            self._finalizer = weakref.finalize(self, self.worker.close)
            return
        if world > 32:
            raise ValueError(f"a switch job has at most 32 workers, not {world}")
        if len(self.boards) > 1:
            self.worker = _open_striped_worker(self.boards, self.job, rank, self.timeout)
            self._finalizer = weakref.finalize(self, self.worker.close)
            return
        worker = UdpSwitchWorker(self.settings["host"], port_base=self.settings["port_base"],
                                 job=self.job, worker=rank, timeout=self.timeout)
        self.worker = worker
        self._finalizer = weakref.finalize(self, worker.close)

    def _after_open(self, group, rank, world, to_global):
        """Group rank 0 writes every rank's address into the job's worker table and commits
        the job; the others wait for its broadcast of the layout (or of its error)."""
        striped = len(self.boards) > 1
        mine = self.worker.addresses if striped else self.worker.address
        addresses = [None] * world
        if world > 1:
            dist.all_gather_object(addresses, mine, group=group)
        else:
            addresses = [mine]
        outcome = [None]
        if rank == 0:
            try:
                value = self._configure(addresses)
                # an authenticated job's key (network.md section 7) goes to the ranks over
                # the hook's own process group, never to or from the board
                outcome[0] = ("ok", (value, self._job_key(value)))
            except Exception as exc:          # noqa: BLE001 (every rank raises it)
                outcome[0] = ("error", _describe(exc))
        if world > 1:
            dist.broadcast_object_list(outcome, src=_group_rank_zero(group), group=group)
        kind, value = outcome[0]
        job_key = None
        if kind == "ok":
            value, job_key = value
            if self.tree is not None and job_key is not None:
                job_key = job_key[self.plan.leaf]        # this rank's leaf's job
        keyed = {} if job_key is None else {"job_key": job_key}
        if kind == "error":
            where = f"the {len(self.boards)} boards' switches" if striped \
                else "the tree's boards" if self.tree is not None else "the board's switch"
            raise HookBackendError(f"{self.who}: configuring job {self.job} on {where} "
                                   f"failed (rank {to_global(0)}: {value}); every rank "
                                   f"of the group raises this error")
        if striped:
            self.layouts = value
            self.layout = value[0]
        elif self.tree is not None:
            # every rank's worker takes its leaf's layout, as from one board
            self.tree_layout = value
            self.layout = value = value.worker_layout(rank)[1]
        else:
            self.layout = value
        if rank == 0:
            # The job is this hook's until it closes: then group rank 0 releases its slots
            # (after a completed call every rank has every result, so nobody needs them).
            self._finalizer.detach()
            if self.tree is not None:
                self._finalizer = weakref.finalize(self, _release_tree_jobs, self.worker,
                                                   self.tree, self.keys)
            elif striped:
                self._finalizer = weakref.finalize(self, _release_striped_job, self.worker,
                                                   self.boards, self.job)
            else:
                self._finalizer = weakref.finalize(self, _release_job, self.worker,
                                                   self.settings, self.job)
        if self.group is None and not (self.tree is not None and self.tree.groups
                                       and any(self.tree.groups)):
            self.worker.set_layout(value, **keyed)
        else:
            # joining the group may fail on one rank (no multicast on its interface):
            # every rank learns it, none waits for a worker that will not hear results
            error = None
            try:
                self.worker.set_layout(value, **keyed)
            except Exception as exc:          # noqa: BLE001 (every rank raises it)
                error = _describe(exc)
            where = f"{self.group[0]}:{self.group[1]}" if self.group is not None else \
                "(a leaf's, Tree.groups)"
            agree(self.who, f"joining job {self.job}'s result group {where} failed", error,
                  group, world, to_global, status_first=True)

    def _configure(self, addresses):
        if self.tree is not None:
            return self._configure_tree(addresses)
        if len(self.boards) > 1:
            return self._configure_boards(addresses)
        # a board with a 128-bit key that serves authenticated jobs: the job authenticated,
        # under a fresh epoch, so that no packet of an earlier configuration counts
        return self._configure_board(self.settings, addresses, self.group, epoch="auto")

    def _job_key(self, value):
        """The job key of a single board's authenticated job, or every leaf's of an
        authenticated tree (None for any other)."""
        from ..driver.udp_worker import JobLayout, job_key_for
        from ..switchml.tree import TreeLayout

        if isinstance(value, JobLayout) and value.epoch is not None:
            return job_key_for(self.settings["key"], value)
        if isinstance(value, TreeLayout) and value.root.epoch is not None:
            return tuple(value.leaf_job_key(leaf, self.keys)
                         for leaf in range(len(value.leaves)))
        return None

    def _configure_boards(self, addresses):
        """Configure the job on every board (rank r's address on board b is
        ``addresses[r][b]``), and check that they agree on lanes and slots."""
        from ..driver.striped import check_layouts

        layouts = []
        for b, settings in enumerate(self.boards):
            group = None if self.group is None else (self.group[0], self.group[1] + b)
            try:
                layouts.append(self._configure_board(settings, [a[b] for a in addresses],
                                                     group))
            except Exception as exc:          # noqa: BLE001 (named with its board)
                raise HookBackendError(f"board {b} of {len(self.boards)} "
                                       f"({_where(settings)}): {_describe(exc)}") from None
        check_layouts(layouts)
        return layouts

    def _configure_tree(self, addresses):
        """Configure every job of the tree (root first, each board with its key); a board
        that does not answer is diagnosed (not running, or a wrong key) and named."""
        from ..driver.transport import TransportError
        from ..switchml.tree import configure_tree_over_udp, release_tree

        try:
            return configure_tree_over_udp(self.tree, self.keys, addresses,
                                           epoch=self._tree_epoch())
        except Exception as exc:
            # the boards configured before the failure (the root first) hold the tree's
            # jobs: free them again (best effort)
            release_tree(self.tree, self.keys)
            if not isinstance(exc, TransportError):
                raise
            board = getattr(exc, "board", None)
            if board is None:
                raise
            role = "the root" if board == self.tree.root else \
                f"leaf {self.tree.leaves.index(board)}"
            settings = {"host": board.host, "port_base": board.port_base}
            raise HookBackendError(f"{role} of the tree: {_diagnose(settings)}") from None

    def _tree_epoch(self):
        """A fresh epoch when every board of the tree has a 128-bit key and authenticates
        jobs and upstream keys (each leaf's workers then get their leaf job's key), else
        None. A board that does not answer the probe fails as in the tree's configuration
        (named)."""
        from ..driver.transport import TransportError
        from ..driver.udp import UdpTransport
        from ..driver.udp_worker import authenticates_jobs, authenticates_trees
        from ..golden.ctrl_auth import is_authenticated
        from ..switchml.tree import tree_keys

        keys = tree_keys(self.tree, self.keys)
        if not all(is_authenticated(k) for k in keys.values()):
            return None
        for board, key in keys.items():
            job = self.tree.root_job if board == self.tree.root else self.tree.leaf_job
            with UdpTransport(board.host, port_base=board.port_base, key=key, timeout=0.1,
                              min_timeout=0.02, max_timeout=1.0, retries=4) as probe:
                try:
                    served = authenticates_jobs(probe, job) and authenticates_trees(probe)
                except TransportError as exc:
                    exc.board = board
                    raise
            if not served:
                return None
        return secrets.randbits(32)

    def _configure_board(self, s, addresses, group, epoch=None):
        from ..driver.transport import NoReplyError
        from ..driver.udp import UdpTransport
        from ..driver.udp_worker import authenticates_jobs, configure_job

        control = UdpTransport(s["host"], port_base=s["port_base"], key=s["key"], mtu=s["mtu"],
                               region="switch", timeout=0.1, min_timeout=0.02, max_timeout=1.0,
                               retries=4)
        try:
            if epoch == "auto":
                epoch = secrets.randbits(32) if authenticates_jobs(control, self.job) else None
            return configure_job(control, self.job, addresses, slot_base=self.slot_base,
                                 slot_count=self.slot_count, group=group, epoch=epoch)
        except NoReplyError:
            raise HookBackendError(_diagnose(s)) from None
        finally:
            control.close()

    def index(self, words, exponent, *, dense=False):
        # A forced dense all-reduce ORs its one "holds a non-zero" word in the same round.
        vector, e_max = self._aggregate(words, PacketType.AGG_OR32, exponent,
                                        "the non-zero flag" if dense else "the index")
        return vector, (exponent if e_max is None else e_max)

    def add(self, values, name):
        vector, _ = self._aggregate(np.asarray(values, dtype=np.int32).view(np.uint32),
                                    PacketType.AGG_ADD_I32, 0, f"the {name}")
        return vector.view(np.int32)

    def _aggregate(self, words, op, exponent, name):
        return self.worker.aggregate(words, op, exponent=exponent, name=name)

    def stats(self) -> dict:
        out = {"backend": self.describe(), "startup_seconds": self.startup_seconds}
        if self.worker is not None:
            out.update(self.worker.stats.as_dict())
            out["rto_ms"] = self.worker.rto_ms
        if self.layout is not None:
            out["layout"] = self.layout.as_dict()
        if self.tree is not None:
            out["tree"] = {"leaves": len(self.tree.leaves),
                           "total_workers": self.tree.total_workers,
                           "leaf": None if self.plan is None else self.plan.leaf,
                           "leaf_worker": None if self.plan is None else self.plan.worker}
        if len(self.boards) > 1:
            # the figures above are the boards' summed; here each board's own
            out["boards"] = len(self.boards)
            if self.worker is not None and hasattr(self.worker, "board_stats"):
                out["per_board"] = [{"board": _where(s), **w.as_dict()}
                                    for s, w in zip(self.boards, self.worker.board_stats)]
        return out

    def totals(self) -> dict:
        """As :meth:`NicRingCodec.totals`: packets into the switch and results out of it,
        one result per packet (a packet sent again after a timeout is counted in
        ``resends``, not again in ``packets_in``, as the NIC path counts its transport's
        resends; ``bytes_in`` are the bytes sent, resends included)."""
        w = self.worker.stats if self.worker is not None else None
        if w is None:
            return {"packets_in": 0, "packets_out": 0, "bytes_in": 0, "bytes_out": 0,
                    "resends": 0, "seconds": 0.0, "startup_seconds": self.startup_seconds}
        out = {"packets_in": w.packets, "packets_out": w.results,
               "bytes_in": w.bytes_out, "bytes_out": w.bytes_in, "resends": w.resends,
               "seconds": w.seconds, "startup_seconds": self.startup_seconds}
        if len(self.boards) > 1:
            # scalars only (callers sum them over ranks): the number of boards, and what
            # this rank sent each board
            out["boards"] = len(self.boards)
            for b, s in enumerate(self.worker.board_stats):
                out[f"bytes_in_board{b}"] = s.bytes_out
        return out

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()


def _release_job(worker, settings, job) -> None:
    """Close a rank's switch worker; on group rank 0 also unconfigure the job on the board
    (best effort, within about half a second: a board that is gone has nothing to free)."""
    from ..driver.switch import SwitchInterface
    from ..driver.udp import UdpTransport

    worker.close()
    try:
        control = UdpTransport(settings["host"], port_base=settings["port_base"],
                               key=settings["key"], mtu=settings["mtu"], region="switch",
                               timeout=0.05, min_timeout=0.02, max_timeout=0.2, retries=2)
        try:
            SwitchInterface(control).clear_job(job)
        finally:
            control.close()
    except Exception:                         # noqa: BLE001 (nothing to free, or no board)
        pass


def _release_tree_jobs(worker, tree, keys) -> None:
    """Close group rank 0's worker and unconfigure every job of the tree, leaves first (best
    effort, as :func:`_release_job`)."""
    from ..switchml.tree import release_tree

    worker.close()
    release_tree(tree, keys)


def _open_striped_worker(boards, job, rank, timeout):
    """Rank ``rank``'s worker of ``job`` on every board, striped (one socket per board)."""
    from ..driver.striped import StripedSwitchWorker
    from ..driver.udp_worker import UdpSwitchWorker

    workers = []
    try:
        for settings in boards:
            workers.append(UdpSwitchWorker(settings["host"], port_base=settings["port_base"],
                                           job=job, worker=rank, timeout=timeout))
    except BaseException:
        for worker in workers:
            worker.close()
        raise
    return StripedSwitchWorker(workers)


def _release_striped_job(striped, boards, job) -> None:
    """:func:`_release_job` on every board of a striped job."""
    striped.close()
    for worker, settings in zip(striped.workers, boards):
        _release_job(worker, settings, job)


def _diagnose(settings) -> str:
    """Why the board's control service is silent: a NIC port that answers means a wrong key."""
    from ..driver.transport import TransportError
    from ..driver.udp import UdpTransport

    probe = UdpTransport(settings["host"], port_base=settings["port_base"], timeout=0.2,
                         max_timeout=0.5, retries=2)
    try:
        probe.exchange("tx", [Packet(Header(type=PacketType.RAW_F32))])
    except TransportError:
        return (f"no reply from the board at {_where(settings)}: is it running (gradwire "
                f"board serve for a virtual one), and are the address and port base right?")
    finally:
        probe.close()
    return (f"the board at {_where(settings)} answers on its NIC port but not to control "
            f"requests: the control key is wrong")
