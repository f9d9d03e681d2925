"""The virtual board (``host/board/virtual.py``): real sockets on 127.0.0.1, port
translation, the backend seam, faults on the wire, a clean stop. Loopback only."""
import socket
import threading
import time

import pytest

from contract.network import DEFAULT_IP, SERVICE_OFFSETS, Service
from host.board import BoardBackend, Datagram, VirtualBoard, WireFaults
from host.board.backend import open_board_backend

LOOP = "127.0.0.1"


class Echo(BoardBackend):
    """A backend that answers each datagram with its payload reversed, from the same port,
    plus the datagrams it is told to send; its own port base is not the sockets'."""

    def __init__(self, extra=()):
        self.ip, self.port_base, self.key = "10.9.9.9", 47570, None
        self.seen = []
        self.extra = list(extra)
        self.fail_next = False

    def deliver(self, datagrams):
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("backend bug")
        self.seen.extend(datagrams)
        out = [Datagram(self.ip, d.dst_port, d.src_ip, d.src_port, d.payload[::-1])
               for d in datagrams]
        return out + self.extra


def client():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((LOOP, 0))
    s.settimeout(2.0)
    return s


def test_datagrams_reach_the_backend_with_real_addresses_and_ports_translate_back():
    backend = Echo()
    with VirtualBoard(backend, port_base=None) as board, client() as c:
        for service, offset in SERVICE_OFFSETS.items():
            c.sendto(b"abc" + bytes([offset]), (LOOP, board.port_base + offset))
            data, source = c.recvfrom(100)
            assert data == bytes([offset]) + b"cba"
            assert source == (LOOP, board.port_base + offset)
        d = backend.seen[0]
        assert (d.src_ip, d.src_port) == c.getsockname()
        assert (d.dst_ip, d.dst_port) == ("10.9.9.9", 47570)
        assert [x.dst_port - 47570 for x in backend.seen] == sorted(SERVICE_OFFSETS.values())


def test_only_loopback_destinations_and_service_ports_leave_and_a_backend_bug_is_survived(
        capsys):
    backend = Echo(extra=[Datagram("10.9.9.9", 47570, "192.0.2.1", 9, b"no"),
                          Datagram("10.9.9.9", 47570, "127.0.0.1", 0, b"no"),
                          Datagram("10.9.9.9", 1234, "127.0.0.1", 9, b"no")])
    with VirtualBoard(backend, port_base=None) as board, client() as c:
        c.sendto(b"x", (LOOP, board.port_base))
        assert c.recvfrom(10)[0] == b"x"
        backend.fail_next = True
        c.sendto(b"y", (LOOP, board.port_base))       # its batch is lost with the bug
        deadline = time.monotonic() + 2
        while board.stats["backend_errors"] == 0 and time.monotonic() < deadline:
            time.sleep(0.002)
        c.sendto(b"z", (LOOP, board.port_base))
        assert c.recvfrom(10)[0] == b"z"
        time.sleep(0.05)
        stats = dict(board.stats)
    assert stats["undeliverable"] == 4 and stats["bad_source_port"] == 2
    assert stats["backend_errors"] == 1
    assert "backend bug" in capsys.readouterr().err


def test_stop_closes_every_socket_and_the_ports_are_free_again():
    board = VirtualBoard("golden", port_base=None).start()
    base = board.port_base
    thread = board._thread
    board.stop()
    assert not thread.is_alive()
    again = VirtualBoard("golden", port_base=base).start()      # the same ports bind again
    again.stop()
    assert board._sockets == [] and again._sockets == []


def test_a_taken_port_is_a_clear_error():
    with VirtualBoard("golden", port_base=None) as board:
        with pytest.raises(OSError, match="cannot bind UDP 127.0.0.1"):
            VirtualBoard("golden", port_base=board.port_base + 2).open()


def test_control_datagrams_flush_what_the_wire_holds():
    backend = Echo()
    faults = WireFaults(reorder=0.999, seed=4, max_delay=0.5)     # nearly everything delayed
    with VirtualBoard(backend, port_base=None, faults=faults) as board, client() as c:
        for i in range(20):
            c.sendto(bytes([i]), (LOOP, board.port_base + SERVICE_OFFSETS[Service.NIC_TX]))
        c.sendto(b"C", (LOOP, board.port_base + SERVICE_OFFSETS[Service.CTRL]))
        deadline = time.monotonic() + 0.2
        while len(backend.seen) < 21 and time.monotonic() < deadline:
            time.sleep(0.002)
        # the control request reached the backend after all twenty delayed datagrams,
        # long before their delays (up to 0.5 s) were up
        assert [d.payload for d in backend.seen][-1] == b"C"
        assert sorted(d.payload[0] for d in backend.seen[:-1]) == list(range(20))


def test_named_backends_and_their_errors():
    golden = open_board_backend("golden", key=1, port_base=30000)
    assert golden.ip == DEFAULT_IP and golden.port_base == 30000
    with pytest.raises(ValueError, match="golden"):
        open_board_backend("fpga", key=1)
    with pytest.raises(ValueError, match="named backend"):
        VirtualBoard(Echo(), key=5)


def test_serve_forever_stops_on_request_from_another_thread():
    board = VirtualBoard("golden", port_base=None).open()
    thread = threading.Thread(target=board.serve_forever)
    thread.start()
    time.sleep(0.05)
    board.request_stop()
    thread.join(timeout=5)
    assert not thread.is_alive()
    board.stop()
