"""The boards: their tops, clocks and builds (``constraints/boards.toml``).

- :mod:`hdl.board.top`: the board table, PLL dividers and the self-test top.
- :mod:`hdl.board.network`: the network top (the engines behind the board's RGMII port).
- :mod:`hdl.board.build`: ``make bitstream``; :mod:`hdl.board.program`: ``make program``.
- :mod:`hdl.board.engine_timing`: ``make bench-timing`` (an engine alone);
  :mod:`hdl.board.slack`: every failing endpoint of a routed build.
"""
