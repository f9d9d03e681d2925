"""The host driver: one API over every backend (Glasgow's split).

- Interfaces: :mod:`~host.driver.nic`, :mod:`~host.driver.switch`, on the register maps of
  :mod:`contract.registers`.
- Transports: :mod:`~host.driver.transport` (the API), :mod:`~host.driver.models` (golden),
  :mod:`~host.driver.lockstep` (two side by side), :mod:`~host.driver.backends` (the seam
  to the simulator and the board).
- Over UDP: :mod:`~host.driver.udp`, :mod:`~host.driver.udp_switch`,
  :mod:`~host.driver.udp_worker`, with :mod:`~host.driver.settings`,
  :mod:`~host.driver.rtt` and :mod:`~host.driver.sockets`.
"""
