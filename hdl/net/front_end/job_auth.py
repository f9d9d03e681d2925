"""Section 7's authenticated jobs on the switch's path: tags checked, replays dropped,
results tagged.

``docs/protocol/network.md`` section 7, **Jobs**: a job configured with authentication has
a 128-bit job key derived from the control key, its job number and an ``epoch``
(``SipHash-2-4(control key, "gwjobkey" job 0 epoch 00 00) || ... job 1 ...``). Every
``AGG_*`` datagram of the job carries a SipHash-2-4 tag under that key in header bytes
24..31 (computed with them zero), and so does every result the board sends for it. A
per-(slot, worker) replay filter drops a tagged data packet whose ``seq`` is below the last
that passed for its slot from its worker.

:class:`JobGate` stands between the switch's input buffer (in its ``hold`` mode) and the
engine, with one :class:`~hdl.crypto.siphash.SipHash24`::

    DECIDE   a datagram's header: its job has authentication (and it is a data packet at
             least a header long)? its (slot, worker) entry of the replay filter is read
    HASH     its words through SipHash (header word 3 as zero), taken from the buffer at
             SipHash's pace (a word every 2 clocks: 300 MB/s at 75 MHz)
    TAG      the tag compared: wrong -> released (``bad_tag``); a ``seq`` below the
             entry's -> released (``replay``); else the entry becomes the ``seq`` and the
             buffer reads the datagram ``again``
    FORWARD  the datagram to the engine, a beat a clock, then released

A datagram of a job without authentication goes straight to FORWARD. Between datagrams
the gate applies the jobs' commits (:data:`~hdl.net.front_end.job_workers.JobCommit`): it
clears the job's filter entries (its slot range, every worker: one a clock) and derives its
key with the same SipHash (two messages of 16 bytes, about 24 clocks), so the filter and
the keys change only between datagrams.

:class:`ResultSeal` stands between the switch's output buffer and the fan-out, with a
SipHash of its own: a result of a job with authentication is read once into it (two
32-bit words a SipHash word), then sent (and replayed to each worker) with its tag in
bytes 24..31. The results of jobs without authentication pass as they are.

Not here yet: the upstream keys of trees (``upstream_key``, wrapped writes), so a tree's
aggregates up and its parent's results are neither tagged nor checked (the board's
``auth_features`` register says so).
"""
from __future__ import annotations

import dataclasses

from amaranth import Array, C, Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from contract.header import HEADER_BYTES, HEADER_FIELDS
from contract.network import CTRL_TAG_OFFSET, JOB_KEY_LABEL
from hdl.crypto.siphash import KEY_BITS, TAG_BITS, SipHash24
from hdl.net.front_end.ctrl_auth import CtrlAuth, check_auth_key
from hdl.net.front_end.fanout import ResultTag
from hdl.net.front_end.job_workers import JobCommit
from hdl.net.front_end.layouts import ServiceBeat, egress_word
from hdl.net.front_end.registers import JobAuthRegister
from hdl.net.front_end.source_check import RESULT_BIT
from hdl.switch.control import ActiveJob

__all__ = ["JobKey", "JobAuthEvents", "JobGate", "ResultSeal"]

_FIELDS = {f.name: f for f in HEADER_FIELDS}
_TAG_WORD = CTRL_TAG_OFFSET // 8          # header word 3: the tag, hashed as zero
assert CTRL_TAG_OFFSET % 8 == 0

#: A job's authentication as applied: on, and the derived key (byte 0 in bits 7..0).
JobKey = data.StructLayout({"on": 1, "key": KEY_BITS})
#: One strobe each per datagram the gate drops.
JobAuthEvents = data.StructLayout({"bad_tag": 1, "replay": 1})


def _field(value, name):
    """Header field ``name`` of the header beat ``value`` (little-endian)."""
    f = _FIELDS[name]
    return value[8 * f.offset:8 * (f.offset + f.size)]


@dataclasses.dataclass(frozen=True)
class _CommitWork:
    """What the commit states of :class:`JobGate` work with."""
    siphash: SipHash24
    write: object
    keys: object
    t: Signal
    t_enable: Signal
    t_epoch: Signal
    half: Signal
    derived: Signal
    clear_slot: Signal
    clear_end: Signal
    clear_worker: Signal
    slot_bits: int
    worker_bits: int
    job_bits: int


def _check_sizes(who, jobs, slots, max_workers):
    for name, value, top in (("jobs", jobs, 64), ("slots", slots, 1 << 16),
                             ("max_workers", max_workers, 32)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
            raise ValueError(f"{who} {name} must be 1..{top}, not {value!r}")


class JobGate(wiring.Component):
    """Checks the tags and ``seq`` of the data packets of jobs with authentication.

    Parameters
    ----------
    key : bytes
        The board's 128-bit control key (16 bytes), which the job keys derive from.
    jobs, slots, max_workers : int
        The switch's (the replay filter has an entry per slot and worker).

    Members
    -------
    i : In(stream.Signature(ServiceBeat))
        The switch's input buffer's datagrams (``IngressBuffer(hold=True)``).
    again, release : Out(1)
        To that buffer: read the datagram once more / free it (strobes).
    o : Out(stream.Signature(ServiceBeat))
        To the engine.
    pending : In(ArrayLayout(JobAuthRegister, jobs))
        The ``job_auth`` registers as written.
    commit : In(JobCommit)
        The switch's commits (:class:`~hdl.net.front_end.job_workers.JobWorkers`).
    active : In(ArrayLayout(ActiveJob, jobs))
        The jobs' active slot ranges.
    keys : Out(ArrayLayout(JobKey, jobs))
        The jobs' authentication as applied (for :class:`ResultSeal`).
    events : Out(JobAuthEvents)
    """

    def __init__(self, *, key, jobs, slots, max_workers):
        self._key = check_auth_key(key)
        _check_sizes("JobGate", jobs, slots, max_workers)
        self.jobs, self.slots, self.max_workers = jobs, slots, max_workers
        super().__init__({
            "i": In(stream.Signature(ServiceBeat)),
            "again": Out(1),
            "release": Out(1),
            "o": Out(stream.Signature(ServiceBeat)),
            "pending": In(data.ArrayLayout(JobAuthRegister, jobs)),
            "commit": In(JobCommit),
            "active": In(data.ArrayLayout(ActiveJob, jobs)),
            "keys": Out(data.ArrayLayout(JobKey, jobs)),
            "events": Out(JobAuthEvents),
        })

    def __repr__(self):
        return f"JobGate(jobs={self.jobs}, key=<secret>)"

    def elaborate(self, platform):
        m = Module()
        i, o = self.i, self.o
        J = self.jobs
        job_bits = max(1, (J - 1).bit_length())
        worker_bits = max(1, (self.max_workers - 1).bit_length())
        slot_bits = max(1, (self.slots - 1).bit_length())

        m.submodules.siphash = siphash = SipHash24()
        hash_key = Signal(KEY_BITS)
        m.d.comb += [siphash.key.valid.eq(1), siphash.key.p.eq(hash_key)]
        control_key = int.from_bytes(self._key, "little")

        # The replay filter: per (slot, worker) whether a seq passed since the slot's job's
        # commit, and the last that did.
        entry_layout = data.StructLayout({"valid": 1, "seq": 32})
        m.submodules.filter = memory = Memory(shape=entry_layout,
                                              depth=1 << (slot_bits + worker_bits), init=[])
        read = memory.read_port()
        write = memory.write_port()

        m.d.sync += [self.events.eq(0), self.again.eq(0), self.release.eq(0)]

        # -- the commits: taken as the switch grants them, applied between datagrams ------
        task = Signal(J)                  # commits not yet applied
        task_enable = Signal(J)
        task_epoch = Array(Signal(32, name=f"task_epoch{j}") for j in range(J))
        with m.If(self.commit.done & (self.commit.job < J)):
            job = self.commit.job[:job_bits]
            m.d.sync += [task.bit_select(job, 1).eq(1),
                         task_enable.bit_select(job, 1).eq(
                             self.pending[job].enable & self.commit.configured),
                         task_epoch[job].eq(self.pending[job].epoch)]
        keys = self.keys
        t = Signal(job_bits)              # the job whose commit is being applied
        t_enable = Signal()
        t_epoch = Signal(32)
        half = Signal()                   # which half of the job key is being derived
        derived = Signal(64)
        clear_slot = Signal(17)
        clear_end = Signal(17)
        clear_worker = Signal(worker_bits)
        next_task = Signal(job_bits)
        for j in reversed(range(J)):
            with m.If(task[j]):
                m.d.comb += next_task.eq(j)

        # -- the datagram in hand ----------------------------------------------------------
        d_job = Signal(8)
        d_worker = Signal(8)
        d_slot = Signal(16)
        d_seq = Signal(32)
        d_carried = Signal(64)
        d_length = Signal(16)
        d_result = Signal()
        word = Signal(16)                 # SipHash word of the message being fed
        in_filter = Signal()
        known = d_job < J
        job_now = keys[d_job[:job_bits]]
        span = self.active[d_job[:job_bits]] if J > 1 else self.active[0]
        m.d.comb += read.addr.eq(Cat(d_worker[:worker_bits], d_slot[:slot_bits]))
        entry = data.View(entry_layout, read.data)

        with m.FSM():
            with m.State("IDLE"):
                with m.If(task != 0):
                    m.d.sync += [
                        t.eq(next_task), task.bit_select(next_task, 1).eq(0),
                        t_enable.eq(task_enable.bit_select(next_task, 1)),
                        t_epoch.eq(task_epoch[next_task]),
                        keys[next_task].on.eq(0), half.eq(0), hash_key.eq(control_key),
                        clear_slot.eq(self.active[next_task].base),
                        clear_end.eq(self.active[next_task].end), clear_worker.eq(0),
                    ]
                    m.next = "CLEAR"
                with m.Elif(i.valid):
                    header = i.p.data
                    m.d.sync += [
                        d_job.eq(_field(header, "job")), d_worker.eq(_field(header, "worker")),
                        d_slot.eq(_field(header, "slot")), d_seq.eq(_field(header, "seq")),
                        d_carried.eq(header.word_select(_TAG_WORD, 64)),
                        d_length.eq(i.p.meta.length),
                        d_result.eq(_field(header, "flags")[RESULT_BIT]),
                    ]
                    m.next = "DECIDE"
            self._commit_states(m, _CommitWork(
                siphash=siphash, write=write, keys=keys, t=t, t_enable=t_enable,
                t_epoch=t_epoch, half=half, derived=derived, clear_slot=clear_slot,
                clear_end=clear_end, clear_worker=clear_worker, slot_bits=slot_bits,
                worker_bits=worker_bits, job_bits=job_bits))
            with m.State("DECIDE"):
                # the filter's entry is read here; the job's key loaded for SipHash
                m.d.comb += read.en.eq(1)
                m.d.sync += [
                    hash_key.eq(job_now.key), word.eq(0),
                    in_filter.eq(known & (span.base <= d_slot) & (d_slot < span.end)
                                 & (d_worker < self.max_workers)),
                ]
                with m.If(known & job_now.on & (d_length >= HEADER_BYTES) & ~d_result):
                    m.next = "HASH"
                with m.Else():
                    m.next = "FORWARD"
            with m.State("HASH"):
                # (the control service's feed: header word 3 as zero, the last word's bytes)
                last_word = CtrlAuth._feed(m, siphash, i.p.data, d_length, word)
                m.d.comb += siphash.i.valid.eq(i.valid)
                with m.If(i.valid & siphash.i.ready):
                    m.d.sync += word.eq(word + 1)
                    with m.If(last_word | (word[:2] == 3)):
                        m.d.comb += i.ready.eq(1)       # the beat's last word is taken
                    with m.If(last_word):
                        m.next = "TAG"
            with m.State("TAG"):
                m.d.comb += siphash.o.ready.eq(1)
                with m.If(siphash.o.valid):
                    with m.If(siphash.o.p != d_carried):
                        m.d.sync += [self.events.bad_tag.eq(1), self.release.eq(1)]
                        m.next = "IDLE"
                    with m.Elif(in_filter & entry.valid & (d_seq < entry.seq)):
                        m.d.sync += [self.events.replay.eq(1), self.release.eq(1)]
                        m.next = "IDLE"
                    with m.Else():
                        with m.If(in_filter):
                            m.d.comb += [write.addr.eq(read.addr), write.en.eq(1),
                                         write.data.eq(Cat(1, d_seq))]
                        m.d.sync += self.again.eq(1)
                        m.next = "FORWARD"
            with m.State("FORWARD"):
                m.d.comb += [o.valid.eq(i.valid), o.p.eq(i.p), i.ready.eq(o.ready)]
                with m.If(i.valid & o.ready & i.p.last):
                    m.d.sync += self.release.eq(1)
                    m.next = "SETTLE"
            with m.State("SETTLE"):
                # the release reaches the buffer: its next datagram is not yet out
                m.next = "IDLE"
        return m


    @staticmethod
    def _commit_states(m, w):
        """The states that apply a commit (entered from IDLE with ``w.t`` the job): its
        filter entries cleared, then (with authentication) its key derived."""
        siphash, write, keys = w.siphash, w.write, w.keys
        t, t_enable, t_epoch, half, derived = w.t, w.t_enable, w.t_epoch, w.half, w.derived
        clear_slot, clear_end, clear_worker = w.clear_slot, w.clear_end, w.clear_worker
        slot_bits, worker_bits, job_bits = w.slot_bits, w.worker_bits, w.job_bits
        with m.State("CLEAR"):
            # the job's slot range, every worker of each slot (an unconfigured job's
            # range is empty)
            with m.If(clear_slot < clear_end):
                m.d.comb += [write.addr.eq(Cat(clear_worker, clear_slot[:slot_bits])),
                             write.data.eq(0), write.en.eq(1)]
                m.d.sync += clear_worker.eq(clear_worker + 1)
                with m.If(clear_worker == (1 << worker_bits) - 1):
                    m.d.sync += clear_slot.eq(clear_slot + 1)
            with m.Elif(t_enable):
                m.next = "DERIVE_LABEL"
            with m.Else():
                m.next = "IDLE"
        with m.State("DERIVE_LABEL"):
            m.d.comb += [siphash.i.valid.eq(1),
                         siphash.i.p.data.eq(int.from_bytes(JOB_KEY_LABEL, "little")),
                         siphash.i.p.bytes.eq(8), siphash.i.p.last.eq(0)]
            with m.If(siphash.i.ready):
                m.next = "DERIVE_JOB"
        with m.State("DERIVE_JOB"):
            # the job (1 byte), the half (1 byte), the epoch (4 bytes), 2 zero bytes
            m.d.comb += [siphash.i.valid.eq(1),
                         siphash.i.p.data.eq(Cat(t, C(0, 8 - job_bits), half, C(0, 7),
                                                 t_epoch, C(0, 16))),
                         siphash.i.p.bytes.eq(8), siphash.i.p.last.eq(1)]
            assert job_bits <= 8
            with m.If(siphash.i.ready):
                m.next = "DERIVE_TAG"
        with m.State("DERIVE_TAG"):
            m.d.comb += siphash.o.ready.eq(1)
            with m.If(siphash.o.valid):
                with m.If(~half):
                    m.d.sync += [derived.eq(siphash.o.p), half.eq(1)]
                    m.next = "DERIVE_LABEL"
                with m.Else():
                    m.d.sync += [keys[t].key.eq(Cat(derived, siphash.o.p)),
                                 keys[t].on.eq(1)]
                    m.next = "IDLE"


class ResultSeal(wiring.Component):
    """Tags the results of jobs with authentication on their way to the workers.

    Parameters
    ----------
    jobs : int
        The switch's.

    Members
    -------
    i : In(stream.Signature(egress_word(ResultTag)))
        The switch's output buffer's results.
    replay : Out(1)
        To that buffer (sampled at a result's last word): send it again.
    o : Out(stream.Signature(egress_word(ResultTag)))
        To the fan-out: the results, tagged where their job has authentication.
    o_replay : In(1)
        The fan-out's ``replay``.
    keys : In(ArrayLayout(JobKey, jobs))
        The jobs' authentication (:class:`JobGate`'s).
    """

    def __init__(self, *, jobs):
        _check_sizes("ResultSeal", jobs, 1, 1)
        self.jobs = jobs
        super().__init__({
            "i": In(stream.Signature(egress_word(ResultTag))),
            "replay": Out(1),
            "o": Out(stream.Signature(egress_word(ResultTag))),
            "o_replay": In(1),
            "keys": In(data.ArrayLayout(JobKey, jobs)),
        })

    def elaborate(self, platform):
        m = Module()
        i, o = self.i, self.o
        J = self.jobs
        job_bits = max(1, (J - 1).bit_length())
        m.submodules.siphash = siphash = SipHash24()
        hash_key = Signal(KEY_BITS)
        m.d.comb += [siphash.key.valid.eq(1), siphash.key.p.eq(hash_key)]

        keys = self.keys
        tag = Signal(TAG_BITS)
        sealed = Signal()                 # the result in hand carries `tag`
        index = Signal(16)                # its 32-bit word going out
        low = Signal(32)                  # a SipHash word's first half
        pair = Signal(15)                 # SipHash word being fed
        high_half = Signal()              # the word on `i` is a SipHash word's second half

        tag_words = (CTRL_TAG_OFFSET // 4, CTRL_TAG_OFFSET // 4 + 1)
        m.d.comb += [
            o.p.eq(i.p),
            o.p.data.eq(Mux(sealed & (index == tag_words[0]), tag[:32],
                            Mux(sealed & (index == tag_words[1]), tag[32:], i.p.data))),
        ]
        with m.FSM():
            with m.State("IDLE"):
                job = i.p.tag.job
                with m.If(i.valid):
                    on = (job < J) & keys[job[:job_bits]].on & ~i.p.tag.upstream \
                        & (i.p.length >= HEADER_BYTES)
                    m.d.sync += [hash_key.eq(keys[job[:job_bits]].key), sealed.eq(0),
                                 index.eq(0), pair.eq(0), high_half.eq(0)]
                    with m.If(on):
                        m.next = "HASH"
                    with m.Else():
                        m.next = "PASS"
            with m.State("HASH"):
                # two 32-bit words to a SipHash word; word 3 (the tag's place) as zero; a
                # result's length is whole 32-bit words, so its last SipHash word may be
                # half of one
                value = Mux(pair == _TAG_WORD, 0, Mux(high_half, Cat(low, i.p.data),
                                                      Cat(i.p.data, C(0, 32))))
                feed = high_half | i.p.last
                m.d.comb += [
                    siphash.i.p.data.eq(value),
                    siphash.i.p.bytes.eq(Mux(high_half, 8, 4)),
                    siphash.i.p.last.eq(i.p.last),
                    siphash.i.valid.eq(i.valid & feed),
                    i.ready.eq(Mux(feed, siphash.i.ready, 1)),
                    self.replay.eq(1),           # read it again, to send it
                ]
                with m.If(i.valid & i.ready):
                    m.d.sync += [low.eq(i.p.data), high_half.eq(~high_half)]
                    with m.If(feed):
                        m.d.sync += [pair.eq(pair + 1), high_half.eq(0)]
                    with m.If(i.p.last):
                        m.next = "TAG"
            with m.State("TAG"):
                m.d.comb += siphash.o.ready.eq(1)
                with m.If(siphash.o.valid):
                    m.d.sync += [tag.eq(siphash.o.p), sealed.eq(1)]
                    m.next = "PASS"
            with m.State("PASS"):
                m.d.comb += [o.valid.eq(i.valid), i.ready.eq(o.ready),
                             self.replay.eq(self.o_replay)]
                with m.If(i.valid & o.ready):
                    m.d.sync += index.eq(index + 1)
                    with m.If(i.p.last):
                        m.d.sync += index.eq(0)
                        with m.If(~self.o_replay):
                            m.next = "IDLE"
        return m
