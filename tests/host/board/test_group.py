"""Result groups (``docs/protocol/network.md`` section 3) on the board side: the golden board
datagram by datagram (no sockets), and the virtual board's switch socket (its multicast
options; what it refuses to send). Multicast over real sockets is
``tests/host/driver/test_udp_group.py``'s, in a network namespace of its own."""
import socket
import time

from contract.header import WORKER_MULTICAST, Header
from contract.network import (GROUP_TTL, NET_REGISTERS, SERVICE_OFFSETS, CtrlOp, Service,
                              ip_to_int, network_address)
from host.board import Datagram, VirtualBoard
from host.golden.aggregator import AggregatorModel
from tests.host.board.test_golden import HOST, PORTS, agg, board, configure, ctrl, read, \
    register, to
from tests.host.board.test_virtual import Echo, client

GROUP_TABLE = NET_REGISTERS["group"]
GROUP = ("239.77.0.1", 47580)
SERVICE_SWITCH = SERVICE_OFFSETS[Service.SWITCH]


def group_reg(job, field):
    return network_address("net", GROUP_TABLE.address(job, field))


def set_group(b, job, ip, port):
    return ctrl(b, CtrlOp.WRITE, [(group_reg(job, "ip"), ip_to_int(ip) if ip else 0),
                                  (group_reg(job, "port"), port)])


def round_of(b, job, addresses, slot, seq=0):
    out = []
    for w, address in enumerate(addresses):
        out += b.deliver([to(Service.SWITCH, agg(job, w, slot, 10 + w, seq=seq).to_bytes(),
                             src=address)])
    return out


def test_a_multicast_result_leaves_once_to_the_group_and_answers_to_resends_stay_unicast():
    b = board(slots=8)
    addresses = [(HOST, 41000 + w) for w in range(4)]
    for w, address in enumerate(addresses):
        register(b, 1, w, address)
    assert set_group(b, 1, *GROUP) == [ip_to_int(GROUP[0]), GROUP[1]]
    configure(b, 1, 4, 0, 8)
    model = AggregatorModel(slots=8, lanes=64, max_workers=32, jobs=4)
    model.configure_job(1, 4, 0, 8)
    for w in range(4):
        want = model.process(agg(1, w, 3, 10 + w))
    out = round_of(b, 1, addresses, 3)
    # one datagram, to the group, from the switch port, the multicast result itself
    assert [(d.src_ip, d.src_port, d.dst_ip, d.dst_port) for d in out] == \
        [(b.ip, PORTS[Service.SWITCH], *GROUP)]
    assert out[0].payload == want[0].to_bytes()
    assert Header.parse(out[0].payload).worker == WORKER_MULTICAST
    assert (b.counters["switch_out"], b.counters["switch_group_out"]) == (1, 1)
    # a retransmission of the complete round: unicast to the worker's table entry
    again = b.deliver([to(Service.SWITCH, agg(1, 2, 3, 12).to_bytes(), src=addresses[2])])
    assert [(d.dst_ip, d.dst_port) for d in again] == [addresses[2]]
    assert Header.parse(again[0].payload).worker == 2
    assert (b.counters["switch_out"], b.counters["switch_group_out"]) == (2, 1)
    # the counters read over control say the same
    assert read(b, network_address("net", dict(NET_REGISTERS["counter"].items())
                                   ["switch_group_out"])) == [1]


def test_no_group_a_half_written_one_and_a_cleared_one_fan_out_per_worker():
    b = board(slots=8)
    addresses = [(HOST, 41000 + w) for w in range(3)]
    for w, address in enumerate(addresses):
        register(b, 0, w, address)
    configure(b, 0, 3, 0, 8)
    assert read(b, group_reg(0, "ip"), group_reg(0, "port")) == [0, 0]
    targets = [(d.dst_ip, d.dst_port) for d in round_of(b, 0, addresses, 0)]
    assert targets == addresses
    set_group(b, 0, GROUP[0], 0)                       # an address without a port: no group
    assert [(d.dst_ip, d.dst_port) for d in round_of(b, 0, addresses, 1)] == addresses
    set_group(b, 0, *GROUP)
    assert [(d.dst_ip, d.dst_port) for d in round_of(b, 0, addresses, 2)] == [GROUP]
    set_group(b, 0, None, 0)                           # cleared: one per worker again
    assert [(d.dst_ip, d.dst_port) for d in round_of(b, 0, addresses, 3)] == addresses
    assert b.counters["switch_out"] == 3 * 3 + 1 and b.counters["switch_group_out"] == 1


def test_group_registers_hold_per_job_and_beyond_the_switchs_jobs_read_zero():
    b = board(jobs=2)
    assert set_group(b, 1, "239.1.2.3", 0xFFFF) == [ip_to_int("239.1.2.3"), 0xFFFF]
    assert read(b, group_reg(0, "ip"), group_reg(0, "port")) == [0, 0]
    # job 2 is beyond this board's two jobs: its entry ignores writes
    assert set_group(b, 2, "239.1.2.3", 5) == [0, 0]
    # the port is 16 bits wide
    assert ctrl(b, CtrlOp.WRITE, [(group_reg(1, "port"), 0x1_0005)]) == [5]


# -- the virtual board's switch socket --------------------------------------------------

def test_the_switch_socket_sends_to_groups_with_ttl_1_loop_and_the_boards_interface():
    with VirtualBoard("golden", port_base=None) as board:
        s = board._sockets[SERVICE_SWITCH]
        assert s.getsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL) == GROUP_TTL == 1
        assert s.getsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP) == 1
        interface = s.getsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, 4)
        assert socket.inet_ntoa(interface) == board.host
        assert board.stats["multicast"] == 0


def test_multicast_destinations_leave_from_the_switch_port_only():
    # From the NIC port a multicast destination is undeliverable (not sent): only the
    # switch sends to groups. (The switch's own group datagrams are sent in the namespace
    # test: nothing here sends multicast from the machine's own namespace.)
    backend = Echo(extra=[Datagram("10.9.9.9", 47570, GROUP[0], GROUP[1], b"no"),
                          Datagram("10.9.9.9", 47573, "224.0.0.1", GROUP[1], b"no")])
    with VirtualBoard(backend, port_base=None) as board, client() as c:
        c.sendto(b"x", ("127.0.0.1", board.port_base))
        assert c.recvfrom(10)[0] == b"x"
        time.sleep(0.05)
        stats = dict(board.stats)
    assert stats["undeliverable"] == 2 and stats["multicast"] == 0
