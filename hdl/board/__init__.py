"""The boards: their tops, clocks and builds (``constraints/boards.toml``).

- :mod:`hdl.board.boards`: the boards table (:class:`Board`, :func:`load_boards`);
- :mod:`hdl.board.clocking`: the PLL (dividers, ``EHXPLLL``) and the reset tree of both tops;
  :mod:`hdl.board.pins`: a board's pins by their boards-table names;
- :mod:`hdl.board.network`: the network top (the engines behind the board's RGMII port);
  :mod:`hdl.board.top`: the self-test top; :mod:`hdl.board.wire`: the NIC in the wire (a
  two-port board between a host and the network); :mod:`hdl.board.status`: what their
  LEDs and PHY resets share;
- :mod:`hdl.board.tools`: the tools, apart from the tops: ``make bitstream``
  (``python -m hdl.board.build``), ``make program`` (``python -m hdl.board.program``),
  ``make bench-timing`` (``python -m hdl.board.engine_timing``), the failing endpoints of a
  routed build (``python -m hdl.board.slack``), the LiteEth core alone through Yosys
  (``python -m hdl.board.eth_synth``); those modules hand over to the tools.
"""
