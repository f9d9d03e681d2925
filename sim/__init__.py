"""Simulation of the gateware.

- :mod:`sim.runner`: Amaranth -> Verilog -> Verilator model; :mod:`sim.harness`: the
  compiled harness (C++ clock loop, Python once per exchange).
- cocotb benches: :mod:`sim.tb_nic`, :mod:`sim.tb_switch`, :mod:`sim.tb_network`,
  :mod:`sim.tb_eth`, with their stimulus (:mod:`sim.nic_stimulus`,
  :mod:`sim.switch_traffic`) and tops (:mod:`sim.network_top`, :mod:`sim.eth_echo`).
- :mod:`sim.cocotb_transport` and :mod:`sim.bridge`: the driver's API over cocotb.
- :mod:`sim.e2e` with :mod:`sim.workloads`: ``make sim``; :mod:`sim.benchmarks`: the
  gateware's ``make bench`` sections.
"""
