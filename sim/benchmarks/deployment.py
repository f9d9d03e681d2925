"""The deployment, measured: an all-reduce on the network a user builds, packet by packet.

The tables of ``aggregation`` model "a link of L Gb/s per worker" (``links.py``): a switch
with a port per worker, as SwitchML's Tofino has (the ideal switch). No board of this
project is that. Here the network is what a user plugs together
(``docs/protocol/network.md`` section 3):

- ``N`` workers, each on its own 1 GbE port of one **store-and-forward Ethernet switch**:
  full duplex, one FIFO output queue per port served at line rate, a frame forwarded
  :data:`FORWARD_LATENCY_S` after its last bit has arrived, a multicast frame copied to the
  output queue of every member; each host's NIC serialises its own sends (a FIFO too);
  no frame is lost (queues are unbounded; the peak queue of the boards' ports is reported);
- ``B`` aggregator boards (ECPIX-5: one 1 GbE port each), each on one port of the switch;
  worker ``w`` sends the packets of chunk ``c`` to board ``c mod B``; each board's engine
  serves its packets one at a time in arrival order, each taking the cycles per packet
  **measured in this run** on the Verilated ``switch_top`` (the ``aggregation`` bench's
  harness path, one round of 8 workers at two sizes: the slope) at the board's engine
  clock (``links.engine_clock``); a chunk's result leaves when its last worker's packet is
  through the engine: **with a result group** as one datagram (the switch copies it to
  every worker's port), **without** as one datagram per worker, all out of the board's port;
- every datagram costs its packet bytes plus :data:`links.FRAMING_BYTES` on the wire; an
  aggregator packet (and its result) is the 32-byte header plus 64 int32 lanes;
- the **window** of ``aggregator-protocol.md`` section 3: a worker sends chunk ``c`` only
  once it holds the result of chunk ``c - S B`` (the same slot of the same board, one round
  back), ``S`` = :data:`SLOTS` per board;
- phases run one after the other (the host needs a phase's whole result before the next:
  the plan after the index, the peeling after the sketch); host work is not counted.

Methods, each an all-reduce of :data:`VALUES` float32 values per worker:

- **LHC through the aggregator** (``lhc_agg``): the index round (OR), then the sketch and
  fallback rounds (ADD) or the dense int32 round, as ``host.golden.lhc.choose_path``
  decides; the rounds' packet counts are exact, from the golden model's plan and peeling
  schedule at :data:`VALUES` values (``aggregation.phase_words``);
- **dense int32 through the aggregator** (``dense_agg``, SwitchML's): the exponent round and
  the dense round;
- **the fp32 ring** (``ring_fp32``): ``2 (N - 1)`` steps, each worker sending its chunk to
  its neighbour through the switch in 2048-value RAW_F32 packets (jumbo frames);
- **the INCEPTIONN ring through NICs in the wire** (``ring_inc_wire``, k = 10): the same
  ring, each worker behind a Versa wire board (``network.md`` section 6): host to board at
  1 GbE raw, board to switch compressed, switch to the neighbour's board compressed, board
  to host raw; the compressed size is the golden INCEPTIONN ring's wire bytes over its fp32
  bytes (headers included) on gradient-like values (``host.benchmarks.inceptionn
  .gradients``), measured in this run; the wire board's engines take one 32-byte beat per
  clock at its 62.5 MHz (``docs/measurements.md``: TX 1.000, RX 0.997 beats per clock);
- **the INCEPTIONN ring, codec in the host's NIC** (``ring_inc_nic``): what the paper
  builds and no board here is: the host's own link carries the compressed bytes;
- **LHC summed by the hosts in a ring** (``lhc_ring``): the same phases as ``lhc_agg``, each
  an int32 ring all-reduce (the index OR-merged, the sketch and fallback ADD-merged: no
  aggregator needed) in 2048-word packets.

**Method (scaling).** 2^27 values are millions of packets per worker: too many to simulate
one by one for every configuration. Every packet of an aggregator round costs the same, so
a round of ``K`` chunks is simulated exactly, packet by packet, at ``K1``, ``2 K1`` and
``3 K1`` chunks (``K1`` = :data:`STREAM_K1` or two windows, whichever is larger), a line
``T = a + b K`` is fitted through them, and rounds longer than ``3 K1`` take the line
(rounds up to ``3 K1`` chunks are simulated exactly); the largest relative deviation of a
simulated point from its line is reported (the bench fails above
:data:`LINEARITY_TOLERANCE`). A ring step is simulated the same way at :data:`RING_P1` and
twice as many packets of the step's (average) size. ``quick`` runs fewer worker counts, a
smaller vector and a small Verilator run.

Reported: per configuration the all-reduce time and the **per-worker Gb/s** (32 x values
over that time: uncompressed, as the ``aggregation`` tables), and the bytes on a board's
link per result (with a group one datagram, without ``N``).

**Two levels** (:func:`two_levels`; the one-switch rows above are untouched by it). One
aggregator serves at most 32 workers of a job, so beyond 32 workers one level is impossible
and a job needs the tree of ``aggregator-protocol.md`` section 4, on a fabric of several
switches: ``N`` = 64, 256 and 1024 workers (and 32, as two leaves of 16, beside one level)
in leaf groups of ``m`` = 32 or 16 workers, each with ``B`` leaf boards (the job's chunks
striped over them), on 48-port leaf switches with uplinks of a parameter speed
(:data:`UPLINKS`: one 10 GbE uplink per leaf switch, and one 1 GbE) to one spine switch
that holds ``R`` root boards (``R = B``: one tree per stripe; ``R = 1``: one root board for
every stripe); result groups at both levels (the section comment before
:func:`tree_layout`). The rings (fp32, INCEPTIONN, LHC summed by the hosts) run on the
same fabric, ordered by leaf switch. A tree's round is fitted as a one-level round is, from
``K1`` = :data:`TREE_K1_WINDOWS` windows (its queues settle later) and checked for
linearity the same way; every leaf switch being alike, one is simulated for all.
"""
from __future__ import annotations

import heapq
import time
from pathlib import Path

import numpy as np

from . import links

__all__ = ["run", "Link", "aggregation_stream", "ring_step", "StreamFit", "WORKERS",
           "DENSITIES", "VALUES", "SLOTS", "AGG_FRAME", "FORWARD_LATENCY_S", "boards_for",
           "tree_layout", "tree_stream", "TreeFit", "fabric_ring_step", "two_levels",
           "TREE_WORKERS", "LEAF_SIZES", "TREE_BOARDS", "UPLINKS", "MAX_JOB_WORKERS",
           "SWITCH_PORTS"]

#: Worker counts of the one-switch table (one level serves at most 32; the two-level rows,
#: :data:`TREE_WORKERS`, go beyond).
WORKERS = (2, 4, 8, 16, 32)
#: Union densities; 1.0 is a dense gradient.
DENSITIES = (0.01, 0.05, 0.3, 1.0)
VALUES = 1 << 27
GBPS = 1.0
#: Slots per board and job (the network top's aggregator: 64 slots of 64 lanes).
SLOTS = 64
LANES = 64
#: One aggregator packet on the wire: header + 64 int32 lanes + framing.
AGG_FRAME = links.HEADER_BYTES + 4 * LANES + links.FRAMING_BYTES
#: A store-and-forward switch's forwarding time after a frame's last bit (an assumption:
#: commodity 1 GbE switches state a few microseconds for a full frame, most of it the
#: frame's own serialisation, which the model counts separately).
FORWARD_LATENCY_S = 1e-6
#: The INCEPTIONN wire board (Versa, TOP=wire): engine clock and bytes per beat.
WIRE_MHZ = 62.5
BEAT_BYTES = 32
K_INCEPTIONN = 10
STREAM_K1 = 256
RING_P1 = 32
LINEARITY_TOLERANCE = 0.005
SEED = 20240227
QUICK = {"workers": (2, 4, 8), "values": 1 << 22, "engine_chunks": (8, 24),
         "gradient_values": 1 << 14}
ENGINE_CHUNKS = (64, 256)
GRADIENT_VALUES = 1 << 18


def boards_for(workers):
    """B in {1, 2, 4, N/8, N/4, N/2} (whole, at least 1, at most N), sorted."""
    return sorted({b for b in (1, 2, 4, workers // 8, workers // 4, workers // 2)
                   if 1 <= b <= workers})


# ---------------------------------------------------------------------------------------
# the packet-level model

class Link:
    """One direction of a full-duplex port: a FIFO served at line rate.

    Frames must be offered in time order (the event loop does); a frame offered at ``t``
    starts when the link is free and the returned time is when its last bit has left
    (arrived at the far end: no propagation delay on a LAN's metres)."""
    __slots__ = ("byte_s", "free", "bytes", "frames", "peak_queue")

    def __init__(self, gbps):
        self.byte_s = 8.0 / (gbps * 1e9)
        self.free = 0.0
        self.bytes = 0
        self.frames = 0
        self.peak_queue = 0.0       # bytes waiting ahead of a new frame, at most

    def send(self, t, nbytes):
        if self.free > t:
            self.peak_queue = max(self.peak_queue, (self.free - t) / self.byte_s)
            t = self.free
        self.free = t + nbytes * self.byte_s
        self.bytes += nbytes
        self.frames += 1
        return self.free


def aggregation_stream(workers, boards, chunks, *, group, engine_s, slots=SLOTS, gbps=GBPS,
                       latency_s=FORWARD_LATENCY_S, frame=AGG_FRAME, ports=1):
    """One aggregator round of ``chunks`` chunks, every worker sending every chunk, through
    one store-and-forward switch to ``boards`` boards; returns a dict: ``seconds`` (from the
    first send to the last worker holding the last result) and the boards' link counters.

    ``ports``: switch ports per board (2: a Versa serving on both, which no top does yet);
    chunk ``c`` goes to port ``c mod (B ports)``, of board ``(c mod (B ports)) div ports``,
    whose one engine serves both."""
    up = [Link(gbps) for _ in range(workers)]          # worker -> switch
    down = [Link(gbps) for _ in range(workers)]        # switch -> worker
    links_ = boards * ports
    b_in = [Link(gbps) for _ in range(links_)]         # switch -> board port
    b_out = [Link(gbps) for _ in range(links_)]        # board port -> switch
    engine_free = [0.0] * boards
    arrived = [0] * chunks
    window = slots * boards
    finish = [0.0] * workers
    received = [0] * workers
    heap, seq = [], 0
    AT_SWITCH, AT_BOARD, RESULT_AT_SWITCH, GROUP_AT_SWITCH, AT_WORKER = range(5)

    def push(t, kind, a, b):
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (t, seq, kind, a, b))

    for w in range(workers):
        for c in range(min(window, chunks)):
            push(up[w].send(0.0, frame) + latency_s, AT_SWITCH, w, c)
    while heap:
        t, _, kind, a, c = heapq.heappop(heap)
        if kind == AT_SWITCH:                       # a worker's packet, into the board's queue
            push(b_in[c % links_].send(t, frame), AT_BOARD, a, c)
        elif kind == AT_BOARD:                      # fully received: through the engine
            port = c % links_
            b = port // ports
            done = max(t, engine_free[b]) + engine_s
            engine_free[b] = done
            arrived[c] += 1
            if arrived[c] == workers:
                if group:
                    push(b_out[port].send(done, frame) + latency_s, GROUP_AT_SWITCH, 0, c)
                else:
                    for w in range(workers):
                        push(b_out[port].send(done, frame) + latency_s, RESULT_AT_SWITCH, w,
                             c)
        elif kind == GROUP_AT_SWITCH:               # the switch copies it to every member
            for w in range(workers):
                push(down[w].send(t, frame), AT_WORKER, w, c)
        elif kind == RESULT_AT_SWITCH:
            push(down[a].send(t, frame), AT_WORKER, a, c)
        else:                                       # a worker holds result c: slot free again
            finish[a] = t
            received[a] += 1
            nxt = c + window
            if nxt < chunks:
                push(up[a].send(t, frame) + latency_s, AT_SWITCH, a, nxt)
    if any(r != chunks for r in received):
        raise AssertionError("a worker is missing results")
    results = chunks
    return {"seconds": max(finish), "chunks": chunks,
            "board_in_bytes": sum(x.bytes for x in b_in),
            "board_out_bytes": sum(x.bytes for x in b_out),
            "board_out_datagrams": sum(x.frames for x in b_out),
            "board_out_bytes_per_result": sum(x.bytes for x in b_out) / results,
            "board_out_datagrams_per_result": sum(x.frames for x in b_out) / results,
            "board_in_bytes_per_chunk": sum(x.bytes for x in b_in) / results,
            "board_in_peak_queue_bytes": max(x.peak_queue for x in b_in),
            "worker_in_bytes": down[0].bytes, "worker_out_bytes": up[0].bytes}


def ring_step(workers, packets, frame, *, gbps=GBPS, latency_s=FORWARD_LATENCY_S,
              wire=None):
    """Seconds of one ring step: every worker sends ``packets`` frames of ``frame`` bytes to
    its neighbour through the switch, until the last one is received.

    ``wire``: ``(compressed_frame, engine_s)`` puts each worker behind a NIC in the wire:
    host -> board ``frame`` bytes, the board's engine ``engine_s`` per packet, board ->
    switch -> neighbour's board ``compressed_frame`` bytes, its engine, then ``frame``
    bytes to the neighbouring host."""
    n = workers
    up = [Link(gbps) for _ in range(n)]
    down = [Link(gbps) for _ in range(n)]
    heap, seq = [], 0
    last = 0.0
    if wire is None:
        for w in range(n):
            for _ in range(packets):
                seq += 1
                heapq.heappush(heap, (up[w].send(0.0, frame) + latency_s, seq, 0, w))
        while heap:
            t, _, _, w = heapq.heappop(heap)
            last = max(last, down[(w + 1) % n].send(t, frame))
        return last
    small, engine_s = wire
    h_up = [Link(gbps) for _ in range(n)]      # host -> its wire board (raw)
    h_down = [Link(gbps) for _ in range(n)]    # wire board -> host (raw)
    tx_free, rx_free = [0.0] * n, [0.0] * n
    for w in range(n):
        for _ in range(packets):
            seq += 1
            heapq.heappush(heap, (h_up[w].send(0.0, frame), seq, 0, w))
    while heap:
        t, _, kind, w = heapq.heappop(heap)
        if kind == 0:                          # at the sender's wire board: compress
            tx_free[w] = max(t, tx_free[w]) + engine_s
            seq += 1
            heapq.heappush(heap, (up[w].send(tx_free[w], small) + latency_s, seq, 1, w))
        elif kind == 1:                        # at the switch: to the neighbour's board
            r = (w + 1) % n
            seq += 1
            heapq.heappush(heap, (down[r].send(t, small), seq, 2, r))
        else:                                  # at the receiver's wire board: decompress
            rx_free[w] = max(t, rx_free[w]) + engine_s
            last = max(last, h_down[w].send(rx_free[w], frame))
    return last


class StreamFit:
    """Aggregator round times for one (N, B, group): exact up to ``3 K1`` chunks, the fitted
    line beyond (module docstring); caches every simulated round."""

    def __init__(self, workers, boards, group, engine_s, k1=None, ports=1):
        self.workers, self.boards, self.group, self.engine_s = workers, boards, group, engine_s
        self.ports = ports
        self._fit(k1 or max(STREAM_K1, 2 * SLOTS * boards))

    def _fit(self, k1):
        # the line through K1, 2 K1 and 3 K1 chunks (shared with TreeFit)
        self.k1 = k1
        self._cache = {}
        points = [(k, self.simulate(k)["seconds"]) for k in (self.k1, 2 * self.k1, 3 * self.k1)]
        x = np.array([p[0] for p in points], dtype=float)
        y = np.array([p[1] for p in points], dtype=float)
        self.b, self.a = (float(v) for v in np.polyfit(x, y, 1))
        self.deviation = float(np.max(np.abs(self.a + self.b * x - y) / y))

    def _simulate(self, chunks):
        return aggregation_stream(self.workers, self.boards, chunks, group=self.group,
                                  engine_s=self.engine_s, ports=self.ports)

    def simulate(self, chunks):
        if chunks not in self._cache:
            self._cache[chunks] = self._simulate(chunks)
        return self._cache[chunks]

    def seconds(self, chunks):
        if chunks <= 0:
            return 0.0
        if chunks <= 3 * self.k1:
            return self.simulate(chunks)["seconds"]
        return self.a + self.b * chunks


def _ring_seconds(workers, words, frame_of, wire_of=None, step=None):
    """A ring all-reduce of ``words`` 4-byte words: ``2 (N - 1)`` steps of the largest chunk
    in packets of at most :data:`links.RING_PACKET_VALUES` words; each step simulated at
    ``RING_P1`` and ``2 RING_P1`` packets of the step's average size and scaled (linear:
    every packet of a step costs the same on every link); returns seconds.

    ``step(workers, packets, frame, wire)``: one step's seconds; :func:`ring_step` (one
    switch) unless given (:func:`fabric_ring_step` through :func:`_fabric_step`)."""
    if words <= 0:
        return 0.0
    if step is None:
        def step(n, p, f, wire):
            return ring_step(n, p, f, wire=wire)
    chunk = -(-words // workers)
    packets = -(-chunk // links.RING_PACKET_VALUES)
    per_packet = chunk / packets                       # values per packet, on average
    frame = frame_of(per_packet)
    wire = wire_of(per_packet) if wire_of else None
    if packets <= 2 * RING_P1:
        seconds = step(workers, packets, frame, wire)
    else:
        t1 = step(workers, RING_P1, frame, wire)
        t2 = step(workers, 2 * RING_P1, frame, wire)
        seconds = t2 + (packets - 2 * RING_P1) * (t2 - t1) / RING_P1
    return 2 * (workers - 1) * seconds


def _raw_frame(values):
    return links.HEADER_BYTES + 4 * values + links.FRAMING_BYTES


# ---------------------------------------------------------------------------------------
# two levels: a tree of aggregators on a two-tier Ethernet fabric
#
# One aggregator serves at most 32 workers of a job (aggregator-protocol.md section 2), and
# 1024 workers do not hang off one switch. The tree of section 4 of that document, on the
# fabric a user would build for it:
#
# - ``N`` workers in ``N / m`` leaf groups of ``m`` workers; each group's job has ``B`` leaf
#   boards (one 1 GbE port each), chunk ``c`` to leaf board ``c mod B`` (network.md
#   section 3, as one level does);
# - **leaf switches** of :data:`SWITCH_PORTS` 1 GbE ports: as many whole leaf groups (their
#   workers and leaf boards) as fit beside the ``U`` uplinks; store-and-forward as the one
#   switch of the one-level model, the same :data:`FORWARD_LATENCY_S`;
# - ``U`` uplinks of ``S`` Gb/s from each leaf switch to **one spine switch**, full duplex
#   (a parameter: :data:`UPLINKS`); a flow keeps to one uplink (the hash of a link
#   aggregation): leaf board ``b`` of the switch's ``i``-th group on uplink ``(i B + b) mod
#   U``, the root's results of stripe ``b`` on ``b mod U``;
# - ``R`` **root boards** on 1 GbE ports of the spine (``R = B``: leaf board ``b`` of every
#   group has root board ``b`` as its parent, ``B`` independent trees; ``R = 1``: one root
#   board holds the ``B`` stripes' root jobs, its 64 slots split between them, so each
#   stripe has ``64 / B`` slots and the window shrinks to 64 chunks); the root boards are on
#   the spine even where one leaf switch would do;
# - a leaf board's engine serves the workers' packets and the root's results (one engine
#   time each, in arrival order); when its ``m`` workers' packets of a chunk are through,
#   it sends ONE packet (the aggregate, the size of a contribution) to its root board;
#   when the root's ``N / m`` leaves' packets are through, the root sends the result to its
#   **result group** (the stripe's leaf boards: the spine copies it once to every leaf
#   switch with a member, the leaf switch to each member), and each leaf board passes it on
#   to its own job's result group (the leaf switch copies it to the group's ``m`` workers);
# - the window: a worker sends chunk ``c`` once it holds the result of chunk
#   ``c - S' B`` (``S'`` the stripe's slots), as on one level.
#
# Every leaf switch is alike and sees the same traffic at the same times (the root's
# results reach every leaf switch at one time, the leaves' packets reach the spine at one
# time), so :func:`tree_stream` may simulate fewer leaf switches than there are and count
# each leaf packet at the spine as the packets of the switches it stands for (the tests
# check that this gives the times of the whole fabric).

#: Worker counts of the two-level rows (32: two leaves of 16, the smallest tree, beside one
#: level at the most workers one level serves).
TREE_WORKERS = (32, 64, 256, 1024)
#: Workers per leaf aggregator.
LEAF_SIZES = (32, 16)
#: Leaf boards per leaf group (the job's chunks striped over them).
TREE_BOARDS = (1, 2, 4)
#: A job's workers on one aggregator, at most (aggregator-protocol.md sections 2 and 4).
MAX_JOB_WORKERS = 32
#: Ports of a leaf switch and of the spine (the common 48-port switch).
SWITCH_PORTS = 48
#: Uplink settings, name -> (Gb/s of one uplink, uplinks per leaf switch). "10g": one 10 GbE
#: uplink, as a 48 x 1 GbE switch with SFP+ uplinks has (the realistic setting and the one
#: the tables lead with); "1g": one 1 GbE uplink, all switches 1 GbE.
UPLINKS = {"10g": (10.0, 1), "1g": (1.0, 1)}
#: Quick runs: one worker count, one uplink setting, two board counts.
QUICK_TREE = {"workers": (64,), "leaf_sizes": (32, 16), "boards": (1, 2), "uplinks": ("10g",)}


def tree_layout(workers, leaf_size, boards, roots, *, uplinks=1, ports=SWITCH_PORTS):
    """Where a two-level job's workers and boards go on the fabric, or why they cannot.

    Parameters
    ----------
    workers, leaf_size : int
        ``N`` and the workers of one leaf aggregator ``m``.
    boards, roots : int
        Leaf boards per leaf group ``B`` and root boards ``R`` (``R`` divides ``B``).
    uplinks : int
        Uplinks of each leaf switch to the spine.
    ports : int
        Ports of every switch.

    Returns
    -------
    dict
        ``leaves``, ``leaves_per_switch`` (whole leaf groups, a divisor of ``leaves``, so
        that every leaf switch is alike), ``switches``, ``leaf_switch_ports`` and
        ``spine_ports`` (in use), ``boards`` (leaf and root boards in all); or
        ``{"impossible": why}``.
    """
    if leaf_size > MAX_JOB_WORKERS:
        return {"impossible": f"a leaf serves at most {MAX_JOB_WORKERS} workers"}
    if workers % leaf_size:
        return {"impossible": f"{workers} workers are not whole leaves of {leaf_size}"}
    if roots < 1 or boards % roots:
        return {"impossible": f"{roots} root boards do not divide {boards} stripes"}
    leaves = workers // leaf_size
    if leaves < 2:
        return {"impossible": "one leaf: one level serves it"}
    if leaves > MAX_JOB_WORKERS:
        return {"impossible": f"{leaves} leaves: a root serves at most {MAX_JOB_WORKERS} "
                              f"(a third level)"}
    fit = (ports - uplinks) // (leaf_size + boards)
    per_switch = max((h for h in range(1, min(fit, leaves) + 1) if leaves % h == 0),
                     default=0)
    if per_switch == 0:
        return {"impossible": f"a leaf group does not fit a {ports}-port switch"}
    switches = leaves // per_switch
    spine = switches * uplinks + roots
    if spine > ports:
        return {"impossible": f"the spine needs {spine} ports"}
    return {"leaves": leaves, "leaves_per_switch": per_switch, "switches": switches,
            "leaf_switch_ports": per_switch * (leaf_size + boards) + uplinks,
            "spine_ports": spine, "boards": leaves * boards + roots}


def tree_stream(leaves, leaf_size, boards, chunks, *, engine_s, roots=None,
                leaves_per_switch=1, uplink_gbps=10.0, uplinks=1, simulated_switches=None,
                slots=SLOTS, gbps=GBPS, latency_s=FORWARD_LATENCY_S, frame=AGG_FRAME):
    """One aggregator round of ``chunks`` chunks through a two-level tree on the two-tier
    fabric (the section comment above), result groups at both levels.

    Parameters
    ----------
    leaves, leaf_size : int
        Leaf groups (the root's workers, at most 32) and workers per leaf group ``m``.
    boards : int
        Leaf boards per leaf group ``B``; chunk ``c`` goes to leaf board ``c mod B``.
    chunks : int
        Chunks every worker sends (each ``frame`` bytes on the wire, as its result).
    engine_s : float
        Engine seconds per packet of a leaf or root board (contribution or result).
    roots : int, optional
        Root boards ``R`` (divides ``B``; default ``B``): stripe ``b`` has root board
        ``b mod R``, whose slots the ``B / R`` stripes on it share.
    leaves_per_switch : int
        Leaf groups on one leaf switch (divides ``leaves``).
    uplink_gbps, uplinks : float, int
        Speed and number of each leaf switch's uplinks to the spine.
    simulated_switches : int, optional
        Leaf switches simulated packet by packet (divides the switch count; default all);
        each stands for ``switches / simulated_switches`` alike ones, whose packets reach
        the spine at the same times.
    slots, gbps, latency_s, frame
        Slots per board, the boards' and workers' port speed, the switches' forwarding
        time, an aggregator datagram's bytes on the wire.

    Returns
    -------
    dict
        ``seconds`` (first send to the last worker holding the last result) and per-chunk
        byte counts and peak queues of the leaf boards', the root boards' and the uplinks'
        links.

    Notes
    -----
    A board's engine only ever serves what its one port brings in, and that port is a
    FIFO: the engine's order is the port's, so an engine's time is computed when the frame
    is put on the port (no event per arrival); a board's outbound port and a worker's
    uplink are likewise only used at times that only grow (engine completions, results
    out of a FIFO port), so they are sent on at once. What is shared between boards
    (switch output queues) is sent on in event order.
    """
    roots = boards if roots is None else roots
    if boards % roots or leaves % leaves_per_switch:
        raise ValueError("roots must divide boards and leaves_per_switch leaves")
    per_switch, m = leaves_per_switch, leaf_size
    switches = leaves // per_switch
    sim = switches if simulated_switches is None else simulated_switches
    if switches % sim:
        raise ValueError("simulated_switches must divide the switches")
    replicas = switches // sim
    groups = sim * per_switch
    # R < B: the root's slots are shared by B / R stripes (their slot ranges must nest in
    # the root job's), so each stripe has fewer
    window = slots * roots // boards * boards
    w_up = [Link(gbps) for _ in range(groups * m)]          # worker -> leaf switch
    w_down = [Link(gbps) for _ in range(groups * m)]        # leaf switch -> worker
    l_in = [[Link(gbps) for _ in range(boards)] for _ in range(groups)]   # -> leaf board
    l_out = [[Link(gbps) for _ in range(boards)] for _ in range(groups)]  # leaf board ->
    l_free = [[0.0] * boards for _ in range(groups)]
    l_count = [[0] * chunks for _ in range(groups)]
    u_up = [[Link(uplink_gbps) for _ in range(uplinks)] for _ in range(sim)]  # -> spine
    u_down = [[Link(uplink_gbps) for _ in range(uplinks)] for _ in range(sim)]
    r_in = [Link(gbps) for _ in range(roots)]               # spine -> root board
    r_out = [Link(gbps) for _ in range(roots)]
    r_free = [0.0] * roots
    r_count = [0] * chunks
    finish = [0.0] * (groups * m)
    received = [0] * (groups * m)
    heap, seq = [], 0
    CONTRIB, UP_AT_LEAF_SWITCH, UP_AT_SPINE, ROOT_RESULT, AT_LEAF_SWITCH, LEAF_RESULT = range(6)

    def push(t, kind, a, c):
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (t, seq, kind, a, c))

    def leaf_engine(g, b, t):            # a frame onto leaf board (g, b)'s port at t
        done = max(l_in[g][b].send(t, frame), l_free[g][b]) + engine_s
        l_free[g][b] = done
        return done

    for w in range(groups * m):
        for c in range(min(window, chunks)):
            push(w_up[w].send(0.0, frame) + latency_s, CONTRIB, w, c)
    while heap:
        t, _, kind, a, c = heapq.heappop(heap)
        b = c % boards
        if kind == CONTRIB:                     # a worker's packet at its leaf switch
            g = a // m
            done = leaf_engine(g, b, t)
            l_count[g][c] += 1
            if l_count[g][c] == m:              # the leaf's aggregate: one packet upstream
                push(l_out[g][b].send(done, frame) + latency_s, UP_AT_LEAF_SWITCH, g, c)
        elif kind == UP_AT_LEAF_SWITCH:         # onto the leaf switch's uplink
            s, i = divmod(a, per_switch)
            push(u_up[s][(i * boards + b) % uplinks].send(t, frame) + latency_s, UP_AT_SPINE,
                 a, c)
        elif kind == UP_AT_SPINE:               # at the spine: to the stripe's root board,
            r = b % roots                       # with the same packet of each alike switch
            for _ in range(replicas):
                done = max(r_in[r].send(t, frame), r_free[r]) + engine_s
                r_free[r] = done
                r_count[c] += 1
            if r_count[c] == leaves:            # the root's result, once, to its group
                push(r_out[r].send(done, frame) + latency_s, ROOT_RESULT, r, c)
        elif kind == ROOT_RESULT:               # the spine copies it to each leaf switch
            for s in range(sim):
                push(u_down[s][b % uplinks].send(t, frame) + latency_s, AT_LEAF_SWITCH, s, c)
        elif kind == AT_LEAF_SWITCH:            # the leaf switch copies it to its members
            for g in range(a * per_switch, (a + 1) * per_switch):
                done = leaf_engine(g, b, t)     # the leaf passes it on to its job's group
                push(l_out[g][b].send(done, frame) + latency_s, LEAF_RESULT, g, c)
        else:                                   # the leaf switch copies it to the workers
            nxt = c + window
            for w in range(a * m, (a + 1) * m):
                arrived = w_down[w].send(t, frame)
                finish[w] = arrived
                received[w] += 1
                if nxt < chunks:                # the slot is free again: the next chunk
                    push(w_up[w].send(arrived, frame) + latency_s, CONTRIB, w, nxt)
    if any(r != chunks for r in received) or any(k != leaves for k in r_count):
        raise AssertionError("a worker is missing results")
    per_chunk = 1.0 / chunks
    return {
        "seconds": max(finish), "chunks": chunks, "window": window,
        # one leaf group's B boards, all R root boards, one leaf switch's uplinks
        "leaf_in_bytes_per_chunk": sum(x.bytes for x in l_in[0]) * per_chunk,
        "leaf_out_bytes_per_chunk": sum(x.bytes for x in l_out[0]) * per_chunk,
        "root_in_bytes_per_chunk": sum(x.bytes for x in r_in) * per_chunk,
        "root_out_bytes_per_chunk": sum(x.bytes for x in r_out) * per_chunk,
        "uplink_up_bytes_per_chunk": sum(x.bytes for x in u_up[0]) * per_chunk,
        "uplink_down_bytes_per_chunk": sum(x.bytes for x in u_down[0]) * per_chunk,
        "leaf_in_peak_queue_bytes": max(x.peak_queue for row in l_in for x in row),
        "root_in_peak_queue_bytes": max(x.peak_queue for x in r_in),
        "uplink_peak_queue_bytes": max(x.peak_queue for row in u_up + u_down for x in row),
        "worker_in_bytes": w_down[0].bytes, "worker_out_bytes": w_up[0].bytes}


class TreeFit(StreamFit):
    """:class:`StreamFit` for a two-level tree (:func:`tree_stream`, one leaf switch
    simulated for all alike ones): exact up to ``3 K1`` chunks, the line beyond."""

    def __init__(self, layout, leaf_size, boards, roots, engine_s, *, uplink_gbps, uplinks,
                 k1=None, simulated_switches=1):
        self.layout, self.leaf_size, self.boards, self.roots = layout, leaf_size, boards, roots
        self.engine_s, self.uplink_gbps, self.uplinks = engine_s, uplink_gbps, uplinks
        self.simulated_switches = simulated_switches
        # TREE_K1_WINDOWS windows (the window is R S chunks: B S with R = B): a tree's
        # queues settle later than one level's
        self._fit(k1 or max(STREAM_K1, TREE_K1_WINDOWS * SLOTS * roots))

    def _simulate(self, chunks):
        return tree_stream(self.layout["leaves"], self.leaf_size, self.boards, chunks,
                           engine_s=self.engine_s, roots=self.roots,
                           leaves_per_switch=self.layout["leaves_per_switch"],
                           uplink_gbps=self.uplink_gbps, uplinks=self.uplinks,
                           simulated_switches=self.simulated_switches)


def fabric_ring_step(workers, per_switch, packets, frame, *, uplink_gbps, gbps=GBPS,
                     latency_s=FORWARD_LATENCY_S, wire=None):
    """Seconds of one ring step on the two-tier fabric: :func:`ring_step`, the workers
    ``per_switch`` to a leaf switch in ring order, a step to a worker on another leaf switch
    through the sender's leaf switch, its uplink (``uplink_gbps``), the spine, the
    receiver's leaf switch's downlink and that leaf switch.

    Parameters
    ----------
    workers, per_switch : int
        Ring size and workers per leaf switch.
    packets, frame : int
        Packets each worker sends in the step and their bytes on the wire.
    uplink_gbps : float
        Speed of the uplink each crossing flow uses (one flow per uplink and direction).
    wire : tuple, optional
        ``(compressed_frame, engine_s)``: each worker behind a NIC in the wire, as in
        :func:`ring_step`; the compressed frame crosses the switches.

    Returns
    -------
    float
        Seconds until the last packet is received.

    Notes
    -----
    In a ring ordered by leaf switch every link carries one flow (a leaf switch's uplink
    only its last worker's, its downlink only its first worker's), so the step's time is
    the crossing flow's whatever the number of workers and switches, from two switches on:
    the bench simulates 2 switches of 2 workers (the tests check it against the whole
    ring).
    """
    n = workers
    switches = -(-n // per_switch)
    up = [Link(gbps) for _ in range(n)]
    down = [Link(gbps) for _ in range(n)]
    u_up = [Link(uplink_gbps) for _ in range(switches)]
    u_down = [Link(uplink_gbps) for _ in range(switches)]
    if wire is not None:
        net, engine_s = wire
        h_up = [Link(gbps) for _ in range(n)]
        h_down = [Link(gbps) for _ in range(n)]
        tx_free, rx_free = [0.0] * n, [0.0] * n
    else:
        net = frame
    # each flow's route: ("link", Link, bytes, latency after) or ("engine", frees, index)
    routes = []
    for w in range(n):
        r = (w + 1) % n
        route = []
        if wire is not None:
            route += [("link", h_up[w], frame, 0.0), ("engine", tx_free, w)]
        route.append(("link", up[w], net, latency_s))
        if w // per_switch != r // per_switch:
            route += [("link", u_up[w // per_switch], net, latency_s),
                      ("link", u_down[r // per_switch], net, latency_s)]
        route.append(("link", down[r], net, 0.0))
        if wire is not None:
            route += [("engine", rx_free, r), ("link", h_down[r], frame, 0.0)]
        routes.append(route)
    heap, seq, last = [], 0, 0.0
    for w in range(n):
        for _ in range(packets):
            seq += 1
            heapq.heappush(heap, (0.0, seq, w, 0))
    while heap:
        t, _, w, hop = heapq.heappop(heap)
        step = routes[w][hop]
        if step[0] == "link":
            t = step[1].send(t, step[2]) + step[3]
        else:
            frees, i = step[1], step[2]
            t = frees[i] = max(t, frees[i]) + engine_s
        if hop + 1 < len(routes[w]):
            seq += 1
            heapq.heappush(heap, (t, seq, w, hop + 1))
        else:
            last = max(last, t)
    return last


def _fabric_step(uplink_gbps):
    """A ring step on the fabric for :func:`_ring_seconds`: the crossing flow's time, from a
    ring of 2 leaf switches of 2 workers (:func:`fabric_ring_step`'s notes)."""
    def step(n, packets, frame, wire):
        return fabric_ring_step(4, 2, packets, frame, uplink_gbps=uplink_gbps, wire=wire)
    return step


# ---------------------------------------------------------------------------------------
# measured inputs

def measure_engine(quick):
    """Cycles per packet of the Verilated ``switch_top`` (the board's aggregator: 64 slots of
    64 lanes): one ADD round of 8 workers at two sizes, every result checked; the slope."""
    from sim.harness.transport import open_top

    from .aggregation import ADD, ENGINE, _Switch

    workers = 8
    sizes = QUICK["engine_chunks"] if quick else ENGINE_CHUNKS
    rng = np.random.default_rng(SEED)
    points = []
    with open_top("switch_top", **ENGINE.as_dict()) as transport:
        switch = _Switch(transport, workers)
        for chunks in sizes:
            words = rng.integers(0, 1 << 32, (workers, chunks * ENGINE.lanes), dtype=np.uint32)
            got, _, stats = switch.round(words, ADD)
            if not np.array_equal(got, words.sum(axis=0, dtype=np.uint32)):
                raise AssertionError("the switch's sum differs from the workers' sum")
            points.append((chunks * workers, stats["cycles"]))
    (p1, c1), (p2, c2) = points
    return {"cycles_per_packet": (c2 - c1) / (p2 - p1), "points": points,
            "workers": workers, "engine": ENGINE.as_dict()}


def measure_inceptionn(quick):
    """The golden INCEPTIONN ring's wire bytes over its fp32 bytes (headers included), k=10,
    4 workers of gradient-like values."""
    from host.benchmarks.inceptionn import gradients

    from .inceptionn_comm import _ring

    n = QUICK["gradient_values"] if quick else GRADIENT_VALUES
    grads = [gradients(n, seed=1000 + w) for w in range(4)]
    stats, _ = _ring(grads, K_INCEPTIONN)
    return {"k": K_INCEPTIONN, "values": n, "workers": 4,
            "ring_wire_vs_fp32": stats.wire_bytes / stats.raw_bytes}


def lhc_phases(values, densities, rng):
    """Per density: the LHC rounds' words (golden plan and peeling schedule) and the path."""
    from .aggregation import phase_words
    return {d: phase_words(values, d, rng) for d in densities}


# ---------------------------------------------------------------------------------------
# the section

METHODS = {
    "ring_fp32": "fp32 ring",
    "ring_inc_wire": "INCEPTIONN ring, NICs in the wire (k=10)",
    "ring_inc_nic": "INCEPTIONN ring, codec in the host's NIC (k=10; no board here)",
    "lhc_ring": "LHC summed by the hosts (ring)",
    "lhc_agg": "LHC through the aggregator",
    "dense_agg": "dense int32 through the aggregator",
}


def _agg_chunks(phase, path):
    lanes = LANES
    words = phase["words"]
    if path == "dense_agg":
        names = ("exponent", "dense")
    elif phase["chosen"] == "dense":
        names = ("index", "dense")
    else:
        names = ("index", "sketch", "fallback")
    return {name: -(-words[name] // lanes) for name in names}


def _lhc_ring_words(phase):
    words = phase["words"]
    names = ("index", "dense") if phase["chosen"] == "dense" else ("index", "sketch", "fallback")
    return {name: words[name] for name in names}


#: The tree's line is fitted from K1 = this many windows: the leaf boards' ports carry the
#: root's results too, and those join the queues one round trip late, so a tree's round
#: needs some ten windows to settle (one level's, whose ports carry no results, two); from
#: 16 windows on the line meets exact rounds of 65,536 chunks within 0.15 %.
TREE_K1_WINDOWS = 16
QUICK_TREE_K1_WINDOWS = 4


def two_levels(quick, engine_s, phases, values, small, wire_board):
    """The two-level rows: trees on the two-tier fabric against the rings on that fabric,
    and, at N = 32, against one level of boards on one switch.

    Parameters
    ----------
    quick : bool
        :data:`QUICK_TREE` instead of the full grid.
    engine_s : float
        Engine seconds per packet (measured in this run).
    phases : dict
        :func:`lhc_phases` at ``values``.
    values : int
        Values per worker.
    small, wire_board : callable
        The INCEPTIONN rings' compressed frame and the wire board's ``(frame, engine_s)`` for
        a packet of ``v`` values (``run``'s).

    Returns
    -------
    dict
        ``trees[uplink][N][m]``: the layout, or why it is impossible, and per ``B`` and
        root count (``"R=B"``, ``"R=1"``) the fit and per density the LHC and dense
        all-reduces; ``rings[uplink][N]``: the rings on the fabric (N above 32);
        ``flat[N]``: one level, or why it is impossible; ``flat_same_boards``: at N = 32,
        one level with as many boards as each tree; ``max_fit_deviation``.
    """
    started = time.perf_counter()
    grid = QUICK_TREE if quick else {"workers": TREE_WORKERS, "leaf_sizes": LEAF_SIZES,
                                     "boards": TREE_BOARDS, "uplinks": tuple(UPLINKS)}
    windows = QUICK_TREE_K1_WINDOWS if quick else TREE_K1_WINDOWS
    bits = 32 * values
    trees, rings, worst = {}, {}, 0.0

    def allreduces(fit):
        per = {}
        for d in DENSITIES:
            per[f"{d:g}"] = {}
            for method in ("lhc_agg", "dense_agg"):
                chunks = _agg_chunks(phases[d], method)
                s = sum(fit.seconds(k) for k in chunks.values())
                per[f"{d:g}"][method] = {"seconds": s, "gbps": bits / s / 1e9, "chunks": chunks}
        return per

    for name in grid["uplinks"]:
        uplink_gbps, uplinks = UPLINKS[name]
        step = _fabric_step(uplink_gbps)
        rings[name] = {}
        for n in grid["workers"]:
            if n <= MAX_JOB_WORKERS:
                continue                # one switch holds them: the one-level rows' rings
            fp32 = _ring_seconds(n, values, _raw_frame, step=step)
            inc_wire = _ring_seconds(n, values, _raw_frame, wire_board, step=step)
            inc_nic = _ring_seconds(n, values, small, step=step)
            lhc = {f"{d:g}": sum(_ring_seconds(n, w, _raw_frame, step=step)
                                 for w in _lhc_ring_words(phases[d]).values())
                   for d in DENSITIES}
            rings[name][str(n)] = {
                **{m: {"seconds": s, "gbps": bits / s / 1e9} for m, s in
                   (("ring_fp32", fp32), ("ring_inc_wire", inc_wire), ("ring_inc_nic", inc_nic))},
                "lhc_ring": {d: {"seconds": s, "gbps": bits / s / 1e9} for d, s in lhc.items()}}
        trees[name] = {}
        for n in grid["workers"]:
            trees[name][str(n)] = {}
            for m in grid["leaf_sizes"]:
                whole = tree_layout(n, m, 1, 1, uplinks=uplinks)
                if "impossible" in whole:        # whatever the boards (too many leaves)
                    trees[name][str(n)][str(m)] = {"impossible": whole["impossible"]}
                    continue
                entry = {"boards": {}}
                for b in grid["boards"]:
                    entry["boards"][str(b)] = {}
                    for r in sorted({b, 1}, reverse=True):
                        layout = tree_layout(n, m, b, r, uplinks=uplinks)
                        rk = "R=B" if r == b else "R=1"
                        if "impossible" in layout:
                            entry["boards"][str(b)][rk] = {"impossible": layout["impossible"]}
                            continue
                        fit = TreeFit(layout, m, b, r, engine_s, uplink_gbps=uplink_gbps,
                                      uplinks=uplinks, k1=max(STREAM_K1, windows * SLOTS * r))
                        if fit.deviation > LINEARITY_TOLERANCE:
                            raise AssertionError(
                                f"tree N={n} m={m} B={b} R={r} {name}: round time not linear "
                                f"in chunks ({fit.deviation:.3%})")
                        worst = max(worst, fit.deviation)
                        sample = fit.simulate(fit.k1)
                        entry["boards"][str(b)][rk] = {
                            "roots": r, "layout": layout, "densities": allreduces(fit),
                            "fit": {"a_s": fit.a, "b_s_per_chunk": fit.b, "k1": fit.k1,
                                    "max_deviation": fit.deviation,
                                    "frames_per_chunk": fit.b / (AGG_FRAME * 8 / (GBPS * 1e9))},
                            **{k: v for k, v in sample.items()
                               if k.endswith("_per_chunk") or k.endswith("peak_queue_bytes")},
                            "window": sample["window"]}
                trees[name][str(n)][str(m)] = entry
    flat = {str(n): ({"impossible": f"{n} workers: one aggregator serves at most "
                                    f"{MAX_JOB_WORKERS} of a job"}
                     if n > MAX_JOB_WORKERS else {"rows": "aggregator"})
            for n in grid["workers"]}
    # one level with as many boards as a tree of two 16-worker leaves (2 B + R): where one
    # level can serve the workers at all, it is the fair comparison
    same = {}
    first = grid["uplinks"][0]
    for n in grid["workers"]:
        for m, entry in trees[first][str(n)].items():
            if n > MAX_JOB_WORKERS or "impossible" in entry:
                continue
            for b, by_r in entry["boards"].items():
                for rk, cfg in by_r.items():
                    if "impossible" in cfg:
                        continue
                    total = cfg["layout"]["boards"]
                    fit = StreamFit(n, total, True, engine_s)
                    worst = max(worst, fit.deviation)
                    same.setdefault(str(n), {}).setdefault(m, {}).setdefault(b, {})[rk] = {
                        "boards": total, "densities": allreduces(fit)}
    # leaf boards per leaf group a tree (R = B) needs to beat LHC summed by the hosts in a
    # ring on the same fabric: an estimate, not simulated. While the leaf boards' ports bind
    # (the root's N / m aggregates per chunk are at most the leaf's m + 1 frames, and the
    # workers' own ports, one frame per chunk each way, are below (m + 1) / B) a tree's
    # time falls as 1 / B (the B = 1, 2, 4 rows: within 0.2 %), so B = ring / tree(B = 1)
    beat = {}
    for name, by_n in trees.items():
        for n, by_m in by_n.items():
            if n not in rings[name]:
                continue
            for m, entry in by_m.items():
                one = entry.get("boards", {}).get("1", {}).get("R=B", {})
                if "densities" not in one:
                    continue
                for d in DENSITIES:
                    key = f"{d:g}"
                    guess = (rings[name][n]["lhc_ring"][key]["gbps"]
                             / one["densities"][key]["lhc_agg"]["gbps"])
                    b = int(np.ceil(guess - 1e-9))
                    fits = "impossible" not in tree_layout(int(n), int(m), b, b,
                                                           uplinks=UPLINKS[name][1])
                    beat.setdefault(name, {}).setdefault(n, {}).setdefault(m, {})[key] = {
                        "estimate": guess, "boards": b, "fits": fits,
                        "root_binds": int(n) // int(m) > int(m) + 1,
                        "workers_bind": b > int(m) + 1}
    return {"grid": {k: list(v) for k, v in grid.items()}, "k1_windows": windows,
            "boards_to_beat_lhc_ring_estimate": beat,
            "switch_ports": SWITCH_PORTS, "max_job_workers": MAX_JOB_WORKERS,
            "uplinks": {k: {"gbps": g, "links": u} for k, (g, u) in UPLINKS.items()
                        if k in grid["uplinks"]},
            "trees": trees, "rings": rings, "flat": flat, "flat_same_boards": same,
            "max_fit_deviation": worst, "seconds": time.perf_counter() - started}


def _print_two_levels(tl, agg, rings1, bits):
    """The two-level tables and comparisons (``run``'s output)."""
    print(f"\ntwo levels: leaf aggregators of m workers, B leaf boards per leaf group, R root "
          f"boards (R=B: B trees; R=1: one root board for the B stripes); leaf switches of "
          f"{tl['switch_ports']} x 1 GbE ports, uplinks to one spine switch with the root "
          f"boards; result groups at both levels; per-worker Gb/s; rings: one switch up to "
          f"{tl['max_job_workers']} workers, the two-tier fabric beyond")

    def ring_gbps(name, n, method, key):
        if int(n) in rings1:                     # one switch (the one-level rows' rings)
            s = rings1[int(n)][method]
            s = s[float(key)] if method == "lhc_ring" else s
            return bits / s / 1e9
        if n not in tl["rings"][name]:
            return float("nan")
        r = tl["rings"][name][n][method]
        return r[key]["gbps"] if method == "lhc_ring" else r["gbps"]

    first = next(iter(tl["trees"]))
    for name, trees in tl["trees"].items():
        u = tl["uplinks"][name]
        print(f"\nuplinks: {u['links']} x {u['gbps']:g} GbE per leaf switch")
        for d in DENSITIES:
            key = f"{d:g}"
            print(f" density {d:g}:   N    fp32 INCwire  INCnic LHCring | LHC through a tree "
                  f"per m and B (R=B/R=1), dense int32 tree at the largest B | one level (LHC)")
            for n, by_m in trees.items():
                line = f"{n:>17} " + "".join(f"{ring_gbps(name, n, m, key):>8.3f}" for m in (
                    "ring_fp32", "ring_inc_wire", "ring_inc_nic", "lhc_ring")) + " |"
                for m, entry in by_m.items():
                    if "impossible" in entry:
                        line += f" m={m}: impossible ({entry['impossible']}) |"
                        continue
                    cells = []
                    for b, by_r in entry["boards"].items():
                        g = [by_r[rk]["densities"][key]["lhc_agg"]["gbps"]
                             if "densities" in by_r[rk] else float("nan")
                             for rk in ("R=B", "R=1") if rk in by_r]
                        cells.append(f"B={b}:" + "/".join(f"{x:.3f}" for x in g))
                    top = entry["boards"][max(entry["boards"], key=int)].get("R=B", {})
                    dense = (top["densities"][key]["dense_agg"]["gbps"] if "densities" in top
                             else float("nan"))
                    line += f" m={m}: " + " ".join(cells) + f" dense {dense:.3f} |"
                flat = tl["flat"][n]
                if "impossible" in flat:
                    line += " impossible"
                elif int(n) in agg:
                    line += " " + " ".join(
                        f"B={b}:{agg[int(n)][b][True]['densities'][d]['lhc_agg']['gbps']:.3f}"
                        for b in agg[int(n)])
                print(line)
    for n, by_m in tl["flat_same_boards"].items():
        for m, by_b in by_m.items():
            for b, by_r in by_b.items():
                for rk, cfg in by_r.items():
                    tree = tl["trees"][first][n][m]["boards"][b][rk]["densities"]
                    level = (f"; one level of B={b} boards: "
                             f"{agg[int(n)][int(b)][True]['densities'][0.01]['lhc_agg']['gbps']:.3f}"
                             f" / {agg[int(n)][int(b)][True]['densities'][0.05]['lhc_agg']['gbps']:.3f}"
                             if int(n) in agg and int(b) in agg[int(n)] else "")
                    print(f"N={n}: tree m={m} B={b} {rk} ({cfg['boards']} boards), LHC Gb/s at "
                          f"1 % / 5 %: {tree['0.01']['lhc_agg']['gbps']:.3f} / "
                          f"{tree['0.05']['lhc_agg']['gbps']:.3f}; one level of as many "
                          f"boards: {cfg['densities']['0.01']['lhc_agg']['gbps']:.3f} / "
                          f"{cfg['densities']['0.05']['lhc_agg']['gbps']:.3f}{level}")
    for name, by_n in tl["boards_to_beat_lhc_ring_estimate"].items():
        print(f"leaf boards per leaf group a tree (R=B) needs to beat LHC summed by the hosts "
              f"in a ring ({name} uplinks; estimate, 1/B; * : more than a 48-port leaf switch "
              f"holds; ! : the estimate does not hold, another port binds first): " + "; ".join(
                  f"N={n} m={m} " + " ".join(
                      f"{float(k):.0%}:{e['boards']}{'' if e['fits'] else '*'}"
                      f"{'!' if e['root_binds'] or e['workers_bind'] else ''}"
                      for k, e in by_d.items())
                  for n, by_m in by_n.items() for m, by_d in by_m.items()))
    print(f"largest deviation of a simulated tree round from its line: "
          f"{tl['max_fit_deviation']:.4%} (the two levels took {tl['seconds']:.0f} s)")


def run(quick: bool, out_dir="build/bench") -> dict:
    started = time.perf_counter()
    workers_list = QUICK["workers"] if quick else WORKERS
    values = QUICK["values"] if quick else VALUES
    mhz, clock_source = links.engine_clock()
    engine = measure_engine(quick)
    engine_s = engine["cycles_per_packet"] / (mhz * 1e6)
    inc = measure_inceptionn(quick)
    rng = np.random.default_rng(SEED)
    phases = lhc_phases(values, DENSITIES, rng)
    bits = 32 * values

    # rings (no boards): per N and density
    def small(v):               # a compressed packet of v values on the wire
        return inc["ring_wire_vs_fp32"] * (links.HEADER_BYTES + 4 * v) + links.FRAMING_BYTES

    def wire_board(v):          # (compressed frame, the wire engine's time per packet)
        beats = -(-(links.HEADER_BYTES + 4 * v) // BEAT_BYTES)
        return small(v), beats / (WIRE_MHZ * 1e6)

    rings = {}
    for n in workers_list:
        fp32 = _ring_seconds(n, values, _raw_frame)
        inc_wire = _ring_seconds(n, values, _raw_frame, wire_board)
        inc_nic = _ring_seconds(n, values, small)
        rings[n] = {"ring_fp32": fp32, "ring_inc_wire": inc_wire, "ring_inc_nic": inc_nic,
                    "lhc_ring": {d: sum(_ring_seconds(n, w, _raw_frame)
                                        for w in _lhc_ring_words(phases[d]).values())
                                 for d in DENSITIES}}

    # the aggregator: per N, B, group
    agg, fits = {}, {}
    for n in workers_list:
        agg[n] = {}
        for b in boards_for(n):
            agg[n][b] = {}
            for group in (True, False):
                fit = StreamFit(n, b, group, engine_s)
                fits[(n, b, group)] = fit
                if fit.deviation > LINEARITY_TOLERANCE:
                    raise AssertionError(f"N={n} B={b} group={group}: round time not linear "
                                         f"in chunks ({fit.deviation:.3%})")
                per = {}
                for d in DENSITIES:
                    per[d] = {}
                    for method in ("lhc_agg", "dense_agg"):
                        chunks = _agg_chunks(phases[d], method)
                        seconds = sum(fit.seconds(k) for k in chunks.values())
                        per[d][method] = {"seconds": seconds, "gbps": bits / seconds / 1e9,
                                          "chunks": chunks}
                sample = fit.simulate(fit.k1)
                agg[n][b][group] = {
                    "densities": per, "fit": {"a_s": fit.a, "b_s_per_chunk": fit.b,
                                              "k1": fit.k1, "max_deviation": fit.deviation},
                    "board_out_bytes_per_result": sample["board_out_bytes_per_result"],
                    "board_out_datagrams_per_result": sample["board_out_datagrams_per_result"],
                    "board_in_bytes_per_chunk": sample["board_in_bytes_per_chunk"],
                    "board_in_peak_queue_bytes": sample["board_in_peak_queue_bytes"]}

    # how many boards (with a group) LHC through the aggregator needs to beat LHC summed by
    # the hosts in a ring: while the boards' links bind, its time falls as 1/B; the guess
    # is then simulated
    beat_ring = {}
    for n in workers_list:
        beat_ring[n] = {}
        for d in DENSITIES:
            chunks = _agg_chunks(phases[d], "lhc_agg")
            ring_s = rings[n]["lhc_ring"][d]
            guess = sum(fits[(n, 1, True)].seconds(k) for k in chunks.values()) / ring_s
            b = int(np.ceil(guess - 1e-9))
            entry = {"boards": None, "estimate": guess}
            while b <= n:
                if (n, b, True) not in fits:
                    fits[(n, b, True)] = StreamFit(n, b, True, engine_s)
                s = sum(fits[(n, b, True)].seconds(k) for k in chunks.values())
                if s < ring_s:
                    entry.update(boards=b, seconds=s, vs_lhc_ring=ring_s / s)
                    break
                b += 1
            beat_ring[n][d] = entry
    # a board with two ports (the Versa has two; its network top serves one today)
    two_ports = {}
    for n in workers_list:
        two_ports[n] = {}
        for b in sorted({1, max(1, n // 8)}):
            fit = StreamFit(n, b, True, engine_s, ports=2)
            two_ports[n][b] = {f"{d:g}": bits / sum(fit.seconds(k) for k in
                                                  _agg_chunks(phases[d], "lhc_agg").values()) / 1e9
                               for d in DENSITIES}
    # two levels: trees of aggregators on a two-tier fabric (N above 32)
    tree = two_levels(quick, engine_s, phases, values, small, wire_board)
    seconds = time.perf_counter() - started

    def gbps_ring(n, method, d):
        s = rings[n][method][d] if method == "lhc_ring" else rings[n][method]
        return bits / s / 1e9

    # ---- print
    print(f"{values:,} values per worker, 1 GbE ports on one store-and-forward switch "
          f"(+{FORWARD_LATENCY_S * 1e6:g} us forwarding), {links.FRAMING_BYTES} B framing per "
          f"datagram; aggregator boards: {SLOTS} slots, {engine['cycles_per_packet']:.3f} "
          f"cycles per packet measured on the Verilated switch_top, at {mhz:g} MHz "
          f"({clock_source}); INCEPTIONN k={K_INCEPTIONN}: ring bytes / fp32 "
          f"{inc['ring_wire_vs_fp32']:.3f} (golden ring, gradient-like values)")
    print("per-worker Gb/s (32 x values / all-reduce time); agg columns B = boards, "
          "g = with a result group, u = without")
    for d in DENSITIES:
        print(f"\nunion density {d:g} (LHC path: {phases[d]['chosen']})")
        head = f"{'N':>3}{'fp32':>7}{'INCwire':>8}{'INCnic':>7}{'LHCring':>8}"
        print(head + "   LHC agg per B (g/u) | dense agg B=1 (g)")
        for n in workers_list:
            line = (f"{n:>3}{gbps_ring(n, 'ring_fp32', d):>7.3f}"
                    f"{gbps_ring(n, 'ring_inc_wire', d):>8.3f}"
                    f"{gbps_ring(n, 'ring_inc_nic', d):>7.3f}{gbps_ring(n, 'lhc_ring', d):>8.3f}  ")
            for b in boards_for(n):
                g = agg[n][b][True]["densities"][d]["lhc_agg"]["gbps"]
                u = agg[n][b][False]["densities"][d]["lhc_agg"]["gbps"]
                line += f" B={b}:{g:.3f}/{u:.3f}"
            line += f" | {agg[n][1][True]['densities'][d]['dense_agg']['gbps']:.3f}"
            print(line)
    print("\nbytes on a board's link per result (out) and per chunk (in):")
    for n in workers_list:
        g, u = agg[n][1][True], agg[n][1][False]
        print(f"  N={n:>2}: with a group {g['board_out_bytes_per_result']:.0f} B "
              f"({g['board_out_datagrams_per_result']:.0f} datagram), without "
              f"{u['board_out_bytes_per_result']:.0f} B ({u['board_out_datagrams_per_result']:.0f}"
              f" datagrams); in {g['board_in_bytes_per_chunk']:.0f} B; peak queue at the "
              f"board's port {g['board_in_peak_queue_bytes'] / 1024:.0f} KiB")
    print("\nLHC through the aggregator (B = 1, group) against LHC summed by the hosts in a "
          "ring, and the boards it needs to beat that ring (- : more boards than workers):")
    for d in DENSITIES:
        print(f"  density {d:g}: " + "; ".join(
            f"N={n} {agg[n][1][True]['densities'][d]['lhc_agg']['gbps'] / gbps_ring(n, 'lhc_ring', d):.2f}x, "
            f"B>={beat_ring[n][d]['boards'] or '-'}" for n in workers_list))
    diff = max(abs(agg[n][b][True]["densities"][d][m]["seconds"]
                   / agg[n][b][False]["densities"][d][m]["seconds"] - 1)
               for n in workers_list for b in boards_for(n) for d in DENSITIES
               for m in ("lhc_agg", "dense_agg"))
    print(f"with against without a result group: all-reduce times differ by at most "
          f"{diff:.3%} (the board's ingress carries N datagrams per chunk either way)")
    print("LHC through B boards of two ports each (group), Gb/s per worker at 1 % / 5 %: " + "; ".join(
        f"N={n} B={b} {g['0.01']:.3f} / {g['0.05']:.3f}" for n in workers_list
        for b, g in two_ports[n].items()))
    worst = max(f.deviation for f in fits.values())
    print(f"largest deviation of a simulated round from its line: {worst:.4%}")

    targets = _targets(agg, rings, workers_list, bits)
    for t in targets:
        print(f"target: {t['what']}: {'HOLDS' if t['holds'] else 'MISSES'} ({t['detail']})")
    _print_two_levels(tree, agg, rings, bits)
    png = Path(out_dir) / "deployment.png"
    _plot(agg, rings, workers_list, bits, png, values, tree)
    print(f"plot: {png}  ({seconds:.0f} s)")

    return {
        "values": values, "gbps_link": GBPS, "framing_bytes": links.FRAMING_BYTES,
        "forward_latency_s": FORWARD_LATENCY_S, "slots": SLOTS, "agg_frame_bytes": AGG_FRAME,
        "clock_mhz": mhz, "clock_source": clock_source, "engine": engine,
        "engine_s_per_packet": engine_s, "inceptionn": inc,
        "phases": {f"{d:g}": {"chosen": p["chosen"], "words": p["words"], "rows": p["rows"],
                              "unpeeled": p["unpeeled"]} for d, p in phases.items()},
        "methods": METHODS,
        "rings": {str(n): {m: ({f"{d:g}": {"seconds": s, "gbps": bits / s / 1e9}
                                for d, s in r[m].items()} if m == "lhc_ring"
                               else {"seconds": r[m], "gbps": bits / r[m] / 1e9})
                           for m in r} for n, r in rings.items()},
        "aggregator": {str(n): {str(b): {("group" if g else "no_group"): {
            **{k: v for k, v in cfg.items() if k != "densities"},
            "densities": {f"{d:g}": x for d, x in cfg["densities"].items()}}
            for g, cfg in by_g.items()} for b, by_g in by_b.items()}
            for n, by_b in agg.items()},
        "boards_to_beat_lhc_ring": {str(n): {f"{d:g}": e for d, e in by_d.items()}
                                    for n, by_d in beat_ring.items()},
        "group_vs_no_group_max_rel_diff": diff,
        "two_port_boards_lhc_agg_gbps": {str(n): {str(b): g for b, g in by_b.items()}
                                         for n, by_b in two_ports.items()},
        "max_fit_deviation": worst, "targets": targets, "plot": str(png),
        "two_levels": tree,
        "seconds": seconds,
    }


def _targets(agg, rings, workers_list, bits):
    out = []
    fp32 = {n: bits / rings[n]["ring_fp32"] / 1e9 for n in workers_list}

    def check(what, cases):
        misses = []
        for n, b, d in cases:
            g = agg[n][b][True]["densities"][d]["lhc_agg"]["gbps"]
            if g <= fp32[n]:
                misses.append(f"N={n} B={b}: {g:.3f} vs {fp32[n]:.3f} Gb/s "
                              f"({g / fp32[n]:.2f}x)")
        ratios = ", ".join(
            f"N={n} B={b} {agg[n][b][True]['densities'][d]['lhc_agg']['gbps'] / fp32[n]:.2f}x"
            for n, b, d in cases)
        out.append({"what": what, "holds": not misses and bool(cases),
                    "detail": "; ".join(misses) if misses else ratios, "ratios": ratios})

    check("LHC 1 % with one board beats the fp32 ring up to 16 workers (with groups)",
          [(n, 1, 0.01) for n in workers_list if n <= 16])
    check("LHC 5 % with B = N/8 boards beats the fp32 ring from 8 to 32 workers (with groups)",
          [(n, max(1, n // 8), 0.05) for n in workers_list if 8 <= n <= 32])
    return out


def _plot(agg, rings, workers_list, bits, out_path, values, tree=None):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(DENSITIES), figsize=(4.2 * len(DENSITIES), 4.2),
                             sharey=True, squeeze=False)
    x = list(workers_list)
    for ax, d in zip(axes[0], DENSITIES):
        ax.plot(x, [bits / rings[n]["ring_fp32"] / 1e9 for n in x], "k-o", label=METHODS["ring_fp32"])
        ax.plot(x, [bits / rings[n]["ring_inc_wire"] / 1e9 for n in x], "--s", color="tab:purple",
                markersize=4,
                label=METHODS["ring_inc_wire"])
        ax.plot(x, [bits / rings[n]["ring_inc_nic"] / 1e9 for n in x], ":s", color="tab:purple",
                label=METHODS["ring_inc_nic"])
        ax.plot(x, [bits / rings[n]["lhc_ring"][d] / 1e9 for n in x], "-^", color="tab:green",
                label=METHODS["lhc_ring"])
        for label, pick, style in (("B = 1", lambda n: 1, "-o"),
                                   ("B = N/8", lambda n: max(1, n // 8), "--o"),
                                   ("B = N/2", lambda n: max(1, n // 2), ":o")):
            ax.plot(x, [agg[n][pick(n)][True]["densities"][d]["lhc_agg"]["gbps"] for n in x],
                    style, color="tab:orange", label=f"{METHODS['lhc_agg']}, {label}, group")
        ax.plot(x, [agg[n][1][True]["densities"][d]["dense_agg"]["gbps"] for n in x], "-d",
                color="tab:blue", label=f"{METHODS['dense_agg']}, B = 1, group")
        ticks = x + (_plot_two_levels(ax, tree, d) if tree else [])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sorted(set(ticks)), [str(n) for n in sorted(set(ticks))])
        ax.set_xlabel("workers N")
        ax.set_title("dense gradient" if d >= 1 else f"union density {d:.0%}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("Gb/s per worker (uncompressed)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=7)
    title = (f"one all-reduce of {values:,} values, every worker and board on a 1 GbE port "
             f"of one store-and-forward switch (modelled packet by packet)")
    if tree:
        name = next(iter(tree["trees"]))
        u = tree["uplinks"][name]
        title += (f";\nred stars and crosses: two levels (N = 32: two leaves of 16); dashed "
                  f"beyond 32 workers: the rings; both on leaf switches with {u['links']} x "
                  f"{u['gbps']:g} GbE uplinks to a spine")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0.2 if tree else 0.16, 1, 1))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, dpi=110)
    plt.close(fig)


def _plot_two_levels(ax, tree, d):
    """The two-level lines on one density's axes (the first uplink setting): LHC through
    trees of 32- and 16-worker leaves with the most leaf boards and as many roots, and the
    fp32 and LHC rings on the fabric beyond 32 workers; returns their worker counts."""
    name = next(iter(tree["trees"]))
    key = f"{d:g}"
    shown = []
    for m, style in (("32", "-*"), ("16", "-x")):
        points = []
        for n, by_m in tree["trees"][name].items():
            entry = by_m.get(m, {})
            if "boards" not in entry:
                continue
            b = max(entry["boards"], key=int)
            cfg = entry["boards"][b].get("R=B", {})
            if "densities" in cfg:
                points.append((int(n), cfg["densities"][key]["lhc_agg"]["gbps"]))
        if points:
            ax.plot(*zip(*points), style, color="tab:red", markersize=7,
                    label=f"LHC through a tree, {m}-worker leaves, B = {b} (R = B), groups")
            shown += [p[0] for p in points]
    rings = tree["rings"][name]
    ns = sorted(int(n) for n in rings)
    if ns:
        ax.plot(ns, [rings[str(n)]["ring_fp32"]["gbps"] for n in ns], "k--o", markersize=4,
                label="fp32 ring on the two-tier fabric")
        ax.plot(ns, [rings[str(n)]["ring_inc_nic"]["gbps"] for n in ns], "--s",
                color="tab:purple", markersize=4,
                label="INCEPTIONN ring, codec in the NIC, on the two-tier fabric")
        ax.plot(ns, [rings[str(n)]["lhc_ring"][key]["gbps"] for n in ns], "--^",
                color="tab:green", markersize=4, label="LHC ring on the two-tier fabric")
    return shown + ns
