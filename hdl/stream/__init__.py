"""Stream building blocks every engine uses.

- Pipeline registers: :mod:`~hdl.stream.stage`, :mod:`~hdl.stream.skid_buffer`.
- FIFOs and buffers: :mod:`~hdl.stream.posted_fifo`, :mod:`~hdl.stream.credit_buffer`,
  :mod:`~hdl.stream.packet_buffer` (whole packets only).
- :mod:`~hdl.stream.axis`: AXI-Stream beats, and the flat ports of exported tops.
- :mod:`~hdl.stream.width`: 32-bit words to 256-bit beats and back (``Upsizer``,
  ``Downsizer``).
- :mod:`~hdl.stream.arbiter`: packet streams onto one, a whole packet at a time
  (``PacketArbiter``).
"""
