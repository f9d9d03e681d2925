"""The host side of the in-network path (SwitchML's scheme, ``aggregator-protocol.md``).

- :mod:`host.switchml.window`: one worker's window over a message, without I/O
  (packetisation, one outstanding packet per slot, resends, results matched by ``seq``);
- :mod:`host.switchml.network`: every worker of one or more jobs on a simulated network
  (a tick clock), and the LHC all-reduce over any switch transport;
- :mod:`host.switchml.faults`: the network fault model the simulated network and the
  virtual board's wire share.
"""
