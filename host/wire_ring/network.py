"""The ring through NICs in the wire: N hosts, N wire boards, one learning switch, one
simulated clock.

Topology (``docs/protocol/network.md`` section 6)::

    host r --host link r-- board r (GoldenWire) port 0 | port 1 --network link r-- switch port r

Every host (:class:`~host.wire_ring.host.RingHost`) sends its ring chunks as ``RAW_F32``
gradient datagrams to its right neighbour; its board compresses them, the
:class:`~host.wire_ring.switch.LearningSwitch` forwards them to the neighbour's board, which
decompresses them for the neighbour. Acks come back the same way, untouched.

**Time.** A discrete-event loop in simulated seconds, no wall clock. Each direction of each
link is a FIFO at ``rate`` bits per second with a propagation ``latency``: a frame leaves
when the link is free and its last bit arrives ``8 * len / rate + latency`` later. The
boards and the switch forward in zero time (store and forward: a frame is handed on when
its last bit is in). Events at the same time are taken in the order they were made, so a
run is a function of its inputs and seeds alone.

**Faults** (``faults``, a seeded :class:`~host.board.link_faults.WireFaults`): every frame on a
network link (board to switch, switch to board) is lost, duplicated or delayed (which
reorders it behind later frames) as that model draws; host links are clean (a host and its
board sit on one short cable). Recovery is the hosts' (:mod:`host.wire_ring.reliable`).

**Bytes.** Every frame a link carries is counted, FCS included, by link kind (host links,
network links) and by what it carries (gradient datagrams, acks, anything else): a frame
counts once on every link it crosses, so a datagram from host a to host b counts twice on
host links (a's and b's) and twice on network links. Frames flooded by the switch before it
has learnt a station count on every link they take.
"""
from __future__ import annotations

import dataclasses
import heapq
import itertools

import numpy as np

from contract.frames import (ETHERTYPE_IPV4, ETHERTYPE_OFFSET, IP_PROTO_UDP,
                             IP_PROTOCOL_OFFSET, UDP_OFFSET)
from contract.network import SIMULATION_KEY, WIRE_GRADIENT_PORT
from host.board.link_faults import WireFaults
from host.board.wire_golden import GoldenWire

from ..golden import inceptionn
from .frames import Endpoint
from .host import RingHost
from .reliable import ACK_PORT
from .switch import LearningSwitch

__all__ = ["LinkSpec", "WireRingStats", "RingStalled", "ring_addresses", "ring_over_wire",
           "golden_ring", "bits_equal", "MAX_WORKERS"]

#: hosts of one ring here: the addresses below leave room for 64, and so does the switch
MAX_WORKERS = 64
_KINDS = ("gradient", "ack", "other")
_SUBNET = "192.168.77."


class RingStalled(RuntimeError):
    """The ring did not finish within its bounds (events or simulated time)."""


@dataclasses.dataclass(frozen=True)
class LinkSpec:
    """One link's two directions: ``rate`` bits per second, ``latency`` seconds."""
    rate: float = 10e9
    latency: float = 1e-6

    def __post_init__(self):
        if not self.rate > 0 or not self.latency >= 0:
            raise ValueError(f"a link needs a positive rate and a latency >= 0, not {self}")


def ring_addresses(workers: int) -> tuple[list[Endpoint], list[Endpoint]]:
    """``(hosts, boards)``: distinct addresses on 192.168.77.0/24 for ``workers`` hosts and
    their boards. Board ``r`` has ``02:47:57:00:00:{r+1}`` and ``.{2+r}`` (board 0 has the
    spec's defaults), host ``r`` has ``02:47:57:01:00:{r}`` and ``.{100+r}``."""
    _check_workers(workers)
    boards = [Endpoint(f"02:47:57:00:00:{r + 1:02x}", f"{_SUBNET}{2 + r}") for r in range(workers)]
    hosts = [Endpoint(f"02:47:57:01:00:{r:02x}", f"{_SUBNET}{100 + r}") for r in range(workers)]
    every = hosts + boards
    assert len({e.mac for e in every}) == len({e.ip for e in every}) == 2 * workers
    return hosts, boards


def _check_workers(workers):
    if isinstance(workers, bool) or not isinstance(workers, int) \
            or not 2 <= workers <= MAX_WORKERS:
        raise ValueError(f"a ring needs 2..{MAX_WORKERS} hosts, not {workers!r}")


def _kind(frame: bytes) -> str:
    """What a frame carries, by its UDP destination port (IPv4 without options)."""
    if len(frame) >= UDP_OFFSET + 4 \
            and frame[ETHERTYPE_OFFSET:ETHERTYPE_OFFSET + 2] == ETHERTYPE_IPV4.to_bytes(2, "big") \
            and frame[IP_PROTOCOL_OFFSET] == IP_PROTO_UDP:
        port = int.from_bytes(frame[UDP_OFFSET + 2:UDP_OFFSET + 4], "big")
        if port == WIRE_GRADIENT_PORT:
            return "gradient"
        if port == ACK_PORT:
            return "ack"
    return "other"


class _Link:
    """Both directions of one link: FIFO timing, byte and frame counts, optional faults."""

    def __init__(self, spec: LinkSpec, counts: dict, faults: WireFaults | None):
        self.spec, self.counts, self.faults = spec, counts, faults
        self.free_at = [0.0, 0.0]

    def send(self, direction: int, now: float, frame: bytes) -> list[float]:
        """Arrival times at the far end of ``frame`` sent at ``now`` (none: lost)."""
        start = max(now, self.free_at[direction])
        done = start + 8 * len(frame) / self.spec.rate
        self.free_at[direction] = done
        kind = _kind(frame)
        self.counts["bytes"][kind] += len(frame)
        self.counts["frames"][kind] += 1
        arrival = done + self.spec.latency
        return self.faults.arrivals(arrival) if self.faults else [arrival]


@dataclasses.dataclass
class WireRingStats:
    """What the ring through the wire cost and did.

    ``host_link`` and ``network_link`` are ``{"bytes": {kind: n}, "frames": {kind: n}}``
    for kinds ``gradient``, ``ack``, ``other`` (module docstring). ``hosts`` sums the hosts'
    sender and receiver statistics, ``boards`` the wire boards' counters per port, ``switch``
    the switch's, ``faults`` the fault model's (None without faults).
    """
    workers: int
    values: int
    k: int
    mtu: int
    host_link: dict
    network_link: dict
    hosts: dict
    boards: dict
    switch: dict
    faults: dict | None
    simulated_seconds: float
    events: int

    @property
    def host_bytes(self) -> int:
        return sum(self.host_link["bytes"].values())

    @property
    def network_bytes(self) -> int:
        return sum(self.network_link["bytes"].values())

    @property
    def ratio(self) -> float:
        """Bytes on host links over bytes on network links (every frame)."""
        return self.host_bytes / self.network_bytes if self.network_bytes else float("nan")

    @property
    def gradient_ratio(self) -> float:
        """The same for gradient datagrams alone."""
        net = self.network_link["bytes"]["gradient"]
        return self.host_link["bytes"]["gradient"] / net if net else float("nan")

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(host_bytes=self.host_bytes, network_bytes=self.network_bytes,
                 ratio=self.ratio, gradient_ratio=self.gradient_ratio)
        return d


def ring_over_wire(tensors, k: int = 10, *, mtu: int = 1500, faults: WireFaults | None = None,
                   host_link: LinkSpec = LinkSpec(), network_link: LinkSpec = LinkSpec(),
                   timeout: float = 1e-3, max_tries: int = 16, ack_every: int = 8,
                   quantize: bool = True, max_events: int = 10_000_000,
                   max_seconds: float = 60.0):
    """INCEPTIONN's ring all-reduce of ``tensors`` by hosts behind wire boards.

    Parameters
    ----------
    tensors : list of numpy.ndarray
        One float32 tensor per host (2..64 hosts), all the same shape.
    k : int
        The codec's error bound ``2^-k``, 1..15 (the hosts' datagrams carry it).
    mtu : int
        IP MTU of every link: at most ``nic_values_for_mtu(mtu)`` values per datagram.
    faults : host.board.link_faults.WireFaults, optional
        Loss, duplication and reordering on the network links.
    host_link, network_link : LinkSpec
        Rate and latency of the two kinds of link.
    timeout, max_tries, ack_every, quantize :
        The hosts' settings (:class:`~host.wire_ring.host.RingHost`).
    max_events, max_seconds : int, float
        Bounds of the run: more events or more simulated time is a :class:`RingStalled`.

    Returns
    -------
    results : list of numpy.ndarray
        Every host's reduced tensor, in the input shape.
    stats : WireRingStats
    """
    _check_workers(len(tensors))
    workers = len(tensors)
    k = inceptionn.check_k(k)
    shape = np.shape(tensors[0])
    for r, t in enumerate(tensors):
        if np.asarray(t).dtype != np.float32 or np.shape(t) != shape:
            raise ValueError(f"host {r}: expected a float32 tensor of shape {shape}, got "
                             f"{np.asarray(t).dtype} {np.shape(t)}")
    for name, bound in (("max_events", max_events), ("max_seconds", max_seconds)):
        if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not bound > 0:
            raise ValueError(f"{name} must be positive, not {bound!r}")
    host_addresses, board_addresses = ring_addresses(workers)
    hosts = [RingHost(r, np.asarray(tensors[r]), k, workers=workers, me=host_addresses[r],
                      left=host_addresses[r - 1], right=host_addresses[(r + 1) % workers],
                      mtu=mtu, timeout=timeout, max_tries=max_tries, ack_every=ack_every,
                      quantize=quantize)
             for r in range(workers)]
    boards = [GoldenWire(SIMULATION_KEY, ip=a.ip, mac=a.mac) for a in board_addresses]
    switch = LearningSwitch(workers)
    counts = {side: {"bytes": dict.fromkeys(_KINDS, 0), "frames": dict.fromkeys(_KINDS, 0)}
              for side in ("host", "network")}
    host_links = [_Link(host_link, counts["host"], None) for _ in range(workers)]
    net_links = [_Link(network_link, counts["network"], faults) for _ in range(workers)]

    events = []                 # (time, order, target, frame); target: ("host"|"board"|
    order = itertools.count()   # "switch"|"timer", r[, port])
    timer_at = [None] * workers

    def push(times, target, frame=None):
        for t in times:
            heapq.heappush(events, (t, next(order), target, frame))

    def from_host(r, now, frames):
        for frame in frames:            # direction 0: host to board
            push(host_links[r].send(0, now, frame), ("board", r, 0), frame)
        deadline = hosts[r].next_deadline()
        if deadline is not None and (timer_at[r] is None or deadline < timer_at[r]):
            timer_at[r] = deadline
            push([deadline], ("timer", r))

    for r, h in enumerate(hosts):
        from_host(r, 0.0, h.start(0.0))
    handled = 0
    now = 0.0
    while not all(h.quiet for h in hosts):
        if not events:
            raise RingStalled("no event left and the ring is not finished")
        now, _, target, frame = heapq.heappop(events)
        handled += 1
        if handled > max_events or now > max_seconds:
            raise RingStalled(f"the ring did not finish within {max_events} events and "
                              f"{max_seconds} simulated seconds (at {handled} events, "
                              f"{now:.6f} s; hosts finished: "
                              f"{[h.finished for h in hosts]})")
        kind, r = target[0], target[1]
        if kind == "timer":
            if timer_at[r] == now:
                timer_at[r] = None
                from_host(r, now, hosts[r].on_timer(now))
        elif kind == "host":
            from_host(r, now, hosts[r].receive(frame, now))
        elif kind == "board":
            for port, out in boards[r].receive(target[2], frame):
                if port == 0:           # direction 1: board to host
                    push(host_links[r].send(1, now, out), ("host", r), out)
                else:                   # direction 0: board to switch
                    push(net_links[r].send(0, now, out), ("switch", r), out)
        else:
            for port, out in switch.receive(r, frame, now):
                push(net_links[port].send(1, now, out), ("board", port, 1), out)

    stats = WireRingStats(
        workers=workers, values=int(np.prod(shape)), k=k, mtu=mtu,
        host_link=counts["host"], network_link=counts["network"],
        hosts=_summed([{**{f"tx_{n}": v for n, v in h.sender.stats.items()},
                        **{f"rx_{n}": v for n, v in h.receiver.stats.items()},
                        **{f"frames_{n}" if n != "frames_in" else n: v
                           for n, v in h.counters.items()}} for h in hosts]),
        boards={port: _summed([b.counters[port] for b in boards]) for port in (0, 1)},
        switch=dict(switch.counters), faults=faults.stats() if faults else None,
        simulated_seconds=now, events=handled)
    return [h.acc.reshape(shape) for h in hosts], stats


def _summed(dicts) -> dict:
    out = {}
    for d in dicts:
        for name, value in d.items():
            out[name] = out.get(name, 0) + value
    return out


def golden_ring(tensors, k: int):
    """:func:`host.golden.ring.ring_allreduce` of ``tensors`` through the golden NIC: the
    results the ring through the wire must reproduce bit for bit."""
    from host.driver.models import NicModelTransport
    from host.driver.nic import NicInterface
    from host.golden.ring import ring_allreduce

    results, _ = ring_allreduce(list(tensors), NicInterface(NicModelTransport()), k)
    return results


def bits_equal(a, b) -> bool:
    """Same float32 bits (NaN payloads, signed zeros), same shape."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))
