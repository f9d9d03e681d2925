"""Control of a board backend in this process: ``CTRL`` datagrams without sockets.

:class:`BackendControl` is the control side of :class:`~host.driver.udp.UdpTransport`
(``read``, ``write``, ``read_many``, ``write_many``, a ``region`` for local addresses) for a
:class:`~host.board.backend.BoardBackend` that lives in this process, such as the boards
of an in-process network (``host/switchml/tree_network.py``). Every request is a ``CTRL``
packet with the board's key, delivered to the backend as a datagram to its control port
from a controller's address, and its reply is read back exactly as the UDP transport reads
it (``docs/protocol/network.md`` section 4), so the driver's code that configures a board
(:class:`~host.driver.switch.SwitchInterface`, :func:`host.driver.udp_worker.configure_job`)
runs unchanged on the golden board or on a Verilated one. The in-process wire loses
nothing, so there are no resends.
"""
from __future__ import annotations

import itertools
import struct

from contract.header import HEADER_BYTES, HEADER_FIELDS, Flags, Header, PacketType
from contract.network import (CTRL_MAX_PAIRS, CTRL_OP_OFFSET, SERVICE_OFFSETS, CtrlOp, Service,
                              network_address)
from contract.registers import DATA_BITS
from host.driver.ctrl_counter import next_counter
from host.driver.transport import BadTagError, Transport, TransportError
from host.golden.ctrl_auth import (control_key, counter_of, is_authenticated, seal,
                                   unsealed, with_counter, wrapped_request)
from host.driver.udp import check_read_back

from .backend import BoardBackend, Datagram

__all__ = ["BackendControl", "CONTROLLER"]

#: Where the control requests come from (no board's worker table holds it).
CONTROLLER = ("10.255.255.254", 47999)
_WORD = (1 << DATA_BITS) - 1
_FIELD = {f.name: f for f in HEADER_FIELDS}
_FLAGS = _FIELD["flags"].offset
_COUNT = _FIELD["count"]


class BackendControl(Transport):
    """``CTRL`` requests to ``backend``, in this process.

    Parameters
    ----------
    backend : BoardBackend
        The board.
    key : int or None
        Its control key (default: ``backend.key``).
    region : str or None
        ``"nic"``, ``"switch"`` or ``"net"``: ``read``/``write`` take that region's local
        addresses, as :class:`~host.driver.udp.UdpTransport`'s do; None: full addresses.
    source : (str, int)
        The controller's address.
    """

    def __init__(self, backend: BoardBackend, key: int | None = None, *,
                 region: str | None = None, source=CONTROLLER):
        super().__init__()
        self.backend = backend
        self.key = backend.key if key is None else key
        if self.key is None:
            raise TransportError("no control key: the backend does not show one; give it")
        self.key = control_key(self.key)
        self.region = region
        self.source = source
        self._seq = itertools.count(1)
        self.requests = 0

    def _address(self, address: int, full: bool) -> int:
        if isinstance(address, bool) or not isinstance(address, int):
            raise ValueError(f"a register address is an integer, not {address!r}")
        if self.region is not None and not full:
            return network_address(self.region, address)
        if not 0 <= address <= _WORD:
            raise ValueError(f"a CTRL address is 32 bits, not {address:#x}")
        return address

    def _request(self, op: CtrlOp, pairs) -> list[int]:
        header = bytearray(Header(type=PacketType.CTRL, count=len(pairs),
                                  seq=next(self._seq) & _WORD).pack())
        header[CTRL_OP_OFFSET] = op
        words = [w for pair in pairs for w in pair]
        port = self.backend.port_base + SERVICE_OFFSETS[Service.CTRL]
        packet = bytes(header) + struct.pack(f"<{len(words)}I", *words)
        authenticated = is_authenticated(self.key)
        if authenticated:          # section 7: a fresh counter, key words wrapped, the tag
            packet = with_counter(packet, next_counter())
        packet = seal(self.key, wrapped_request(self.key, packet))
        request = Datagram(self.source[0], self.source[1], self.backend.ip, port, packet)
        self.requests += 1
        replies = [d for d in self.backend.deliver([request]) + self.backend.poll()
                   if (d.dst_ip, d.dst_port) == tuple(self.source) and d.src_port == port]
        if len(replies) != 1:
            raise TransportError(f"the board at {self.backend.ip} answered a control request "
                                 f"with {len(replies)} replies (none: a wrong key, or no "
                                 f"control service)")
        reply = replies[0].payload
        if authenticated and (not unsealed(self.key, reply)
                              or counter_of(reply) != counter_of(packet)):
            raise BadTagError(Service.CTRL, f"the control reply from the board at "
                              f"{self.backend.ip} has a wrong SipHash tag or counter")
        flags = reply[_FLAGS]
        count = int.from_bytes(reply[_COUNT.offset:_COUNT.offset + _COUNT.size], "little")
        if flags & Flags.ERROR or not flags & Flags.RESULT or count != len(pairs) \
                or len(reply) != HEADER_BYTES + 8 * count:
            raise TransportError(f"the board at {self.backend.ip} refused a control request "
                                 f"of {len(pairs)} pairs (flags {flags:#x})")
        values = struct.unpack(f"<{2 * count}I", reply[HEADER_BYTES:])
        return list(values[1::2])

    def _run(self, op: CtrlOp, pairs) -> list[int]:
        values = []
        for i in range(0, len(pairs), CTRL_MAX_PAIRS):
            values += self._request(op, pairs[i:i + CTRL_MAX_PAIRS])
        return values

    def read_many(self, addresses, *, full: bool = False) -> list[int]:
        """Read registers, 64 per request (addresses as :meth:`UdpTransport.read_many`)."""
        return self._run(CtrlOp.READ, [(self._address(a, full), 0) for a in addresses])

    def write_many(self, pairs, *, verify: bool = True, full: bool = False) -> list[int]:
        """Write ``(address, value)`` pairs in order; the values read back. With ``verify``
        a register that reads back another value (read-only, unmapped, too narrow) is a
        TransportError, as over UDP; a ``commit`` reads back the job's status."""
        writes = [(self._address(a, full), int(v)) for a, v in pairs]
        for address, value in writes:
            if not 0 <= value <= _WORD:
                raise ValueError(f"a register value is 32 bits, not {value!r}")
        read_back = self._run(CtrlOp.WRITE, writes)
        check_read_back(writes, read_back, verify=verify)
        return read_back

    def read(self, addr):
        return self.read_many([addr])[0]

    def write(self, addr, value):
        self.write_many([(addr, value)])

    def _exchange(self, stream, packets, options):
        raise TransportError("BackendControl carries control requests only; data goes "
                             "through the network that holds the board")
