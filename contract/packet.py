"""AXI-Stream packets: one 32-byte header beat, then payload beats of eight 32-bit lanes.

A :class:`Packet` is what crosses every AXI-Stream interface of the project, in the golden
models, the reference models, the driver and the testbenches. Its byte image
(:meth:`Packet.to_bytes`) is the stream's bytes in order: beat ``b`` carries bytes
``32*b .. 32*b+31`` with byte 0 in ``tdata[7:0]``; ``tkeep`` marks the valid bytes of the last
beat, which are always whole 32-bit words.
"""
from __future__ import annotations

import dataclasses

from contract.header import BEAT_BYTES, HEADER_BYTES, Header

__all__ = ["Packet", "PacketError"]


class PacketError(ValueError):
    """A packet's byte image is malformed (too short, or not whole 32-bit words)."""


@dataclasses.dataclass(frozen=True)
class Packet:
    header: Header
    payload: bytes = b""

    def __post_init__(self):
        object.__setattr__(self, "payload", bytes(self.payload))
        if len(self.payload) % 4:
            raise PacketError(f"payload is {len(self.payload)} bytes, not whole 32-bit words")

    def to_bytes(self) -> bytes:
        return self.header.pack() + self.payload

    @classmethod
    def from_bytes(cls, data) -> "Packet":
        data = bytes(data)
        if len(data) < HEADER_BYTES:
            raise PacketError(f"a packet needs a {HEADER_BYTES}-byte header, got {len(data)} bytes")
        return cls(Header.parse(data), data[HEADER_BYTES:])

    @property
    def beats(self) -> int:
        """Number of AXI-Stream beats (header included)."""
        return -(-len(self.to_bytes()) // BEAT_BYTES)

    def to_beats(self):
        """``[(tdata, tkeep, tlast), ...]`` as integers, one tuple per beat."""
        data = self.to_bytes()
        out = []
        for start in range(0, len(data), BEAT_BYTES):
            chunk = data[start:start + BEAT_BYTES]
            tkeep = (1 << len(chunk)) - 1
            out.append((int.from_bytes(chunk, "little"), tkeep, start + BEAT_BYTES >= len(data)))
        return out

    def __str__(self):
        return f"<{self.header} +{len(self.payload)}B>"
