"""The switch engine: LHC's in-network aggregation on a SwitchML-style slot pool
(``docs/switch-contract.md``).

- :mod:`~hdl.switch.aggregator`: the streaming engine; :mod:`~hdl.switch.header_check`
  (drop causes), :mod:`~hdl.switch.lane_alu` (ADD / OR per lane),
  :mod:`~hdl.switch.slot_memory` (the slots' block RAM), :mod:`~hdl.switch.control` (jobs,
  clearing, counters).
- :mod:`~hdl.switch.top`: the aggregator behind the exported ports.
"""
