"""A tree of aggregators on a simulated network, in this process: boards and hosts
exchanging UDP datagrams on a tick clock, with seeded loss, duplication and reordering on
both levels (``docs/protocol/aggregator-protocol.md`` section 4).

:class:`TreeNetwork` holds the boards: any :class:`~host.board.backend.BoardBackend`, one
per :class:`~host.switchml.tree.BoardAddress` (the golden board by default,
:meth:`TreeNetwork.golden`; a Verilated one plugs in the same way, through
``board_factory``). Everything goes through the boards' network side as on a real wire:
each board is configured with ``CTRL`` datagrams (:class:`~host.board.control.BackendControl`
and :func:`~host.switchml.tree.configure_tree`), every worker sends ``AGG_*`` datagrams from
its own address to its leaf's switch port, each leaf sends its completed slots to the root's
switch port and the root's results come back to it, from the addresses the boards'
worker tables and upstream registers name. The network only carries datagrams: it
delivers a datagram to the board or host whose address it names (to every member of a
leaf's result group for a datagram to the group), after the hop's latency and its faults.

The hosts are :mod:`host.switchml.network`'s simulated workers (one
:class:`~host.switchml.window.SwitchWorkerWindow` per phase: chunks over the leaf job's
slots, one outstanding packet per slot, resends on a timeout, results matched by ``seq``),
unchanged: they talk to their leaf alone, and their timeouts drive every recovery, the
upstream level's included (no board keeps a timer).

**Faults** (:class:`TreeFaults`): one :class:`~host.switchml.network.TickFaults` for the
workers' links to their leaves and one for the leaves' links to the root, each losing,
duplicating and delaying every transmission, and each keeping the window order SwitchML
needs on the way up (every copy of a sender's packet for a slot arrives before that
sender's next-round packet on the slot; a leaf is a worker of the root). A tree needs one
more rule of its network, on the way down: **every copy of a parent's result for (slot,
v) reaches the leaf before the leaf's next round on (slot, v) is complete.** The leaf's
engine does not compare a result's ``seq`` with the round it waits for, so a copy two
rounds late would be taken as the result of the later round. With base latencies ``Lw``
(worker links) and ``Lu`` (upstream links) and the upstream links' largest extra delay
``Du``, a round trip of the workers bounds every late copy when ``Du < 2 Lw``
(:func:`tree_faults` keeps to it); the run raises :class:`~host.switchml.window.ProtocolError`
if a leaf ever passes on a result of another round than the one it sent up.

Counted per level (:class:`LevelStats`): datagrams up and down, first transmissions and
resends (a worker's after its timeout; a leaf's aggregate sent up again on a worker's
resend), results multicast and unicast, and what the faults did.

Entry points: :func:`run_trees` (worker protocols on one or more configured trees at
once), :func:`allreduce_tree` (the LHC all-reduce of one tensor per worker, bit for bit
:func:`host.golden.lhc.allreduce` over every worker), :class:`TreeSwitch` (several
all-reduces at once, one tree job each, the interface the end-to-end simulation trains
through).
"""
from __future__ import annotations

import collections
import dataclasses
import heapq
import ipaddress
import itertools
from typing import Callable, Mapping, Sequence

import numpy as np

from contract.header import HEADER_BYTES, WORKER_MULTICAST, Flags, Header
from contract.network import DEFAULT_MAC, SERVICE_OFFSETS, Service, is_multicast
from contract.packet import Packet
from contract.registers import SWITCH_REGISTERS, decode_switch_params

from ..golden import lhc
from host.board.backend import Datagram

from .network import PacketStats, TickFaults, _SimulatedWorker, lhc_protocol
from .tree import BoardAddress, Tree, TreeLayout, configure_tree
from .window import ProtocolError

__all__ = ["TreeNetwork", "TreeFaults", "tree_faults", "TreeJob", "LevelStats", "TreeStats",
           "run_trees", "allreduce_tree", "TreeSwitch", "worker_address", "DEFAULT_TIMEOUT",
           "LEVELS"]

#: Ticks a worker waits for a result before resending: above a round trip through both
#: levels with :func:`tree_faults`'s latencies and delays (4 hops, at most 28 ticks).
DEFAULT_TIMEOUT = 40
#: The levels counted: worker links (hosts and leaves), upstream links (leaves and root).
LEVELS = ("workers", "upstream")
#: The key boards are built with (no control packet leaves this process).
_KEY = 0x6772616477697265
_UP, _TIMEOUT = 0, 1
_SWITCH = SERVICE_OFFSETS[Service.SWITCH]


def worker_address(tree_index: int, leaf: int, worker: int, job: int) -> tuple[str, int]:
    """Where the simulated worker ``worker`` of leaf ``leaf`` of the ``tree_index``-th tree
    of a run receives: a host address of its own (10.x.y.z) and a port per job."""
    host = 10 << 24 | (64 + tree_index % 64) << 16 | leaf << 8 | worker + 1
    return str(ipaddress.IPv4Address(host)), 40000 + job


@dataclasses.dataclass
class TreeFaults:
    """The fault models of a tree's two levels: ``workers`` for the hosts' links to their
    leaves, ``upstream`` for the leaves' links to the root (None: no faults there, base
    latency 1).

    ``script`` (optional) sees every transmission after the fault models and decides what
    arrives: ``script(hop, (src, dst, payload), now, copies) -> copies``, ``hop`` one of
    ``"worker_up"`` (a worker to its leaf), ``"worker_down"`` (a leaf to a worker),
    ``"upstream_up"`` (a leaf to the root), ``"upstream_down"`` (the root to a leaf),
    ``copies`` a list of ``(tick, (src, dst, payload))``: return fewer to lose one, more to
    duplicate one or put a forged datagram on the wire, later ticks to delay one (a copy
    never arrives before the next tick). Targeted tests use it."""
    workers: TickFaults | None = None
    upstream: TickFaults | None = None
    script: Callable | None = None

    def __post_init__(self):
        self.workers = self.workers if self.workers is not None else TickFaults()
        self.upstream = self.upstream if self.upstream is not None else TickFaults()
        if self.upstream.max_delay * bool(self.upstream.reorder) >= 2 * self.workers.latency:
            raise ValueError(
                f"the upstream links' largest extra delay ({self.upstream.max_delay} ticks) "
                f"must stay below two worker-link latencies ({2 * self.workers.latency}): a "
                f"parent's result later than that could reach a leaf that waits for the "
                f"next round of its slot (module docstring)")


def tree_faults(rate: float, seed: int = 0) -> TreeFaults:
    """Loss, duplication and reordering, each with probability ``rate``, on both levels
    (seeds ``seed`` and ``seed + 1``): worker links of latency 2 and extra delays up to 8
    ticks, upstream links of latency 1 and extra delays up to 3 (below two worker-link
    latencies: the rule of the module docstring)."""
    return TreeFaults(
        workers=TickFaults(seed, loss=rate, dup=rate, reorder=rate, max_delay=8, latency=2),
        upstream=TickFaults(seed + 1, loss=rate, dup=rate, reorder=rate, max_delay=3,
                            latency=1))


@dataclasses.dataclass
class LevelStats:
    """What crossed one level's links (both directions), counted by the network."""
    datagrams_up: int = 0        # workers -> leaves, or leaves -> root (copies not counted)
    first_up: int = 0            # ... of them first transmissions
    resends_up: int = 0          # ... of them sent again (timeouts; aggregates sent up again)
    datagrams_down: int = 0      # leaves -> workers, or root -> leaves
    multicast_down: int = 0      # ... of them copies of multicast results
    unicast_down: int = 0        # ... of them unicast answers to resends
    group_down: int = 0          # ... datagrams to a result group (each counted once)
    delivered: int = 0           # copies that reached a board or host
    lost: int = 0
    duplicated: int = 0
    delayed: int = 0
    held_back: int = 0

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class TreeStats:
    """A tree run: the workers' packets (:class:`~host.switchml.network.PacketStats`, every
    worker of the tree), each level's datagrams, the boards' counters, the ticks."""
    packets: PacketStats
    levels: dict
    counters: dict = dataclasses.field(default_factory=dict)   # board -> {"switch", "net"}
    ticks: int = 0

    def as_dict(self) -> dict:
        return {"packets": self.packets.as_dict(),
                "levels": {name: level.as_dict() for name, level in self.levels.items()},
                "counters": {str(board): c for board, c in self.counters.items()},
                "ticks": self.ticks}


@dataclasses.dataclass(frozen=True)
class TreeJob:
    """One configured tree and one protocol generator per worker of it (by rank), started
    at chunk ``first_chunk`` (0 after the configuration)."""
    layout: TreeLayout
    protocols: Sequence
    first_chunk: int = 0


def _golden_board(board: BoardAddress, **params):
    from host.board.golden import GoldenBoard
    return GoldenBoard(_KEY, ip=board.host, port_base=board.port_base, mac=DEFAULT_MAC,
                       **params)


class TreeNetwork:
    """Boards on an in-process network (see the module docstring).

    Parameters
    ----------
    boards : mapping of BoardAddress to BoardBackend
        Each backend's ``ip`` and ``port_base`` must be its address's (datagrams are routed
        by them).
    """

    def __init__(self, boards: Mapping[BoardAddress, object]):
        self.boards = dict(boards)
        for address, backend in self.boards.items():
            if (backend.ip, backend.port_base) != (address.host, address.port_base):
                raise ValueError(f"board {address} is built as {backend.ip}:"
                                 f"{backend.port_base}: the network routes by the address")
        self._by_ip = {address.host: address for address in self.boards}
        if len(self._by_ip) != len(self.boards):
            raise ValueError("two boards share an address: give each board its own IPv4 "
                             "address on the in-process network")

    @classmethod
    def golden(cls, trees, board_factory: Callable | None = None, **params) -> "TreeNetwork":
        """A board for every board of ``trees`` (a :class:`Tree` or several sharing
        boards), built by ``board_factory(address, **params)`` (default: the golden board,
        with ``params`` such as ``slots``, ``lanes``, ``jobs``)."""
        trees = [trees] if isinstance(trees, Tree) else list(trees)
        factory = board_factory or _golden_board
        addresses = dict.fromkeys(board for tree in trees for board in tree.boards)
        return cls({address: factory(address, **params) for address in addresses})

    def control(self, board: BoardAddress):
        """The control transport of ``board`` (region ``"switch"``)."""
        from host.board.control import BackendControl
        return BackendControl(self.boards[board], region="switch")

    def configure(self, tree: Tree, addresses) -> TreeLayout:
        """:func:`~host.switchml.tree.configure_tree` over the boards' control."""
        return configure_tree(tree, self.control, addresses)

    def counters(self, board: BoardAddress) -> dict:
        """The board's switch and network counters, read over its control port."""
        from contract.network import NET_REGISTERS, SWITCH_REGISTERS, network_address
        from host.board.control import BackendControl
        control = BackendControl(self.boards[board])
        blocks = {"switch": ("switch", SWITCH_REGISTERS["counter"]),
                  "net": ("net", NET_REGISTERS["counter"])}
        out = {}
        for name, (region, block) in blocks.items():
            items = list(block.items())
            values = control.read_many([network_address(region, a) for _, a in items],
                                       full=True)
            out[name] = dict(zip((n for n, _ in items), values))
        return out

    def board_at(self, ip: str, port: int) -> BoardAddress | None:
        """The board whose service port ``ip:port`` is, else None."""
        board = self._by_ip.get(ip)
        if board is None or not 0 <= port - board.port_base < len(SERVICE_OFFSETS):
            return None
        return board


class _Endpoint:
    """One worker of one tree job on the network: its simulated worker and where it is."""

    def __init__(self, simulated, job_index, rank, leaf, address, leaf_switch, job):
        self.simulated, self.job_index, self.rank, self.leaf = simulated, job_index, rank, leaf
        self.address, self.leaf_switch, self.job = address, leaf_switch, job


def run_trees(jobs: Sequence[TreeJob], network: TreeNetwork, *,
              faults: TreeFaults | None = None, timeout: int = DEFAULT_TIMEOUT,
              max_ticks: int = 10_000_000, addresses=None):
    """Run every worker protocol of every tree job at once on ``network``.

    Parameters
    ----------
    jobs : sequence of TreeJob
        Configured trees (their jobs on disjoint slots where they share boards) and their
        workers' protocols (:class:`~host.switchml.network.Phase` generators, as
        :func:`host.switchml.network.run_protocols` takes).
    network : TreeNetwork
    faults : TreeFaults or None
    timeout : int
        Ticks a worker waits for a result before it resends.
    addresses : sequence of sequences, optional
        Each job's worker addresses by rank, as its boards' worker tables hold them
        (default :func:`worker_address` of each).

    Returns
    -------
    list of ``(results by rank, TreeStats)``, one per job.

    Raises
    ------
    ProtocolError
        No progress (nothing in flight but unfinished workers, or ``max_ticks``), a result
        that does not answer its packet, workers of one job that disagree on phase sizes,
        or a leaf that passed on a result of another round than the one it sent up (a
        network that broke the module docstring's rule).
    """
    jobs = list(jobs)
    if int(timeout) != timeout or timeout < 1:
        raise ValueError(f"timeout must be a positive number of ticks, got {timeout!r}")
    faults = faults if faults is not None else TreeFaults()
    level_faults = {"workers": faults.workers, "upstream": faults.upstream}
    before = {name: (f.lost, f.duplicated, f.delayed, f.held_back)
              for name, f in level_faults.items()}
    levels = [{name: LevelStats() for name in LEVELS} for _ in jobs]
    packet_stats = []
    endpoints: dict[tuple[str, int], _Endpoint] = {}
    by_job = []
    groups = collections.defaultdict(list)        # (ip, port) -> endpoints of that group
    root_of_board = {}                            # (board, root job) -> job index
    for j, job in enumerate(jobs):
        tree, layout = job.layout.tree, job.layout
        if len(job.protocols) != tree.total_workers:
            raise ValueError(f"tree job {j}: {len(job.protocols)} protocols for "
                             f"{tree.total_workers} workers")
        lanes = layout.root.lanes
        stats = PacketStats(workers=tree.total_workers, lanes=lanes,
                            slot_count=layout.root.slot_count)
        leaf_stats = [PacketStats() for _ in tree.leaves]
        packet_stats.append((stats, leaf_stats))
        job_addresses = addresses[j] if addresses is not None else \
            [worker_address(j, tree.worker(r).leaf, tree.worker(r).worker, tree.leaf_job)
             for r in range(tree.total_workers)]
        mine = []
        for rank, protocol in enumerate(job.protocols):
            plan = tree.worker(rank)
            leaf_layout = layout.leaves[plan.leaf]
            simulated = _SimulatedWorker(
                plan.worker, iter(protocol), job=tree.leaf_job,
                slot_base=leaf_layout.slot_base, slot_count=leaf_layout.slot_count,
                lanes=leaf_layout.lanes, first_chunk=job.first_chunk,
                stats=leaf_stats[plan.leaf])
            address = tuple(job_addresses[rank])
            if address in endpoints:
                raise ValueError(f"two workers at {address[0]}:{address[1]}")
            endpoint = _Endpoint(simulated, j, rank, plan.leaf, address,
                                 plan.board.switch_address, tree.leaf_job)
            endpoints[address] = endpoint
            mine.append(endpoint)
            if leaf_layout.group is not None:
                groups[tuple(leaf_layout.group)].append(endpoint)
        by_job.append(mine)
        root_of_board[(tree.root, tree.root_job)] = j

    events = []
    order = itertools.count()
    finished = [None] * len(jobs)
    seen_up = set()                  # (board, job, slot, version, seq) sent up once
    pending = {}                     # (board, job, slot, version) -> seq last sent up
    unrouted = collections.Counter()

    def schedule(times, datagram, level, hop, now):
        copies = [(t, datagram) for t in times]
        if faults.script is not None:
            copies = faults.script(hop, datagram, now, copies)
        for t, copy in copies:
            heapq.heappush(events, (max(t, now + 1), next(order), _UP, (*copy, level)))

    def from_worker(endpoint, packet, now, attempt):
        h = packet.header
        j = endpoint.job_index
        level = levels[j]["workers"]
        level.datagrams_up += 1
        if attempt:
            level.resends_up += 1
        else:
            level.first_up += 1
        datagram = (endpoint.address, endpoint.leaf_switch, packet.to_bytes())
        f = faults.workers
        # a worker's rounds on a slot keep their order on the way up (the window rule)
        key = ("worker", endpoint.leaf_switch, h.job, h.worker, h.slot)
        schedule(f.hold_in_window_order(key, h.seq, f.arrivals(now)), datagram, level,
                 "worker_up", now)
        heapq.heappush(events, (now + timeout, next(order), _TIMEOUT,
                                (endpoint.address, h.seq, attempt)))

    def send_new(endpoint, packets, now):
        for packet in packets:
            packet_stats[endpoint.job_index][0].packets_sent += 1
            from_worker(endpoint, packet, now, 0)

    def from_board(board, src_port, dst, payload, now):
        """A datagram a board sent: classify it by level, check the rule, put it on the
        wire (to a board, a worker, or every member of a group)."""
        src = (board.host, src_port)
        header = Header.parse(payload) if len(payload) >= HEADER_BYTES else None
        target = network.board_at(*dst)
        if target is not None:                       # board to board: the upstream level
            f = faults.upstream
            if header is not None and not header.flags & Flags.RESULT:
                # a leaf's aggregate, to the root's job
                j = root_of_board.get((target, header.job))
                level = levels[j]["upstream"] if j is not None else None
                key = (board, header.job, header.slot, header.slot_version, header.seq)
                if level is not None:
                    level.datagrams_up += 1
                    if key in seen_up:
                        level.resends_up += 1
                    else:
                        level.first_up += 1
                seen_up.add(key)
                pending[key[:4]] = header.seq
                # a leaf is a worker of the root: its rounds on a slot keep their order
                times = f.hold_in_window_order(("leaf", dst, header.job, header.worker,
                                                header.slot), header.seq, f.arrivals(now))
                hop = "upstream_up"
            else:
                # the root's result, to a leaf
                j = root_of_board.get((board, header.job)) if header is not None else None
                level = levels[j]["upstream"] if j is not None else None
                if level is not None:
                    level.datagrams_down += 1
                    if header.worker == WORKER_MULTICAST:
                        level.multicast_down += 1
                    else:
                        level.unicast_down += 1
                times = f.arrivals(now)
                hop = "upstream_down"
            schedule(times, (src, dst, payload), level, hop, now)
            return
        # to hosts: a leaf's results (or anything else a board sends a host)
        members = groups.get(dst) if is_multicast(dst[0]) else None
        receivers = members if members is not None else \
            [endpoints[dst]] if dst in endpoints else []
        if not receivers:
            unrouted[dst] += 1
            return
        j = receivers[0].job_index
        level = levels[j]["workers"]
        level.datagrams_down += 1
        if header is not None and header.flags & Flags.RESULT:
            if header.worker == WORKER_MULTICAST:
                level.multicast_down += 1
                seq = pending.get((board, header.job, header.slot, header.slot_version))
                if seq is not None and seq != header.seq:
                    raise ProtocolError(
                        f"board {board} passed on the result of round seq {header.seq} of "
                        f"job {header.job} slot {header.slot} version {header.slot_version} "
                        f"while it waited for round {seq}: a result from upstream arrived "
                        f"two rounds late (the network broke the tree's rule; "
                        f"aggregator-protocol.md section 4)")
            else:
                level.unicast_down += 1
        if members is not None:
            level.group_down += 1
        for receiver in receivers:
            # the network's switch copies a group datagram to every member
            schedule(faults.workers.arrivals(now), (src, receiver.address, payload), level,
                     "worker_down", now)

    def deliver_to_worker(endpoint, src, payload, now):
        if src != endpoint.leaf_switch or len(payload) < HEADER_BYTES:
            return                                      # foreign (a UdpSwitchWorker's rule)
        packet = Packet.from_bytes(payload)
        h = packet.header
        if not (h.flags & Flags.RESULT and h.job == endpoint.job):
            return
        stats = packet_stats[endpoint.job_index][0]
        accepted, following = endpoint.simulated.on_result(packet)
        if accepted:
            stats.results_accepted += 1
        else:
            stats.results_ignored += 1
        send_new(endpoint, following, now)

    for mine in by_job:
        for endpoint in mine:
            send_new(endpoint, endpoint.simulated.start(), 0)
    now = 0

    def note_finished():
        for j, mine in enumerate(by_job):
            if finished[j] is None and all(e.simulated.finished for e in mine):
                finished[j] = now

    note_finished()
    while not all(e.simulated.finished for mine in by_job for e in mine):
        if not events:
            raise ProtocolError("deadlock: nothing in flight but workers unfinished")
        now = events[0][0]
        if now > max_ticks:
            waiting = {(e.job_index, e.rank): sorted(e.simulated.outstanding)[:5]
                       for mine in by_job for e in mine if e.simulated.outstanding}
            raise ProtocolError(f"no completion after {max_ticks} ticks; outstanding chunks "
                                f"(first few per job and rank): {dict(list(waiting.items())[:8])}")
        to_boards = collections.defaultdict(list)
        to_hosts, timeouts = [], []
        while events and events[0][0] == now:
            _, _, kind, item = heapq.heappop(events)
            if kind == _TIMEOUT:
                timeouts.append(item)
                continue
            src, dst, payload, level = item
            if level is not None:
                level.delivered += 1
            board = network.board_at(*dst)
            if board is not None:
                to_boards[board].append((src, dst, payload))
            else:
                to_hosts.append((src, dst, payload))
        for board, batch in to_boards.items():
            backend = network.boards[board]
            outputs = backend.deliver([Datagram(s[0], s[1], d[0], d[1], p)
                                       for s, d, p in batch]) + backend.poll()
            for out in outputs:
                from_board(board, out.src_port, (out.dst_ip, out.dst_port), out.payload, now)
        for src, dst, payload in to_hosts:
            endpoint = endpoints.get(dst)
            if endpoint is not None:
                deliver_to_worker(endpoint, src, payload, now)
        for address, seq, attempt in timeouts:
            endpoint = endpoints[address]
            packet = endpoint.simulated.resend(seq, attempt)
            if packet is not None:
                packet_stats[endpoint.job_index][0].resends += 1
                from_worker(endpoint, packet, now, attempt + 1)
        note_finished()

    out = []
    for j, (job, mine) in enumerate(zip(jobs, by_job)):
        logs = {tuple(e.simulated.phase_log) for e in mine}
        if len(logs) != 1:
            raise ProtocolError(f"tree job {j}: workers disagree on phase sizes: "
                                f"{sorted(logs)}")
        stats, leaf_stats = packet_stats[j]
        stats.chunks = dict(leaf_stats[0].chunks)
        stats.ticks = finished[j] if finished[j] is not None else now
        stats.next_chunk = mine[0].simulated.next_chunk
        stats.wire_bytes_per_worker = {name: chunks * (HEADER_BYTES + 4 * stats.lanes)
                                       for name, chunks in stats.chunks.items()}
        for name, f in level_faults.items():
            # the fault models may serve several jobs: each job's stats show the run's
            lost, dup, delayed, held = (now_value - then for now_value, then in zip(
                (f.lost, f.duplicated, f.delayed, f.held_back), before[name]))
            level = levels[j][name]
            level.lost, level.duplicated, level.delayed, level.held_back = \
                lost, dup, delayed, held
        stats.lost = sum(levels[j][name].lost for name in LEVELS)
        stats.duplicated = sum(levels[j][name].duplicated for name in LEVELS)
        stats.delayed = sum(levels[j][name].delayed for name in LEVELS)
        stats.held_back = sum(levels[j][name].held_back for name in LEVELS)
        tree = job.layout.tree
        counters = {board: network.counters(board) for board in tree.boards}
        out.append(([e.simulated.result for e in mine],
                    TreeStats(packets=stats, levels=levels[j], counters=counters,
                              ticks=stats.ticks)))
    if unrouted:
        raise ProtocolError(f"boards sent datagrams to addresses nobody has: "
                            f"{dict(unrouted)}")
    return out


def allreduce_tree(tensors, network: TreeNetwork, layout: TreeLayout, *,
                   path: str = "sketch", load: float = lhc.DEFAULT_LOAD, r_min: int = 1,
                   faults: TreeFaults | None = None, timeout: int = DEFAULT_TIMEOUT,
                   first_chunk: int = 0, max_ticks: int = 10_000_000):
    """LHC all-reduce of ``tensors`` (one per worker of the configured tree, by rank).

    Every worker quantises with the scale of the whole tree's worker count (the sum is over
    all of them), so the result is bit for bit :func:`host.golden.lhc.allreduce` of every
    tensor, as one aggregator of all the workers would give.

    Returns
    -------
    result : numpy.ndarray of float32
    stats : dict
        ``{"lhc": LhcStats, "packets": PacketStats, "tree": TreeStats}``.
    """
    from .network import _agreed_result, _lhc_workers
    tree = layout.tree
    tensors = list(tensors)
    if len(tensors) != tree.total_workers:
        raise ValueError(f"{len(tensors)} tensors for a tree of {tree.total_workers} workers")
    workers = _lhc_workers(tensors, load=load, r_min=r_min, path=path)
    ((results, stats),) = run_trees(
        [TreeJob(layout, [lhc_protocol(w) for w in workers], first_chunk)], network,
        faults=faults, timeout=timeout, max_ticks=max_ticks)
    result, parts = _agreed_result(results, stats.packets)
    parts["tree"] = stats
    return result, parts


class TreeSwitch:
    """Several LHC all-reduces at once through one tree shape, each its own tree job: the
    ``allreduce_jobs`` of :class:`~host.driver.switch.SwitchInterface` for the end-to-end
    simulation (``sim/e2e.py``), over a :class:`TreeNetwork`.

    Parameters
    ----------
    network : TreeNetwork
    root : BoardAddress
    leaves : sequence of BoardAddress
    workers : int
        Workers per leaf.
    faults : TreeFaults or None
    timeout : int
    max_ticks : int
        A call that has not finished by then raises ProtocolError.

    Each call configures its jobs afresh (job ``j`` on the root and on every leaf, the pool
    split evenly between the jobs, consecutive from slot 0) and runs them all at once.
    """

    def __init__(self, network: TreeNetwork, root, leaves, workers: int, *,
                 faults: TreeFaults | None = None, timeout: int = DEFAULT_TIMEOUT,
                 max_ticks: int = 10_000_000):
        self.network = network
        self.root, self.leaves, self.workers = root, tuple(leaves), workers
        self.faults, self.timeout, self.max_ticks = faults, timeout, max_ticks
        self.slots = min(decode_switch_params(network.control(b).read(
            SWITCH_REGISTERS["params"].address))["slots"] for b in (root, *self.leaves))
        #: per call: each job's TreeStats
        self.calls: list = []

    def allreduce_jobs(self, tensor_sets, *, path="sketch", **options):
        """One LHC all-reduce per tensor set (one tensor per worker of the tree, by rank),
        all at once; ``[(result, flat stats)]`` in order, each result bit for bit
        :func:`host.golden.lhc.allreduce` of its set."""
        from .network import _agreed_result, _lhc_workers
        tensor_sets = [list(t) for t in tensor_sets]
        count = len(tensor_sets)
        if not 1 <= count <= self.slots:
            raise ValueError(f"{count} jobs on a pool of {self.slots} slots")
        paths = [path] * count if isinstance(path, str) else list(path)
        jobs, base = [], 0
        for j, tensors in enumerate(tensor_sets):
            slot_count = self.slots // count + (j < self.slots % count)
            tree = Tree(self.root, self.leaves, self.workers, root_job=j, leaf_job=j,
                        slot_base=base, slot_count=slot_count)
            base += slot_count
            addresses = [worker_address(j, tree.worker(r).leaf, tree.worker(r).worker, j)
                         for r in range(tree.total_workers)]
            layout = self.network.configure(tree, addresses)
            workers = _lhc_workers(tensors, load=options.get("load", lhc.DEFAULT_LOAD),
                                   r_min=options.get("r_min", 1), path=paths[j])
            jobs.append(TreeJob(layout, [lhc_protocol(w) for w in workers]))
        runs = run_trees(jobs, self.network, faults=self.faults, timeout=self.timeout,
                         max_ticks=self.max_ticks)
        out, call = [], []
        for results, stats in runs:
            result, parts = _agreed_result(results, stats.packets)
            flat = dataclasses.asdict(parts["lhc"])
            flat.update(stats.packets.as_dict())
            flat["results_unicast"] = stats.levels["workers"].unicast_down
            for name, level in stats.levels.items():
                flat.update({f"{name}_{key}": value for key, value in level.as_dict().items()})
            out.append((result, flat))
            call.append(stats)
        self.calls.append(call)
        return out
