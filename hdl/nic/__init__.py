"""The NIC engines of INCEPTIONN (``docs/nic-contract.md``).

- Transmit: :mod:`~hdl.nic.compressor` = :mod:`~hdl.nic.lane_encoder` ->
  :mod:`~hdl.nic.block_packer` -> :mod:`~hdl.nic.bit_accumulator`.
- Receive: :mod:`~hdl.nic.decompressor` = :mod:`~hdl.nic.block_ends` ->
  :mod:`~hdl.nic.unpacker` -> :mod:`~hdl.nic.lane_decoder`.
- :mod:`~hdl.nic.layouts`: the block format both share; :mod:`~hdl.nic.engine`: both paths
  and their counters on a register port (``NicEngine``, exported as ``nic_top``).
"""
