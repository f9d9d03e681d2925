"""The NIC in the wire's LiteEth PHY and MAC moved to :mod:`hdl.wire.mac`, the wire's own
room; this module keeps the old import path working."""
from hdl.wire.mac import BEAT_BYTES, LiteEthWireCore, MacBeat

__all__ = ["BEAT_BYTES", "MacBeat", "LiteEthWireCore"]
