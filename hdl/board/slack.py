"""``python -m hdl.board.slack``: every failing endpoint of a routed build, at the path the
Makefile and users call. The tool is :mod:`hdl.board.tools.slack`; importing this module
gives that one, so that ``hdl.board.slack.main`` and every other name of it stay where
they were."""
import sys

from hdl.board.tools import slack as _tool

if __name__ == "__main__":
    sys.exit(_tool.main())
sys.modules[__name__] = _tool
