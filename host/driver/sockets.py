"""The UDP socket plumbing every sender to a board shares: non-blocking sockets with large
buffers, draining what arrived, and the local address a board sees a host at."""
from __future__ import annotations

import socket

from .transport import TransportError

__all__ = ["open_udp_socket", "drain", "local_address_towards"]

#: large enough for a window of jumbo datagrams in both directions
_BUFFER_BYTES = 4 << 20
#: datagrams taken per drain, so that one busy socket cannot starve the others
_DRAIN = 512


def open_udp_socket(bind_ip: str) -> socket.socket:
    """A non-blocking UDP socket bound to a free port of ``bind_ip``."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            s.setsockopt(socket.SOL_SOCKET, option, _BUFFER_BYTES)
        s.bind((bind_ip, 0))
        s.setblocking(False)
    except BaseException:
        s.close()
        raise
    return s


def drain(sock) -> list[tuple[bytes, tuple]]:
    """The ``(data, source)`` datagrams waiting on ``sock`` (up to a bound), without
    blocking."""
    out = []
    for _ in range(_DRAIN):
        try:
            out.append(sock.recvfrom(1 << 16))
        except (BlockingIOError, InterruptedError):
            break
        except OSError:        # an ICMP error queued on the socket: nothing to read
            break
    return out


def local_address_towards(address: tuple[str, int]) -> str:
    """The local IPv4 address a board at ``address`` sees this host at (what its worker
    table must hold); TransportError if there is no route."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(address)
        return probe.getsockname()[0]
    except OSError as exc:
        raise TransportError(f"no route to the board at {address[0]}: {exc}") from None
    finally:
        probe.close()
