"""Re-export of :mod:`contract.packet`, where the shared definition lives (kept importable)."""
from contract.packet import *  # noqa: F401,F403
from contract.packet import __all__  # noqa: F401
