"""The NIC engine top: transmit compressor, receive decompressor, counters on a register port.

Ports (flat, so cocotbext-axi binds by prefix and the names are the AXI ones):

* ``tx_s_axis_*`` -> :class:`~hdl.nic.compressor.Compressor` -> ``tx_m_axis_*``
* ``rx_s_axis_*`` -> :class:`~hdl.nic.decompressor.Decompressor` -> ``rx_m_axis_*``
* ``ctrl_addr`` (16), ``ctrl_re`` (1) -> ``ctrl_rdata`` (32), valid the cycle after ``ctrl_re``:
  the counters of ``contract.registers.NIC_REGISTERS`` (blocks ``tx`` and ``rx``, in
  ``contract.counters`` order); other addresses read 0. Counters are 32 bits and wrap around.
"""
from amaranth import Module, Signal
from amaranth.lib import wiring

from contract.registers import NIC_REGISTERS
from hdl.ctrl_port import ctrl_port_members
from hdl.nic.compressor import Compressor
from hdl.nic.decompressor import Decompressor
from hdl.stream.axis import connect_flat_axis, flat_axis_members

__all__ = ["NicTop"]

COUNTER_BITS = 32


class NicTop(wiring.Component):
    """Both NIC engines and their counters.

    Parameters
    ----------
    max_count : int
        Largest ``INC_F32`` packet (values) the receive path decompresses (default 2048).
    """

    def __init__(self, *, max_count=2048):
        self.max_count = max_count
        members = {}
        members.update(flat_axis_members("tx_s_axis", sink=True))
        members.update(flat_axis_members("tx_m_axis", sink=False))
        members.update(flat_axis_members("rx_s_axis", sink=True))
        members.update(flat_axis_members("rx_m_axis", sink=False))
        members.update(ctrl_port_members(writable=False))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.tx = tx = Compressor()
        m.submodules.rx = rx = Decompressor(max_count=self.max_count)
        connect_flat_axis(m, self, "tx_s_axis", tx.i, sink=True)
        connect_flat_axis(m, self, "tx_m_axis", tx.o, sink=False)
        connect_flat_axis(m, self, "rx_s_axis", rx.i, sink=True)
        connect_flat_axis(m, self, "rx_m_axis", rx.o, sink=False)

        registers = {}
        for path, events in (("tx", tx.events), ("rx", rx.events)):
            for name, address in NIC_REGISTERS[path].items():
                counter = Signal(COUNTER_BITS, name=f"{path}_{name}")
                with m.If(getattr(events, name)):
                    m.d.sync += counter.eq(counter + 1)   # wraps at 2^32
                registers[address] = counter

        with m.If(self.ctrl_re):
            m.d.sync += self.ctrl_rdata.eq(0)
            with m.Switch(self.ctrl_addr):
                for address, counter in registers.items():
                    with m.Case(address):
                        m.d.sync += self.ctrl_rdata.eq(counter)
        return m
