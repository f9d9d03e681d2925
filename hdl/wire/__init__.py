"""The NIC in the wire (``docs/protocol/network.md`` section 6): a two-port board, port 0
facing the host and port 1 the network, that forwards frames and runs gradient datagrams
through the NIC engines on the way (golden model: ``host/board/wire_golden.py``).

- :mod:`~hdl.wire.classify`: what happens to each arriving frame, decided on the fly as it
  leaves the MAC (``FrameClassifier``): pass, for the board, gradient datagram, or a drop.
- :mod:`~hdl.wire.path`: one direction of the wire (``WirePath``): the classifier, the frame
  store (:mod:`~hdl.wire.store`: store and forward, frames that do not fit dropped and
  counted), gradient payloads out to and back from one direction of a shared
  ``hdl.nic.engine.NicEngine`` (:mod:`~hdl.wire.nic_turn`), replaced datagrams re-framed
  into the output FIFO (:mod:`~hdl.wire.reframe`), counter strobes for the port the frames
  arrive on.
- :mod:`~hdl.wire.service`: the board's own service on the host side (``BoardService``):
  the frame buffer (:mod:`~hdl.wire.request`), the ARP, echo and ``CTRL`` responders
  (:mod:`~hdl.wire.arp`, :mod:`~hdl.wire.echo`, :mod:`~hdl.wire.ctrl`) behind the reply
  multiplexer (:mod:`~hdl.wire.reply`).
- :mod:`~hdl.wire.engine`: the whole wire below the two MACs (``WireEngine``): a path each
  way, the ``NicEngine`` they share, each port's counters and the register port
  (``contract.registers.WIRE_REGISTERS``).
- :mod:`~hdl.wire.mac`: both ports' LiteEth PHY and MAC (``LiteEthWireCore``), raw frames
  a 32-bit beat at a time (``MacBeat``).
- :mod:`~hdl.wire.top`: the wire with both ports' LiteEth PHY and MAC
  (:mod:`~hdl.wire.mac`) on one clock (``WireTop``): what the board top
  (``hdl.board.wire``) and the Verilator top (``sim/wire_top.py``) put on their pins.
"""
