"""Where a board is and how large its datagrams may be.

The board's address, port base, key and MTU come from the arguments, else the environment
(:func:`board_settings`): ``GRADWIRE_BOARD`` (``HOST`` or ``HOST:PORT_BASE``),
``GRADWIRE_PORT_BASE``, ``GRADWIRE_KEY`` (16 hex digits: section 4's 64-bit key; or 32:
section 7's 128-bit key, authenticated control) and ``GRADWIRE_MTU``. Packet sizes
follow from the MTU (:func:`nic_packet_values`): 1500 by default, up to 9000 (jumbo
frames), at least :data:`MTU_MIN`.
"""
from __future__ import annotations

import functools
import os

import numpy as np

from contract.header import HEADER_BYTES, LANES, NIC_MAX_COUNT
from contract.network import (IP_UDP_HEADER_BYTES, MTU_DEFAULT, PORT_BASE, format_key,
                              nic_values_for_mtu, parse_key, service_ports)

__all__ = ["board_settings", "parse_key", "format_key", "inc_max_bytes", "nic_packet_values",
           "ENV_BOARD", "ENV_PORT_BASE", "ENV_KEY", "ENV_MTU", "MTU_MIN"]

ENV_BOARD = "GRADWIRE_BOARD"
ENV_PORT_BASE = "GRADWIRE_PORT_BASE"
ENV_KEY = "GRADWIRE_KEY"
ENV_MTU = "GRADWIRE_MTU"
#: the smallest IPv4 MTU every host must accept
MTU_MIN = 576


def _port_base(value, source) -> int:
    try:
        base = int(value)
        service_ports(base)
    except (TypeError, ValueError):
        raise ValueError(f"{source}: the port base must be an integer in 1..65532, "
                         f"not {value!r}") from None
    return base


def board_settings(board=None, *, port_base=None, key=None, mtu=None, environ=None) -> dict:
    """``{"host", "port_base", "key", "mtu"}`` from the arguments, else the environment
    (:data:`ENV_BOARD`, :data:`ENV_PORT_BASE`, :data:`ENV_KEY`, :data:`ENV_MTU`), else
    the defaults (127.0.0.1, 47570, no key, 1500). ``board`` is ``HOST`` or
    ``HOST:PORT_BASE``."""
    env = os.environ if environ is None else environ
    text = board if board is not None else env.get(ENV_BOARD) or "127.0.0.1"
    host, _, base_text = str(text).partition(":")
    if not host:
        raise ValueError(f"board address {text!r} has no host")
    if port_base is None and base_text:
        port_base = _port_base(base_text, f"board address {text!r}")
    if port_base is None:
        port_base = _port_base(env.get(ENV_PORT_BASE, PORT_BASE), ENV_PORT_BASE)
    if key is None and env.get(ENV_KEY):
        try:
            key = parse_key(env[ENV_KEY])
        except ValueError as exc:
            raise ValueError(f"{ENV_KEY}: {exc}") from None
    elif isinstance(key, str):
        key = parse_key(key)
    if mtu is None:
        mtu = env.get(ENV_MTU, MTU_DEFAULT)
    try:
        mtu = int(mtu)
    except (TypeError, ValueError):
        raise ValueError(f"the MTU must be an integer, not {mtu!r}") from None
    return {"host": host, "port_base": port_base, "key": key, "mtu": mtu}


@functools.lru_cache(maxsize=4096)
def inc_max_bytes(values: int) -> int:
    """Largest ``INC_F32`` packet (header included) the NIC emits for ``values`` values:
    every value raw (tag 11), so 272 bits per 8 values, padded to 32 bits."""
    from host.golden.inceptionn import stream_bytes
    return HEADER_BYTES + stream_bytes(np.full(values, 3, dtype=np.uint8))


def nic_packet_values(mtu: int) -> int:
    """Values per NIC packet at an IP MTU of ``mtu`` bytes: the most (whole 8-value beats,
    at most 2048) for which the raw request and the worst-case compressed reply both fit one
    datagram. 336 at 1500 (a raw packet of 360 values fits, but its compressed form may
    take 1562 bytes), 2048 at 9000."""
    limit = mtu - IP_UDP_HEADER_BYTES
    values = nic_values_for_mtu(mtu)
    values -= values % LANES
    while values > LANES and inc_max_bytes(values) > limit:
        values -= LANES
    if inc_max_bytes(values) > limit:
        raise ValueError(f"an MTU of {mtu} bytes leaves no room for a NIC packet")
    return min(values, NIC_MAX_COUNT)
