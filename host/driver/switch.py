"""Host interface of the switch aggregator: configure jobs, all-reduce, read counters.

The same :class:`SwitchInterface` runs over any transport with the stream ``agg`` and the
switch register map: the reference model (:class:`~host.driver.models.SwitchModelTransport`),
the Verilated gateware (:func:`open_switch` with ``backend="verilator"``), or a board over
UDP. Windowing, resends and result collection are ``host.switchml.network``'s.
"""
from __future__ import annotations

import dataclasses
import numbers

from contract.network import PORT_BASE, Service, service_ports
from contract.registers import (COMMIT, MAX_JOBS_IN_TABLE, MAX_WORKERS_IN_TABLE,
                                SWITCH_REGISTERS, JobStatus, decode_switch_limits,
                                decode_switch_params)
from contract.tops import TOP_PORTS

from .backends import open_backend
from .transport import NoReplyError, TransportError

__all__ = ["SwitchInterface", "open_switch", "SWITCH_STREAMS", "NoUpstreamError",
           "UPSTREAM_FIELDS", "parse_upstream", "format_upstream"]

_JOB_REGS = SWITCH_REGISTERS["job"]
_UPSTREAM_REGS = SWITCH_REGISTERS["upstream"]
#: The ``upstream`` registers of a job, in the order they are written (all before the
#: job's commit, which applies them with the job's other pending values).
UPSTREAM_FIELDS = ("ip", "port", "job", "worker")
#: Status reads beyond one per slot before a commit that stays busy is an error.
_COMMIT_POLLS = 64

#: The switch top's AXI-Stream path: name -> (sink prefix, source prefix).
SWITCH_STREAMS = TOP_PORTS["switch_top"].streams


def parse_upstream(address, job=None, worker=None):
    """A job's upstream (``aggregator-protocol.md`` section 4) from its parts, or None.

    Parameters
    ----------
    address : str, (str, int) or None
        The parent aggregator: ``"HOST:PORT"`` or ``(host, port)``, its board's address
        (an IPv4 address or a name that resolves to one) and its switch port, the board's
        port base + 2 (47572 on a board with the default base). None, ``0`` or ``"0"``: no
        upstream (then ``job`` and ``worker`` must be None too).
    job : int
        The parent's job number (0..63, the jobs a worker table holds).
    worker : int
        This aggregator's worker number in the parent's job (0..31).

    Returns
    -------
    host.golden.aggregator.Upstream or None

    Raises
    ------
    ValueError
        One line saying what is wrong.
    """
    import ipaddress
    import socket

    from ..golden.aggregator import Upstream

    if address is None or (isinstance(address, (int, str)) and not isinstance(address, bool)
                           and str(address).strip() == "0"):
        if job is not None or worker is not None:
            raise ValueError("an upstream job or worker without an upstream address")
        return None
    example = f"e.g. 192.168.77.3:{service_ports(PORT_BASE)[Service.SWITCH]}"
    if isinstance(address, str):
        host, sep, port = address.strip().rpartition(":")
        if not sep or not host:
            raise ValueError(f"give the upstream as HOST:PORT, the parent board's address and "
                             f"its port base + 2 ({example}), or 0 for none, not {address!r}")
    else:
        try:
            host, port = address
        except (TypeError, ValueError):
            raise ValueError(f"an upstream is (host, port), HOST:PORT or 0/None, not "
                             f"{address!r}") from None
    try:
        port = int(port)
    except (TypeError, ValueError):
        raise ValueError(f"the upstream's port must be an integer in 1..65535 (the parent "
                         f"board's port base + 2), not {port!r}") from None
    if not 1 <= port <= 0xFFFF:
        raise ValueError(f"the upstream's port must be in 1..65535 (the parent board's port "
                         f"base + 2), not {port}")
    try:
        ip = ipaddress.IPv4Address(socket.gethostbyname(str(host)))
    except (OSError, UnicodeError, ValueError):
        raise ValueError(f"the upstream's host {host!r} is not an IPv4 address or a name "
                         f"that resolves to one") from None
    # The parent is a board: it takes datagrams to its own address only (network.md
    # section 1), so a group or broadcast address would never reach it, and 0 means none.
    if ip.is_multicast or ip.is_unspecified or ip == ipaddress.IPv4Address("255.255.255.255"):
        raise ValueError(f"the upstream's address {ip} is not a board's (a unicast IPv4 "
                         f"address)")
    for name, value, count in (("job", job, MAX_JOBS_IN_TABLE),
                               ("worker", worker, MAX_WORKERS_IN_TABLE)):
        if value is None:
            raise ValueError(f"an upstream needs this aggregator's {name} number in the "
                             f"parent's job" if name == "worker" else
                             "an upstream needs the parent's job number")
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) \
                or not 0 <= value < count:
            what = "the parent's job" if name == "job" else "the worker number in the parent's job"
            raise ValueError(f"{what} must be an integer in 0..{count - 1}, not {value!r}")
    return Upstream(int(ip), port, int(job), int(worker))


def format_upstream(upstream) -> str:
    """``"IP:PORT job J worker W"`` for an ``Upstream`` (``"none"`` for None)."""
    import ipaddress
    if upstream is None:
        return "none"
    return (f"{ipaddress.IPv4Address(upstream.ip)}:{upstream.port} job {upstream.job} "
            f"worker {upstream.worker}")


class NoUpstreamError(TransportError):
    """The switch holds no ``upstream`` registers: its gateware predates trees of
    aggregators (``docs/protocol/aggregator-protocol.md`` section 4), so a job of it cannot
    be a leaf."""


class SwitchInterface:
    """Drive the in-network aggregator.

    Parameters
    ----------
    transport : host.driver.transport.Transport
        Stream ``agg`` and the switch registers.
    """

    def __init__(self, transport):
        self.transport = transport
        params = decode_switch_params(transport.read(SWITCH_REGISTERS["params"].address))
        limits = decode_switch_limits(transport.read(SWITCH_REGISTERS["limits"].address))
        self.slots, self.lanes = params["slots"], params["lanes"]
        self.jobs, self.max_workers = limits["jobs"], limits["max_workers"]
        if not self.slots or not self.lanes or self.lanes % 8 or not self.jobs \
                or not 1 <= self.max_workers <= 32:
            raise RuntimeError(f"the switch reports {self.slots} slots of {self.lanes} lanes, "
                               f"{self.jobs} jobs of up to {self.max_workers} workers: is this "
                               f"a gradwire switch?")
        self._next_chunk = {}

    def configure_job(self, job, workers, slot_base, slot_count, upstream=None):
        """Give ``job`` ``workers`` workers and the slots [slot_base, slot_base+slot_count);
        resets the state of those slots.

        Parameters
        ----------
        upstream : host.golden.aggregator.Upstream or None
            The job's parent aggregator (``docs/protocol/aggregator-protocol.md`` section
            4): the job becomes a leaf of the parent's job, its completed slots go there
            and its workers get the parent's results. None: no upstream. The four
            ``upstream`` registers are written before the commit either way (None writes
            zeros), so a job configured again without one loses its old upstream.

        Raises
        ------
        ValueError
            A bad range or worker count, an ``upstream`` that is not an ``Upstream``, or a
            configuration the switch rejects.
        NoUpstreamError
            ``upstream`` given to a switch without the upstream registers (they do not read
            back what was written); the job's registers are left uncommitted.
        """
        if not 0 <= slot_base < slot_base + slot_count <= self.slots:
            raise ValueError(f"slots {slot_base}..{slot_base + slot_count - 1} are not inside "
                             f"the switch's pool of {self.slots}")
        if not 1 <= workers <= self.max_workers:
            raise ValueError(f"workers must be in 1..{self.max_workers} (the switch's "
                             f"max_workers), not {workers}")
        self._check_job(job)
        self._write_upstream(job, upstream)
        self._commit(job, workers=workers, slot_base=slot_base, slot_count=slot_count)
        self._next_chunk[job] = 0

    def upstream(self, job):
        """``job``'s upstream as the switch holds it (pending until the job's next commit,
        so after a commit: the applied one): an ``Upstream``, or None (no upstream, or a
        switch without the registers, which read 0)."""
        from ..golden.aggregator import Upstream
        self._check_job(job)
        values = [self.transport.read(_UPSTREAM_REGS.address(job, field))
                  for field in UPSTREAM_FIELDS]
        return Upstream.from_registers(*values)

    def _write_upstream(self, job, upstream):
        """Write ``job``'s four upstream registers (zeros for None), then, for an upstream,
        check that they read back: a switch that does not hold them reads 0 (or, over UDP,
        the transport's own read-back check fails first)."""
        from ..golden.aggregator import Upstream
        if upstream is not None and not isinstance(upstream, Upstream):
            raise ValueError(f"upstream must be a host.golden.aggregator.Upstream or None, "
                             f"not {upstream!r}")
        values = dict.fromkeys(UPSTREAM_FIELDS, 0) if upstream is None \
            else {field: getattr(upstream, field) for field in UPSTREAM_FIELDS}
        try:
            for field, value in values.items():
                self.transport.write(_UPSTREAM_REGS.address(job, field), value)
            if upstream is None:
                # zeros read back as zeros whether or not the switch holds the registers
                return
            got = {field: self.transport.read(_UPSTREAM_REGS.address(job, field))
                   for field in UPSTREAM_FIELDS}
        except NoReplyError:
            raise
        except TransportError as exc:
            # a board over UDP checks every write's read-back; a lockstep run compares the
            # gateware's read with the model's: either way the registers are not there
            raise NoUpstreamError(self._no_upstream(job, f"({exc})")) from None
        if got != values:
            raise NoUpstreamError(self._no_upstream(job, f"(wrote {values}, read back {got})"))

    @staticmethod
    def _no_upstream(job, detail):
        return (f"the switch does not hold job {job}'s upstream registers: its gateware "
                f"predates trees of aggregators (docs/protocol/aggregator-protocol.md section "
                f"4), so its jobs cannot have an upstream {detail}")

    def _check_job(self, job):
        if isinstance(job, bool) or not isinstance(job, numbers.Integral) \
                or not 0 <= job < self.jobs:
            raise ValueError(f"job must be in 0..{self.jobs - 1} (the switch has {self.jobs} "
                             f"jobs), not {job!r}")

    def clear_job(self, job):
        """Unconfigure ``job``: its packets are dropped (``drop_unconfigured_job``)."""
        self._commit(job, workers=0)
        self._next_chunk.pop(job, None)

    def job_status(self, job):
        """The job's :class:`~contract.registers.JobStatus` (busy, last commit rejected)."""
        return JobStatus(self.transport.read(_JOB_REGS.address(job, "commit")))

    def _commit(self, job, **values):
        """Write the job's pending registers, commit them and wait for the engine to take
        them; raise ``ValueError`` if the engine rejects the configuration."""
        if not 0 <= job < self.jobs:
            raise ValueError(f"job must be in 0..{self.jobs - 1} (the switch has {self.jobs} "
                             f"jobs), not {job}")
        for field, value in values.items():
            self.transport.write(_JOB_REGS.address(job, field), value)
        self.transport.write(_JOB_REGS.address(job, "commit"), COMMIT)
        # A commit waits for the engine to drain, then clears one slot per clock.
        for _ in range(self.slots + _COMMIT_POLLS):
            status = self.job_status(job)
            if not status & JobStatus.BUSY:
                break
        else:
            raise TransportError(f"the switch is still busy with job {job}'s commit after "
                                 f"{self.slots + _COMMIT_POLLS} status reads")
        if status & JobStatus.REJECTED:
            raise ValueError(f"the switch rejected job {job}'s configuration {values} (a "
                             f"range overlapping another configured job's, or one the engine "
                             f"cannot hold); the job is now unconfigured")

    def counters(self):
        return {name: self.transport.read(address)
                for name, address in SWITCH_REGISTERS["counter"].items()}

    def send(self, packets, **options):
        """Raw access: feed packets to the aggregator, return what it emits."""
        return self.transport.exchange("agg", packets, **options)

    def allreduce(self, tensors, *, job=0, slot_base=0, slot_count=None, fault=None,
                  configure=True, **options):
        """LHC all-reduce of one float32 tensor per worker through the switch.

        With ``configure`` the job is (re)configured for ``len(tensors)`` workers over
        ``slot_count`` slots (default: the whole pool from ``slot_base``) first.

        ``options`` go to :func:`host.switchml.network.allreduce_over_transport`: ``path``
        ("sketch", the default, "dense" or "auto"), ``load``, ``r_min``, ``timeout``, ...

        Returns
        -------
        result : np.ndarray (float32)
            Bit for bit ``host.golden.lhc.allreduce(tensors)[0]``.
        stats : dict
            LHC statistics (path, rows, peeled, unpeeled, bytes per phase, ...) and packet
            statistics (packets sent, resends, results).
        """
        from ..switchml.network import allreduce_over_transport
        if slot_count is None:
            slot_count = self.slots - slot_base
        if configure:
            self.configure_job(job, len(tensors), slot_base, slot_count)
        elif job not in self._next_chunk:
            raise RuntimeError(f"job {job} was not configured through this interface")
        result, stats = allreduce_over_transport(
            tensors, lambda packets: self.transport.exchange("agg", packets, idle=32),
            job=job, slot_base=slot_base, slot_count=slot_count, lanes=self.lanes,
            fault=fault, first_chunk=self._next_chunk[job], **options)
        self._next_chunk[job] = stats["packets"].next_chunk
        return result, _flat_stats(stats)

    def allreduce_jobs(self, tensor_sets, *, jobs=None, slot_counts=None, path="sketch",
                       fault=None, configure=True, **options):
        """Several all-reduces at once, each its own job on this switch.

        Parameters
        ----------
        tensor_sets : sequence of sequences of arrays
            Per job, one float32 tensor per worker (jobs may have different worker counts
            and tensor sizes).
        jobs : sequence of int, optional
            Job numbers (default 0, 1, ...).
        slot_counts : sequence of int, optional
            Slots per job, consecutive from slot 0 (default: the pool split evenly).
        path : str or sequence of str
            "sketch", "dense" or "auto", for every job or per job.
        configure : bool
            (Re)configure every job first (default); otherwise continue each job's chunk
            count from its last message.

        ``options`` (``load``, ``r_min``, ``timeout``, ...) apply to every job.

        Returns
        -------
        list of ``(result, stats)`` as :meth:`allreduce`, in job order.
        """
        from ..switchml.network import allreduce_jobs_over_transport
        jobs, requests, options = job_requests(
            self, tensor_sets, jobs=jobs, slot_counts=slot_counts, path=path,
            configure=configure, slot_base=0, options=options, what="the switch has")
        runs = allreduce_jobs_over_transport(
            requests, lambda packets: self.transport.exchange("agg", packets, idle=32),
            lanes=self.lanes, fault=fault, **options)
        out = []
        for job, (result, stats) in zip(jobs, runs):
            self._next_chunk[job] = stats["packets"].next_chunk
            out.append((result, _flat_stats(stats)))
        return out


def job_requests(owner, tensor_sets, *, jobs, slot_counts, path, configure, slot_base,
                 options, what):
    """What :meth:`SwitchInterface.allreduce_jobs` (and its striped form) hand to
    :func:`host.switchml.network.allreduce_jobs_over_transport`: ``(jobs, requests,
    options left)``, each job on its consecutive slots from ``slot_base`` (configured first
    when ``configure``; otherwise its chunk count goes on from ``owner._next_chunk``).
    ``what`` names the slot pool in an error (``"the switch has"``)."""
    tensor_sets = [list(t) for t in tensor_sets]
    count = len(tensor_sets)
    jobs = list(range(count)) if jobs is None else list(jobs)
    if slot_counts is None:
        if count > owner.slots:
            raise ValueError(f"{count} jobs need at least one slot each; {what} {owner.slots}")
        slot_counts = [owner.slots // count + (j < owner.slots % count) for j in range(count)]
    slot_counts = list(slot_counts)
    paths = [path] * count if isinstance(path, str) else list(path)
    if not len(jobs) == len(slot_counts) == len(paths) == count:
        raise ValueError(f"{count} tensor sets but {len(jobs)} jobs, {len(slot_counts)} "
                         f"slot counts and {len(paths)} paths")
    options = dict(options)
    loads = {key: options.pop(key) for key in ("load", "r_min") if key in options}
    requests, base = [], slot_base
    for job, tensors, slot_count, job_path in zip(jobs, tensor_sets, slot_counts, paths):
        if configure:
            owner.configure_job(job, len(tensors), base, slot_count)
        elif job not in owner._next_chunk:
            raise RuntimeError(f"job {job} was not configured through this interface")
        requests.append(dict(tensors=tensors, job=job, slot_base=base, slot_count=slot_count,
                             first_chunk=owner._next_chunk[job], path=job_path, **loads))
        base += slot_count
    return jobs, requests, options


def _flat_stats(stats):
    """``{"lhc": LhcStats, "packets": PacketStats}`` as one flat dict."""
    flat = {}
    for part in ("lhc", "packets"):
        value = stats[part]
        flat.update(dataclasses.asdict(value) if dataclasses.is_dataclass(value)
                    else dict(value))
    return flat


def open_switch(backend="golden", *, check=True, waves=None, slots=64, lanes=64,
                max_workers=32, jobs=4, **backend_options):
    """A transport to the switch aggregator: the ``"golden"`` model, or a backend of
    ``host.driver.backends``: the Verilated ``switch_top`` gateware through the compiled
    harness (``"verilator"``) or the cocotb bridge (``"cocotb"``), or a board over UDP
    (``"udp"``); by default checked packet for packet against the model in lockstep;
    ``backend_options`` go to the backend (``"udp"``: see ``host.board.udp_backend.open_top``)."""
    from .models import SwitchModelTransport
    params = dict(slots=slots, lanes=lanes, max_workers=max_workers, jobs=jobs)
    if backend == "golden":
        return SwitchModelTransport(**params)
    device = open_backend(backend, "switch_top", waves=waves, **params, **backend_options)
    if not check:
        return device
    from .lockstep import LockstepTransport
    return LockstepTransport(device, SwitchModelTransport(**params), SWITCH_REGISTERS)
