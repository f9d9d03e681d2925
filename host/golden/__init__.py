"""The bit-exact reference models that the gateware is checked against.

- :mod:`~host.golden.inceptionn`: the INCEPTIONN codec (``inceptionn-format.md``).
- :mod:`~host.golden.lhc` (with :mod:`~host.golden.murmur3`): LHC's index, sketch and
  peeling.
- :mod:`~host.golden.aggregator`: the switch's slot pool; :mod:`~host.golden.ring`: the ring
  all-reduce through the NIC.
- :mod:`~host.golden.siphash`: SipHash-2-4 and the tags, job keys and wrapped words of
  ``network.md`` section 7.
"""
