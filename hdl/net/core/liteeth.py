"""The LiteEth Ethernet/IPv4/UDP core: per-board configuration and cached generation.

``constraints/network.toml`` holds each board's network choices (:func:`load_network_config`
returns them as a checked :class:`NetworkConfig`); :func:`generate` runs LiteEth's Python
API (the Migen half, :mod:`hdl.net.core.liteeth_migen`, in a subprocess) and returns the
Verilog of the core with its port list, cached under ``build/liteeth/<board>-<hash>/`` by
the content of the configuration, the versions of LiteEth, LiteX and Migen and the
generator's own source. Generation takes about a second.

Two kinds of core (:data:`CORE_MODULES`): ``network``, module ``liteeth_core``, the board's
own Ethernet/IPv4/UDP endpoint on one port (the network top), and ``wire``, module
``liteeth_wire``, LiteEth's PHY and MAC on each of a board's two ports, raw frames without
their FCS (the NIC in the wire, ``network.md`` section 6: frames go from one port to the
other, and the parsing is the wire's own, :mod:`hdl.wire`).

What the generated core is and does (ports, timing, clocks, drops): ``docs/network-core.md``
and :mod:`hdl.net.core.liteeth_migen`; the Amaranth side is
:class:`hdl.net.core.eth_core.LiteEthCore`.
"""
from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import importlib.metadata
import ipaddress
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from types import MappingProxyType

__all__ = ["NETWORK_FILE", "CORE_NAME", "CORE_MODULES", "RGMII_PINS", "EVENTS",
           "NetworkConfig", "CorePort", "GeneratedCore", "load_network_config", "generate", "parse_ports"]

REPO = Path(__file__).resolve().parents[3]
NETWORK_FILE = REPO / "constraints" / "network.toml"
CORE_NAME = "liteeth_core"
#: kind of core -> the Verilog module it generates
CORE_MODULES = {"network": CORE_NAME, "wire": "liteeth_wire"}
#: The core's RGMII pins, the keys of a board's ``pins`` table.
RGMII_PINS = ("tx_clk", "tx_ctl", "tx_data", "rx_clk", "rx_ctl", "rx_data")
#: Packages whose code goes into the generated Verilog (their versions key the cache).
GENERATOR_PACKAGES = ("liteeth", "litex", "migen")
#: The core's event strobes: output ``ev_<name>``, a one-cycle pulse in the sys domain per
#: frame or datagram dropped (or ARP event), with what it counts.
EVENTS = {
    "rx_preamble": "frame without a valid preamble/SFD (dropped by the MAC)",
    "rx_fcs": "frame with a bad FCS (a datagram in it is handed out with error set)",
    "rx_runt": "frame under 64 bytes with its FCS (good FCS; datagram flagged error)",
    "rx_oversize": "frame over the jumbo limit (good FCS; datagram flagged error)",
    "rx_mac": "frame for another MAC address (dropped)",
    "rx_ethertype": "frame neither IPv4 nor ARP, e.g. IPv6 or VLAN-tagged (dropped)",
    "ip_header": "IPv4 header with options (IHL > 5) or not IPv4 at all (dropped)",
    "ip_checksum": "IPv4 header checksum wrong (dropped)",
    "ip_address": "IPv4 datagram for another IP address (dropped)",
    "ip_fragment": "IPv4 fragment (MF set or offset non-zero; dropped)",
    "ip_protocol": "IPv4 protocol neither UDP nor ICMP (dropped)",
    "udp_length": "UDP length under 8, beyond the IP payload, or the frame ended early "
                  "(good FCS; datagram flagged error)",
    "udp_checksum": "non-zero UDP checksum wrong (good FCS; datagram flagged error)",
    "arp_miss": "transmit to an IP not in the ARP cache: the datagram is parked and an ARP "
                "request goes out",
    "arp_unreachable": "no ARP reply after 8 requests arp_timeout_s apart: the parked "
                       "datagram was dropped",
    "arp_busy_drop": "transmit to an IP not in the ARP cache while another datagram is "
                     "parked: dropped at once (no ARP request)",
}
#: DELAYG: 25 ps per tap, 7-bit tap count.
DELAY_TAP_NS = 0.025
DELAY_MAX_TAPS = 127


@dataclasses.dataclass(frozen=True)
class NetworkConfig:
    """One board's network core, as ``constraints/network.toml`` describes it."""
    board: str
    part: str
    resource: tuple
    pins: MappingProxyType
    tx_delay_ns: float
    rx_delay_ns: float
    mac_address: str
    ip_address: str
    sys_clk_hz: int
    arp_entries: int
    arp_timeout_s: float
    max_frame: int
    icmp_fifo_depth: int
    udp_ports: MappingProxyType
    #: the second RGMII port of a two-port board (the NIC in the wire's network side), as
    #: ``resource`` and ``pins``; None on a board with one port
    port1_resource: tuple | None = None
    port1_pins: MappingProxyType | None = None

    def __post_init__(self):
        where = f"network config of {self.board!r}"
        octets = self.mac_address.split(":")
        if len(octets) != 6 or not all(re.fullmatch(r"[0-9a-fA-F]{2}", o) for o in octets):
            raise ValueError(f"{where}: MAC address must look like 02:47:57:00:00:01, "
                             f"not {self.mac_address!r}")
        if int(octets[0], 16) & 1:
            raise ValueError(f"{where}: MAC address {self.mac_address} is a multicast "
                             "address (lowest bit of the first octet set)")
        try:
            ip = ipaddress.IPv4Address(self.ip_address)
        except ValueError:
            raise ValueError(f"{where}: IPv4 address must be dotted decimal, "
                             f"not {self.ip_address!r}") from None
        if ip.is_multicast or ip.is_unspecified or int(ip) & 0xff == 0xff:
            # LiteEth's IP transmitter treats any address ending in .255 as broadcast.
            raise ValueError(f"{where}: {ip} cannot be a board address")
        for name in ("tx_delay_ns", "rx_delay_ns"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not (
                    0 <= value <= DELAY_MAX_TAPS * DELAY_TAP_NS):
                raise ValueError(f"{where}: {name} must be 0..{DELAY_MAX_TAPS * DELAY_TAP_NS}"
                                 f" ns (DELAYG taps of 25 ps), not {value!r}")
        if not isinstance(self.sys_clk_hz, int) or not 50e6 <= self.sys_clk_hz <= 250e6:
            # 32-bit words at 1 Gb/s need 31.25 MHz plus per-packet overhead.
            raise ValueError(f"{where}: sys_clk_hz must be 50..250 MHz, not {self.sys_clk_hz!r}")
        if not isinstance(self.arp_entries, int) or not 2 <= self.arp_entries <= 1024:
            raise ValueError(f"{where}: arp_entries must be 2..1024, not {self.arp_entries!r}")
        if (isinstance(self.arp_timeout_s, bool) or not isinstance(self.arp_timeout_s, (int, float))
                or not 1e-6 <= self.arp_timeout_s <= 10):
            raise ValueError(f"{where}: arp_timeout_s must be 1 us..10 s, "
                             f"not {self.arp_timeout_s!r}")
        if not isinstance(self.max_frame, int) or not 64 <= self.max_frame <= 16000:
            raise ValueError(f"{where}: max_frame must be 64..16000 bytes, "
                             f"not {self.max_frame!r}")
        depth = self.icmp_fifo_depth
        if not isinstance(depth, int) or depth < 64 or depth & (depth - 1):
            raise ValueError(f"{where}: icmp_fifo_depth must be a power of two >= 64, "
                             f"not {depth!r}")
        if set(self.pins) != set(RGMII_PINS):
            raise ValueError(f"{where}: pins must name exactly {', '.join(RGMII_PINS)}; "
                             f"got {', '.join(sorted(self.pins))}")
        if (self.port1_resource is None) != (self.port1_pins is None):
            raise ValueError(f"{where}: port1_resource and port1_pins go together")
        if self.port1_pins is not None and set(self.port1_pins) != set(RGMII_PINS):
            raise ValueError(f"{where}: port1_pins must name exactly {', '.join(RGMII_PINS)}; "
                             f"got {', '.join(sorted(self.port1_pins))}")
        if self.port1_resource is not None and tuple(self.port1_resource) == tuple(self.resource):
            raise ValueError(f"{where}: port1_resource is port 0's resource "
                             f"{list(self.resource)}")
        ports = list(self.udp_ports.values())
        if len(set(ports)) != len(ports) or not all(
                isinstance(p, int) and 1 <= p <= 65535 for p in ports):
            raise ValueError(f"{where}: udp_ports must be distinct ports 1..65535, "
                             f"not {dict(self.udp_ports)}")

    @property
    def mac_int(self) -> int:
        return int(self.mac_address.replace(":", ""), 16)

    @property
    def ip_int(self) -> int:
        return int(ipaddress.IPv4Address(self.ip_address))

    @property
    def two_ports(self) -> bool:
        """Whether the board has a second RGMII port (it can be a NIC in the wire)."""
        return self.port1_resource is not None

    def replace(self, **changes) -> "NetworkConfig":
        """A copy with some keys changed (checked again), e.g. build options MAC and IP."""
        return dataclasses.replace(self, **changes)

    def core_config(self) -> dict:
        """What the Verilog depends on: the generator's input (and the cache key's)."""
        return {
            "device": self.part,
            "mac_address": self.mac_address.lower(),
            "ip_address": self.ip_address,
            "tx_delay_ns": float(self.tx_delay_ns),
            "rx_delay_ns": float(self.rx_delay_ns),
            "sys_clk_hz": self.sys_clk_hz,
            "arp_entries": self.arp_entries,
            "arp_timeout_s": float(self.arp_timeout_s),
            "max_frame": self.max_frame,
            "icmp_fifo_depth": self.icmp_fifo_depth,
        }

    def wire_core_config(self) -> dict:
        """The ``wire`` core's generator input: PHY and MAC on both ports, nothing above
        (no addresses: the board's own service is the wire's, not LiteEth's)."""
        if not self.two_ports:
            raise ValueError(f"board {self.board!r} has one RGMII port: no NIC in the wire "
                             f"(constraints/network.toml names no port1_resource)")
        return {
            "kind": "wire",
            "device": self.part,
            "tx_delay_ns": float(self.tx_delay_ns),
            "rx_delay_ns": float(self.rx_delay_ns),
            "sys_clk_hz": self.sys_clk_hz,
        }


def load_network_config(board: str, path: Path | str = NETWORK_FILE, **overrides) -> NetworkConfig:
    """The network configuration of ``board``; ``overrides`` replace single keys."""
    with open(path, "rb") as f:
        table = tomllib.load(f)
    boards = sorted(k for k in table if k != "defaults")
    if board not in boards:
        raise ValueError(f"No network configuration for board {board!r} in {path}; "
                         f"known: {', '.join(boards)}")
    merged = {**table.get("defaults", {}), **table[board], **overrides}
    fields = {f.name for f in dataclasses.fields(NetworkConfig)} - {"board"}
    optional = {"port1_resource", "port1_pins"}
    unknown = sorted(set(merged) - fields)
    missing = sorted(fields - optional - set(merged))
    if unknown or missing:
        raise ValueError(f"network config of {board!r} in {path}: "
                         + (f"unknown keys {', '.join(unknown)}" if unknown else "")
                         + ("; " if unknown and missing else "")
                         + (f"missing keys {', '.join(missing)}" if missing else ""))
    for key in ("resource", "port1_resource"):
        resource = merged.get(key)
        if resource is None:
            continue
        if (not isinstance(resource, (list, tuple)) or len(resource) != 2
                or not isinstance(resource[0], str) or not isinstance(resource[1], int)):
            raise ValueError(f"network config of {board!r}: {key} must be [name, number], "
                             f"not {resource!r}")
        merged[key] = tuple(resource)
    merged["pins"] = MappingProxyType(dict(merged["pins"]))
    if merged.get("port1_pins") is not None:
        merged["port1_pins"] = MappingProxyType(dict(merged["port1_pins"]))
    merged["udp_ports"] = MappingProxyType(dict(merged["udp_ports"]))
    return NetworkConfig(board=board, **merged)


@dataclasses.dataclass(frozen=True)
class CorePort:
    """One port of the generated module."""
    name: str
    direction: str      # "i" or "o"
    width: int


@dataclasses.dataclass(frozen=True)
class GeneratedCore:
    """A generated core: its Verilog file, module name and ports."""
    config: NetworkConfig
    verilog_path: Path
    ports: tuple
    module: str = CORE_NAME

    def port(self, name: str) -> CorePort:
        for port in self.ports:
            if port.name == name:
                return port
        raise KeyError(f"{self.module} has no port {name!r}")

    def verilog(self) -> str:
        return self.verilog_path.read_text()


_PORT_RE = re.compile(r"^\s*(input|output|inout)\s+(?:wire|reg)?\s*(?:\[(\d+):(\d+)\])?\s*(\w+)")


def parse_ports(verilog_text: str, module: str = CORE_NAME) -> tuple:
    """Ports of ``module`` in Verilog-2001 ANSI style (as Migen writes them)."""
    match = re.search(rf"^module\s+{module}\s*\((.*?)^\);", verilog_text, re.M | re.S)
    if match is None:
        raise ValueError(f"No module {module!r} in the generated Verilog")
    ports = []
    for line in match.group(1).splitlines():
        m = _PORT_RE.match(line)
        if m:
            direction, msb, lsb, name = m.groups()
            if direction == "inout":
                raise ValueError(f"{module} port {name} is bidirectional; the core should "
                                 "have none (no MDIO)")
            width = int(msb) - int(lsb) + 1 if msb is not None else 1
            ports.append(CorePort(name, direction[0], width))
    return tuple(ports)


def _versions() -> dict:
    versions = {}
    for package in GENERATOR_PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            raise RuntimeError(
                f"{package} is not installed: the network core needs LiteEth "
                "(`make setup` installs the project's `net` extra)") from None
    return versions


def _build_root() -> Path:
    return Path(os.environ.get("GRADWIRE_BUILD", REPO / "build")) / "liteeth"


def generate(config: NetworkConfig, build_root: Path | str | None = None, *,
             kind: str = "network") -> GeneratedCore:
    """Generate (or reuse) the Verilog of ``config``'s core of ``kind`` (:data:`CORE_MODULES`).

    Raises ``RuntimeError`` with LiteEth's own message when the generator fails, and
    ``ValueError`` for an unknown kind or a ``wire`` core on a board with one port.
    """
    if kind not in CORE_MODULES:
        raise ValueError(f"kind must be one of {', '.join(CORE_MODULES)}, not {kind!r}")
    module = CORE_MODULES[kind]
    core_config = config.core_config() if kind == "network" else config.wire_core_config()
    sources = hashlib.sha256()
    for source in (Path(__file__), Path(__file__).with_name("liteeth_migen.py")):
        sources.update(source.read_bytes())
    key = json.dumps({"config": core_config, "versions": _versions(),
                      "generator": sources.hexdigest()},
                     sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    out_dir = Path(build_root or _build_root()) / f"{config.board}-{digest}"
    out_dir.mkdir(parents=True, exist_ok=True)
    verilog_path = out_dir / f"{module}.v"
    with open(out_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not verilog_path.exists():
            (out_dir / "config.json").write_text(json.dumps(json.loads(key), indent=2) + "\n")
            partial = out_dir / f"{module}.v.partial"
            result = subprocess.run(
                [sys.executable, "-m", "hdl.net.core.liteeth_migen", str(out_dir / "config.json"),
                 str(partial)],
                cwd=REPO, capture_output=True, text=True,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(
                    [str(REPO), os.environ.get("PYTHONPATH", "")])})
            (out_dir / "generate.log").write_text(result.stdout + result.stderr)
            if result.returncode != 0:
                tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-15:])
                raise RuntimeError(f"LiteEth generation failed for {config.board} "
                                   f"(log: {out_dir / 'generate.log'}):\n{tail}")
            partial.replace(verilog_path)
    return GeneratedCore(config=config, verilog_path=verilog_path, module=module,
                         ports=parse_ports(verilog_path.read_text(), module))
