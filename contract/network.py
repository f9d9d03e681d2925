"""The network contract (``docs/protocol/network.md``): addresses, one UDP port per service,
the ``CTRL`` packet, and the one address map that ``CTRL`` packets read and write.

Everything the board's network front end (``hdl/net/``), the host's UDP transport, the
virtual board and the tests share about the network is declared here.
"""
from __future__ import annotations

import dataclasses
import enum
import ipaddress

from .frames import IP_HEADER, MAX_FRAME_BYTES, MIN_FRAME_BYTES, UDP_HEADER
from .header import HEADER_BYTES, NIC_MAX_COUNT
from .registers import (MAX_JOBS_IN_TABLE, MAX_WORKERS_IN_TABLE, NET_REGISTERS, NIC_REGISTERS,
                        SWITCH_REGISTERS, WIRE_REGISTERS, RegisterMap)

__all__ = [
    "DEFAULT_MAC", "DEFAULT_IP", "PORT_BASE", "Service", "SERVICE_OFFSETS", "service_ports",
    "MTU_DEFAULT", "MTU_JUMBO", "IP_UDP_HEADER_BYTES", "NIC_VALUES_PER_MTU", "nic_values_for_mtu",
    "CTRL_TYPE", "CtrlOp", "CTRL_OP_OFFSET", "CTRL_COUNT_OFFSET", "CTRL_SEQ_OFFSET", "CTRL_KEY_OFFSET",
    "CTRL_KEY_BYTES", "CTRL_AUTH_KEY_BYTES", "CTRL_COUNTER_OFFSET", "CTRL_COUNTER_BYTES",
    "CTRL_TAG_OFFSET", "CTRL_TAG_BYTES", "JOB_KEY_LABEL", "WRAP_LABEL", "CTRL_MAX_PAIRS", "SIMULATION_KEY", "parse_key",
    "format_key", "MAX_JOBS_IN_TABLE", "MAX_WORKERS_IN_TABLE",
    "NET_REGISTERS", "Region", "NETWORK_REGIONS", "network_address", "decode_network_address",
    "mac_to_int", "ip_to_int", "WIRE_GRADIENT_PORT", "WIRE_PORTS", "MAX_FRAME_BYTES",
    "MIN_FRAME_BYTES", "BufferSizes", "GROUP_TTL", "is_multicast", "multicast_mac", "group_active",
]

#: The board's addresses unless the bitstream is built with others (spec section 1).
DEFAULT_MAC = "02:47:57:00:00:01"
DEFAULT_IP = "192.168.77.2"

#: The first of the four service ports (spec section 2).
PORT_BASE = 47570


class Service(enum.Enum):
    """The board's services, one UDP port each (``PORT_BASE + offset``)."""
    NIC_TX = "nic_tx"     #: NIC transmit path (compressor): one packet in, the TX output back
    NIC_RX = "nic_rx"     #: NIC receive path (decompressor): nothing back for a dropped one
    SWITCH = "switch"     #: switch aggregator: results to the job's workers
    CTRL = "ctrl"         #: control: one ``CTRL`` packet, its reply back


SERVICE_OFFSETS = {Service.NIC_TX: 0, Service.NIC_RX: 1, Service.SWITCH: 2, Service.CTRL: 3}


def service_ports(port_base: int = PORT_BASE) -> dict[Service, int]:
    """The UDP port of every service for a board serving from ``port_base``."""
    if not 1 <= port_base <= 0xFFFF - 3:
        raise ValueError(f"port_base {port_base} leaves no room for four ports below 65536")
    return {service: port_base + offset for service, offset in SERVICE_OFFSETS.items()}


#: The NIC in the wire (spec section 6): the UDP port of gradient datagrams (a build
#: option), and the board's two ports: 0 faces the host, 1 the network.
WIRE_GRADIENT_PORT = 47574
WIRE_PORTS = (0, 1)
#: Ethernet frames the board accepts, FCS included (spec section 1): 64 to 9018 bytes
#: (``MIN_FRAME_BYTES``, ``MAX_FRAME_BYTES``: declared in :mod:`contract.frames`).

#: IP MTUs: standard Ethernet, and the jumbo frames the board accepts (9018-byte frames).
MTU_DEFAULT = 1500
MTU_JUMBO = 9000
#: IPv4 (no options) and UDP headers inside the MTU.
IP_UDP_HEADER_BYTES = IP_HEADER + UDP_HEADER


def nic_values_for_mtu(mtu: int) -> int:
    """Most fp32 values a NIC packet (32-byte header, payload) carries in one datagram of an
    ``mtu``-byte IP packet, capped at the NIC's maximum of 2048 (spec section 2)."""
    values = (mtu - IP_UDP_HEADER_BYTES - HEADER_BYTES) // 4
    if values < 8:
        raise ValueError(f"an MTU of {mtu} bytes leaves no room for a NIC packet")
    return min(values, NIC_MAX_COUNT)


#: 360 at the standard MTU (spec section 2: (1472 - 32) / 4).
NIC_VALUES_PER_MTU = nic_values_for_mtu(MTU_DEFAULT)


#: ``type`` of a ``CTRL`` packet (header offset 2; aggregator-protocol.md section 1).
CTRL_TYPE = 4


class CtrlOp(enum.IntEnum):
    """``op`` byte of a ``CTRL`` packet (header offset 4, where other types have ``k``)."""
    READ = 0
    WRITE = 1


#: Byte offsets of the ``CTRL`` fields in the 32-byte header (spec section 4).
CTRL_OP_OFFSET = 4
CTRL_COUNT_OFFSET = 8
CTRL_SEQ_OFFSET = 16
CTRL_KEY_OFFSET = 24
CTRL_KEY_BYTES = 8
#: Authenticated control (spec section 7; host side only for now, the gateware follows): a
#: 128-bit control key, never sent; a 64-bit little-endian counter in header bytes 16..23
#: (``seq`` is its low 32 bits); a SipHash-2-4 tag in place of the key, bytes 24..31.
CTRL_AUTH_KEY_BYTES = 16
CTRL_COUNTER_OFFSET = CTRL_SEQ_OFFSET
CTRL_COUNTER_BYTES = 8
CTRL_TAG_OFFSET = CTRL_KEY_OFFSET
CTRL_TAG_BYTES = 8
#: Section 7's derivations: a job key's messages start with JOB_KEY_LABEL, a wrapped
#: write's pad's with WRAP_LABEL (8 bytes each: one SipHash word).
JOB_KEY_LABEL = b"gwjobkey"
WRAP_LABEL = b"gwwrap\0\0"
#: (address, value) pairs per ``CTRL`` packet, 1..64.
CTRL_MAX_PAIRS = 64
#: The control key of the simulation tops (``make verilog``, the benches, the Verilated
#: board): public, so never a board's (``make bitstream`` draws a random one).
SIMULATION_KEY = 0x5349_4D55_4C41_5445      # "SIMULATE"

@dataclasses.dataclass(frozen=True)
class Region:
    """One register map in the network address space: ``address = index << 16 | local``."""
    name: str
    index: int
    registers: RegisterMap


#: The one address map ``CTRL`` packets use (32-bit addresses). A board serves the regions
#: it has and reads the others as 0: the network top ``nic``, ``switch`` and ``net``, the
#: NIC in the wire ``wire`` alone (its control service, ``hdl.wire.service``).
NETWORK_REGIONS = (
    Region("nic", 0, NIC_REGISTERS),
    Region("switch", 1, SWITCH_REGISTERS),
    Region("net", 2, NET_REGISTERS),
    Region("wire", 3, WIRE_REGISTERS),
)
_REGIONS_BY_NAME = {r.name: r for r in NETWORK_REGIONS}
_REGIONS_BY_INDEX = {r.index: r for r in NETWORK_REGIONS}


def network_address(region: str, local: int) -> int:
    """The 32-bit ``CTRL`` address of ``local`` in ``region`` (``"nic"``, ``"switch"``,
    ``"net"``, ``"wire"``)."""
    if region not in _REGIONS_BY_NAME:
        raise KeyError(f"no region {region!r} (regions: {', '.join(_REGIONS_BY_NAME)})")
    if not 0 <= local <= 0xFFFF:
        raise ValueError(f"local address {local:#x} does not fit 16 bits")
    return _REGIONS_BY_NAME[region].index << 16 | local


def decode_network_address(address: int):
    """``(region, local address)`` of a 32-bit ``CTRL`` address, or ``None`` outside every
    region (the board reads such an address as 0 and ignores writes to it)."""
    region = _REGIONS_BY_INDEX.get(address >> 16)
    return None if region is None else (region, address & 0xFFFF)


def mac_to_int(mac: str) -> int:
    """``"02:47:57:00:00:01"`` as a 48-bit integer (first byte most significant)."""
    parts = mac.split(":")
    if len(parts) != 6 or not all(len(p) == 2 for p in parts):
        raise ValueError(f"{mac!r} is not a MAC address like 02:47:57:00:00:01")
    try:
        return int("".join(parts), 16)
    except ValueError:
        raise ValueError(f"{mac!r} is not a MAC address like 02:47:57:00:00:01") from None


def ip_to_int(ip: str) -> int:
    """``"192.168.77.2"`` as a 32-bit integer (first byte most significant)."""
    return int(ipaddress.IPv4Address(ip))


#: IPv4 TTL of a result sent to a job's result group (spec section 3: the group stays on
#: the board's segment).
GROUP_TTL = 1


def is_multicast(ip: int | str) -> bool:
    """Whether an IPv4 address (dotted or as an integer) is in 224.0.0.0/4."""
    value = ip_to_int(ip) if isinstance(ip, str) else ip
    return value >> 28 == 0xE


def multicast_mac(ip: int | str) -> str:
    """The Ethernet address of an IPv4 multicast group: ``01:00:5e`` and the low 23 bits."""
    value = ip_to_int(ip) if isinstance(ip, str) else ip
    if not is_multicast(value):
        raise ValueError(f"{ipaddress.IPv4Address(value)} is not an IPv4 multicast address "
                         f"(224.0.0.0/4)")
    low = value & 0x7FFFFF
    return "01:00:5e:" + ":".join(f"{low >> s & 0xFF:02x}" for s in (16, 8, 0))


def group_active(ip: int, port: int) -> bool:
    """Whether a job's ``group`` registers name a group: both fields non-zero (the board
    sends to whatever address is written; the host writes only multicast ones)."""
    return ip != 0 and port != 0


@dataclasses.dataclass(frozen=True)
class BufferSizes:
    """Beats (32 bytes) of each service's input and output buffer in the board's network
    front end, and datagrams queued (``hdl.net.front_end.front_end.NetworkFrontEnd``).

    The defaults, which every board's network top is built with, take a jumbo datagram
    (8972 bytes, 281 beats) whole into every data service and hold several standard ones;
    the control service's requests are at most 544 bytes (17 beats). The host keeps what it
    has in flight within the output buffers (``host.driver.pacing``).
    """
    nic_in: int = 512
    nic_out: int = 512
    switch_in: int = 512
    switch_out: int = 64
    ctrl_in: int = 64
    ctrl_out: int = 32
    queue: int = 32


def parse_key(text: str) -> int | bytes:
    """A control key from its hex digits (``"0x"`` and ``_``/``:`` separators allowed): 1 to
    16 digits are section 4's 64-bit key, an ``int``; exactly 32 are section 7's 128-bit
    key (``docs/protocol/network.md``: its bytes in order, first byte first), 16 ``bytes``,
    whatever their value (leading zeros included)."""
    digits = str(text).strip().lower().removeprefix("0x").replace("_", "").replace(":", "")
    if any(c not in "0123456789abcdef" for c in digits) or not (
            1 <= len(digits) <= 2 * CTRL_KEY_BYTES or len(digits) == 2 * CTRL_AUTH_KEY_BYTES):
        raise ValueError(f"a control key is 1 to {2 * CTRL_KEY_BYTES} hex digits (64 bits) or "
                         f"exactly {2 * CTRL_AUTH_KEY_BYTES} (128 bits, authenticated "
                         f"control), not {text!r}")
    if len(digits) == 2 * CTRL_AUTH_KEY_BYTES:
        return bytes.fromhex(digits)
    return int(digits, 16)


def format_key(key: int | bytes) -> str:
    """``key`` as the hex digits :func:`parse_key` reads: 16 for a 64-bit key, 32 for a
    128-bit one."""
    if isinstance(key, (bytes, bytearray)):
        return bytes(key).hex()
    return f"{key:0{2 * CTRL_KEY_BYTES}x}"
