"""Switch self-test traffic: virtual workers feeding the aggregator, a checker of the sums.

* :class:`AggTraffic` configures one job on the aggregator's control port (``workers``
  workers, slots ``[slot_base, slot_base + window)``), then runs ``workers``
  :class:`VirtualWorker` sources through a packet-level round-robin
  :class:`hdl.stream.arbiter.PacketArbiter` (its registered form)
  and a :class:`BeatFormer` (the workers hand over their state, the 256-bit beats are made
  after the arbiter) into the aggregator, SwitchML style: round ``r`` uses slot ``slot_base + r % window``,
  version ``(r // window) % 2``, and a worker may send round ``r`` only when fewer than
  ``window`` rounds are outstanding (at most one packet in flight per slot and version).
* Every worker sends one packet per round: a header with a random exponent, then ``lanes``
  pseudo-random 32-bit values (one 64-bit LFSR per worker, advanced every beat, spread over
  the eight lanes by :func:`_lane_word`); rounds with ``r % 4 == 3`` use ``AGG_OR32`` (with
  sparser values, so that an OR of several workers is not all ones), the others
  ``AGG_ADD_I32``.
* :class:`AggExpected` replays every worker's LFSR (same seeds, so nothing is stored) and makes the result packet each round must produce: wrap-around sum or OR of the
  workers' lanes, the maximum exponent, the ``RESULT`` flag, worker 0xFF. A
  :class:`hdl.selftest.stream_checker.StreamChecker` compares it with the aggregator's output.

Results arrive in round order: round ``r`` completes with the last worker's round-``r``
packet, and every worker sends its rounds in order.

:class:`AggTrafficModel` is the same traffic in Python (for the tests, which also run it
through the reference model ``host.golden.aggregator.AggregatorModel``).
"""
from amaranth import Cat, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from contract.header import (
    BEAT_BYTES,
    LANES,
    MAGIC,
    VERSION,
    WORKER_MULTICAST,
    Flags,
    Header,
    PacketType,
)
from contract.registers import COMMIT, SWITCH_REGISTERS
from hdl.ctrl_port import RegisterPort
from hdl.header import HeaderLayout
from hdl.selftest.fault_inject import FaultInjector
from hdl.selftest.gradient_gen import RNG_WIDTH, derive_seed
from hdl.selftest.lfsr import LFSR, lfsr_advance
from hdl.selftest.stream_checker import StreamChecker
from hdl.stream.arbiter import PacketArbiter
from hdl.stream.axis import AxisBeat, axis_signature
from hdl.stream.credit_buffer import CreditBuffer
from hdl.stream.skid_buffer import SkidBuffer
from hdl.stream.stage import register_stage

__all__ = ["AggTrafficModel", "WorkerBeat", "VirtualWorker", "BeatFormer",
           "AggExpected", "AggTraffic"]

FULL_KEEP = (1 << BEAT_BYTES) - 1


def _is_or_round(r):
    return r & 3 == 3


def _worker_seed(seed, worker):
    return derive_seed(seed, 16 * (worker + 1))


def _rotl32(x, n):
    n %= 32
    return ((x << n) | (x >> (32 - n))) & 0xFFFFFFFF if n else x


#: Per-lane constants that decorrelate the lanes of one beat (golden-ratio multiples).
_LANE_XOR = tuple((0x9E3779B9 * (j + 1)) & 0xFFFFFFFF for j in range(LANES))


def _lane_word(r, lane, op_or):
    """Lane ``lane`` of a worker beat from the worker's 64 random bits ``r``.

    One LFSR per worker feeds all eight lanes: each lane XORs differently rotated halves
    of ``r`` with its own constant (every bit is a 2-input XOR: cheap, and the lanes differ
    in every carry pattern). OR rounds AND two such words, so about a quarter of the bits
    are set and an OR of a few workers is not all ones.
    """
    low, high = r & 0xFFFFFFFF, r >> 32
    word = _rotl32(low, 5 * lane) ^ _rotl32(high, 11 * lane + 3) ^ _LANE_XOR[lane]
    if op_or:
        word &= _rotl32(low, 7 * lane + 13) ^ _rotl32(high, 3 * lane + 17)
    return word


class AggTrafficModel:
    """The traffic of :class:`AggTraffic` and the results it expects, in Python.

    ``worker_packets(w)`` yields worker ``w``'s packets (``contract.packet.Packet``-ready
    ``(Header, payload words)``) round by round; ``expected_results()`` yields the result
    ``(Header, words)`` of every round.
    """

    def __init__(self, *, workers=4, lanes=64, window=8, slot_base=0, job=0, seed=1):
        self.workers, self.lanes, self.window = workers, lanes, window
        self.slot_base, self.job, self.seed = slot_base, job, seed

    def _round_header(self, r, worker, exponent):
        return Header(type=PacketType.AGG_OR32 if _is_or_round(r) else PacketType.AGG_ADD_I32,
                      job=self.job, worker=worker, exponent=exponent, count=self.lanes,
                      slot=self.slot_base + r % self.window,
                      slot_version=(r // self.window) & 1, seq=r & 0xFFFFFFFF,
                      offset=(r * self.lanes) & 0xFFFFFFFF)

    def worker_packets(self, worker):
        state = _worker_seed(self.seed, worker)
        r = 0
        while True:
            exponent = state & 0xFF
            exponent -= 256 if exponent & 0x80 else 0
            state = lfsr_advance(state, RNG_WIDTH, RNG_WIDTH)
            words = []
            for _ in range(self.lanes // LANES):
                words += [_lane_word(state, j, _is_or_round(r)) for j in range(LANES)]
                state = lfsr_advance(state, RNG_WIDTH, RNG_WIDTH)
            yield self._round_header(r, worker, exponent), words
            r += 1

    def expected_results(self):
        streams = [self.worker_packets(w) for w in range(self.workers)]
        r = 0
        while True:
            packets = [next(s) for s in streams]
            words = [0] * self.lanes
            for _, payload in packets:
                for i, v in enumerate(payload):
                    words[i] = (words[i] | v) if _is_or_round(r) else (words[i] + v) & 0xFFFFFFFF
            exponent = max(h.exponent for h, _ in packets)
            header = packets[-1][0].replace(flags=Flags.RESULT, worker=WORKER_MULTICAST,
                                            exponent=exponent)
            yield header, words
            r += 1


def _beat_from_rng(value, op_or):
    """The 256-bit payload beat of a worker's 64-bit random ``value`` (:func:`_lane_word`)."""
    low, high = value[0:32], value[32:64]

    def rotl(x, n):
        return x.rotate_left(n % 32)

    lanes = []
    for j in range(LANES):
        word = rotl(low, 5 * j) ^ rotl(high, 11 * j + 3) ^ _LANE_XOR[j]
        sparse = word & (rotl(low, 7 * j + 13) ^ rotl(high, 3 * j + 17))
        lanes.append(Mux(op_or, sparse, word))
    return Cat(*lanes)


def _is_or(round_number):
    return round_number[0:2] == 3


def _round_header(m, *, round_number, slot_index, version, lanes, slot_base, job, worker,
                  exponent, flags):
    """The header of round ``round_number`` (a ``HeaderLayout`` signal)."""
    header = Signal(HeaderLayout)
    m.d.comb += [
        header.magic.eq(MAGIC), header.version.eq(VERSION),
        header.type.eq(Mux(_is_or(round_number), PacketType.AGG_OR32, PacketType.AGG_ADD_I32)),
        header.flags.eq(flags), header.job.eq(job), header.worker.eq(worker),
        header.exponent.eq(exponent), header.count.eq(lanes),
        header.slot.eq(slot_base + slot_index), header.slot_version.eq(version),
        header.seq.eq(round_number), header.offset.eq(round_number * lanes),
    ]
    return header


class _RoundCounter:
    """Round number, slot index inside the window and slot version, stepped together."""

    def __init__(self, window, name):
        self.round = Signal(32, name=f"{name}_round")
        self.slot_index = Signal(range(window), name=f"{name}_slot")
        self.version = Signal(name=f"{name}_version")
        self.window = window

    def step(self, m):
        m.d.sync += self.round.eq(self.round + 1)
        with m.If(self.slot_index == self.window - 1):
            m.d.sync += [self.slot_index.eq(0), self.version.eq(~self.version)]
        with m.Else():
            m.d.sync += self.slot_index.eq(self.slot_index + 1)


def _worker_rng(m, seed, worker, name):
    """The LFSR of one virtual worker (a source and its replica each have one); it advances
    once per beat, header beats included."""
    rng = LFSR(width=RNG_WIDTH, seed=_worker_seed(seed, worker))
    m.submodules[name] = rng
    return rng


#: What a virtual worker hands to the arbiter for each beat: its state, not the 256-bit
#: beat. :class:`BeatFormer` makes the beat after the arbiter, once for all workers, so
#: the wide data never goes through a multiplexer.
WorkerBeat = data.StructLayout({
    "rng": RNG_WIDTH,        # the worker's LFSR value for this beat
    "header": 1,             # this is the header beat
    "last": 1,
    "round": 32,
    "slot_index": 16,        # slot inside the job's window
    "version": 1,
    "worker": 5,
})


class VirtualWorker(wiring.Component):
    """One worker's beats, round after round, while ``round < limit``, as
    :data:`WorkerBeat` descriptors (:class:`BeatFormer` turns them into AXI-Stream beats).

    The descriptor is a function of the worker's registers, which only change when a beat
    is taken, so it is stable while ``valid``.

    Attributes
    ----------
    o : Out(stream.Signature(WorkerBeat))
    limit : In(32)
        The worker may start round ``r`` only if ``r < limit``.
    """

    def __init__(self, *, worker, lanes, window, seed):
        if not 0 <= worker < 32:
            raise ValueError(f"worker must be in 0..31, not {worker!r}")
        self.worker, self.lanes, self.window, self.seed = worker, lanes, window, seed
        super().__init__({"o": Out(stream.Signature(WorkerBeat)), "limit": In(32)})

    def elaborate(self, platform):
        m = Module()
        rng = _worker_rng(m, self.seed, self.worker, "rng")
        rounds = _RoundCounter(self.window, "worker")
        beats_left = Signal(range(self.lanes // LANES + 1))   # payload beats still to send
        # may the round in `rounds.round` start? A register, for the round number as it
        # will be after this cycle; `limit` only grows, so a value one cycle old is safe.
        allowed = Signal()
        in_header = beats_left == 0
        m.d.comb += [
            self.o.valid.eq(~in_header | allowed),
            self.o.payload.rng.eq(rng.value),
            self.o.payload.header.eq(in_header),
            self.o.payload.last.eq(beats_left == 1),
            self.o.payload.round.eq(rounds.round),
            self.o.payload.slot_index.eq(rounds.slot_index),
            self.o.payload.version.eq(rounds.version),
            self.o.payload.worker.eq(self.worker),
        ]
        taken = self.o.valid & self.o.ready
        stepping = taken & (beats_left == 1)
        # both compares from registers; `stepping` only picks one (it arrives late)
        m.d.sync += allowed.eq(Mux(stepping, rounds.round + 1 < self.limit,
                                   rounds.round < self.limit))
        with m.If(taken):
            m.d.comb += rng.advance.eq(1)
            m.d.sync += beats_left.eq(Mux(in_header, self.lanes // LANES, beats_left - 1))
            with m.If(beats_left == 1):
                rounds.step(m)
        return m


class BeatFormer(wiring.Component):
    """Turns :data:`WorkerBeat` descriptors into AXI-Stream beats (one register).

    Attributes
    ----------
    i : In(stream.Signature(WorkerBeat))
    o : Out(axis_signature())
    """

    def __init__(self, *, lanes, slot_base, job):
        self.lanes, self.slot_base, self.job = lanes, slot_base, job
        super().__init__({"i": In(stream.Signature(WorkerBeat)), "o": Out(axis_signature())})

    def elaborate(self, platform):
        m = Module()
        d = self.i.payload
        header = _round_header(m, round_number=d.round, slot_index=d.slot_index,
                               version=d.version, lanes=self.lanes, slot_base=self.slot_base,
                               job=self.job, worker=d.worker, exponent=d.rng[0:8],
                               flags=Flags.NONE)
        with register_stage(m, self.i, self.o):
            m.d.sync += [
                self.o.payload.data.eq(Mux(d.header, header.as_value(),
                                           _beat_from_rng(d.rng, _is_or(d.round)))),
                self.o.payload.keep.eq(FULL_KEEP),
                self.o.payload.last.eq(d.last),
            ]
        return m


class AggExpected(wiring.Component):
    """The result packets the aggregator must emit, round after round (free-running
    pipeline: the workers' values, one register level per level of the combining tree, an
    output register, then a :class:`hdl.stream.credit_buffer.CreditBuffer`).

    Attributes
    ----------
    o : Out(axis_signature())
    """

    def __init__(self, *, workers, lanes, window, slot_base, job, seed):
        self.workers, self.lanes, self.window = workers, lanes, window
        self.slot_base, self.job, self.seed = slot_base, job, seed
        super().__init__({"o": Out(axis_signature())})

    def elaborate(self, platform):
        m = Module()
        replicas = [_worker_rng(m, self.seed, w, f"w{w}_rng") for w in range(self.workers)]
        rounds = _RoundCounter(self.window, "expected")
        # Free-running pipeline (no clock enables on its wide registers): a beat is issued
        # whenever the buffer at the end grants space, and moves on every clock.
        levels = (self.workers - 1).bit_length()       # register levels of the tree
        m.submodules.buffer = buffer = CreditBuffer(AxisBeat, latency=levels + 2)
        wiring.connect(m, buffer.o, wiring.flipped(self.o))
        issue = buffer.space

        # stage 1: the workers' values of this beat (exponents, or payload lanes)
        beats_left = Signal(range(self.lanes // LANES + 1))
        s1_valid, s1_header, s1_op_or, s1_last = Signal(), Signal(), Signal(), Signal()
        s1_exponents = [Signal(8, name=f"s1_exp{w}") for w in range(self.workers)]
        s1_beats = [Signal(256, name=f"s1_beat{w}") for w in range(self.workers)]
        s1_fields = Signal(HeaderLayout)
        header = _round_header(m, round_number=rounds.round, slot_index=rounds.slot_index,
                               version=rounds.version, lanes=self.lanes,
                               slot_base=self.slot_base, job=self.job,
                               worker=WORKER_MULTICAST, exponent=0, flags=Flags.RESULT)
        op_or = _is_or(rounds.round)
        m.d.sync += [s1_valid.eq(issue), s1_header.eq(beats_left == 0), s1_op_or.eq(op_or),
                     s1_last.eq(beats_left == 1), s1_fields.eq(header)]
        m.d.sync += [s1_exponents[w].eq(rng.value[0:8]) for w, rng in enumerate(replicas)]
        m.d.sync += [s1_beats[w].eq(_beat_from_rng(rng.value, op_or))
                     for w, rng in enumerate(replicas)]
        with m.If(issue):
            m.d.comb += [rng.advance.eq(1) for rng in replicas]
            m.d.sync += beats_left.eq(Mux(beats_left == 0, self.lanes // LANES, beats_left - 1))
            with m.If(beats_left == 1):
                rounds.step(m)

        # then a tree that combines pairs, one register level per tree level (lane-wise
        # wrap-around sum or OR; signed max of the exponents): no chain of adders or
        # compares between two registers, whatever the number of workers
        items = [(e.as_signed(), b) for e, b in zip(s1_exponents, s1_beats)]
        meta = {"valid": s1_valid, "header": s1_header, "op_or": s1_op_or, "last": s1_last,
                "fields": s1_fields}
        level = 1
        while len(items) > 1:
            level += 1
            combined = []
            for k in range(0, len(items), 2):
                exponent = Signal(signed(8), name=f"s{level}_exp{k // 2}")
                beat = Signal(256, name=f"s{level}_beat{k // 2}")
                if k + 1 < len(items):
                    (ea, ba), (eb, bb) = items[k], items[k + 1]
                    lanes = [Mux(meta["op_or"], ba[32 * j:32 * j + 32] | bb[32 * j:32 * j + 32],
                                 (ba[32 * j:32 * j + 32] + bb[32 * j:32 * j + 32])[0:32])
                             for j in range(LANES)]
                    m.d.sync += [exponent.eq(Mux(ea > eb, ea, eb)), beat.eq(Cat(*lanes))]
                else:
                    m.d.sync += [exponent.eq(items[k][0]), beat.eq(items[k][1])]
                combined.append((exponent, beat))
            staged = {name: Signal.like(value, name=f"s{level}_{name}")
                      for name, value in meta.items()}
            m.d.sync += [staged[name].eq(value) for name, value in meta.items()]
            items, meta = combined, staged
        assert level == levels + 1

        exponent, beat = items[0]
        result_header = Signal(HeaderLayout)
        m.d.comb += [result_header.eq(meta["fields"]), result_header.exponent.eq(exponent)]
        m.d.sync += [
            buffer.i.valid.eq(meta["valid"]),
            buffer.i.payload.data.eq(Mux(meta["header"], result_header.as_value(), beat)),
            buffer.i.payload.keep.eq(FULL_KEEP),
            buffer.i.payload.last.eq(meta["last"]),
        ]
        return m


class AggTraffic(wiring.Component):
    """Configures the aggregator, drives it with virtual workers and checks its results.

    Parameters
    ----------
    workers : int
        Virtual workers (1..32 and at most the engine's ``max_workers``).
    lanes : int
        The engine's ``P``.
    window : int
        Slots of the job = rounds in flight (at most the engine's slot pool).
    slot_base, job : int
        Where the job lives in the engine.
    clear_cycles : int
        Cycles to wait after committing the job before sending (the engine stalls its input
        while it clears slots anyway; this only keeps the first packets out of that stall).
    seed : int
    stall_limit : int
        See :class:`hdl.selftest.stream_checker.StreamChecker`.

    Attributes
    ----------
    o : Out(axis_signature())
        To the aggregator's input.
    results : In(axis_signature())
        The aggregator's output.
    ctrl : Out(RegisterPort())
        To the aggregator's register port; it writes the job's configuration, then leaves
        the port (``configured`` high) to a counter reader. It never reads (``re`` stays 0).
    inject_fault : In(1)
        Corrupt worker payloads (see :class:`hdl.selftest.fault_inject.FaultInjector`).
    configured : Out(1)
    sent : Out(32)
        Worker packets sent.
    flipped : Out(32)
        Payload beats corrupted by fault injection.
    beats, packets, errors, bad_packets : Out(32)
    error : Out(1)
        The result checker's counters (``packets`` = results checked).
    """

    def __init__(self, *, workers=4, lanes=64, window=8, slot_base=0, job=0,
                 clear_cycles=256, seed=2, stall_limit=1 << 20):
        if not isinstance(workers, int) or not 1 <= workers <= 32:
            raise ValueError(f"workers must be in 1..32, not {workers!r}")
        if not isinstance(lanes, int) or lanes < LANES or lanes % LANES:
            raise ValueError(f"lanes must be a positive multiple of {LANES}, not {lanes!r}")
        if not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be a positive number of slots, not {window!r}")
        self.workers, self.lanes, self.window = workers, lanes, window
        self.slot_base, self.job, self.seed = slot_base, job, seed
        self.clear_cycles, self.stall_limit = clear_cycles, stall_limit
        super().__init__({
            "o": Out(axis_signature()),
            "results": In(axis_signature()),
            "ctrl": Out(RegisterPort()),
            "inject_fault": In(1),
            "configured": Out(1),
            "sent": Out(32), "flipped": Out(32),
            "beats": Out(32), "packets": Out(32), "errors": Out(32), "bad_packets": Out(32),
            "error": Out(1),
        })

    def model(self):
        """The :class:`AggTrafficModel` of this traffic."""
        return AggTrafficModel(workers=self.workers, lanes=self.lanes, window=self.window,
                               slot_base=self.slot_base, job=self.job, seed=self.seed)

    def elaborate(self, platform):
        m = Module()
        common = dict(lanes=self.lanes, window=self.window, slot_base=self.slot_base,
                      job=self.job, seed=self.seed)

        # configuration: workers, slot_base, slot_count, commit; then wait for the clear
        job = SWITCH_REGISTERS["job"]
        writes = [(job.address(self.job, "workers"), self.workers),
                  (job.address(self.job, "slot_base"), self.slot_base),
                  (job.address(self.job, "slot_count"), self.window),
                  (job.address(self.job, "commit"), COMMIT)]
        step = Signal(range(len(writes) + 1))
        wait = Signal(range(self.clear_cycles + 1), init=self.clear_cycles)
        with m.If(step < len(writes)):
            with m.Switch(step):
                for index, (address, value) in enumerate(writes):
                    with m.Case(index):
                        m.d.comb += [self.ctrl.addr.eq(address), self.ctrl.wdata.eq(value),
                                     self.ctrl.we.eq(1)]
            m.d.sync += step.eq(step + 1)
        with m.Elif(wait != 0):
            m.d.sync += wait.eq(wait - 1)
        with m.Else():
            m.d.sync += self.configured.eq(1)

        m.submodules.checker = checker = StreamChecker(stall_limit=self.stall_limit)
        m.submodules.arbiter = arbiter = PacketArbiter(self.workers, shape=WorkerBeat,
                                                       registered=True)
        # SwitchML flow control: at most `window` rounds between sent and completed
        limit = Signal(32)
        m.d.sync += limit.eq(Mux(self.configured, checker.packets + self.window, 0))
        for w in range(self.workers):
            worker = VirtualWorker(worker=w, lanes=self.lanes, window=self.window,
                                   seed=self.seed)
            m.submodules[f"worker{w}"] = worker
            m.d.comb += worker.limit.eq(limit)
            # Skid buffers (descriptors are narrow) register the ready every worker sees and
            # the one the arbiter sees: the aggregator's ready would otherwise run through
            # the beat former and the arbiter's grant into every worker's clock enables.
            skid = SkidBuffer(WorkerBeat)
            m.submodules[f"worker{w}_skid"] = skid
            wiring.connect(m, worker.o, skid.i)
            wiring.connect(m, skid.o, arbiter.inputs[w])
        m.submodules.former = former = BeatFormer(lanes=self.lanes, slot_base=self.slot_base,
                                                  job=self.job)
        m.submodules.inject = inject = FaultInjector()
        m.submodules.arbiter_skid = arbiter_skid = SkidBuffer(WorkerBeat)
        wiring.connect(m, arbiter.o, arbiter_skid.i)
        wiring.connect(m, arbiter_skid.o, former.i)
        wiring.connect(m, former.o, inject.i)
        wiring.connect(m, inject.o, wiring.flipped(self.o))
        m.d.comb += [inject.enable.eq(self.inject_fault), self.flipped.eq(inject.flipped)]
        with m.If(self.o.valid & self.o.ready & self.o.payload.last):
            m.d.sync += self.sent.eq(self.sent + 1)

        m.submodules.expected = expected = AggExpected(workers=self.workers, **common)
        wiring.connect(m, expected.o, checker.expected)
        wiring.connect(m, wiring.flipped(self.results), checker.received)
        for name in ("beats", "packets", "errors", "bad_packets", "error"):
            m.d.comb += getattr(self, name).eq(getattr(checker, name))
        return m
