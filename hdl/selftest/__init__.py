"""The built-in self-test: the engines fed and checked on the chip, reported over a UART.

- Traffic: :mod:`~hdl.selftest.lfsr`, :mod:`~hdl.selftest.gradient_gen` (NIC),
  :mod:`~hdl.selftest.agg_traffic` (switch), :mod:`~hdl.selftest.fault_inject`.
- Checking: :mod:`~hdl.selftest.lane_quantizer`, :mod:`~hdl.selftest.nic_checker`,
  :mod:`~hdl.selftest.stream_checker`, :mod:`~hdl.selftest.counter_poller`.
- Report: :mod:`~hdl.selftest.report`, :mod:`~hdl.selftest.uart_tx`; all of it in
  :mod:`~hdl.selftest.top`.
"""
