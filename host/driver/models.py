"""Transports backed by the reference models: pure NumPy, no clock, fast.

They answer the same streams and control registers as the gateware tops, so the driver
programs a model exactly as it programs the hardware.
"""
from __future__ import annotations

from contract.counters import NIC_RX_COUNTERS, NIC_TX_COUNTERS
from contract.registers import NIC_REGISTERS
from host.driver.transport import Transport

__all__ = ["NicModelTransport", "SwitchModelTransport"]


def _reply(frames, packets_in):
    return {"frames": [p.to_bytes() for p in frames], "in_beats": 0, "out_beats": 0,
            "stall_in": 0, "first_in": None, "first_out": None, "last_out": None}


def _check_stream(stream):
    if stream not in ("tx", "rx"):
        raise ValueError(f"the NIC has streams 'tx' and 'rx', not {stream!r}")


class NicModelTransport(Transport):
    """The NIC top's golden model: stream ``tx`` compresses, ``rx`` decompresses.

    Parameters
    ----------
    max_count : int
        The receive path's largest packet (values), as the gateware's parameter.
    """

    def __init__(self, *, max_count=2048):
        super().__init__()
        self.max_count = max_count
        self.counters = {"tx": dict.fromkeys(NIC_TX_COUNTERS, 0),
                         "rx": dict.fromkeys(NIC_RX_COUNTERS, 0)}

    def process(self, stream, packet):
        """One packet through path ``stream`` (``"tx"`` or ``"rx"``), counted as the engine
        counts it: ``(packet_out or None, cause)``, ``cause`` its counter name besides
        ``"packets"`` (``host.golden.inceptionn.nic_tx`` / ``nic_rx``)."""
        from host.golden.inceptionn import nic_rx, nic_tx
        _check_stream(stream)
        if stream == "tx":
            result, cause = nic_tx(packet)
        else:
            result, cause = nic_rx(packet, self.max_count)
        self.counters[stream]["packets"] += 1
        self.counters[stream][cause] += 1
        return result, cause

    def _exchange(self, stream, packets, options):
        _check_stream(stream)
        out = [result for result, _ in (self.process(stream, p) for p in packets)
               if result is not None]
        return _reply(out, len(packets))

    def read(self, addr):
        decoded = NIC_REGISTERS.decode(addr)
        if decoded is None:
            raise ValueError(f"no NIC register at 0x{addr:03x}")
        return self.counters[decoded.entry.name][decoded.counter] & 0xFFFF_FFFF

    def write(self, addr, value):
        raise ValueError("the NIC has no writable registers")


class SwitchModelTransport(Transport):
    """The switch top's reference model (``host.golden.aggregator.AggregatorModel``), stream
    ``agg``; its registers are the model's own (``SWITCH_REGISTERS``, served as the
    gateware serves them)."""

    def __init__(self, *, slots=64, lanes=64, max_workers=32, jobs=4):
        super().__init__()
        from host.golden.aggregator import AggregatorModel
        self.model = AggregatorModel(slots=slots, lanes=lanes, max_workers=max_workers,
                                     jobs=jobs)
        self.params = dict(slots=slots, lanes=lanes, max_workers=max_workers, jobs=jobs)

    def _exchange(self, stream, packets, options):
        if stream != "agg":
            raise ValueError(f"the switch has one stream 'agg', not {stream!r}")
        out = []
        for packet in packets:
            out.extend(self.model.process(packet))
        return _reply(out, len(packets))

    def write(self, addr, value):
        self.model.write(int(addr), int(value))

    def read(self, addr):
        return self.model.read(int(addr))
