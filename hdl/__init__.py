"""The gateware, by subsystem.

- :mod:`hdl.stream`: stream building blocks (stages, FIFOs, buffers, AXI-Stream beats).
- :mod:`hdl.nic`: the INCEPTIONN compressor and decompressor and the NIC engine top.
- :mod:`hdl.switch`: the LHC/SwitchML aggregator and the switch engine top.
- :mod:`hdl.net`: the network: the LiteEth core and the front end before the engines.
- :mod:`hdl.wire`: the NIC in the wire (two ports, the engines between them).
- :mod:`hdl.selftest`: built-in traffic, checkers and the UART report.
- :mod:`hdl.board`: board tops, PLLs, ``make bitstream`` / ``make program``, timing tools.
- Shared here: :mod:`hdl.header` (the header layout), :mod:`hdl.ctrl_port` (the register
  port), :mod:`hdl.replica` (registers synthesis keeps apart), :mod:`hdl.export`
  (``make verilog``).
"""
