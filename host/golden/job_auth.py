"""Authenticated jobs, the network front end's side (``docs/protocol/network.md`` section 7,
**Jobs**), as the golden board keeps them.

A job with authentication has a 128-bit **job key** derived from the board's control key,
the job and an ``epoch`` (:func:`host.golden.siphash.job_key`; never sent). Its ``AGG_*``
datagrams and the results the board sends for it carry a SipHash-2-4 tag under that key in
header bytes 24..31. Before the aggregator sees a tagged data packet, a replay filter per
(slot, worker) keeps the ``seq`` of the last packet that passed and drops one with a lower
``seq``: a worker sends a slot's next chunk only once the result of its last one is in,
so its genuine packets to a slot (first sends and resends alike) never go back, while the
replay of a (slot, version)'s earlier use carries a ``seq`` at least ``S`` lower. (Slots
move on independently: a worker's chunk stuck on one slot may be far behind what it sends
to the others, so no one window per worker would do.)

:class:`JobAuthTable` holds the pending and the active state of every job
(``contract.registers.AUTH_REGISTERS`` ``job_auth[j]``): the job's commit applies what was
written and forgets the job's filter, so a new epoch starts clean and makes every packet
of the old one worthless.
"""
from __future__ import annotations

import dataclasses

from contract.header import HEADER_FIELDS, HEADER_BYTES

from .siphash import check_tag, job_key, tag_datagram

__all__ = ["JobAuth", "JobAuthTable", "REPLAY", "PASSED"]

_SEQ, _SLOT = (next(f for f in HEADER_FIELDS if f.name == name) for name in ("seq", "slot"))

#: verdicts of :meth:`JobAuthTable.filter` (a drop's is its counter's name)
PASSED, REPLAY = "passed", "drop_replay"


@dataclasses.dataclass(frozen=True)
class JobAuth:
    """One job's authentication as committed: its epoch and derived key."""
    epoch: int
    key: bytes


class JobAuthTable:
    """Every job's authentication registers and replay filters.

    Parameters
    ----------
    control_key : bytes
        The board's 16-byte control key (section 7); the job keys derive from it.
    jobs : int
        Jobs the board serves: registers of jobs beyond read 0 and ignore writes.
    """

    def __init__(self, control_key: bytes, jobs: int):
        if not isinstance(control_key, bytes) or len(control_key) != 16:
            raise ValueError("authenticated jobs need section 7's 16-byte control key")
        self._control_key = control_key
        self.jobs = jobs
        #: job -> {"enable", "epoch", "word0".."word3"} as written (the upstream key's
        #: words unwrapped), applied by the job's commit
        self._pending = [dict(enable=0, epoch=0, word0=0, word1=0, word2=0, word3=0)
                         for _ in range(jobs)]
        #: job -> the job key of its upstream's job (aggregator-protocol.md section 4)
        self._upstream_keys: dict[int, bytes] = {}
        #: job -> JobAuth for a committed job with authentication
        self._active: dict[int, JobAuth] = {}
        #: (job, worker, slot) -> the seq of the last data packet that passed the filter
        self._last: dict[tuple[int, int, int], int] = {}

    # -- registers -----------------------------------------------------------------------

    def register(self, job: int, field: str) -> int:
        """``job_auth[job].field`` as written (0 for a job beyond the board's, and for the
        upstream key's words, which never read back)."""
        if not 0 <= job < self.jobs or field.startswith("word"):
            return 0
        return self._pending[job][field]

    def set_register(self, job: int, field: str, value: int) -> None:
        """Write ``job_auth[job].field`` (applied by the job's commit)."""
        if 0 <= job < self.jobs:
            self._pending[job][field] = value

    def commit(self, job: int, configured: bool = True) -> None:
        """The job's commit: its pending registers become what the front end checks (for a
        job the commit ``configured``; an unconfigured job has none), and its replay filter
        starts empty."""
        if not 0 <= job < self.jobs:
            return
        pending = self._pending[job]
        if configured and pending["enable"] & 1:
            self._active[job] = JobAuth(pending["epoch"],
                                        job_key(self._control_key, job, pending["epoch"]))
        else:
            self._active.pop(job, None)
        words = [pending[f"word{i}"] for i in range(4)]
        if configured and any(words):
            self._upstream_keys[job] = b"".join(w.to_bytes(4, "little") for w in words)
        else:
            self._upstream_keys.pop(job, None)
        for key in [k for k in self._last if k[0] == job]:
            del self._last[key]

    def upstream_key(self, job: int) -> bytes | None:
        """The job key of ``job``'s upstream (its packets up and the parent's results are
        tagged under it), or None (no key: untagged)."""
        return self._upstream_keys.get(job)

    def active(self, job: int) -> JobAuth | None:
        """The job's authentication, or None (a job without it, or not committed)."""
        return self._active.get(job)

    # -- datagrams -----------------------------------------------------------------------

    def check_tag(self, job: int, data: bytes) -> bool:
        """Whether ``data`` (a datagram of the authenticated ``job``) carries its tag under
        the job key. Checked before anything else: a wrong tag changes nothing."""
        return check_tag(self._active[job].key, data)

    def filter(self, job: int, worker: int, data: bytes, slots: range) -> str:
        """The replay filter's verdict on worker ``worker``'s tagged data packet ``data``
        (:data:`PASSED` or :data:`REPLAY`): a ``seq`` below the last that passed for its
        slot from that worker is a replay; one that passes becomes the last. The filter
        keeps the job's own ``slots`` only (a board keeps an entry per slot of its pool):
        a packet to another slot passes, and the aggregator drops it."""
        seq = int.from_bytes(data[_SEQ.offset:_SEQ.offset + _SEQ.size], "little")
        slot = int.from_bytes(data[_SLOT.offset:_SLOT.offset + _SLOT.size], "little")
        if slot not in slots:
            return PASSED
        last = self._last.get((job, worker, slot))
        if last is not None and seq < last:
            return REPLAY
        self._last[(job, worker, slot)] = seq
        return PASSED

    def seal(self, job: int, image: bytes) -> bytes:
        """A result of ``job`` as it leaves: tagged under the job key where the job has one."""
        auth = self._active.get(job)
        if auth is None or len(image) < HEADER_BYTES:
            return image
        return tag_datagram(auth.key, image)
