"""Re-export of :mod:`contract.header`, where the shared definition lives (kept importable)."""
from contract.header import *  # noqa: F401,F403
from contract.header import __all__  # noqa: F401
