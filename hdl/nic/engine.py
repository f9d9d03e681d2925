"""The NIC engine: transmit compressor, receive decompressor, and their counters.

* ``tx_in`` -> :class:`~hdl.nic.compressor.Compressor` -> ``tx_out``
* ``rx_in`` -> :class:`~hdl.nic.decompressor.Decompressor` -> ``rx_out``
* ``ctrl`` (read-only :class:`~hdl.ctrl_port.RegisterPort`): the counters of
  ``contract.registers.NIC_REGISTERS`` (blocks ``tx`` and ``rx``, in ``contract.counters``
  order); other addresses read 0. Counters are 32 bits and wrap around.

The self-test and network tops compose it directly; ``make verilog`` exports it as
``nic_top`` behind flat AXI-Stream ports (:mod:`hdl.export`).
"""
from amaranth import Cat, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from contract.counters import NIC_RX_COUNTERS
from contract.registers import NIC_REGISTERS
from hdl.ctrl_port import RegisterPort
from hdl.nic.compressor import Compressor
from hdl.nic.decompressor import Decompressor
from hdl.stream.axis import axis_signature

__all__ = ["COUNTER_BITS", "NicEngine"]

COUNTER_BITS = 32


class NicEngine(wiring.Component):
    """Both NIC paths and their counter file.

    Parameters
    ----------
    max_count : int
        Largest ``INC_F32`` packet (values) the receive path decompresses (default 2048).

    Members
    -------
    tx_in : In(axis_signature())
        Packets to compress.
    tx_out : Out(axis_signature())
        Compressed (or passed) packets.
    rx_in : In(axis_signature())
        Packets to decompress.
    rx_out : Out(axis_signature())
        Decompressed (or passed) packets.
    ctrl : In(RegisterPort(writable=False))
        The counters.
    rx_dropped : Out(1)
        The receive path dropped a packet this cycle (any ``drop_*`` counter's event): the
        network front end's one-request-in-flight rule waits for a reply or for this.
    """

    tx_in: In(axis_signature())
    tx_out: Out(axis_signature())
    rx_in: In(axis_signature())
    rx_out: Out(axis_signature())
    ctrl: In(RegisterPort(writable=False))
    rx_dropped: Out(1)

    def __init__(self, *, max_count=2048):
        self.max_count = max_count
        # built here so that a bad parameter is an error at construction (Decompressor checks)
        self._tx, self._rx = Compressor(), Decompressor(max_count=max_count)
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        m.submodules.tx = tx = self._tx
        m.submodules.rx = rx = self._rx
        wiring.connect(m, wiring.flipped(self.tx_in), tx.i)
        wiring.connect(m, tx.o, wiring.flipped(self.tx_out))
        wiring.connect(m, wiring.flipped(self.rx_in), rx.i)
        wiring.connect(m, rx.o, wiring.flipped(self.rx_out))
        m.d.comb += self.rx_dropped.eq(Cat(*(rx.events[name] for name in NIC_RX_COUNTERS
                                             if name.startswith("drop_"))).any())

        registers = {}
        for path, events in (("tx", tx.events), ("rx", rx.events)):
            for name, address in NIC_REGISTERS[path].items():
                counter = Signal(COUNTER_BITS, name=f"{path}_{name}")
                with m.If(getattr(events, name)):
                    m.d.sync += counter.eq(counter + 1)   # wraps at 2^32
                registers[address] = counter

        with m.If(self.ctrl.re):
            m.d.sync += self.ctrl.rdata.eq(0)
            with m.Switch(self.ctrl.addr):
                for address, counter in registers.items():
                    with m.Case(address):
                        m.d.sync += self.ctrl.rdata.eq(counter)
        return m
