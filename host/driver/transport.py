"""Transports: what carries packets between the host driver and an engine.

The driver talks to every engine through the same small interface, :class:`Transport`, so
its code is the same whether the engine is the NumPy reference model, the Verilated
gateware (:class:`VerilatorTransport`), or, later, an FPGA NIC behind a UDP socket:

- ``exchange(stream, packets) -> list[Packet]``: send packets into one of the engine's
  AXI-Stream paths and return what that path emits;
- ``write(addr, value)`` / ``read(addr)``: the engine's control registers;
- ``stats``: per-stream counts of beats and clock cycles (``None`` where there is no clock).
"""
from __future__ import annotations

import os
import secrets
import tempfile
import threading
from dataclasses import dataclass, field
from multiprocessing.connection import Client, Listener
from pathlib import Path

from ..packet import Packet

__all__ = ["Transport", "TransportError", "ExchangeStats", "VerilatorTransport"]


class TransportError(RuntimeError):
    """The engine behind a transport failed, timed out or went away."""


@dataclass
class ExchangeStats:
    """Totals of one stream over all exchanges (clock-accurate on a simulated engine)."""
    exchanges: int = 0
    packets_in: int = 0
    packets_out: int = 0
    in_beats: int = 0
    out_beats: int = 0
    #: clock cycles from each exchange's first input beat to its last output beat, summed
    busy_cycles: int = 0
    #: cycles in which the input offered a beat that the engine did not take
    stall_cycles: int = 0
    #: clock cycles the exchanges ran in all (idle tails included)
    cycles: int = 0
    latencies: list = field(default_factory=list)

    def add(self, reply, packets_in):
        self.exchanges += 1
        self.packets_in += packets_in
        self.packets_out += len(reply["frames"])
        self.in_beats += reply["in_beats"]
        self.out_beats += reply["out_beats"]
        self.stall_cycles += reply["stall_in"]
        self.cycles += reply.get("cycles") or 0
        if reply["first_in"] is not None and reply["last_out"] is not None:
            self.busy_cycles += reply["last_out"] - reply["first_in"] + 1
        if reply["first_in"] is not None and reply["first_out"] is not None:
            self.latencies.append(reply["first_out"] - reply["first_in"])

    def as_dict(self):
        d = {k: v for k, v in self.__dict__.items() if k != "latencies"}
        if self.busy_cycles:
            d["in_beats_per_cycle"] = self.in_beats / self.busy_cycles
            d["out_beats_per_cycle"] = self.out_beats / self.busy_cycles
        if self.latencies:
            d["first_beat_latency_cycles"] = min(self.latencies)
        return d


class Transport:
    """Base class. Subclasses implement :meth:`_exchange`, :meth:`write` and :meth:`read`."""

    #: name of the clock-accurate backend, or None for models without a clock
    clocked = False

    def __init__(self):
        self.stats = {}

    def exchange(self, stream, packets, **options):
        """Send ``packets`` into ``stream`` and return the packets it emits, in order."""
        packets = list(packets)
        reply = self._exchange(stream, packets, options)
        self.stats.setdefault(stream, ExchangeStats()).add(reply, len(packets))
        return [Packet.from_bytes(f) for f in reply["frames"]]

    def _exchange(self, stream, packets, options):
        raise NotImplementedError

    def write(self, addr, value):
        raise NotImplementedError

    def read(self, addr):
        raise NotImplementedError

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class VerilatorTransport(Transport):
    """The Verilated gateware, driven through cocotb and cocotbext-axi.

    The simulator runs in a child process (``sim/bridge.py`` as the cocotb test); requests
    go over a private Unix socket. Simulated time only advances inside a request.

    Parameters
    ----------
    top : str
        Top module name.
    verilog : str
        Its Verilog text (``sim.runner.export_verilog``).
    streams : dict
        ``{name: (sink_prefix, source_prefix)}``, e.g. ``{"tx": ("tx_s_axis", "tx_m_axis")}``.
    ctrl : bool
        Whether the top has the ``ctrl_*`` register port.
    waves : bool
        Record the whole session's waveforms into ``build/waves/<top>/`` (FST where
        Verilator can write it, else VCD).
    """

    clocked = True

    def __init__(self, top, verilog, streams, *, ctrl=True, waves=None, period_ns=8,
                 connect_timeout=600):
        super().__init__()
        from sim.runner import build, run_cocotb

        self.top = top
        self._tmp = tempfile.TemporaryDirectory(prefix="gradwire-bridge-")
        address = os.path.join(self._tmp.name, "bridge.sock")
        authkey = secrets.token_bytes(16)
        self._listener = Listener(address, family="AF_UNIX", authkey=authkey)
        build(top, verilog, waves=bool(waves))   # build before the clock starts ticking
        params = {"address": address, "authkey": authkey.hex(), "streams": streams,
                  "ctrl": ctrl, "period_ns": period_ns}
        self._failure = None
        if waves:
            # Waves outlive the session: build/waves/<top>/dump.fst (or .vcd).
            from sim.runner import BUILD
            self.test_dir = BUILD / "waves" / top
        else:
            self.test_dir = Path(tempfile.mkdtemp(prefix=f"{top}-", dir=self._tmp.name))

        def simulate():
            try:
                run_cocotb(top, verilog, "sim.bridge", params=params, waves=waves,
                           test_dir=self.test_dir)
            except BaseException as exc:   # SystemExit from cocotb's runner included
                self._failure = exc
            finally:
                if not hasattr(self, "_conn"):
                    # Unblock accept() so the host sees the failure instead of hanging.
                    try:
                        Client(address, family="AF_UNIX", authkey=authkey).close()
                    except OSError:
                        pass

        self._thread = threading.Thread(target=simulate, name=f"verilator-{top}", daemon=True)
        self._thread.start()
        conn = self._listener.accept()
        if self._failure is not None or not self._thread.is_alive():
            raise TransportError(f"the {top} simulation ended before it connected: "
                                 f"{self._failure!r}; see {self.test_dir}/sim.log")
        self._conn = conn

    def _call(self, *request):
        try:
            self._conn.send(request)
            status, reply = self._conn.recv()
        except (EOFError, OSError) as exc:
            raise TransportError(f"the {self.top} simulation went away ({exc}); "
                                 f"see {self.test_dir}/sim.log") from exc
        if status != "ok":
            raise TransportError(f"{self.top}: {reply}")
        return reply

    def _exchange(self, stream, packets, options):
        return self._call("exchange", stream, [p.to_bytes() for p in packets], options)

    def write(self, addr, value):
        self._call("write", int(addr), int(value))

    def read(self, addr):
        return self._call("read", int(addr))

    def idle(self, cycles):
        self._call("idle", int(cycles))

    @property
    def cycle(self):
        return self._call("cycle")

    def close(self):
        if getattr(self, "_conn", None) is not None:
            try:
                self._call("close")
            except TransportError:
                pass
            self._conn.close()
            self._conn = None
            self._thread.join(timeout=60)
        self._listener.close()
        self._tmp.cleanup()
