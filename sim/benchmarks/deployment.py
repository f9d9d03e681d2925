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
"""
from __future__ import annotations

import heapq
import time
from pathlib import Path

import numpy as np

from . import links

__all__ = ["run", "Link", "aggregation_stream", "ring_step", "StreamFit", "WORKERS",
           "DENSITIES", "VALUES", "SLOTS", "AGG_FRAME", "FORWARD_LATENCY_S", "boards_for"]

#: Worker counts of the table (trees of aggregators, for more than 32, do not exist yet).
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
        self.k1 = k1 or max(STREAM_K1, 2 * SLOTS * boards)
        self._cache = {}
        points = [(k, self.simulate(k)["seconds"]) for k in (self.k1, 2 * self.k1, 3 * self.k1)]
        x = np.array([p[0] for p in points], dtype=float)
        y = np.array([p[1] for p in points], dtype=float)
        self.b, self.a = (float(v) for v in np.polyfit(x, y, 1))
        self.deviation = float(np.max(np.abs(self.a + self.b * x - y) / y))

    def simulate(self, chunks):
        if chunks not in self._cache:
            self._cache[chunks] = aggregation_stream(self.workers, self.boards, chunks,
                                                     group=self.group, engine_s=self.engine_s,
                                                     ports=self.ports)
        return self._cache[chunks]

    def seconds(self, chunks):
        if chunks <= 0:
            return 0.0
        if chunks <= 3 * self.k1:
            return self.simulate(chunks)["seconds"]
        return self.a + self.b * chunks


def _ring_seconds(workers, words, frame_of, wire_of=None):
    """A ring all-reduce of ``words`` 4-byte words: ``2 (N - 1)`` steps of the largest chunk
    in packets of at most :data:`links.RING_PACKET_VALUES` words; each step simulated at
    ``RING_P1`` and ``2 RING_P1`` packets of the step's average size and scaled (linear:
    every packet of a step costs the same on every link); returns seconds."""
    if words <= 0:
        return 0.0
    chunk = -(-words // workers)
    packets = -(-chunk // links.RING_PACKET_VALUES)
    per_packet = chunk / packets                       # values per packet, on average
    frame = frame_of(per_packet)
    wire = wire_of(per_packet) if wire_of else None
    if packets <= 2 * RING_P1:
        step = ring_step(workers, packets, frame, wire=wire)
    else:
        t1 = ring_step(workers, RING_P1, frame, wire=wire)
        t2 = ring_step(workers, 2 * RING_P1, frame, wire=wire)
        step = t2 + (packets - 2 * RING_P1) * (t2 - t1) / RING_P1
    return 2 * (workers - 1) * step


def _raw_frame(values):
    return links.HEADER_BYTES + 4 * values + links.FRAMING_BYTES


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
    png = Path(out_dir) / "deployment.png"
    _plot(agg, rings, workers_list, bits, png, values)
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


def _plot(agg, rings, workers_list, bits, out_path, values):
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
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(x, [str(n) for n in x])
        ax.set_xlabel("workers N")
        ax.set_title("dense gradient" if d >= 1 else f"union density {d:.0%}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("Gb/s per worker (uncompressed)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=7)
    fig.suptitle(f"one all-reduce of {values:,} values, every worker and board on a 1 GbE port "
                 f"of one store-and-forward switch (modelled packet by packet)", fontsize=9)
    fig.tight_layout(rect=(0, 0.16, 1, 1))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, dpi=110)
    plt.close(fig)
