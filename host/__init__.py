"""The host software.

- :mod:`host.golden`: the bit-exact reference models (codecs, aggregator, ring).
- :mod:`host.driver`: the engines' interfaces and the transports that reach them.
- :mod:`host.switchml`: the in-network path's workers (window, simulated network, faults).
- :mod:`host.board`: a board on the network (golden, virtual, TAP).
- :mod:`host.ddp`: training integration (PyTorch DDP hooks, accuracy experiment).
- :mod:`host.commands` and :mod:`host.cli`: the ``gradwire`` command line;
  :mod:`host.benchmarks` and :mod:`host.bench`: ``make bench``.
"""
