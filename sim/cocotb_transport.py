"""The Verilated gateware behind the driver's :class:`~host.driver.transport.Transport` API,
driven through cocotb and cocotbext-axi (the cocotb side is ``sim/bridge.py``).

:func:`open_top` is the ``"cocotb"`` backend of ``host.driver.backends`` (the same
gateware as the ``"verilator"`` backend's compiled harness, driven through cocotb for its
waveform debugging).
"""
from __future__ import annotations

import os
import secrets
import tempfile
import threading
from multiprocessing.connection import Client, Listener
from pathlib import Path

from contract.tops import TOP_PORTS
from hdl.export import export_verilog, make_top
from host.driver.transport import Transport, TransportError

__all__ = ["CocotbTransport", "open_top"]


def open_top(top, *, waves=None, **params):
    """A :class:`CocotbTransport` to the exported ``top`` built with ``params``."""
    ports = TOP_PORTS[top]
    return CocotbTransport(top, export_verilog(make_top(top, **params), top), ports.streams,
                           ctrl=True, waves=waves)


class CocotbTransport(Transport):
    """The Verilated gateware, driven through cocotb and cocotbext-axi.

    The simulator runs in a child process (``sim/bridge.py`` as the cocotb test); requests
    go over a private Unix socket. Simulated time only advances inside a request.

    Parameters
    ----------
    top : str
        Top module name.
    verilog : str
        Its Verilog text (``hdl.export.export_verilog``).
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

        self._thread = threading.Thread(target=simulate, name=f"cocotb-{top}", daemon=True)
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
