"""The compiled harness as a driver transport: the fast way to the Verilated gateware.

:class:`HarnessTransport` builds (or reuses) the harness of a top (``sim/harness/build.py``)
and runs it as a child process that speaks a small binary protocol over two pipes (see
``harness.cpp``). The clock loop and the AXI-Stream handshakes run in C++; Python is
involved once per request: a whole batch of packets in, the packets out and the cycle
counts back. Its cycles are those of the cocotb bridge (``backend="cocotb"``) for the same
requests and options, so the two are interchangeable (``tests/sim/harness/test_harness.py`` checks).

A child process rather than a library in this process, so that a model that crashes (or a
harness that is killed) ends as a :class:`~host.driver.transport.TransportError` carrying
the harness's log, never as a dead or hung caller.
"""
from __future__ import annotations

import functools
import os
import struct

from contract.tops import TOP_PORTS
from host.driver.transport import Transport, TransportError

from .build import build_harness, top_ports
from .child import LOG_TAIL_LINES, HarnessProcess  # noqa: F401 (LOG_TAIL_LINES: re-export)
from .patterns import IN, OUT, ExchangeOptions, PausePattern
from .verilog_cache import cached_verilog

__all__ = ["HarnessTransport", "open_top"]

OP_EXCHANGE, OP_WRITE, OP_READ, OP_IDLE, OP_CYCLE, OP_CLOSE, OP_PATTERN, OP_BARE, OP_INFO = \
    range(1, 10)
_EXCHANGE_HEAD = struct.Struct("<BBQQQQQQQI")
_EXCHANGE_REPLY = struct.Struct("<QQQQQQqqqqI")
_U32 = struct.Struct("<I")


def _fields(o: ExchangeOptions):
    return (o.seed & (1 << 64) - 1, o.pattern(IN).threshold, o.pattern(OUT).threshold,
            o.burst_in, o.burst_out, o.idle, o.max_cycles)


@functools.lru_cache(maxsize=256, typed=True)
def _cached_fields(**options):
    return _fields(ExchangeOptions.from_dict(options))


def _exchange_fields(**options):
    """The exchange request's option fields, checked (callers repeat the same few, so the
    answers are cached, by value and type)."""
    try:
        return _cached_fields(**options)
    except TypeError:   # an unhashable value: the uncached check explains what is wrong
        return _fields(ExchangeOptions.from_dict(options))


def _waves_from_environment():
    return os.environ.get("WAVES", "0") not in ("", "0")


def open_top(top, *, waves=None, **params):
    """A :class:`HarnessTransport` to the exported ``top`` built with ``params`` (the
    ``"verilator"`` backend of ``host.driver.backends``; its Verilog from
    :func:`~sim.harness.verilog_cache.cached_verilog`)."""
    return HarnessTransport(top, cached_verilog(top, **params), TOP_PORTS[top].streams,
                            ctrl=True, waves=waves)


class HarnessTransport(HarnessProcess, Transport):
    """The Verilated gateware of ``top`` behind the compiled harness.

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
    waves : bool, optional
        Record the session's waveforms into ``build/waves/<top>/dump.fst`` (VCD where
        Verilator cannot write FST here); default from ``WAVES``.
    period_ns : int
        Clock period the waveforms show.
    max_cycles : int
        Default cycle budget of an exchange (an exchange's ``max_cycles`` option wins).
    timeout : float, optional
        Wall-clock seconds to wait for any one answer (default: no limit; a harness that
        dies is noticed at once either way).

    Attributes
    ----------
    build : sim.harness.build.HarnessBuild
        The executable used, and the time its build took.
    """

    clocked = True

    def __init__(self, top, verilog, streams, *, ctrl=True, waves=None, period_ns=8,
                 max_cycles=10_000_000, timeout=None):
        super().__init__()
        self.top = self.name = top
        self.label = f"the {top} harness"
        self.streams = dict(streams)
        self._index = {name: i for i, name in enumerate(self.streams)}
        self._max_cycles = int(max_cycles)
        self._timeout = timeout
        self._stuck = None
        self._proc = None
        #: wall time the harness spent in its clock loops (the rest of an exchange's time
        #: is the protocol, the packets' encoding and Python)
        self.loop_seconds = 0.0
        self._ports = top_ports(verilog, top)
        waves = _waves_from_environment() if waves is None else bool(waves)
        self.build = build_harness(top, verilog, self.streams, ctrl=ctrl, waves=waves)
        args = [*self._waves_arguments(top, waves), "--period-ps", str(int(period_ns * 1000))]

        self._start(self.build.executable, args, f"gradwire-harness-{top}-")
        info = self._call(bytes([OP_INFO]))
        names, at = [], 4
        for _ in range(_U32.unpack_from(info)[0]):
            length = _U32.unpack_from(info, at)[0]
            names.append(info[at + 4:at + 4 + length].decode())
            at += 4 + length + 8
        if names != list(self.streams):
            self.close()
            raise TransportError(f"the {top} harness has streams {names}, expected "
                                 f"{list(self.streams)}")

    # ---- the pipes ----------------------------------------------------------------------

    def _call(self, request):
        return self._request(request)

    # ---- the Transport API --------------------------------------------------------------

    def _stream_index(self, stream):
        try:
            return self._index[stream]
        except KeyError:
            raise ValueError(f"the {self.top} harness has streams "
                             f"{', '.join(map(repr, self.streams))}, not {stream!r}") from None

    def _exchange(self, stream, packets, options):
        index = self._stream_index(stream)
        head = _exchange_fields(**{"max_cycles": self._max_cycles, **options})
        if self._stuck:
            raise TransportError(self._stuck)
        frames = [p.to_bytes() for p in packets]
        if not all(frames):
            raise ValueError("an AXI-Stream frame needs at least one byte")
        parts = [_EXCHANGE_HEAD.pack(OP_EXCHANGE, index, *head, len(frames))]
        for f in frames:
            parts.append(_U32.pack(len(f)))
            parts.append(f)
        try:
            answer = self._call(b"".join(parts))
        except TransportError as exc:
            if self._proc is not None and self._proc.poll() is None:
                # The harness lives, but the engine stopped mid-exchange.
                self._stuck = (f"{exc}; the {self.top} engine is stuck in that exchange: "
                               f"close this transport and open a new one")
            raise
        (loop_ns, cycles, in_beats, out_beats, stall_in, stall_out, first_in, last_in,
         first_out, last_out, count) = _EXCHANGE_REPLY.unpack_from(answer)
        self.loop_seconds += loop_ns * 1e-9
        at, out = _EXCHANGE_REPLY.size, []
        for _ in range(count):
            length = _U32.unpack_from(answer, at)[0]
            out.append(answer[at + 4:at + 4 + length])
            at += 4 + length
        none = lambda v: None if v < 0 else v
        return {"frames": out, "cycles": cycles, "in_beats": in_beats, "out_beats": out_beats,
                "stall_in": stall_in, "stall_out": stall_out, "first_in": none(first_in),
                "last_in": none(last_in), "first_out": none(first_out),
                "last_out": none(last_out)}

    def _check_register(self, addr, value=None):
        addr_bits = self._ports.get("ctrl_addr", (None, 0))[1]
        if not isinstance(addr, int) or not 0 <= addr < 1 << addr_bits:
            raise ValueError(f"register address {addr!r} is outside the {addr_bits}-bit "
                             f"ctrl_addr of {self.top}")
        if value is not None:
            data_bits = self._ports.get("ctrl_wdata", (None, 32))[1]
            if not isinstance(value, int) or not 0 <= value < 1 << data_bits:
                raise ValueError(f"register value {value!r} does not fit {data_bits} bits")

    def write(self, addr, value):
        addr, value = int(addr), int(value)
        self._check_register(addr, value)
        self._call(struct.pack("<BII", OP_WRITE, addr, value))

    def read(self, addr):
        addr = int(addr)
        self._check_register(addr)
        return struct.unpack("<Q", self._call(struct.pack("<BI", OP_READ, addr)))[0]

    def idle(self, cycles):
        """Run ``cycles`` clock cycles with no input (outputs are still taken)."""
        cycles = int(cycles)
        if cycles < 0:
            raise ValueError(f"idle cycles must be >= 0, not {cycles}")
        self._call(struct.pack("<BQ", OP_IDLE, cycles))

    @property
    def cycle(self):
        """Clock cycles since reset."""
        return struct.unpack("<Q", self._call(bytes([OP_CYCLE])))[0]

    # ---- checks and measurements --------------------------------------------------------

    def pause_sequence(self, pattern: PausePattern, n: int) -> bytes:
        """``pattern.paused(1..n)`` as the C++ side computes it (see ``patterns.py``)."""
        return self._call(struct.pack("<BQIQQQ", OP_PATTERN, pattern.seed & (1 << 64) - 1,
                                      pattern.side, pattern.threshold, pattern.burst, n))[8:]

    def bare_speed(self, stream, packets, cycles):
        """Clock the model ``cycles`` times in the plainest C++ loop, replaying ``packets``
        into ``stream`` with every output ready; return ``(cycles per second, beats in)``.

        The measurement baseline of ``make bench``. It leaves the design mid-packet, so the
        transport takes no exchanges after it.
        """
        frames = [p.to_bytes() for p in packets]
        parts = [struct.pack("<BBQI", OP_BARE, self._stream_index(stream), int(cycles),
                             len(frames))]
        for f in frames:
            parts += [_U32.pack(len(f)), f]
        nanoseconds, beats = struct.unpack("<QQ", self._call(b"".join(parts)))
        self._stuck = f"the {self.top} harness ran a bare speed loop: open a new transport"
        return cycles / (nanoseconds * 1e-9), beats

    def close(self):
        self._stop()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
