"""``python -m hdl.board.engine_timing``: ``make bench-timing``, at the path the Makefile
and users call. The tool is :mod:`hdl.board.tools.engine_timing`; importing this module
gives that one, so that ``hdl.board.engine_timing.main`` and every other name of it stay
where they were."""
import sys

from hdl.board.tools import engine_timing as _tool

if __name__ == "__main__":
    sys.exit(_tool.main())
sys.modules[__name__] = _tool
