"""The switch top for Verilog export and cocotb: the aggregator behind flat ports.

Ports: ``clk``/``rst`` (sync domain), AXI-Stream ``s_axis_t*`` (data packets in) and
``m_axis_t*`` (result packets out) named the way ``cocotbext-axi`` binds by prefix, and the
``ctrl_*`` register port (map in :mod:`hdl.switch.control` and ``host/driver/registers.py``).
"""
from amaranth import Module
from amaranth.lib import wiring

from hdl.ctrl_port import connect_ctrl_port, ctrl_port_members
from hdl.stream.axis import connect_flat_axis, flat_axis_members
from hdl.switch.aggregator import Aggregator

__all__ = ["SwitchTop"]


class SwitchTop(wiring.Component):
    """:class:`~hdl.switch.aggregator.Aggregator` with flat ports; parameters are passed through.

    The export default (``make verilog``) is the contract's default engine: 64 slots,
    P = 64 lanes, 32 workers, 4 jobs.
    """

    def __init__(self, *, slots=64, lanes=64, max_workers=32, jobs=4):
        self.engine = Aggregator(slots=slots, lanes=lanes, max_workers=max_workers, jobs=jobs)
        super().__init__({
            **flat_axis_members("s_axis", sink=True),
            **flat_axis_members("m_axis", sink=False),
            **ctrl_port_members(),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.engine = engine = self.engine
        connect_flat_axis(m, self, "s_axis", engine.i, sink=True)
        connect_flat_axis(m, self, "m_axis", engine.o, sink=False)
        connect_ctrl_port(m, self, engine)
        return m
