"""Packet sequences for checking the switch aggregator against its reference model.

Pure Python (no simulator): the cocotb testbench (``sim/tb_switch.py``), the Amaranth
simulator test of the whole engine and the benchmark all replay these sequences into the
gateware and into :class:`host.golden.aggregator.AggregatorModel` and compare.

A sequence is a list of steps:

- ``("packet", bytes)``: one packet's byte image (malformed ones included);
- ``("configure", job, workers, slot_base, slot_count)``: commit a job configuration
  (``workers == 0`` clears the job);
- ``("configure", job, workers, slot_base, slot_count, upstream)``: the same with the job's
  upstream registers (an :class:`~host.golden.aggregator.Upstream` or None), written before
  the commit (aggregator-protocol.md section 4).

Every generator takes the engine's parameters (:class:`EngineParams`) and a
``random.Random``, so a failing case is reproduced from its seed.
"""
from __future__ import annotations

import dataclasses
import random

from contract.header import Header, PacketType
from contract.packet import Packet
from contract.registers import COMMIT, SWITCH_REGISTERS

__all__ = ["EngineParams", "NASTY_WORDS", "BAD_CLASSES", "random_payload", "data_packet",
           "bad_packet", "partial_middle_beat", "configure_steps", "protocol_traffic",
           "hammer_traffic", "chaos_traffic", "tree_traffic", "configure_writes",
           "configure_model"]

OPS = (PacketType.AGG_ADD_I32, PacketType.AGG_OR32)

#: Words that stress wrap-around and sign handling (and float bit patterns: NaN with a
#: payload, infinities, -0.0, the smallest denormal).
NASTY_WORDS = (0, 1, 0x7FFF_FFFF, 0x8000_0000, 0xFFFF_FFFF, 0xFFFF_FFFE, 0x7FC0_1234,
               0xFF80_0000, 0x7F80_0000, 0x8000_0000, 0x0000_0001, 0x8000_0001)


@dataclasses.dataclass(frozen=True)
class EngineParams:
    slots: int = 16
    lanes: int = 64
    max_workers: int = 32
    jobs: int = 4

    def as_dict(self):
        return dataclasses.asdict(self)


def random_payload(rng: random.Random, lanes: int, *, nasty=0.2) -> bytes:
    words = [rng.choice(NASTY_WORDS) if rng.random() < nasty else rng.getrandbits(32)
             for _ in range(lanes)]
    return b"".join(w.to_bytes(4, "little") for w in words)


def data_packet(rng, params: EngineParams, *, job, worker, slot, slot_version, op,
                exponent=None, payload=None, **fields) -> bytes:
    """A well-formed aggregation packet (random exponent, payload, seq, offset, flags, k)."""
    header = Header(
        type=op, job=job, worker=worker, slot=slot, slot_version=slot_version,
        exponent=rng.randrange(-128, 128) if exponent is None else exponent,
        count=params.lanes, seq=rng.getrandbits(32), offset=rng.getrandbits(32),
        # Any flags but RESULT, which a worker never sets: the engine takes a packet with
        # RESULT as a result from its upstream (section 4).
        flags=rng.choice([0, 0, 1, 4, 5]), k=rng.randrange(256))
    header = header.replace(**fields)
    if payload is None:
        payload = random_payload(rng, params.lanes)
    return Packet(header, payload).to_bytes()


#: Every kind of malformed packet of the contract (mixed_op needs slot state: it is made by
#: the traffic generators, not here).
BAD_CLASSES = ("magic", "version", "type", "job_beyond", "job_unconfigured", "worker",
               "slot", "slot_version", "count", "short_payload", "long_payload", "header_only",
               "partial_word", "partial_beat", "tiny", "bad_and_short")


def bad_packet(rng, params: EngineParams, kind, *, job, workers, slot_range,
               unconfigured_job=None, version=0) -> bytes:
    """One malformed packet of class ``kind`` that would otherwise be good for ``job``."""
    good = dict(job=job, worker=rng.randrange(workers), slot=rng.choice(slot_range),
                slot_version=version, op=rng.choice(OPS))
    P = params.lanes
    if kind == "magic":
        return data_packet(rng, params, **good, magic=rng.choice([0, 0x46, 0x48, 0xFF]))
    if kind == "version":
        return data_packet(rng, params, **good, version=rng.choice([0, 2, 255]))
    if kind == "type":
        return data_packet(rng, params, **{**good, "op": rng.choice([0, 1, 4, 255])})
    if kind == "job_beyond":
        return data_packet(rng, params, **{**good, "job": rng.randrange(params.jobs, 256)})
    if kind == "job_unconfigured":
        if unconfigured_job is None:
            return data_packet(rng, params, **{**good, "job": rng.randrange(params.jobs, 256)})
        return data_packet(rng, params, **{**good, "job": unconfigured_job})
    if kind == "worker":
        return data_packet(rng, params, **{**good, "worker": rng.choice(
            [workers, rng.randrange(workers, 256), 255])})
    if kind == "slot":
        outside = [s for s in (slot_range.start - 1, slot_range.stop, slot_range.stop + 3,
                               params.slots, 0xFFFF) if 0 <= s <= 0xFFFF
                   and s not in slot_range]
        return data_packet(rng, params, **{**good, "slot": rng.choice(outside)})
    if kind == "slot_version":      # only 0 and 1 exist (aggregator-protocol.md section 2)
        return data_packet(rng, params, **{**good, "slot_version": rng.choice(
            [2, 3, rng.randrange(2, 256), 255])})
    if kind == "count":
        return data_packet(rng, params, **good,
                           count=rng.choice([0, P - 1, P + 1, P - 8, P + 8, 0xFFFF_FFFF]))
    if kind == "short_payload":     # tlast one or more beats early
        image = data_packet(rng, params, **good)
        return image[:32 + 32 * rng.randrange(1, P // 8)] if P > 8 else image[:32]
    if kind == "long_payload":      # tlast one or more beats late
        return data_packet(rng, params, **good) + random_payload(rng, 8 * rng.randrange(1, 3))
    if kind == "header_only":
        return data_packet(rng, params, **good)[:32]
    if kind == "partial_word":      # not a whole number of 32-bit words
        image = data_packet(rng, params, **good)
        return image[:len(image) - rng.randrange(1, 4)]
    if kind == "partial_beat":      # whole words, but the last beat is not full
        image = data_packet(rng, params, **good)
        return image[:len(image) - 4 * rng.randrange(1, 8)]
    if kind == "tiny":              # fewer bytes than a header: a length error
        return data_packet(rng, params, **good)[:rng.randrange(1, 32)]
    if kind == "bad_and_short":     # two faults: the higher-priority one counts
        image = data_packet(rng, params, **{**good, "worker": workers})
        return image[:len(image) - 32]
    raise ValueError(f"unknown bad packet class {kind!r}")


def partial_middle_beat(rng, params: EngineParams, *, job, workers, slot_range, version=0):
    """A packet good in every way but one: a beat other than the last (the header beat, or
    a payload beat) whose tkeep is not all ones, as ``(data, keep, last)`` beats. Its bytes
    are all there (``data``), only ``keep`` says some are not."""
    image = data_packet(rng, params, job=job, worker=rng.randrange(workers),
                        slot=rng.choice(slot_range), slot_version=version,
                        op=rng.choice(OPS))
    beats = [[int.from_bytes(image[i:i + 32], "little"), (1 << 32) - 1, i + 32 == len(image)]
             for i in range(0, len(image), 32)]
    bad = rng.randrange(len(beats) - 1)
    beats[bad][1] = rng.choice([0, (1 << 28) - 1, rng.getrandbits(32) & ~1])
    return [tuple(beat) for beat in beats]


def _configure_fields(step):
    """``(job, workers, slot_base, slot_count, upstream)`` of a ``configure`` step."""
    job, workers, base, count, upstream = (tuple(step[1:]) + (None,))[:5]
    return job, workers, base, count, upstream


def configure_writes(step):
    """The register writes that carry out a ``configure`` step, the commit last: the job's
    upstream registers (zero for none, so an old upstream goes) and its job registers."""
    job, workers, base, count, upstream = _configure_fields(step)
    up = dataclasses.astuple(upstream) if upstream is not None else (0, 0, 0, 0)
    up_regs, job_regs = SWITCH_REGISTERS["upstream"], SWITCH_REGISTERS["job"]
    return ([(up_regs.address(job, f), v) for f, v in zip(("ip", "port", "job", "worker"), up)]
            + [(job_regs.address(job, f), v) for f, v in (
                ("workers", workers), ("slot_base", base), ("slot_count", count),
                ("commit", COMMIT))])


def configure_model(model, step):
    """Carry out a ``configure`` step on an :class:`~host.golden.aggregator.AggregatorModel`."""
    job, workers, base, count, upstream = _configure_fields(step)
    if workers:
        model.configure_job(job, workers, base, count, upstream)
    else:
        model.clear_job(job)


def configure_steps(params: EngineParams, worker_counts):
    """Configure job ``j`` with ``worker_counts[j]`` workers on equal slices of the pool."""
    steps, share = [], params.slots // len(worker_counts)
    for job, workers in enumerate(worker_counts):
        steps.append(("configure", job, workers, job * share, share))
    return steps


def protocol_traffic(rng, params: EngineParams, *, jobs, packets, duplicate=0.05, bad=0.0,
                     mixed=0.0, slots_per_job=None):
    """Workers following the SwitchML protocol, several slots and jobs interleaved.

    ``jobs`` maps job -> (workers, slot_range). Each (job, slot) runs rounds: every worker
    contributes once to the current version in a random order, rounds of different slots
    interleave at random, and a slot reused for the next round alternates its version.
    Each round picks ADD or OR at random. With the given probabilities a step instead
    re-sends an earlier packet (a retransmission, answered or dropped), sends a malformed
    packet, or sends a contribution with the other op (mixed_op while a round is open).
    """
    rounds = {}
    for job, (workers, slot_range) in jobs.items():
        chosen = list(slot_range) if slots_per_job is None else rng.sample(
            list(slot_range), min(slots_per_job, len(slot_range)))
        for slot in chosen:
            rounds[(job, slot)] = {"version": rng.randrange(2), "pending": None, "op": None}
    keys = list(rounds)
    sent, steps = [], []
    unconfigured = [j for j in range(params.jobs) if j not in jobs]
    while len(steps) < packets:
        r = rng.random()
        if sent and r < duplicate:
            steps.append(("packet", rng.choice(sent[-64:])))
            continue
        job, slot = rng.choice(keys)
        workers, slot_range = jobs[job]
        state = rounds[(job, slot)]
        if r < duplicate + bad:
            kind = rng.choice(BAD_CLASSES)
            steps.append(("packet", bad_packet(
                rng, params, kind, job=job, workers=workers, slot_range=slot_range,
                unconfigured_job=rng.choice(unconfigured) if unconfigured else None,
                version=state["version"])))
            continue
        if state["pending"] is None or not state["pending"]:
            if state["pending"] is not None:
                state["version"] ^= 1
            state["pending"] = list(range(workers))
            rng.shuffle(state["pending"])
            state["op"] = rng.choice(OPS)
        opened = len(state["pending"]) < workers
        op = state["op"]
        if opened and r < duplicate + bad + mixed:
            op = OPS[1 - OPS.index(op)]           # dropped; the worker stays pending
            worker = rng.choice(state["pending"])
        else:
            worker = state["pending"].pop()
        if rng.random() < 0.02:   # a version other than 0 or 1: dropped, changes nothing
            steps.append(("packet", data_packet(rng, params, job=job, worker=worker,
                                                slot=slot, op=op,
                                                slot_version=2 + rng.randrange(254))))
        image = data_packet(rng, params, job=job, worker=worker, slot=slot,
                            slot_version=state["version"], op=op,
                            exponent=rng.choice([None, rng.randrange(-4, 5)]))
        sent.append(image)
        steps.append(("packet", image))
    return steps


def hammer_traffic(rng, params: EngineParams, *, job, workers, slot, rounds):
    """All workers of one job hammering one slot back to back, version alternating."""
    steps, version = [], rng.randrange(2)
    for _ in range(rounds):
        op = rng.choice(OPS)
        order = list(range(workers))
        rng.shuffle(order)
        for worker in order:
            steps.append(("packet", data_packet(rng, params, job=job, worker=worker, slot=slot,
                                                slot_version=version, op=op)))
        version ^= 1
    return steps


def chaos_traffic(rng, params: EngineParams, *, job, workers, slot_range, packets):
    """Random worker, slot, version and op on a few slots: every state transition, the odd
    ones too (new rounds over stale bitmaps, retransmissions of old rounds, mixed ops)."""
    steps = []
    slots = list(slot_range)[:3]
    for _ in range(packets):
        steps.append(("packet", data_packet(
            rng, params, job=job, worker=rng.randrange(workers), slot=rng.choice(slots),
            slot_version=rng.randrange(2), op=rng.choice(OPS) if rng.random() < 0.2 else OPS[0],
            exponent=rng.randrange(-3, 3))))
    return steps


def tree_traffic(rng, params: EngineParams, *, job, workers, slot_range, packets):
    """A leaf's job (one with an upstream, aggregator-protocol.md section 4) in every state.

    Rounds open and complete on a few slots; between contributions come retransmissions
    (of pending rounds: sent upstream again; of final ones: answered), results from upstream
    as the network front end hands them on (``RESULT`` set, ``job`` the leaf's, ``worker``
    0xFF or a leaf worker's number, any payload and exponent) for pending rounds, again
    (duplicates), for open rounds and the other version (unexpected), and stale ones.
    What each does is the reference model's to say; the generator only makes sure every
    case comes up.
    """
    steps, sent = [], []
    slots = list(slot_range)[:3]
    state = {slot: {"version": rng.randrange(2), "left": [], "op": OPS[0]} for slot in slots}
    while len(steps) < packets:
        slot = rng.choice(slots)
        st = state[slot]
        r = rng.random()
        if r < 0.3:                   # a result from upstream, mostly for this round
            version = st["version"] if rng.random() < 0.8 else 1 - st["version"]
            header = Header(type=st["op"], flags=rng.choice([2, 2, 3, 6]), job=job,
                            worker=rng.choice([0xFF, 0xFF, rng.randrange(workers)]),
                            slot=slot, slot_version=version, count=params.lanes,
                            exponent=rng.randrange(-128, 128), seq=rng.getrandbits(32),
                            offset=rng.getrandbits(32), k=rng.randrange(256))
            image = Packet(header, random_payload(rng, params.lanes)).to_bytes()
            steps.append(("packet", image))
            if rng.random() < 0.3:
                steps.append(("packet", image))     # the same result twice
            continue
        if sent and r < 0.45:         # a retransmission (pending: upstream again)
            steps.append(("packet", rng.choice(sent[-12:])))
            continue
        if not st["left"]:
            st["version"] ^= 1
            st["left"] = list(range(workers))
            rng.shuffle(st["left"])
            st["op"] = rng.choice(OPS)
        image = data_packet(rng, params, job=job, worker=st["left"].pop(), slot=slot,
                            slot_version=st["version"], op=st["op"],
                            exponent=rng.randrange(-4, 5))
        sent.append(image)
        steps.append(("packet", image))
    return steps
