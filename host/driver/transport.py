"""Transports: what carries packets between the host driver and an engine.

The driver talks to every engine through the same small interface, :class:`Transport`, so
its code is the same whether the engine is the NumPy reference model
(``host.driver.models``), the Verilated gateware (the compiled harness,
``sim.harness.transport``, or cocotb, ``sim.cocotb_transport``, both reached through
``host.driver.backends``), or a board behind UDP sockets (``host.driver.udp``):

- ``exchange(stream, packets) -> list[Packet]``: send packets into one of the engine's
  AXI-Stream paths and return what that path emits;
- ``write(addr, value)`` / ``read(addr)``: the engine's control registers;
- ``stats``: per-stream counts of beats and clock cycles (``None`` where there is no clock).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from contract.packet import Packet

__all__ = ["Transport", "TransportError", "NoReplyError", "BadTagError", "ExchangeStats"]


class TransportError(RuntimeError):
    """The engine behind a transport failed, timed out or went away."""


class NoReplyError(TransportError):
    """A request (or an awaited result) over a network stayed unanswered after the retry
    limit.

    Attributes
    ----------
    service : contract.network.Service
        The board's service that did not answer.
    """

    def __init__(self, service, message):
        self.service = service
        super().__init__(message)


class BadTagError(TransportError):
    """A reply from a board with section 7's authenticated control
    (``docs/protocol/network.md``) whose tag is not its tag under the control key: forged,
    corrupted, or from a board built with another key. Nothing in it is taken.

    Attributes
    ----------
    service : contract.network.Service
        The board's service the reply came from.
    """

    def __init__(self, service, message):
        self.service = service
        super().__init__(message)


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
