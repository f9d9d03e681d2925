"""``python -m hdl.board.program``: ``make program``, at the path the Makefile and users
call. The tool is :mod:`hdl.board.tools.program`; importing this module gives that one,
so that ``hdl.board.program.main`` and every other name of it stay where they were."""
import sys

from hdl.board.tools import program as _tool

if __name__ == "__main__":
    sys.exit(_tool.main())
sys.modules[__name__] = _tool
