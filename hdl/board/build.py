"""``python -m hdl.board.build``: ``make bitstream``, at the path the Makefile and users
call. The tool is :mod:`hdl.board.tools.build`; importing this module gives that one, so
that ``hdl.board.build.main`` and every other name of it stay where they were."""
import sys

from hdl.board.tools import build as _tool

if __name__ == "__main__":
    sys.exit(_tool.main())
sys.modules[__name__] = _tool
