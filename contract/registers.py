"""The control registers of the engine tops, declared once.

Every control register (name, address, access, width, meaning) is declared here, and
everything else derives from these declarations: the gateware's address decoders
(``hdl.nic.engine``, ``hdl.switch.control``), the reference models' register serving
(``host.golden.aggregator``, ``host.driver.models``), the driver (``host.driver``), the
self-test's counter report (``hdl.selftest.top``), the cocotb benches, the register tables of
``docs/registers.md`` (:func:`markdown_table`, checked by ``tests/test_architecture.py``)
and the tests.
No register address is written as a number anywhere else.

A map is a list of entries, each one of:

- :class:`Register`: one register at one address;
- :class:`RegisterArray`: ``count`` copies of a group of registers (one per job, say), copy
  ``i`` at ``base + i * stride``; the stride is a power of two, so that a decoder splits the
  address into index and field bits;
- :class:`CounterBlock`: one read-only 32-bit wrapping counter per name of a
  ``contract.counters`` tuple, at consecutive addresses.

The maps follow the gateware's ``ctrl_*`` port (``hdl.ctrl_port``): 16-bit addresses, one
32-bit word each, read data valid the clock after the read strobe (``ctrl_re`` on an exported top).
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Iterator

from .counters import (AGG_COUNTERS, AUTH_COUNTERS, NET_COUNTERS, NIC_RX_COUNTERS, NIC_TX_COUNTERS,
                       WIRE_COUNTERS)

__all__ = [
    "ADDRESS_BITS", "DATA_BITS", "Access", "Register", "RegisterArray", "CounterBlock",
    "RegisterMap", "Decoded", "COMMIT", "JobStatus", "NIC_REGISTERS", "SWITCH_REGISTERS",
    "NET_REGISTERS", "AUTH_REGISTERS", "WIRE_REGISTERS", "MAX_JOBS_IN_TABLE", "MAX_WORKERS_IN_TABLE",
    "REGISTER_MAPS", "markdown_table", "switch_params_word", "decode_switch_params",
    "switch_limits_word", "decode_switch_limits",
]

ADDRESS_BITS = 16
DATA_BITS = 32


class Access(enum.Enum):
    """What the control port allows on a register."""
    R = "R"
    W = "W"
    RW = "R/W"

    @property
    def readable(self) -> bool:
        return self is not Access.W

    @property
    def writable(self) -> bool:
        return self is not Access.R


@dataclasses.dataclass(frozen=True)
class Register:
    """One register. In a :class:`RegisterArray`, ``address`` is the offset in the group."""
    name: str
    address: int
    access: Access
    doc: str
    width: int = DATA_BITS
    #: bits that show the engine's timing (a model without a clock reads them as 0)
    volatile: int = 0

    def __post_init__(self):
        if not 1 <= self.width <= DATA_BITS:
            raise ValueError(f"register {self.name}: width {self.width} is not in 1..{DATA_BITS}")
        if self.address < 0:
            raise ValueError(f"register {self.name}: negative address {self.address}")

    @property
    def end(self) -> int:
        return self.address + 1

    def addresses(self) -> Iterator[tuple[int, str, Register]]:
        yield self.address, self.name, self


@dataclasses.dataclass(frozen=True)
class RegisterArray:
    """``count`` groups of ``fields``; field ``f`` of group ``i`` is at
    ``base + i * stride + f.address``.

    Decoders take the group index from address bits ``[field_bits, field_bits + index_bits)``
    and the field from bits ``[0, field_bits)``.
    """
    name: str
    base: int
    stride: int
    count: int
    fields: tuple[Register, ...]
    doc: str

    def __post_init__(self):
        if self.stride <= 0 or self.stride & (self.stride - 1):
            raise ValueError(f"array {self.name}: stride {self.stride} is not a power of two")
        if self.count <= 0 or self.count & (self.count - 1):
            raise ValueError(f"array {self.name}: count {self.count} is not a power of two")
        if self.base % (self.stride * self.count):
            raise ValueError(f"array {self.name}: base 0x{self.base:x} is not aligned to its "
                             f"size 0x{self.stride * self.count:x}")
        for f in self.fields:
            if f.address >= self.stride:
                raise ValueError(f"array {self.name}: field {f.name} at offset {f.address} "
                                 f"is outside the stride {self.stride}")
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names):
            raise ValueError(f"array {self.name}: duplicate field names {names}")

    @property
    def end(self) -> int:
        return self.base + self.stride * self.count

    @property
    def field_bits(self) -> int:
        return (self.stride - 1).bit_length()

    @property
    def index_bits(self) -> int:
        return (self.count - 1).bit_length()

    def field(self, name: str) -> Register:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"array {self.name} has no field {name!r} "
                       f"(fields: {', '.join(f.name for f in self.fields)})")

    def address(self, index: int, field: str) -> int:
        if not 0 <= index < self.count:
            raise IndexError(f"{self.name} index {index} is outside 0..{self.count - 1}")
        return self.base + index * self.stride + self.field(field).address

    def addresses(self) -> Iterator[tuple[int, str, Register]]:
        for i in range(self.count):
            for f in self.fields:
                yield self.base + i * self.stride + f.address, f"{self.name}[{i}].{f.name}", f


@dataclasses.dataclass(frozen=True)
class CounterBlock:
    """A read-only 32-bit wrapping counter per name, at ``base + index``."""
    name: str
    base: int
    names: tuple[str, ...]
    doc: str

    @property
    def end(self) -> int:
        return self.base + len(self.names)

    def address(self, counter: str) -> int:
        try:
            return self.base + self.names.index(counter)
        except ValueError:
            raise KeyError(f"{self.name} has no counter {counter!r}") from None

    def items(self) -> Iterator[tuple[str, int]]:
        """``(counter name, address)`` in index order."""
        for i, counter in enumerate(self.names):
            yield counter, self.base + i

    def addresses(self) -> Iterator[tuple[int, str, Register]]:
        for counter, address in self.items():
            yield address, f"{self.name}.{counter}", Register(
                counter, address, Access.R, f"{self.doc}: {counter}")


@dataclasses.dataclass(frozen=True)
class Decoded:
    """What lives at an address: the entry, the group index (arrays) and the register."""
    entry: Register | RegisterArray | CounterBlock
    register: Register
    index: int | None = None

    @property
    def counter(self) -> str | None:
        """The counter's name, for an address in a :class:`CounterBlock`."""
        return self.register.name if isinstance(self.entry, CounterBlock) else None


class RegisterMap:
    """The registers of one engine top, checked for overlaps and address width.

    Parameters
    ----------
    name : str
        The top's name (``"nic"``, ``"switch"``).
    entries : sequence of Register, RegisterArray or CounterBlock
        Non-overlapping, in any order.
    """

    def __init__(self, name: str, entries):
        self.name = name
        self.entries = tuple(entries)
        self._by_name = {}
        self._decode = {}
        for entry in self.entries:
            if entry.name in self._by_name:
                raise ValueError(f"map {name}: two entries named {entry.name!r}")
            self._by_name[entry.name] = entry
            for address, full_name, register in entry.addresses():
                if address >= 1 << ADDRESS_BITS:
                    raise ValueError(f"map {name}: {full_name} at 0x{address:x} does not fit "
                                     f"{ADDRESS_BITS} address bits")
                if address in self._decode:
                    other = self._decode[address]
                    raise ValueError(f"map {name}: {full_name} and {other.entry.name} "
                                     f"overlap at 0x{address:x}")
                index = None
                if isinstance(entry, RegisterArray):
                    index = (address - entry.base) // entry.stride
                self._decode[address] = Decoded(entry, register, index)

    def __getitem__(self, name: str):
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"map {self.name} has no entry {name!r} "
                           f"(entries: {', '.join(self._by_name)})") from None

    def __iter__(self):
        return iter(self.entries)

    def decode(self, address: int) -> Decoded | None:
        """The register at ``address``, or None where nothing is mapped (reads 0)."""
        return self._decode.get(address)

    def rows(self):
        """``(address text, access, width, name, meaning)`` per entry, for documentation."""
        for entry in self.entries:
            if isinstance(entry, Register):
                yield (f"0x{entry.address:03X}", entry.access.value, entry.width, entry.name,
                       entry.doc)
            elif isinstance(entry, CounterBlock):
                yield (f"0x{entry.base:03X} + i", "R", DATA_BITS, f"{entry.name}.<counter i>",
                       f"{entry.doc}: {', '.join(entry.names)} (wrapping)")
            else:
                for f in entry.fields:
                    yield (f"0x{entry.base:03X} + {entry.stride}*j + {f.address}",
                           f.access.value, f.width, f"{entry.name}[j].{f.name}",
                           f.doc + (f" (j < {entry.count}: {entry.doc})"
                                    if f is entry.fields[0] else ""))


#: The value that commits a job's pending configuration (any other value does nothing).
COMMIT = 1


class JobStatus(enum.IntFlag):
    """What a read of a job's ``commit`` register returns."""
    BUSY = 1        #: a commit waits for the engine to drain, or its slots are being cleared
    REJECTED = 2    #: the job's last commit was refused (the job is unconfigured)


def switch_params_word(*, slots: int, lanes: int) -> int:
    """The switch's read-only ``params`` register: ``slots | lanes << 16``."""
    if not (0 < slots < 1 << 16 and 0 < lanes < 1 << 16):
        raise ValueError(f"slots {slots} and lanes {lanes} must each fit 16 bits")
    return slots | lanes << 16


def decode_switch_params(word: int) -> dict[str, int]:
    """``{"slots", "lanes"}`` from the ``params`` register."""
    return {"slots": word & 0xFFFF, "lanes": word >> 16 & 0xFFFF}


def switch_limits_word(*, jobs: int, max_workers: int) -> int:
    """The switch's read-only ``limits`` register: ``jobs | max_workers << 16``."""
    if not (0 < jobs < 1 << 16 and 0 < max_workers < 1 << 16):
        raise ValueError(f"jobs {jobs} and max_workers {max_workers} must each fit 16 bits")
    return jobs | max_workers << 16


def decode_switch_limits(word: int) -> dict[str, int]:
    """``{"jobs", "max_workers"}`` from the ``limits`` register."""
    return {"jobs": word & 0xFFFF, "max_workers": word >> 16 & 0xFFFF}


NIC_REGISTERS = RegisterMap("nic", [
    CounterBlock("tx", 0x000, NIC_TX_COUNTERS, "transmit path (compressor) counter"),
    CounterBlock("rx", 0x100, NIC_RX_COUNTERS, "receive path (decompressor) counter"),
])

SWITCH_REGISTERS = RegisterMap("switch", [
    RegisterArray("job", 0x000, 4, 64, (
        Register("workers", 0, Access.RW,
                 "workers n of the job (0 = unconfigured), pending until a commit"),
        Register("slot_base", 1, Access.RW, "first slot of the job, pending until a commit"),
        Register("slot_count", 2, Access.RW, "slots of the job, pending until a commit"),
        Register("commit", 3, Access.RW,
                 f"write {COMMIT}: apply the pending values and clear the job's slots (other "
                 f"values: nothing); read: status, bit 0 busy, bit 1 last commit rejected (a "
                 f"range beyond the pool or overlapping another job's; always, for a job "
                 f"beyond the engine's)",
                 volatile=JobStatus.BUSY),
    ), "the engine serves its first `jobs`"),
    CounterBlock("counter", 0x100, AGG_COUNTERS, "aggregator counter"),
    RegisterArray("upstream", 0x200, 4, 64, (
        Register("ip", 0, Access.RW,
                 "IPv4 address of the job's upstream aggregator (0: no upstream), pending "
                 "until the job's commit"),
        Register("port", 1, Access.RW, "UDP port of the upstream aggregator (its board's "
                 "port base + 2), pending until the job's commit", width=16),
        Register("job", 2, Access.RW, "the job number at the upstream, pending until the "
                 "job's commit", width=8),
        Register("worker", 3, Access.RW, "this aggregator's worker number in the upstream's "
                 "job, pending until the job's commit", width=8),
    ), "each job's upstream (aggregator-protocol.md section 4): with `ip` set, a completed "
       "slot goes upstream and its workers get the upstream's result"),
    Register("limits", 0x1FE, Access.R, "engine limits: jobs in bits 0-15, max_workers in "
                                        "bits 16-31"),
    Register("params", 0x1FF, Access.R, "engine parameters: slots in bits 0-15, lanes P in "
                                        "bits 16-31"),
])

#: The worker table's geometry in the address map: entry ``job * MAX_WORKERS_IN_TABLE +
#: worker``. A board holds entries for its switch's ``jobs`` and ``max_workers`` only.
MAX_JOBS_IN_TABLE = 64
MAX_WORKERS_IN_TABLE = 32

#: The network front end's own registers (16-bit local addresses, region ``net``).
NET_REGISTERS = RegisterMap("net", [
    CounterBlock("counter", 0x000, NET_COUNTERS, "network front end counter"),
    Register("mac_high", 0x100, Access.R, "the board's MAC address, bits 47-32", width=16),
    Register("mac_low", 0x101, Access.R, "the board's MAC address, bits 31-0"),
    Register("ip", 0x102, Access.R, "the board's IPv4 address (a.b.c.d as a << 24 | ...)"),
    Register("port_base", 0x103, Access.R, "UDP port of the first service", width=16),
    Register("services", 0x104, Access.R,
             "services this bitstream serves: bit i = the service at port_base + i", width=4),
    Register("link", 0x105, Access.R, "bit 0: the PHY reports a link", width=1),
    RegisterArray("group", 0x200, 2, MAX_JOBS_IN_TABLE, (
        Register("ip", 0, Access.RW,
                 "IPv4 multicast address of the job's result group (0: no group)"),
        Register("port", 1, Access.RW, "UDP port of the job's result group (0: no group)",
                 width=16),
    ), "each job's result group: with both fields set and the job configured, a multicast "
       "result leaves once, to the group"),
    RegisterArray("worker", 0x1000, 2, MAX_JOBS_IN_TABLE * MAX_WORKERS_IN_TABLE, (
        Register("ip", 0, Access.RW, "IPv4 address where the worker receives results"),
        Register("port", 1, Access.RW,
                 "UDP port where the worker receives results (0: no worker)", width=16),
    ), f"the aggregator's worker table, entry job * {MAX_WORKERS_IN_TABLE} + worker"),
])

#: Authenticated control (``docs/protocol/network.md`` section 7), in region ``net`` beside
#: :data:`NET_REGISTERS`. A board with a 128-bit control key serves these: the golden and
#: virtual boards all of them, the network top built with such a key all but
#: ``upstream_key`` (which reads 0 anyway: the gateware has no upstream keys yet, and says
#: so in ``auth_features``), a network top with a 64-bit key none. Hence a map of its own, out
#: of :data:`REGISTER_MAPS` (whose every register every network top serves; it has its own
#: table in ``docs/registers.md``). The counters sit right after ``NET_COUNTERS``' block and the write counter after
#: ``link``, so their addresses stay when the gateware takes them into :data:`NET_REGISTERS`
#: (``tests/contract/test_auth.py`` checks that no address is both maps').
#: ``auth_features``' bits: what of section 7 a board with a 128-bit key does.
AUTH_FEATURE_CONTROL = 1 << 0
AUTH_FEATURE_JOBS = 1 << 1
AUTH_FEATURE_UPSTREAM = 1 << 2
AUTH_FEATURES_ALL = AUTH_FEATURE_CONTROL | AUTH_FEATURE_JOBS | AUTH_FEATURE_UPSTREAM

AUTH_REGISTERS = RegisterMap("net_auth", [
    CounterBlock("auth_counter", 0x000 + len(NET_COUNTERS), AUTH_COUNTERS,
                 "authenticated control counter (section 7)"),
    Register("write_counter_low", 0x106, Access.R,
             "the largest accepted CTRL write counter, bits 31-0 (0 after power-up)"),
    Register("write_counter_high", 0x107, Access.R,
             "the largest accepted CTRL write counter, bits 63-32 (0 after power-up)"),
    Register("auth_features", 0x108, Access.R,
             "what of section 7 the board does: bit 0 control tags, bit 1 jobs (job_auth, "
             "tags on AGG_* datagrams and results, the replay filter), bit 2 upstream keys "
             "(wrapped writes, a tree's tags)", width=3),
    RegisterArray("job_auth", 0x300, 2, MAX_JOBS_IN_TABLE, (
        Register("enable", 0, Access.RW,
                 "bit 0: the job's AGG_* datagrams and results carry tags under its job key "
                 "(section 7), pending until the job's commit", width=1),
        Register("epoch", 1, Access.RW,
                 "the epoch the job key is derived with, pending until the job's commit"),
    ), "each job's authentication (section 7): applied by the job's commit in region "
       "`switch`, which also forgets the job's replay filter"),
    RegisterArray("upstream_key", 0x400, 4, MAX_JOBS_IN_TABLE, tuple(
        Register(f"word{i}", i, Access.W,
                 f"bytes {4 * i}..{4 * i + 3} of the job's upstream key (a little-endian "
                 f"word), written wrapped; reads 0")
        for i in range(4)),
        "the job key of each job's upstream (aggregator-protocol.md section 4, where the "
        "parent's job has authentication; all zero: none), pending until the job's commit"),
])

#: The NIC in the wire (``hdl.wire.engine.WireEngine``, ``docs/protocol/network.md``
#: section 6): the shared NIC engine's counters where ``NIC_REGISTERS`` has them, then the
#: counters of each port of the wire.
WIRE_REGISTERS = RegisterMap("wire", [
    CounterBlock("tx", 0x000, NIC_TX_COUNTERS,
                 "NIC transmit path (compressor) counter, gradient datagrams from the host"),
    CounterBlock("rx", 0x100, NIC_RX_COUNTERS,
                 "NIC receive path (decompressor) counter, gradient datagrams from the "
                 "network"),
    CounterBlock("port0", 0x200, WIRE_COUNTERS, "host-side port (0) counter"),
    CounterBlock("port1", 0x300, WIRE_COUNTERS, "network-side port (1) counter"),
])

#: Every map, by name: the engine tops', the network front end's and the NIC in the wire's.
#: ``contract.network`` puts each into the one address space of ``CTRL`` packets (regions
#: ``nic`` 0, ``switch`` 1, ``net`` 2, ``wire`` 3).
REGISTER_MAPS = {"nic": NIC_REGISTERS, "switch": SWITCH_REGISTERS, "net": NET_REGISTERS,
                 "wire": WIRE_REGISTERS}


def markdown_table(register_map: RegisterMap) -> str:
    """The map as a Markdown table (``docs/registers.md`` holds this text)."""
    lines = ["| address | access | bits | register | meaning |", "|---|---|---|---|---|"]
    for address, access, width, name, doc in register_map.rows():
        lines.append(f"| `{address}` | {access} | {width} | `{name}` | {doc} |")
    return "\n".join(lines)


if __name__ == "__main__":
    for name, register_map in REGISTER_MAPS.items():
        print(f"`{name}`:\n\n{markdown_table(register_map)}\n")
