"""Run a device transport and a reference transport side by side and compare every packet."""
from __future__ import annotations

from .transport import Transport, TransportError

__all__ = ["LockstepTransport", "MismatchError"]


class MismatchError(TransportError):
    """The device emitted something other than what the reference model emits."""


class LockstepTransport(Transport):
    """Forwards every request to ``device`` and ``reference``; raises on any difference.

    Every packet the device emits is compared byte for byte with the reference model's
    packet, in order, as the system runs; register reads must agree too. ``compared``
    counts what was checked. The device's answer is returned (so its timing stats are kept
    in ``device.stats``). With ``registers`` (the top's
    :class:`~contract.registers.RegisterMap`), the bits a register declares ``volatile``
    (they show the engine's timing, which a model without a clock cannot have, like a
    commit's busy flag) are left out of the comparison. A device whose ``exact_counters``
    is False (a board on a network counts every copy of a datagram that reaches it:
    resends and duplicates) has its counter reads taken as they are, not compared.
    """

    def __init__(self, device, reference, registers=None):
        super().__init__()
        self.registers = registers
        self.device, self.reference = device, reference
        self.clocked = device.clocked
        self.compared = {"packets": 0, "bytes": 0, "registers": 0}
        self.max_packet_values = getattr(device, "max_packet_values", None)

    def exchange(self, stream, packets, **options):
        packets = list(packets)
        got = self.device.exchange(stream, packets, **options)
        want = self.reference.exchange(stream, packets, **options)
        if len(got) != len(want):
            raise MismatchError(f"stream {stream!r}: the device emitted {len(got)} packets, "
                                f"the reference {len(want)} (for {len(packets)} in)")
        for i, (g, w) in enumerate(zip(got, want)):
            gb, wb = g.to_bytes(), w.to_bytes()
            if gb != wb:
                first = next((j for j, (a, b) in enumerate(zip(gb, wb)) if a != b),
                             min(len(gb), len(wb)))
                raise MismatchError(
                    f"stream {stream!r}, packet {i} ({w.header}): first difference at byte "
                    f"{first} (device {len(gb)} bytes, reference {len(wb)} bytes)")
            self.compared["packets"] += 1
            self.compared["bytes"] += len(gb)
        return got

    @property
    def stats(self):
        return self.device.stats

    @stats.setter
    def stats(self, value):   # Transport.__init__ assigns it; the device's stats win
        pass

    def write(self, addr, value):
        self.device.write(addr, value)
        self.reference.write(addr, value)

    def read(self, addr):
        got, want = self.device.read(addr), self.reference.read(addr)
        decoded = self.registers.decode(addr) if self.registers is not None else None
        volatile = decoded.register.volatile if decoded is not None else 0
        if decoded is not None and decoded.counter is not None \
                and not getattr(self.device, "exact_counters", True):
            return got
        if got & ~volatile != want & ~volatile:
            raise MismatchError(f"register 0x{addr:03x}: device {got}, reference {want}")
        self.compared["registers"] += 1
        return got

    def idle(self, cycles):
        """Let the device's clock run (a model has none)."""
        self.device.idle(cycles)

    def close(self):
        self.device.close()
        self.reference.close()
