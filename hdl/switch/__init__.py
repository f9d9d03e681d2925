"""The switch engine: LHC's in-network aggregation on a SwitchML-style slot pool
(``docs/switch-contract.md``).

- :mod:`~hdl.switch.aggregator`: the streaming engine (``Aggregator``, exported as
  ``switch_top``); :mod:`~hdl.switch.header_check`
  (drop causes), :mod:`~hdl.switch.lane_alu` (ADD / OR per lane),
  :mod:`~hdl.switch.slot_memory` (the slots' block RAM), :mod:`~hdl.switch.control` (jobs,
  clearing, counters).
"""
