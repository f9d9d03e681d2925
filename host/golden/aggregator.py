"""Reference model of the switch aggregator (SwitchML-style slots with ADD / OR / MAX).

This is the behaviour contract of ``docs/switch-contract.md`` (spec:
``docs/protocol/aggregator-protocol.md`` section 2) written as executable Python: the gateware
aggregator is compared against :class:`AggregatorModel` packet for packet and counter for
counter. Everything below is normative for the comparison.

Parameters
----------
``slots`` (pool size, default 64), ``lanes`` P (32-bit lanes per packet, default 64, a
multiple of 8), ``max_workers`` (1..32, default 32), ``jobs`` (job configs, default 4).

Per-job configuration (control interface only; data packets never change it)
-----------------------------------------------------------------------------
:meth:`AggregatorModel.configure_job` ``(job, workers, slot_base, slot_count)``: the job
uses the absolute pool slots ``[slot_base, slot_base + slot_count)``. Configuring resets the
state of those slots (both versions: lanes, exponent, count, op, seen bits).
:meth:`AggregatorModel.clear_job` makes a job unconfigured (and resets its slots too, which
nobody can observe). The model rejects bad arguments and a range overlapping another
configured job's with ValueError; through the control registers the same configurations
are refused as the hardware refuses them (``JobStatus.REJECTED``, the job unconfigured).

Per data packet
---------------
Checks, in this priority order; the first that applies drops the whole packet, increments
``drop_<cause>`` and leaves every slot untouched:

1. ``bad_header``: magic != 0x47 or version != 1;
2. ``bad_type``: type is not AGG_ADD_I32 (2) or AGG_OR32 (3);
3. ``unconfigured_job``: job >= ``jobs`` or the job is not configured;
4. ``bad_worker``: worker >= the job's worker count n (so 0xFF too);
5. ``bad_slot``: slot (absolute pool index) outside the job's range;
6. ``bad_slot_version``: slot_version other than 0 or 1;
7. ``bad_count``: the header's count != P;
8. ``bad_length``: payload not exactly 4*P bytes (early or late tlast; a byte image that is
   not a whole number of 32-bit words is a length error too), or a beat other than the
   last whose tkeep is not all ones (:meth:`AggregatorModel.process_beats`). A byte image
   shorter than the 32-byte header counts as ``bad_length`` whatever its content;
9. ``mixed_op``: a new contribution whose op differs from the op of a round in progress on
   that (slot, version).

Every packet in counts in ``packets`` (dropped or not). Counters are 32-bit and wrap, like
the hardware's.

Then, with ``v = slot_version`` (0 or 1) and state per (slot, v): lanes[P] (u32),
exponent (s8), count (0..n), op, seen bitmap::

    if not seen[slot][v][w]:                       # new contribution
        if count not in (0, n) and op != packet op:  -> drop_mixed_op (no change)
        seen[slot][v][w] = 1; seen[slot][1-v][w] = 0
        if count in (0, n):                        # first contribution of a new round
            count = 1; lanes = payload; exponent = packet exponent; op = packet op
        else:
            count += 1; lanes = lanes (op) payload  # per lane: wrap-around ADD or OR
            exponent = max(exponent, packet exponent)   # signed
        accepted += 1
        if count == n: emit result (multicast), results_multicast += 1
    else:                                          # retransmission
        if count == n: emit result unicast to w, results_unicast += 1
        else: retransmit_dropped += 1 (no output)

With n == 1 every new contribution completes at once.

Result packet: the triggering packet's header with ``flags |= RESULT``, ``worker = 0xFF``
(multicast) or ``w`` (unicast), ``exponent`` = the aggregated exponent, ``count = P``;
payload = the P lanes (little-endian u32). Everything else (type, k, job, slot,
slot_version as received, seq, offset) is copied from the triggering packet; reserved bytes
are zero.

Trees (``docs/protocol/aggregator-protocol.md`` section 4)
---------------------------------------------------------
A job configured with an :class:`Upstream` is a leaf of the upstream's job. Then:

- a completion sends no result: it emits the aggregate upstream (the completing packet's
  header with ``RESULT`` clear, ``job`` / ``worker`` the upstream's job and this
  aggregator's worker number there, the aggregated exponent, ``count = P``; the stored
  lanes), counts ``upstream_sent``, and (slot, v) is *pending*;
- a retransmission for a pending (slot, v) emits that packet again (``upstream_resent``);
  only a *final* (slot, v) answers a retransmission with a unicast result;
- a packet with ``RESULT`` set is a result from upstream (the network front end passes on
  only those from the configured upstream, with ``job`` rewritten to the leaf's job; the
  ``bad_worker`` check does not apply to it): for a pending (slot, v) its lanes and
  exponent replace the stored ones, (slot, v) is final, ``results_upstream`` counts and the
  packet goes on as a multicast result (``worker = 0xFF``, ``count = P``, everything else
  as received); for a final one ``drop_result_duplicate``; otherwise (neither pending nor
  final, or a job without an upstream) ``drop_result_unexpected``. No state changes on a
  drop.

A job without an upstream completes final, so everything above section 4 is unchanged for
it, but for a packet with ``RESULT`` set, which it drops as ``result_unexpected``.

Control registers (:meth:`AggregatorModel.write` / :meth:`AggregatorModel.read`, the
gateware's ``ctrl_`` port): the map ``contract.registers.SWITCH_REGISTERS``, served as the
gateware serves it (a model commit takes no time, so ``JobStatus.BUSY`` never reads set).
"""
from __future__ import annotations

import copy
import dataclasses

import numpy as np

from contract.counters import AGG_COUNTERS, AGG_DROP_CAUSES
from contract.header import HEADER_BYTES, MAGIC, VERSION, WORKER_MULTICAST, Flags, Header, PacketType
from contract.packet import Packet
from contract.registers import (COMMIT, SWITCH_REGISTERS, JobStatus, switch_limits_word,
                                switch_params_word)

__all__ = ["AggregatorModel", "JobConfig", "Upstream", "AGG_OPS", "model_transport"]

#: Packet types the aggregator accepts and the per-lane operation of each.
AGG_OPS = {PacketType.AGG_ADD_I32: "add", PacketType.AGG_OR32: "or"}
_JOB_REGS = SWITCH_REGISTERS["job"]
_UPSTREAM_REGS = SWITCH_REGISTERS["upstream"]
_COUNTER_MASK = 0xFFFFFFFF
_NO_OP = 0   # op of a (slot, version) that has never had a contribution


@dataclasses.dataclass(frozen=True)
class Upstream:
    """A job's upstream aggregator (aggregator-protocol.md section 4).

    ``ip`` and ``port`` are the parent aggregator's address (its board's IPv4 address as an
    int, its port base + 2), ``job`` the parent's job number, ``worker`` this aggregator's
    worker number in that job. The engine itself uses ``job`` and ``worker`` only (they go
    into every packet it sends upstream); the network front end sends those packets to
    ``ip:port`` and takes results only from there.
    """
    ip: int
    port: int
    job: int
    worker: int

    def __post_init__(self):
        _check_int("upstream ip", self.ip, 1, _COUNTER_MASK)
        _check_int("upstream port", self.port, 1, 0xFFFF)
        _check_int("upstream job", self.job, 0, 0xFF)
        _check_int("upstream worker", self.worker, 0, 0xFF)

    @classmethod
    def from_registers(cls, ip: int, port: int, job: int, worker: int) -> "Upstream | None":
        """The upstream the ``upstream`` registers describe (None: ``ip`` or ``port`` 0)."""
        if ip == 0 or port == 0:
            return None
        return cls(ip, port, job, worker)


@dataclasses.dataclass(frozen=True)
class JobConfig:
    workers: int
    slot_base: int
    slot_count: int
    upstream: Upstream | None = None

    @property
    def slot_range(self) -> range:
        return range(self.slot_base, self.slot_base + self.slot_count)


class AggregatorModel:
    """The switch aggregator, one packet at a time (see the module docstring).

    Parameters
    ----------
    slots : int
        Slot pool size (1..65536: the header's slot field is 16 bits).
    lanes : int
        P, 32-bit lanes per packet (a positive multiple of 8).
    max_workers : int
        Width of the seen bitmap (1..32).
    jobs : int
        Number of job configurations (1..256: the header's job field is 8 bits).

    Attributes
    ----------
    counters : dict[str, int]
        Keys exactly ``contract.counters.AGG_COUNTERS``, in that order, starting at 0.
    """

    def __init__(self, *, slots: int = 64, lanes: int = 64, max_workers: int = 32,
                 jobs: int = 4):
        _check_int("slots", slots, 1, 1 << 16)
        _check_int("lanes", lanes, 8, 1 << 16)
        if lanes % 8:
            raise ValueError(f"lanes must be a multiple of 8 (one 256-bit beat holds 8), "
                             f"got {lanes}")
        _check_int("max_workers", max_workers, 1, 32)
        _check_int("jobs", jobs, 1, 256)
        if jobs > _JOB_REGS.count:
            raise ValueError(f"{jobs} jobs do not fit the register map's {_JOB_REGS.count}")
        self.slots, self.lanes, self.max_workers, self.jobs = slots, lanes, max_workers, jobs
        self.counters = {name: 0 for name in AGG_COUNTERS}
        self._configs: list[JobConfig | None] = [None] * jobs
        # pending job registers (workers, slot_base, slot_count) and last-commit status
        self._staged = [dict.fromkeys(("workers", "slot_base", "slot_count"), 0)
                        for _ in range(jobs)]
        self._staged_upstream = [dict.fromkeys(("ip", "port", "job", "worker"), 0)
                                 for _ in range(jobs)]
        self._rejected = [False] * jobs
        # state per (slot, version)
        self._lanes = np.zeros((slots, 2, lanes), dtype=np.uint32)
        self._exponent = np.zeros((slots, 2), dtype=np.int64)
        self._count = np.zeros((slots, 2), dtype=np.int64)
        self._op = np.zeros((slots, 2), dtype=np.int64)
        self._seen = np.zeros((slots, 2), dtype=np.int64)   # bit w = worker w
        # A complete (slot, version) of a job with an upstream is pending until the
        # upstream's result makes it final; a job without one completes final.
        self._final = np.zeros((slots, 2), dtype=bool)

    # -- configuration -------------------------------------------------------------------

    def configure_job(self, job: int, workers: int, slot_base: int, slot_count: int,
                      upstream: Upstream | None = None) -> None:
        """Configure ``job`` and reset the state of its slots.

        ``upstream`` makes the job a leaf of an upstream aggregator's job (section 4).
        Raises ValueError for a job number >= ``jobs``, workers outside 1..max_workers, an
        empty range, a range outside the pool, or one overlapping another configured job's.
        """
        if upstream is not None and not isinstance(upstream, Upstream):
            raise ValueError(f"upstream must be an Upstream or None, got {upstream!r}")
        _check_int("job", job, 0, self.jobs - 1)
        _check_int("workers", workers, 1, self.max_workers)
        _check_int("slot_count", slot_count, 1, self.slots)
        _check_int("slot_base", slot_base, 0, self.slots - slot_count)
        config = JobConfig(workers, slot_base, slot_count, upstream)
        for other, other_config in enumerate(self._configs):
            if other != job and other_config is not None:
                r = other_config.slot_range
                if slot_base < r.stop and r.start < slot_base + slot_count:
                    raise ValueError(f"slots {slot_base}..{slot_base + slot_count - 1} of job "
                                     f"{job} overlap job {other}'s {r.start}..{r.stop - 1}")
        self._reset_slots(config.slot_range)
        self._configs[job] = config

    def clear_job(self, job: int) -> None:
        """Make ``job`` unconfigured (its packets are then dropped as unconfigured_job)."""
        _check_int("job", job, 0, self.jobs - 1)
        config = self._configs[job]
        if config is not None:
            self._reset_slots(config.slot_range)
        self._configs[job] = None

    def job_config(self, job: int) -> JobConfig | None:
        _check_int("job", job, 0, self.jobs - 1)
        return self._configs[job]

    def _reset_slots(self, slot_range: range) -> None:
        s = slice(slot_range.start, slot_range.stop)
        self._lanes[s] = 0
        self._exponent[s] = 0
        self._count[s] = 0
        self._op[s] = _NO_OP
        self._seen[s] = 0
        self._final[s] = False

    # -- control registers ---------------------------------------------------------------

    def write(self, addr: int, value: int) -> None:
        """Write a control register (the gateware's ``ctrl_`` port, ``SWITCH_REGISTERS``).

        Writing :data:`~contract.registers.COMMIT` to a job's ``commit`` register configures
        the job from its pending workers, slot_base and slot_count (workers 0: clears it);
        a configuration the engine cannot take leaves the job unconfigured with
        ``JobStatus.REJECTED`` set, as the gateware does. Any other value does nothing.
        Writes to read-only or unmapped addresses are ignored, as by the hardware.
        """
        _check_int("addr", addr, 0, 0xFFFF)
        _check_int("value", value, 0, _COUNTER_MASK)
        decoded = SWITCH_REGISTERS.decode(addr)
        if decoded is None or decoded.index is None or decoded.index >= self.jobs:
            return
        job, field = decoded.index, decoded.register.name
        if decoded.entry is _UPSTREAM_REGS:
            self._staged_upstream[job][field] = value & ((1 << decoded.register.width) - 1)
            return
        if decoded.entry is not _JOB_REGS:
            return
        if field != "commit":
            self._staged[job][field] = value
        elif value == COMMIT:
            staged = self._staged[job]
            self._rejected[job] = False
            try:
                if staged["workers"] == 0:
                    self.clear_job(job)
                else:
                    self.configure_job(job, staged["workers"], staged["slot_base"],
                                       staged["slot_count"], Upstream.from_registers(
                                           **self._staged_upstream[job]))
            except ValueError:
                self.clear_job(job)
                self._rejected[job] = True

    def read(self, addr: int) -> int:
        """Read a control register: pending job registers, job status, counters,
        parameters; 0 where nothing is mapped."""
        _check_int("addr", addr, 0, 0xFFFF)
        decoded = SWITCH_REGISTERS.decode(addr)
        if decoded is None:
            return 0
        if decoded.counter is not None:
            return self.counters[decoded.counter] & _COUNTER_MASK
        if decoded.entry is SWITCH_REGISTERS["params"]:
            return switch_params_word(slots=self.slots, lanes=self.lanes)
        if decoded.entry is SWITCH_REGISTERS["limits"]:
            return switch_limits_word(jobs=self.jobs, max_workers=self.max_workers)
        job = decoded.index
        if job >= self.jobs:    # every commit to a job beyond the engine's is refused
            return JobStatus.REJECTED if decoded.register.name == "commit" else 0
        if decoded.entry is _UPSTREAM_REGS:
            return self._staged_upstream[job][decoded.register.name]
        if decoded.register.name == "commit":
            return JobStatus.REJECTED if self._rejected[job] else 0
        return self._staged[job][decoded.register.name]

    # -- data path -----------------------------------------------------------------------

    def process(self, packet: Packet | bytes | bytearray | memoryview) -> list[Packet]:
        """Feed one packet; return the 0 or 1 packets the engine emits for it."""
        data = packet.to_bytes() if isinstance(packet, Packet) else bytes(packet)
        return self._process(data, whole_beats=True)

    def process_beats(self, beats) -> list[Packet]:
        """Feed one packet given as its AXI-Stream beats ``(data, keep, last)`` (``data`` an
        int or 32 bytes); return what the engine emits.

        As in the gateware, the header is the first beat's whole ``tdata`` (unless it is the
        only beat: then its kept bytes, fewer than 32 being a ``bad_length``), the payload
        the bytes the later beats keep, and a beat other than the last whose ``tkeep`` is
        not all ones makes the packet a ``bad_length`` (after the header's causes).
        """
        image, whole = bytearray(), True
        beats = list(beats)
        for i, (beat, keep, last) in enumerate(beats):
            raw = beat.to_bytes(32, "little") if isinstance(beat, int) else bytes(beat)
            kept = i == 0 and len(beats) > 1
            image += raw if kept else bytes(raw[j] for j in range(32) if keep >> j & 1)
            if i < len(beats) - 1 and keep != (1 << 32) - 1:
                whole = False
        return self._process(bytes(image), whole_beats=whole)

    def _process(self, data: bytes, *, whole_beats: bool) -> list[Packet]:
        self._bump("packets")
        if len(data) < HEADER_BYTES:
            return self._drop("bad_length")
        header = Header.parse(data[:HEADER_BYTES])
        payload = data[HEADER_BYTES:]
        cause = self._check(header, len(payload) if whole_beats else -1)
        if cause is not None:
            return self._drop(cause)
        return self._fold(header, payload)

    def _check(self, header: Header, payload_bytes: int) -> str | None:
        """First drop cause that applies (priority order of AGG_DROP_CAUSES), or None.

        ``mixed_op`` needs the slot state and is checked in :meth:`_fold`.
        """
        if header.magic != MAGIC or header.version != VERSION:
            return "bad_header"
        if header.type not in AGG_OPS:
            return "bad_type"
        config = self._configs[header.job] if header.job < self.jobs else None
        if config is None:
            return "unconfigured_job"
        # A result from upstream numbers workers the upstream's way (section 4).
        if not header.flags & Flags.RESULT and header.worker >= config.workers:
            return "bad_worker"
        if header.slot not in config.slot_range:
            return "bad_slot"
        if header.slot_version not in (0, 1):
            return "bad_slot_version"
        if header.count != self.lanes:
            return "bad_count"
        if payload_bytes != 4 * self.lanes:
            return "bad_length"
        return None

    def _fold(self, header: Header, payload: bytes) -> list[Packet]:
        if header.flags & Flags.RESULT:
            return self._from_upstream(header, payload)
        config = self._configs[header.job]
        n, upstream = config.workers, config.upstream
        slot, v, w = header.slot, header.slot_version, header.worker
        bit = 1 << w
        count = int(self._count[slot, v])
        if not self._seen[slot, v] & bit:                       # new contribution
            if count not in (0, n) and self._op[slot, v] != header.type:
                return self._drop("mixed_op")
            values = np.frombuffer(payload, dtype="<u4").astype(np.uint32)
            self._seen[slot, v] |= bit
            self._seen[slot, 1 - v] &= ~bit
            if count in (0, n):                                 # first of a new round
                self._final[slot, v] = False
                self._count[slot, v] = 1
                self._lanes[slot, v] = values
                self._exponent[slot, v] = header.exponent
                self._op[slot, v] = header.type
            else:
                self._count[slot, v] = count + 1
                if header.type == PacketType.AGG_ADD_I32:
                    self._lanes[slot, v] += values               # uint32: wraps mod 2**32
                else:
                    self._lanes[slot, v] |= values
                self._exponent[slot, v] = max(int(self._exponent[slot, v]), header.exponent)
            self._bump("accepted")
            if self._count[slot, v] != n:
                return []
            if upstream is not None:                            # complete: now pending
                self._bump("upstream_sent")
                return [self._upstream_packet(header, slot, v, upstream)]
            self._final[slot, v] = True
            self._bump("results_multicast")
            return [self._result(header, slot, v, WORKER_MULTICAST)]
        if count == n and self._final[slot, v]:                 # retransmission
            self._bump("results_unicast")
            return [self._result(header, slot, v, w)]
        if count == n:                                          # pending: upstream again
            self._bump("upstream_resent")
            return [self._upstream_packet(header, slot, v, upstream)]
        self._bump("retransmit_dropped")
        return []

    def _from_upstream(self, header: Header, payload: bytes) -> list[Packet]:
        """A result from the job's upstream (the network front end has checked its source and
        put this job's number in ``job``): a pending (slot, v) takes its value and is final."""
        config = self._configs[header.job]
        slot, v = header.slot, header.slot_version
        complete = config.upstream is not None and self._count[slot, v] == config.workers
        if complete and self._final[slot, v]:
            return self._drop("result_duplicate")
        if not complete:
            return self._drop("result_unexpected")
        self._lanes[slot, v] = np.frombuffer(payload, dtype="<u4")
        self._exponent[slot, v] = header.exponent
        self._final[slot, v] = True
        self._bump("results_upstream")
        return [self._result(header, slot, v, WORKER_MULTICAST)]

    def _upstream_packet(self, header: Header, slot: int, v: int,
                         upstream: Upstream) -> Packet:
        """(slot, v)'s aggregate as a contribution to the upstream's job (section 4)."""
        up_header = header.replace(flags=int(header.flags) & ~int(Flags.RESULT),
                                   job=upstream.job, worker=upstream.worker,
                                   exponent=int(self._exponent[slot, v]), count=self.lanes)
        return Packet(up_header, self._lanes[slot, v].astype("<u4").tobytes())

    def _result(self, header: Header, slot: int, v: int, worker: int) -> Packet:
        result_header = header.replace(flags=int(header.flags) | int(Flags.RESULT), worker=worker,
                                       exponent=int(self._exponent[slot, v]),
                                       count=self.lanes)
        return Packet(result_header, self._lanes[slot, v].astype("<u4").tobytes())

    def _bump(self, name: str) -> None:
        self.counters[name] = (self.counters[name] + 1) & _COUNTER_MASK

    def _drop(self, cause: str) -> list[Packet]:
        assert f"drop_{cause}" in AGG_COUNTERS, cause
        self._bump(f"drop_{cause}")
        return []

    # -- inspection ----------------------------------------------------------------------

    def slot_state(self, slot: int, version: int) -> dict:
        """One (slot, version): lanes (uint32 copy), exponent, count, op (packet type or 0
        if never used), seen (bitmap as int), final (complete and final: a pending slot of
        a job with an upstream is complete but not final)."""
        _check_int("slot", slot, 0, self.slots - 1)
        _check_int("version", version, 0, 1)
        return {"lanes": self._lanes[slot, version].copy(),
                "exponent": int(self._exponent[slot, version]),
                "count": int(self._count[slot, version]),
                "op": int(self._op[slot, version]),
                "seen": int(self._seen[slot, version]),
                "final": bool(self._final[slot, version])}

    def state(self) -> dict:
        """A deep copy of everything but the counters (for before/after comparisons)."""
        return {"configs": list(self._configs), "staged": copy.deepcopy(self._staged),
                "staged_upstream": copy.deepcopy(self._staged_upstream),
                "rejected": list(self._rejected), "final": self._final.copy(),
                "lanes": self._lanes.copy(), "exponent": self._exponent.copy(),
                "count": self._count.copy(), "op": self._op.copy(), "seen": self._seen.copy()}

    @staticmethod
    def states_equal(a: dict, b: dict) -> bool:
        """Compare two :meth:`state` snapshots exactly."""
        return a.keys() == b.keys() and all(
            np.array_equal(a[k], b[k]) if isinstance(a[k], np.ndarray) else a[k] == b[k]
            for k in a)


def model_transport(model: AggregatorModel):
    """A transport callable over the model: ``send(packets) -> emitted packets`` in order."""
    def send(packets):
        out = []
        for p in packets:
            out.extend(model.process(p))
        return out
    return send


def _check_int(name, value, lo, hi):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in {lo}..{hi}, got {value}")
