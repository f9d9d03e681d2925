"""``python -m hdl.board.eth_synth``: the LiteEth core alone through Yosys, at the path the
Makefile and users call. The tool is :mod:`hdl.board.tools.eth_synth`; importing this
module gives that one, so that ``hdl.board.eth_synth.main`` and every other name of it
stay where they were."""
import sys

from hdl.board.tools import eth_synth as _tool

if __name__ == "__main__":
    sys.exit(_tool.main())
sys.modules[__name__] = _tool
