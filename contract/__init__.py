"""The shared contract: what the gateware, the golden models, the driver and the tests all
import, and which imports nothing of theirs.

- :mod:`contract.header`, :mod:`contract.packet`: the 32-byte header beat and the packets
  of eight 32-bit lanes per beat.
- :mod:`contract.counters`: counter names and drop causes, in priority order.
- :mod:`contract.registers`: every control register, declared once.
- :mod:`contract.frames`: the Ethernet frame: header sizes, offsets, EtherTypes, IP
  protocols, the FCS and the checksums.
- :mod:`contract.network`: addresses and the UDP port of each service (``network.md``).
- :mod:`contract.tops`: the ports of the exported gateware tops.
"""
