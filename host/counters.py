"""Re-export of :mod:`contract.counters`, where the shared definition lives (kept importable)."""
from contract.counters import *  # noqa: F401,F403
from contract.counters import __all__  # noqa: F401
