"""The switch side of :class:`~host.driver.udp.UdpTransport`: every worker of a job on a
socket of its own (``docs/protocol/aggregator-protocol.md`` section 3, ``network.md``
sections 3 and 5).

Every worker of a job is a socket of its own, registered in the board's worker table (the
first time the transport sends for that (job, worker)); results come back to those sockets
(multicast: one datagram per worker). ``exchange("agg", packets)`` sends each packet from
its worker's socket and returns what the engine emits for them, as an engine transport
does: it knows which packets complete a round because it runs the reference aggregator on
the same packets (``host.golden.aggregator.AggregatorModel``, configured from the board's job
registers) and waits until every worker that the board sends a result to has received its
copy. A job with a result group (``network.md`` section 3, read from the board with its job
registers) gets one more socket, bound to the group and joined on the interface that
reaches the board: the board sends each multicast result of the job once, to the group, and
that one datagram is every local worker's copy (unicast answers to resends still come to the
worker's own socket; a result of another job sharing the group's address and port is
counted as foreign). A worker keeps one outstanding packet per (slot, version); a worker
still waiting for a result on its timeout resends its outstanding packet, and the switch
answers a resend of a complete round with a unicast result (a multicast whose every copy
was lost comes back as unicasts, and is returned as the multicast the engine emitted). The transport must carry
every worker of a job (one host running N workers uses N sockets). After a job's commit
the transport discards whatever its workers' sockets still hold for that job.

Which packet a worker sends when is the caller's business (``host.switchml.network.run_jobs``
drives one :class:`~host.switchml.window.SwitchWorkerWindow` per worker over this
transport); this module only carries the packets and their results.
"""
from __future__ import annotations

import select
import time

from contract.header import HEADER_BYTES, LANES, WORKER_MULTICAST, Flags, Header
from contract.network import (MAX_JOBS_IN_TABLE, MAX_WORKERS_IN_TABLE, NET_REGISTERS, CtrlOp,
                              Service, ip_to_int, network_address)
from contract.packet import Packet
from contract.registers import SWITCH_REGISTERS, JobStatus, decode_switch_params

from .rtt import ResendTimer
from .sockets import drain, open_group_socket, parse_group
from .transport import NoReplyError, TransportError

__all__ = ["SwitchWorkerSockets"]

_JOB_REGS = SWITCH_REGISTERS["job"]
_WORKER_TABLE = NET_REGISTERS["worker"]
_GROUP_TABLE = NET_REGISTERS["group"]
#: status reads while a commit is busy, before the job's state is read anyway
_BUSY_POLLS = 1024


class _WorkerSocket:
    """One worker of a job: its socket and its outstanding packet per (slot, version)."""

    def __init__(self, job, worker, sock):
        self.job, self.worker, self.sock = job, worker, sock
        self.outstanding: dict[tuple[int, int], Packet] = {}

    @property
    def address(self):
        return self.sock.getsockname()


class SwitchWorkerSockets:
    """The ``agg`` stream of :class:`~host.driver.udp.UdpTransport` (a mixin of it: it
    uses the transport's control requests, send path and round-trip estimates)."""

    def _init_switch_workers(self) -> None:
        self._endpoints: dict[tuple[int, int], _WorkerSocket] = {}
        self._shadow = None                 # reference aggregator (knows what completes)
        self._synced_jobs: set[int] = set()
        #: job -> (its result group (ip, port), the socket joined to it)
        self._groups: dict[int, tuple[tuple[str, int], object]] = {}

    def _close_switch_workers(self) -> None:
        for endpoint in self._endpoints.values():
            endpoint.sock.close()
        self._endpoints.clear()
        for _, sock in self._groups.values():
            sock.close()
        self._groups.clear()

    def _sync_group(self, job: int) -> None:
        """Receive ``job``'s result group as the board holds it (join it, or leave the old
        one)."""
        ip, port = self._ctrl(CtrlOp.READ, [(network_address("net", _GROUP_TABLE.address(
            job, field)), 0) for field in ("ip", "port")], window=self.window)
        group = None
        if ip and port:
            dotted = ".".join(str(ip >> shift & 0xFF) for shift in (24, 16, 8, 0))
            try:
                group = parse_group((dotted, port))
            except ValueError as exc:
                raise TransportError(f"job {job}'s result group on the board: {exc}") from None
        old = self._groups.get(job)
        if old is not None and old[0] == group:
            return
        if old is not None:
            old[1].close()
            del self._groups[job]
        if group is not None:
            self._groups[job] = (group, open_group_socket(group, self._local_ip))

    def _switch_read(self, locals_):
        return self._ctrl(CtrlOp.READ, [(network_address("switch", a), 0) for a in locals_],
                          window=self.window)

    def _ensure_shadow(self):
        if self._shadow is None:
            from host.golden.aggregator import AggregatorModel
            word, = self._switch_read([SWITCH_REGISTERS["params"].address])
            params = decode_switch_params(word)
            if not params["slots"] or not params["lanes"] or params["lanes"] % LANES:
                raise TransportError(f"the board's switch reports {params['slots']} slots of "
                                     f"{params['lanes']} lanes: is it built with a switch?")
            self._shadow = AggregatorModel(slots=params["slots"], lanes=params["lanes"],
                                           max_workers=MAX_WORKERS_IN_TABLE,
                                           jobs=MAX_JOBS_IN_TABLE)
        return self._shadow

    def _sync_job(self, job: int) -> None:
        """Configure the reference aggregator's ``job`` as the board has it (its slots
        start fresh: a commit cleared the board's)."""
        shadow = self._ensure_shadow()
        fields = ("workers", "slot_base", "slot_count", "commit")
        for _ in range(_BUSY_POLLS):
            values = dict(zip(fields, self._switch_read([_JOB_REGS.address(job, f)
                                                         for f in fields])))
            if not values["commit"] & JobStatus.BUSY:
                break
        else:
            raise TransportError(f"the board's switch stays busy with job {job}'s commit")
        shadow.clear_job(job)
        if values["workers"] and not values["commit"] & JobStatus.REJECTED:
            try:
                shadow.configure_job(job, values["workers"], values["slot_base"],
                                     values["slot_count"])
            except ValueError:
                # another job of ours moved on the board since we read it: read them again
                for other in list(self._synced_jobs):
                    shadow.clear_job(other)
                self._synced_jobs.clear()
                shadow.configure_job(job, values["workers"], values["slot_base"],
                                     values["slot_count"])
        self._sync_group(job)
        self._synced_jobs.add(job)

    def _after_commit(self, job: int) -> None:
        """A commit cleared the job's slots on the board: forget its state here and discard
        what its workers' sockets still hold (the board has answered the commit, so every
        earlier result is in the buffers by now)."""
        self._synced_jobs.discard(job)
        for (j, _), endpoint in self._endpoints.items():
            if j == job:
                endpoint.outstanding.clear()
                self.network[Service.SWITCH].discarded += len(drain(endpoint.sock))
        if job in self._groups:
            self.network[Service.SWITCH].discarded += len(drain(self._groups[job][1]))

    def worker_address(self, job: int, worker: int) -> tuple[str, int]:
        """The address of (job, worker)'s socket, registered in the board's worker table
        (created and registered on first use)."""
        self._register_workers([(job, worker)])
        return self._endpoints[(job, worker)].address

    def _register_workers(self, pairs) -> None:
        new = sorted({p for p in pairs if p not in self._endpoints})
        if not new:
            return
        for job, worker in new:
            if not (0 <= job < MAX_JOBS_IN_TABLE and 0 <= worker < MAX_WORKERS_IN_TABLE):
                raise ValueError(f"job {job} worker {worker} has no worker table entry (jobs "
                                 f"< {MAX_JOBS_IN_TABLE}, workers < {MAX_WORKERS_IN_TABLE})")
        created = {p: _WorkerSocket(*p, self._new_socket()) for p in new}
        writes = []
        for (job, worker), endpoint in created.items():
            entry = job * MAX_WORKERS_IN_TABLE + worker
            ip, port = endpoint.address
            writes += [(network_address("net", _WORKER_TABLE.address(entry, "ip")), ip_to_int(ip)),
                       (network_address("net", _WORKER_TABLE.address(entry, "port")), port)]
        try:
            read_back = self._ctrl(CtrlOp.WRITE, writes, window=1)
        except BaseException:
            for endpoint in created.values():
                endpoint.sock.close()
            raise
        if read_back != [value for _, value in writes]:
            for endpoint in created.values():
                endpoint.sock.close()
            raise TransportError(f"the board's worker table does not hold entries for "
                                 f"{', '.join(f'job {j} worker {w}' for j, w in new)} (a board "
                                 f"holds its switch's jobs and workers only)")
        self._endpoints.update(created)

    def _exchange_agg(self, packets):
        if not packets:
            return []
        stats = self.network[Service.SWITCH]
        stats.requests += len(packets)
        shadow = self._ensure_shadow()
        for job in sorted({p.header.job for p in packets} - self._synced_jobs):
            if job < MAX_JOBS_IN_TABLE:
                self._sync_job(job)
        self._register_workers((p.header.job, p.header.worker) for p in packets)
        est = self._rtt[Service.SWITCH]
        predictions = []       # (predicted result, kind): kind "m" (multicast) or a worker
        waiting = {}           # (job, worker, slot, version, seq) -> ResendTimer
        for packet in packets:
            h = packet.header
            data = packet.to_bytes()
            self._check_size(len(data), lambda: f"packet ({h})")
            endpoint = self._endpoints[(h.job, h.worker)]
            slot_key = (h.slot, h.slot_version & 1)
            old = endpoint.outstanding.get(slot_key)
            if old is not None and old.header.seq != h.seq:
                raise TransportError(
                    f"job {h.job} worker {h.worker} sends seq {h.seq} on slot {h.slot} "
                    f"version {h.slot_version & 1} while seq {old.header.seq} is still "
                    f"outstanding there (one outstanding packet per slot and version: a "
                    f"worker reuses a slot only after its result)")
            before = shadow.counters["accepted"]
            results = shadow.process(packet)
            if shadow.counters["accepted"] != before:           # a new contribution
                endpoint.outstanding[slot_key] = packet
            self._send(endpoint.sock, data, Service.SWITCH)
            now = time.monotonic()
            for result in results:
                rh = result.header
                if rh.worker == WORKER_MULTICAST:
                    kind, targets = "m", range(shadow.job_config(rh.job).workers)
                else:
                    kind, targets = rh.worker, (rh.worker,)
                predictions.append((result, kind))
                for w in targets:
                    key = (rh.job, w, rh.slot, rh.slot_version & 1, rh.seq)
                    entry = waiting.get(key)
                    if entry is not None:
                        entry.need += 1
                        continue
                    resend = packet if kind != "m" else \
                        self._endpoints[(rh.job, w)].outstanding.get(slot_key)
                    if resend is None:
                        raise TransportError(f"job {rh.job} worker {w} completes slot "
                                             f"{rh.slot} without a packet of this transport's")
                    waiting[key] = ResendTimer(resend, now, now, est.rto)
        copies = self._await_results(waiting, {(r.header.job, r.header.slot,
                                                r.header.slot_version & 1, r.header.seq)
                                               for r, _ in predictions})
        frames = []
        for result, kind in predictions:
            rh = result.header
            round_key = (rh.job, rh.slot, rh.slot_version & 1, rh.seq)
            data = copies.get(round_key + (kind,))
            if data is None:
                # every copy of this kind was lost; the other kind carries the same lanes
                other = next(v for k, v in copies.items() if k[:4] == round_key)
                received = Packet.from_bytes(other)
                data = Packet(rh.replace(exponent=received.header.exponent),
                              received.payload).to_bytes()
                stats.rebuilt += 1
            frames.append(data)
        stats.replies += len(frames)
        self._update_rtt_stats(Service.SWITCH)
        return frames

    def _await_results(self, waiting, rounds):
        """Receive results until every waiting worker has its copy; resend on timeouts.
        Returns the first copy of each (job, slot, version, seq, kind) of ``rounds``."""
        stats, est = self.network[Service.SWITCH], self._rtt[Service.SWITCH]
        address = self._address(Service.SWITCH)
        copies = {}
        by_socket = {e.sock: e for e in self._endpoints.values()
                     if any(k[0] == e.job for k in rounds)}
        # a job's result group: one socket, each datagram every local worker's copy
        group_jobs = {sock: job for job, (_, sock) in self._groups.items()
                      if any(k[0] == job for k in rounds)}
        group_members = {job: [e for e in by_socket.values() if e.job == job]
                         for job in group_jobs.values()}

        def take(endpoint, data, rh):
            version = rh.slot_version & 1
            round_key = (endpoint.job, rh.slot, version, rh.seq)
            if (not rh.flags & Flags.RESULT or rh.job != endpoint.job
                    or rh.worker not in (WORKER_MULTICAST, endpoint.worker)):
                stats.discarded += 1
                return
            kind = "m" if rh.worker == WORKER_MULTICAST else rh.worker
            if round_key in rounds:
                first = copies.setdefault(round_key + (kind,), data)
                if first != data:
                    raise TransportError(f"the board sent two different results for "
                                         f"job {rh.job} slot {rh.slot} version "
                                         f"{version} seq {rh.seq}")
            key = (endpoint.job, endpoint.worker, rh.slot, version, rh.seq)
            entry = waiting.get(key)
            if entry is None:
                stats.discarded += 1
                return
            stats.bytes_in += len(data)
            self._heard[Service.SWITCH] = time.monotonic()
            if entry.attempt == 0:
                est.sample(self._heard[Service.SWITCH] - entry.sent)
            entry.need -= 1
            if entry.need == 0:
                del waiting[key]
                endpoint.outstanding.pop((rh.slot, version), None)

        while waiting:
            wait = min(e.deadline for e in waiting.values()) - time.monotonic()
            ready, _, _ = select.select([*by_socket, *group_jobs], [], [], max(wait, 0.0))
            for sock in ready:
                group_job = group_jobs.get(sock)
                for data, source in drain(sock):
                    if source != address:
                        stats.foreign += 1
                        continue
                    if len(data) < HEADER_BYTES:
                        stats.discarded += 1
                        continue
                    rh = Header.parse(data)
                    if group_job is None:
                        take(by_socket[sock], data, rh)
                    elif (rh.flags & Flags.RESULT and rh.job == group_job
                          and rh.worker == WORKER_MULTICAST):
                        for endpoint in group_members[group_job]:
                            take(endpoint, data, rh)
                    else:                 # another job's result on a shared group
                        stats.foreign += 1
            for key, entry in self._expired(Service.SWITCH, waiting):
                job, worker, slot, version, seq = key
                if entry.attempt >= self.retries:
                    missing = sorted(k[1] for k in waiting if k[0] == job and k[2:] == key[2:])
                    raise NoReplyError(Service.SWITCH,
                        f"no result from the board's switch at {address[0]}:{address[1]} for "
                        f"job {job} slot {slot} version {version} (seq {seq}) at worker(s) "
                        f"{missing} after {entry.attempt + 1} attempts in "
                        f"{time.monotonic() - entry.sent:.1f} s: is the board running, is job "
                        f"{job} configured for these workers, and does this transport carry "
                        f"all of them?")
                self._resend_timer(Service.SWITCH, entry)
                self._send(self._endpoints[(job, worker)].sock, entry.item.to_bytes(),
                           Service.SWITCH)
        return copies
