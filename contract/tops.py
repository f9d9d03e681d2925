"""The ports of the exported gateware tops, as the host's transports see them.

``make verilog`` writes each top of :data:`TOP_PORTS` into ``build/verilog/<name>.v``; the
simulation transports (``sim/``) bind its AXI-Stream ports by these prefixes, and the
driver names the streams by the keys (``exchange("tx", ...)``).
"""
from __future__ import annotations

import dataclasses

from .registers import NIC_REGISTERS, SWITCH_REGISTERS, RegisterMap

__all__ = ["TopPorts", "TOP_PORTS"]


@dataclasses.dataclass(frozen=True)
class TopPorts:
    """One exported top: its AXI-Stream paths and its ``ctrl_*`` register port.

    Attributes
    ----------
    streams : dict
        ``{stream name: (sink prefix, source prefix)}``: the engine's input port group (the
        top's ``*_s_axis_t*`` signals) and output port group (``*_m_axis_t*``).
    registers : RegisterMap
        The register map of its ``ctrl_*`` port.
    writable : bool
        Whether the port has ``ctrl_wdata``/``ctrl_we`` (the NIC's counters are read-only).
    """
    streams: dict
    registers: RegisterMap
    writable: bool


TOP_PORTS = {
    "nic_top": TopPorts({"tx": ("tx_s_axis", "tx_m_axis"), "rx": ("rx_s_axis", "rx_m_axis")},
                        NIC_REGISTERS, writable=False),
    "switch_top": TopPorts({"agg": ("s_axis", "m_axis")}, SWITCH_REGISTERS, writable=True),
}
