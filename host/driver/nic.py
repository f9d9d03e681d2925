"""Host interface of the NIC engines: tensors in, wire packets out, and back.

The same :class:`NicInterface` runs over any transport with streams ``tx`` and ``rx`` and
the NIC register map: the golden model (:class:`~host.driver.models.NicModelTransport`),
the Verilated gateware (:func:`open_nic` with ``backend="verilator"``), or a board over UDP.
"""
from __future__ import annotations

import numpy as np

from contract.registers import NIC_REGISTERS
from contract.tops import TOP_PORTS

from ..golden import inceptionn
from .backends import open_backend

__all__ = ["NicInterface", "open_nic", "NIC_STREAMS"]

#: Quiet clocks after which a simulated exchange ends (the harness's default).
_EXCHANGE_IDLE = 64
#: The NIC top's AXI-Stream paths: name -> (sink prefix, source prefix).
NIC_STREAMS = TOP_PORTS["nic_top"].streams


class NicInterface:
    """Send tensors through the NIC transmit path and receive them through the receive path.

    Parameters
    ----------
    transport : host.driver.transport.Transport
        Streams ``tx`` and ``rx`` and the NIC registers.
    packet_values : int or None
        Values per packet (at most the receive path's ``max_count``); None: the
        transport's ``max_packet_values`` (a network transport's MTU decides), else 2048.
    """

    def __init__(self, transport, *, packet_values=None):
        if packet_values is None:
            packet_values = getattr(transport, "max_packet_values", None) or 2048
        if not isinstance(packet_values, int) or not 1 <= packet_values <= 2048:
            raise ValueError(f"packet_values must be an integer in 1..2048, not {packet_values!r}")
        self.transport = transport
        self.packet_values = packet_values

    def transmit(self, values, k=10, *, job=0, worker=0, seq=0, offset=0, **options):
        """Send a float32 tensor through the TX path (compressing); return the wire packets."""
        values = np.asarray(values)
        if values.dtype != np.float32:
            raise TypeError(f"the NIC carries float32 gradients, not {values.dtype}")
        packets = inceptionn.tensor_to_packets(values.ravel(), k, compress=False,
                                               packet_values=self.packet_values, job=job,
                                               worker=worker, seq=seq, offset=offset)
        return self.transport.exchange("tx", packets, **options)

    def receive(self, packets, n=None, *, offset=0, **options):
        """Pass wire packets through the RX path (decompressing); return the float32 tensor.

        On a clocked transport the exchange waits ``idle`` clocks of quiet before it ends;
        by default long enough for the receive path to decode the longest of ``packets``
        even if it is of the most compressible data (it stores and forwards: a 2048-value
        all-zero packet is 17 beats in and 256 clocks of decoding before its first beat
        out)."""
        packets = list(packets)
        if getattr(self.transport, "clocked", False) and "idle" not in options and packets:
            longest = max(p.header.count for p in packets)
            options["idle"] = -(-longest // 8) + _EXCHANGE_IDLE
        out = self.transport.exchange("rx", packets, **options)
        return inceptionn.packets_to_tensor(out, n, offset=offset)

    def counters(self):
        """``{"tx": {name: value}, "rx": {name: value}}`` read from the registers."""
        return {path: {name: self.transport.read(address)
                       for name, address in NIC_REGISTERS[path].items()}
                for path in ("tx", "rx")}


def open_nic(backend="golden", *, check=True, waves=None, max_count=2048, **backend_options):
    """A transport to the NIC engines.

    Parameters
    ----------
    backend : str
        ``"golden"`` (the golden model), or a backend of ``host.driver.backends``: the
        Verilated ``nic_top`` gateware through the compiled harness (``"verilator"``, fast)
        or through the cocotb bridge (``"cocotb"``, for waveform debugging with cocotb's
        tools; same cycles).
    check : bool
        With a gateware backend: run the golden model in lockstep and compare every packet
        and counter (raises :class:`~host.driver.lockstep.MismatchError`).
    backend_options
        Passed to the backend (``"udp"``: ``board``, ``key``, ``mtu``, ``fault_rate``,
        ``fault_seed``; see ``host.board.udp_backend.open_top``).
    """
    from .models import NicModelTransport
    if backend == "golden":
        return NicModelTransport(max_count=max_count)
    device = open_backend(backend, "nic_top", waves=waves, max_count=max_count,
                          **backend_options)
    if not check:
        return device
    from .lockstep import LockstepTransport
    return LockstepTransport(device, NicModelTransport(max_count=max_count), NIC_REGISTERS)
