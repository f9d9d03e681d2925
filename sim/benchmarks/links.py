"""What the throughput tables share: the engine clock, the link model, the fp32 ring baseline.

Everything here is a **model** built on counted numbers, and says so where it is used:

- a link of ``L`` Gb/s per worker, full duplex, carries one datagram per packet
  (``docs/protocol/network.md`` section 2): the packet's bytes as counted (32-byte header
  plus payload) plus :data:`FRAMING_BYTES` of UDP, IPv4 and Ethernet framing, preamble and
  inter-frame gap; its time is those bytes / ``L``;
- a phase whose packets stream through an engine while they cross the links takes the
  longer of the two (they overlap, packet by packet);
- the fp32 ring all-reduce of the same tensor (the baseline a cluster without in-network
  help runs): ``2 (N - 1)`` steps, in each of which every worker sends one of ``N`` chunks
  (``host.golden.ring.ring_chunk_bounds``) to its neighbour as RAW_F32 packets of at most 2048
  values (jumbo frames); a step takes its largest chunk's wire time; the additions are
  left out (memory speed, far above every link here).
"""
from __future__ import annotations

from contract.frames import ETH_HEADER, FCS_BYTES, IP_HEADER, UDP_HEADER
from contract.header import HEADER_BYTES

__all__ = ["LINKS_GBPS", "FRAMING_BYTES", "HEADER_BYTES", "RING_PACKET_VALUES", "engine_clock",
           "wire_bytes", "link_seconds", "ring_fp32_seconds", "ring_fp32_wire_bytes"]

#: Link rates per worker the tables model, Gb/s.
LINKS_GBPS = (1, 10, 100)
#: Bytes a datagram costs on Ethernet beyond its UDP payload: UDP 8 + IPv4 20 + MAC header
#: 14 + FCS 4 + preamble and start delimiter 8 + inter-frame gap 12.
FRAMING_BYTES = UDP_HEADER + IP_HEADER + ETH_HEADER + FCS_BYTES + 8 + 12
# HEADER_BYTES: the packet header of every packet (contract.header).
#: Values per RAW_F32 / INC_F32 packet in the ring (the NIC's limit, one jumbo frame).
RING_PACKET_VALUES = 2048


def engine_clock():
    """``(MHz, source)``: the engine clock of the latest ``make bitstream``, or the board's
    default when there is none (``sim.e2e.clock_mhz``)."""
    from sim.e2e import clock_mhz
    return clock_mhz()


def wire_bytes(packets: int, payload_bytes: int) -> int:
    """Bytes on the wire of ``packets`` datagrams carrying ``payload_bytes`` of packet
    payload in all (header and framing added per packet)."""
    return payload_bytes + packets * (HEADER_BYTES + FRAMING_BYTES)


def link_seconds(nbytes: float, gbps: float) -> float:
    return 8.0 * nbytes / (gbps * 1e9)


def _ring_steps(values: int, workers: int):
    from host.golden.ring import ring_chunk_bounds
    sizes = [b - a for a, b in ring_chunk_bounds(values, workers)]
    largest = max(sizes)
    return 2 * (workers - 1), largest, sizes


def ring_fp32_wire_bytes(values: int, workers: int) -> int:
    """Bytes one worker sends in the fp32 ring (its chunks as counted, every step)."""
    steps, _, sizes = _ring_steps(values, workers)
    per_round = sum(wire_bytes(-(-s // RING_PACKET_VALUES), 4 * s) for s in sizes if s)
    # over 2 (N - 1) steps every worker sends every chunk but one twice: on average
    return round(per_round * steps / workers)


def ring_fp32_seconds(values: int, workers: int, gbps: float) -> float:
    """Modelled time of one fp32 ring all-reduce over links of ``gbps`` per worker."""
    steps, largest, _ = _ring_steps(values, workers)
    step = wire_bytes(-(-largest // RING_PACKET_VALUES), 4 * largest)
    return steps * link_seconds(step, gbps)
