"""The golden model of a board's network side: ``docs/protocol/network.md`` sections 2-4.

:class:`GoldenBoard` is the network front end as the gateware implements it, written as
executable Python over datagrams: the four services, the aggregator's worker table and
source check, the ``CTRL`` service with the control key (section 4's in clear, or section 7's
tags and write counter, host side only for now) and the one address map, and the
network counters. The behaviour beyond the spec (what every corner does) is
``docs/network-contract.md``; the engines behind it are the golden NIC
(``host.golden.inceptionn`` through :class:`~host.driver.models.NicModelTransport`) and the
reference aggregator (:class:`~host.golden.aggregator.AggregatorModel`).

It works at the level of UDP datagrams: the Ethernet, IPv4 and UDP checks of spec section 1
(FCS, fragments, checksums, ARP) happen in the core below the front end, so their counters
(``contract.counters.NET_CORE_DROPS``, ``arp_*``) stay zero here, as do the buffer-full
drops (a model has no buffers), apart from ``ip_address``: a datagram for another address.
"""
from __future__ import annotations

import ipaddress
import struct
from typing import Sequence

from contract.counters import AUTH_COUNTERS, NET_COUNTERS
from contract.header import (HEADER_BYTES, HEADER_FIELDS, MAGIC, VERSION, WORKER_MULTICAST,
                             Flags, PacketType)
from contract.network import (CTRL_COUNT_OFFSET,
                              CTRL_MAX_PAIRS, CTRL_OP_OFFSET, DEFAULT_IP, DEFAULT_MAC,
                              MAX_WORKERS_IN_TABLE, NET_REGISTERS, PORT_BASE, SERVICE_OFFSETS,
                              CtrlOp, Service, decode_network_address, group_active,
                              ip_to_int, mac_to_int)
from contract.packet import Packet
from contract.registers import (AUTH_FEATURES_ALL, AUTH_REGISTERS, COMMIT, DATA_BITS,
                                SWITCH_REGISTERS)
from host.golden.ctrl_auth import (control_key, counter_of, is_authenticated, is_wrapped,
                                   seal, unsealed)
from host.golden.siphash import check_tag, tag_datagram, wrap_word
from host.golden.job_auth import PASSED, JobAuthTable

from .backend import BoardBackend, Datagram

__all__ = ["GoldenBoard", "ALL_SERVICES", "nic_packet"]

ALL_SERVICES = tuple(Service)
_WORD = (1 << DATA_BITS) - 1
_FIELD = {f.name: f for f in HEADER_FIELDS}
_FLAGS, _JOB, _WORKER = (_FIELD[name].offset for name in ("flags", "job", "worker"))
#: A datagram names its (job, worker) when it reaches the worker byte: the source check
#: applies from there (as the gateware's, ``hdl.net.front_end.source_check``).
_NAMED = _WORKER + 1
_WORKER_TABLE = NET_REGISTERS["worker"]
_GROUP_TABLE = NET_REGISTERS["group"]
_NET_COUNTER_BLOCK = NET_REGISTERS["counter"]
#: the longest CTRL request: a header and CTRL_MAX_PAIRS pairs
_CTRL_MAX_LENGTH = HEADER_BYTES + 8 * CTRL_MAX_PAIRS
_AUTH_COUNTER_BLOCK = AUTH_REGISTERS["auth_counter"]
_JOB_AUTH = AUTH_REGISTERS["job_auth"]
_UPSTREAM_KEY = AUTH_REGISTERS["upstream_key"]
_SWITCH_JOB = SWITCH_REGISTERS["job"]
_SERVICE_COUNTERS = {Service.NIC_TX: "nic_tx", Service.NIC_RX: "nic_rx",
                     Service.SWITCH: "switch", Service.CTRL: "ctrl"}
_CTRL_OPS = {op.value for op in CtrlOp}


def nic_packet(data: bytes) -> Packet:
    """A datagram's payload as the packet a NIC engine takes: the engines take whole 32-bit
    words and a whole header beat, so the front end completes a short datagram with zero
    bytes (``docs/network-contract.md``)."""
    size = max(HEADER_BYTES, -(-len(data) // 4) * 4)
    return Packet.from_bytes(data + bytes(size - len(data)))


class GoldenBoard(BoardBackend):
    """A board (network front end, NIC engines, aggregator) as a golden model.

    Parameters
    ----------
    key : int or bytes
        The control key the board is built with: a 64-bit ``int`` (section 4: the key in
        clear in every ``CTRL`` packet, what the gateware does today), or 16 ``bytes``
        (section 7: every ``CTRL`` request and reply tagged, write counters, the
        ``contract.counters.AUTH_COUNTERS`` and ``contract.registers.AUTH_REGISTERS``;
        host side only for now). ``host.golden.ctrl_auth`` tells them apart.
    ip, mac : str
        The board's addresses (spec section 1 defaults).
    port_base : int
        UDP port of the first service.
    services : iterable of contract.network.Service
        The services the board is built with; datagrams to the port of any other are
        dropped as ``drop_closed_port`` and its registers read 0.
    max_count : int
        The NIC receive path's largest packet (values).
    slots, lanes, max_workers, jobs : int
        The aggregator's parameters (``host.golden.aggregator.AggregatorModel``); the worker table
        holds entries for ``jobs`` jobs of ``max_workers`` workers.
    link : bool
        What the ``link`` register reports.
    """

    def __init__(self, key: int, *, ip: str = DEFAULT_IP, mac: str = DEFAULT_MAC,
                 port_base: int = PORT_BASE, services=ALL_SERVICES, max_count: int = 2048,
                 slots: int = 64, lanes: int = 64, max_workers: int = 32, jobs: int = 4,
                 link: bool = True):
        from host.golden.aggregator import AggregatorModel
        from host.driver.models import NicModelTransport

        self.key = control_key(key)
        #: section 7's authenticated control (a 128-bit key)
        self.authenticated = is_authenticated(self.key)
        self.ip = str(ipaddress.IPv4Address(ip))
        self.mac = mac
        self._mac = mac_to_int(mac)
        self._ip = ip_to_int(self.ip)
        self.port_base = port_base
        self.ports = {service: port_base + offset for service, offset in SERVICE_OFFSETS.items()}
        if not 1 <= port_base <= 0xFFFF - len(SERVICE_OFFSETS) + 1:
            raise ValueError(f"port_base {port_base} leaves no room for the four service ports")
        self.services = frozenset(Service(s) for s in services)
        self._by_port = {port: service for service, port in self.ports.items()
                         if service in self.services}
        if max_workers > MAX_WORKERS_IN_TABLE:
            raise ValueError(f"max_workers {max_workers} exceeds the worker table's "
                             f"{MAX_WORKERS_IN_TABLE} per job")
        self.link = bool(link)
        self.nic = NicModelTransport(max_count=max_count)
        self.aggregator = AggregatorModel(slots=slots, lanes=lanes, max_workers=max_workers,
                                          jobs=jobs)
        self.params = dict(max_count=max_count, slots=slots, lanes=lanes,
                           max_workers=max_workers, jobs=jobs)
        #: network front end counters, keys ``contract.counters.NET_COUNTERS``
        self.counters = dict.fromkeys(NET_COUNTERS, 0)
        if self.authenticated:
            # section 7's counters, kept apart from the gateware's NET_COUNTERS
            self.counters.update(dict.fromkeys(AUTH_COUNTERS, 0))
        #: the largest counter of an accepted CTRL write (section 7; 0 after power-up)
        self.write_counter = 0
        #: section 7's authenticated jobs (a board with a 128-bit key only)
        self.job_auth = JobAuthTable(self.key, jobs) if self.authenticated else None
        #: worker table: (job, worker) -> (ip as int, port); absent = (0, 0)
        self.worker_table: dict[tuple[int, int], tuple[int, int]] = {}
        #: result groups: job -> (ip as int, port); absent = (0, 0), no group
        self.groups: dict[int, tuple[int, int]] = {}
        self._dotted = {}

    def describe(self) -> str:
        p = self.params
        return (f"golden model board {self.ip} ({self.mac}), services "
                f"{', '.join(s.value for s in ALL_SERVICES if s in self.services)}; NIC "
                f"max {p['max_count']} values; switch {p['slots']} slots x {p['lanes']} lanes, "
                f"{p['jobs']} jobs of up to {p['max_workers']} workers")

    # -- the wire ------------------------------------------------------------------------

    def deliver(self, datagrams: Sequence[Datagram]) -> list[Datagram]:
        out = []
        for datagram in datagrams:
            out.extend(self._one(datagram))
        return out

    def _one(self, d: Datagram) -> list[Datagram]:
        if d.dst_ip != self.ip:
            self._count("ip_address")
            return []
        service = self._by_port.get(d.dst_port)
        if service is None:
            self._count("drop_closed_port")
            return []
        if (service is Service.CTRL and self.authenticated
                and len(d.payload) > _CTRL_MAX_LENGTH):
            # section 7: the tag covers the whole datagram, and the board keeps no more
            # than the longest request, so it cannot be checked: dropped by the service's
            # input buffer (never taken in), unanswered
            self._count("drop_bad_ctrl")
            return []
        name = _SERVICE_COUNTERS[service]
        self._count(f"{name}_in")
        if service is Service.NIC_TX or service is Service.NIC_RX:
            replies = self._nic(service, d)
        elif service is Service.SWITCH:
            replies = self._switch(d)
        else:
            replies = self._ctrl(d)
        for _ in replies:
            self._count(f"{name}_out")
        return replies

    def _reply(self, service: Service, dst_ip: str, dst_port: int, payload: bytes) -> Datagram:
        return Datagram(self.ip, self.ports[service], dst_ip, dst_port, payload)

    def _count(self, name: str) -> None:
        self.counters[name] = (self.counters[name] + 1) & _WORD

    # -- NIC services --------------------------------------------------------------------

    def _nic(self, service: Service, d: Datagram) -> list[Datagram]:
        stream = "tx" if service is Service.NIC_TX else "rx"
        return [self._reply(service, d.src_ip, d.src_port, p.to_bytes())
                for p in self.nic.exchange(stream, [nic_packet(d.payload)])]

    # -- switch service ------------------------------------------------------------------

    def _switch(self, d: Datagram) -> list[Datagram]:
        data = d.payload
        if len(data) >= _NAMED and data[_FLAGS] & Flags.RESULT:
            # A result from upstream (aggregator-protocol.md section 4): taken only from a
            # configured job's upstream, for that upstream's job, and handed to the engine
            # under the leaf's own job number.
            leaf = self._leaf_of(ip_to_int(d.src_ip), d.src_port, data[_JOB])
            if leaf is None:
                self._count("drop_result_source")
                return []
            upstream_key = self.job_auth.upstream_key(leaf) if self.job_auth else None
            if upstream_key is not None and not check_tag(upstream_key, data):
                self._count("drop_bad_tag")       # the parent's job key: forged or stale
                return []
            data = bytearray(data)
            data[_JOB] = leaf
            data = bytes(data)
        elif len(data) >= _NAMED:
            job, worker = data[_JOB], data[_WORKER]
            auth = self.job_auth is not None and self.job_auth.active(job) is not None
            # The source first: it is decided as the datagram is stored, the tag only once
            # all of it is (docs/network-contract.md); then, for an authenticated job, the
            # tag, then the replay filter (which a wrong tag must not move).
            entry = self._entry(job, worker)
            if entry is None or entry[1] == 0 or entry != (ip_to_int(d.src_ip), d.src_port):
                self._count("drop_bad_source")
                return []
            if auth and len(data) >= HEADER_BYTES:
                if not self.job_auth.check_tag(job, data):
                    self._count("drop_bad_tag")
                    return []
                config = self.aggregator.job_config(job)
                verdict = self.job_auth.filter(job, worker, data,
                                               config.slot_range if config else range(0))
                if verdict != PASSED:
                    self._count(verdict)
                    return []
        # A datagram too short to name a (job, worker) goes to the engine unchecked, which
        # drops it as bad_length without a slot being touched (so does one that names
        # them but is shorter than a header).
        out = []
        for result in self.aggregator.process(data):
            h = result.header
            image = result.to_bytes()
            if self.job_auth is not None and h.flags & Flags.RESULT:
                image = self.job_auth.seal(h.job, image)
            if not h.flags & Flags.RESULT:
                # The aggregate of a leaf's slot, to its upstream: the leaf job is the one
                # whose slot range holds the slot (ranges never overlap).
                job, upstream = self._upstream_of_slot(h.slot)
                if upstream is not None:
                    upstream_key = self.job_auth.upstream_key(job) if self.job_auth else None
                    if upstream_key is not None:
                        image = tag_datagram(upstream_key, image)
                    self._count("switch_upstream_out")
                    out.append(self._reply(Service.SWITCH, self._dotted_ip(upstream.ip),
                                           upstream.port, image))
                continue
            if h.worker == WORKER_MULTICAST:
                workers = self.aggregator.job_config(h.job).workers
                group = self.groups.get(h.job, (0, 0))
                if workers and group_active(*group):
                    # one datagram to the job's result group, whatever its worker count
                    self._count("switch_group_out")
                    out.append(self._reply(Service.SWITCH, self._dotted_ip(group[0]),
                                           group[1], image))
                    continue
                targets = range(workers)
            else:
                targets = (h.worker,)
            for w in targets:
                entry = self._entry(h.job, w)
                if entry is not None and entry[1]:
                    out.append(self._reply(Service.SWITCH, self._dotted_ip(entry[0]), entry[1],
                                           image))
        return out

    def _leaf_of(self, ip: int, port: int, upstream_job: int) -> int | None:
        """The lowest configured job whose upstream is ``ip:port``'s job ``upstream_job``."""
        for job in range(self.params["jobs"]):
            config = self.aggregator.job_config(job)
            up = config.upstream if config is not None else None
            if up is not None and (up.ip, up.port, up.job) == (ip, port, upstream_job):
                return job
        return None

    def _upstream_of_slot(self, slot: int):
        """``(job, upstream)`` of the configured job whose slot range holds ``slot``
        (``(None, None)`` where none does)."""
        for job in range(self.params["jobs"]):
            config = self.aggregator.job_config(job)
            if config is not None and slot in config.slot_range:
                return job, config.upstream
        return None, None

    def _entry(self, job: int, worker: int):
        """The worker table entry ``(ip, port)`` of (job, worker), or None where the board
        holds no entry (job or worker beyond the switch's)."""
        if job >= self.params["jobs"] or worker >= self.params["max_workers"]:
            return None
        return self.worker_table.get((job, worker), (0, 0))

    def _dotted_ip(self, value: int) -> str:
        text = self._dotted.get(value)
        if text is None:
            text = self._dotted[value] = str(ipaddress.IPv4Address(value))
        return text

    # -- control service -----------------------------------------------------------------

    def _ctrl(self, d: Datagram) -> list[Datagram]:
        data = d.payload
        if len(data) < HEADER_BYTES:
            self._count("drop_bad_ctrl")      # no key to check: no reply
            return []
        if not unsealed(self.key, data):
            # section 4: a wrong key; section 7: a wrong tag, checked before anything else
            # (the counter included): no reply, nothing done
            self._count("drop_bad_tag" if self.authenticated else "drop_bad_key")
            return []
        header = bytearray(data[:HEADER_BYTES])
        op = data[CTRL_OP_OFFSET]
        count = int.from_bytes(data[CTRL_COUNT_OFFSET:CTRL_COUNT_OFFSET + 4], "little")
        payload = data[HEADER_BYTES:]
        if (data[0] != MAGIC or data[1] != VERSION or data[2] != PacketType.CTRL
                or op not in _CTRL_OPS or not 1 <= count <= CTRL_MAX_PAIRS
                or len(payload) != 8 * count):
            self._count("drop_bad_ctrl")
            header[_FLAGS] |= Flags.RESULT | Flags.ERROR
            return [self._reply(Service.CTRL, d.src_ip, d.src_port,
                                self._sealed(bytes(header)))]
        if self.authenticated and op == CtrlOp.WRITE:
            # section 7: a write's counter above every accepted write's, or the whole
            # request is dropped (no reply); an accepted one raises the largest
            counter = counter_of(data)
            if counter <= self.write_counter:
                self._count("drop_replay")
                return []
            self.write_counter = counter
        words = list(struct.unpack(f"<{2 * count}I", payload))
        for i in range(0, 2 * count, 2):
            address = words[i]
            if op == CtrlOp.WRITE:
                value = words[i + 1]
                if self.authenticated and is_wrapped(address):
                    # section 7: a key word arrives wrapped under the request's counter
                    value = wrap_word(self.key, counter_of(data), address, value)
                self.write(address, value)
            words[i + 1] = self.read(address)     # a write reads back after writing
        header[_FLAGS] |= Flags.RESULT
        return [self._reply(Service.CTRL, d.src_ip, d.src_port,
                            self._sealed(bytes(header) + struct.pack(f"<{2 * count}I", *words)))]

    def _sealed(self, reply: bytes) -> bytes:
        """A ``CTRL`` reply as it leaves: section 4 echoes the request's key field (the
        key), section 7 tags the reply under the same key (the counter echoed)."""
        return seal(self.key, reply) if self.authenticated else reply

    # -- the address map -----------------------------------------------------------------

    def read(self, address: int) -> int:
        """Read one 32-bit ``CTRL`` address (``contract.network``); 0 where nothing is."""
        where = decode_network_address(address)
        if where is None:
            return 0
        region, local = where
        if region.name == "nic":
            if not {Service.NIC_TX, Service.NIC_RX} & self.services:
                return 0
            try:
                return self.nic.read(local)
            except ValueError:            # unmapped in the NIC map
                return 0
        if region.name == "switch":
            return self.aggregator.read(local) if Service.SWITCH in self.services else 0
        if region.name == "net":
            return self._read_net(local)
        return 0                          # (the NIC in the wire's region: not this board's)

    def write(self, address: int, value: int) -> None:
        """Write one ``CTRL`` address; read-only and unmapped addresses ignore it."""
        where = decode_network_address(address)
        if where is None:
            return
        region, local = where
        if region.name == "switch" and Service.SWITCH in self.services:
            self.aggregator.write(local, value & _WORD)
            decoded = SWITCH_REGISTERS.decode(local)
            if (self.job_auth is not None and decoded is not None
                    and decoded.entry is _SWITCH_JOB and decoded.register.name == "commit"
                    and value == COMMIT):
                job = decoded.index
                self.job_auth.commit(job, configured=job < self.params["jobs"] and
                                     self.aggregator.job_config(job) is not None)
        elif region.name == "net":
            decoded = NET_REGISTERS.decode(local)
            if decoded is None:
                if self.job_auth is not None:
                    auth = AUTH_REGISTERS.decode(local)
                    if auth is not None and auth.entry in (_JOB_AUTH, _UPSTREAM_KEY):
                        width = auth.register.width
                        self.job_auth.set_register(auth.index, auth.register.name,
                                                   value & ((1 << width) - 1))
                return
            value &= (1 << decoded.register.width) - 1
            if decoded.entry is _GROUP_TABLE:
                if decoded.index < self.params["jobs"]:
                    ip, port = self.groups.get(decoded.index, (0, 0))
                    self.groups[decoded.index] = ((value, port) if decoded.register.name == "ip"
                                                  else (ip, value))
                return
            if decoded.entry is not _WORKER_TABLE:
                return
            job, worker = divmod(decoded.index, MAX_WORKERS_IN_TABLE)
            if self._entry(job, worker) is None:
                return
            ip, port = self.worker_table.get((job, worker), (0, 0))
            if decoded.register.name == "ip":
                ip = value
            else:
                port = value
            self.worker_table[(job, worker)] = (ip, port)

    def _read_net(self, local: int) -> int:
        decoded = NET_REGISTERS.decode(local)
        if decoded is None:
            return self._read_auth(local) if self.authenticated else 0
        if decoded.entry is _NET_COUNTER_BLOCK:
            return self.counters[decoded.counter]
        if decoded.entry is _WORKER_TABLE:
            job, worker = divmod(decoded.index, MAX_WORKERS_IN_TABLE)
            entry = self._entry(job, worker)
            if entry is None:
                return 0
            return entry[0] if decoded.register.name == "ip" else entry[1]
        if decoded.entry is _GROUP_TABLE:
            ip, port = self.groups.get(decoded.index, (0, 0))
            return ip if decoded.register.name == "ip" else port
        name = decoded.register.name
        value = {
            "mac_high": self._mac >> 32,
            "mac_low": self._mac & _WORD,
            "ip": self._ip,
            "port_base": self.port_base,
            "services": sum(1 << SERVICE_OFFSETS[s] for s in self.services),
            "link": int(self.link),
        }[name]
        return value & ((1 << decoded.register.width) - 1)

    def _read_auth(self, local: int) -> int:
        """Section 7's registers (``contract.registers.AUTH_REGISTERS``): its counters and
        the largest accepted write counter, low word first."""
        decoded = AUTH_REGISTERS.decode(local)
        if decoded is None:
            return 0
        if decoded.entry is _AUTH_COUNTER_BLOCK:
            return self.counters[decoded.counter]
        if decoded.entry in (_JOB_AUTH, _UPSTREAM_KEY):
            return self.job_auth.register(decoded.index, decoded.register.name)
        if decoded.register.name == "auth_features":
            return AUTH_FEATURES_ALL
        if decoded.register.name == "write_counter_low":
            return self.write_counter & _WORD
        return self.write_counter >> 32 & _WORD
