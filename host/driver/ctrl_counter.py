"""The counter of authenticated ``CTRL`` requests (``docs/protocol/network.md`` section 7).

A request under a 128-bit control key carries a 64-bit counter in header bytes 16..23; a
board takes a write only if its counter is above that of every write it has accepted. Hosts
use their clock in microseconds, so that several controllers interleave; within this
process :func:`next_counter` is strictly increasing even where the clock repeats or steps
back (every transport of the process draws from it, so ranks in one process never reuse
one), and every request, a resend included, takes a new one.
"""
from __future__ import annotations

import threading
import time

__all__ = ["next_counter"]

_lock = threading.Lock()
_last = 0


def next_counter(clock=time.time_ns) -> int:
    """The next counter: the clock in microseconds, or one above the previous counter when
    the clock has not moved past it. ``clock`` returns nanoseconds (a test may pass a
    stopped one)."""
    global _last
    with _lock:
        now = clock() // 1000
        _last = max(now, _last + 1) & ((1 << 64) - 1)
        return _last
