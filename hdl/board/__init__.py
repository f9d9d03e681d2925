"""The boards: their tops, clocks and builds (``constraints/boards.toml``).

- :mod:`hdl.board.boards`: the boards table (:class:`Board`, :func:`load_boards`);
- :mod:`hdl.board.clocking`: the PLL (dividers, ``EHXPLLL``) and the reset tree of both tops;
  :mod:`hdl.board.pins`: a board's pins by their boards-table names;
- :mod:`hdl.board.network`: the network top (the engines behind the board's RGMII port);
  :mod:`hdl.board.top`: the self-test top; :mod:`hdl.board.wire`: the NIC in the wire (a
  two-port board between a host and the network); :mod:`hdl.board.status`: what their
  LEDs and PHY resets share;
- :mod:`hdl.board.build`: ``make bitstream``; :mod:`hdl.board.program`: ``make program``;
- :mod:`hdl.board.engine_timing`: ``make bench-timing`` (an engine alone);
  :mod:`hdl.board.slack`: every failing endpoint of a routed build;
  :mod:`hdl.board.eth_synth`: the LiteEth core alone through Yosys on a board's pins.
"""
