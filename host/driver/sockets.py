"""The UDP socket plumbing every sender to a board shares: non-blocking sockets with large
buffers, draining what arrived, the local address a board sees a host at, and the socket
that receives a job's result group (``docs/protocol/network.md`` section 3)."""
from __future__ import annotations

import socket

from .transport import TransportError

__all__ = ["open_udp_socket", "drain", "local_address_towards", "parse_group",
           "open_group_socket"]

#: large enough for a window of jumbo datagrams in both directions
_BUFFER_BYTES = 4 << 20
#: datagrams taken per drain, so that one busy socket cannot starve the others
_DRAIN = 512
#: Linux's IP_MULTICAST_ALL (Python names it from 3.12 on): 0 = a socket receives only the
#: groups it joined itself, not every group some socket of the host joined
_IP_MULTICAST_ALL = getattr(socket, "IP_MULTICAST_ALL", 49)


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


def parse_group(group) -> tuple[str, int] | None:
    """A job's result group as ``(ip, port)``, or None for no group.

    ``group`` is None, ``0``, ``"0"`` (no group), an ``(ip, port)`` pair or ``"IP:PORT"``.
    The address must be IPv4 multicast (224.0.0.0/4; 239.0.0.0/8, administratively scoped,
    is the one to use) and the port in 1..65535; ValueError (one line) otherwise.
    """
    import ipaddress

    if group is None or (isinstance(group, (int, str)) and not isinstance(group, bool)
                         and str(group).strip() == "0"):
        return None
    if isinstance(group, str):
        ip, sep, port = group.strip().rpartition(":")
        if not sep:
            raise ValueError(f"give a result group as ADDR:PORT (e.g. 239.1.2.3:47580) or 0 "
                             f"for none, not {group!r}")
    else:
        try:
            ip, port = group
        except (TypeError, ValueError):
            raise ValueError(f"a result group is (ip, port), ADDR:PORT or 0/None, not "
                             f"{group!r}") from None
    try:
        address = ipaddress.IPv4Address(str(ip))
    except ValueError:
        raise ValueError(f"the result group's address {ip!r} is not an IPv4 address") from None
    if not address.is_multicast:
        raise ValueError(f"the result group's address {address} is not IPv4 multicast "
                         f"(224.0.0.0/4; use 239.0.0.0/8, administratively scoped)")
    if isinstance(port, str) and port.strip().isdigit():
        port_number = int(port)
    elif isinstance(port, int) and not isinstance(port, bool) \
            or type(port).__module__ == "numpy" and float(port).is_integer():
        port_number = int(port)
    else:
        raise ValueError(f"the result group's port must be an integer in 1..65535, not "
                         f"{port!r}")
    if not 1 <= port_number <= 0xFFFF:
        raise ValueError(f"the result group's port must be in 1..65535, not {port_number}")
    return str(address), port_number


def open_group_socket(group: tuple[str, int], interface_ip: str) -> socket.socket:
    """A non-blocking UDP socket that receives the result group ``group`` (``(ip, port)``)
    on the interface with address ``interface_ip`` (the one that reaches the board).

    It is bound to the group's address and port (so it takes only datagrams to the group,
    not unicast ones to that port) with ``SO_REUSEADDR`` and ``SO_REUSEPORT`` (every worker
    of a host binds the same group port), and joins the group there
    (``IP_ADD_MEMBERSHIP``: the kernel sends the IGMP report). ``IP_MULTICAST_ALL`` is off:
    it receives its own group only. TransportError if the host cannot join.
    """
    ip, port = group
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if hasattr(socket, "SO_REUSEPORT"):
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            except OSError:
                pass
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _BUFFER_BYTES)
        try:
            s.setsockopt(socket.IPPROTO_IP, _IP_MULTICAST_ALL, 0)
        except OSError:
            pass                       # not Linux: the bind to the group address filters
        try:
            s.bind((ip, port))
            s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
                         socket.inet_aton(ip) + socket.inet_aton(interface_ip))
        except OSError as exc:
            raise TransportError(f"cannot receive the result group {ip}:{port} on the "
                                 f"interface of {interface_ip}: {exc}") from None
        s.setblocking(False)
    except BaseException:
        s.close()
        raise
    return s
