"""The board tools, apart from the board tops they build (:mod:`hdl.board`). Each keeps its
entry point and import path under :mod:`hdl.board` (``python -m hdl.board.build``, the
Makefile's targets): those modules hand over to these.

- :mod:`hdl.board.tools.build`: ``make bitstream``;
- :mod:`hdl.board.tools.program`: ``make program``;
- :mod:`hdl.board.tools.engine_timing`: ``make bench-timing`` (an engine alone);
- :mod:`hdl.board.tools.slack`: every failing endpoint of a routed build;
- :mod:`hdl.board.tools.eth_synth`: the LiteEth core alone through Yosys on a board's pins.
"""
