"""The virtual board with the Verilated network top behind it (``sim/harness/board.py``,
``sim/harness/phy.cpp``): UdpTransport over real sockets on 127.0.0.1 to LiteEth, the front
end and the engines, bit-exact against the golden models, and the golden board and the
Verilated one answering the same datagrams with the same bytes.

One harness build of the network top (the simulation key), cached by content and shared by
every test here; each test starts its own harness process (a reset board) where the state
of another test would matter. Loopback only; every wait is bounded by a transport's retry
limit or the harness's cycle budget.
"""
import secrets
import struct

import numpy as np
import pytest

from contract.counters import NET_CORE_DROPS, NET_COUNTERS
from contract.header import HEADER_BYTES, Flags, Header, PacketType
from contract.network import (CTRL_KEY_OFFSET, CTRL_OP_OFFSET, NET_REGISTERS,
                              CtrlOp, Service, ip_to_int, network_address)
from contract.packet import Packet
from contract.registers import COMMIT, SWITCH_REGISTERS
from host.board import Datagram, GoldenBoard, VirtualBoard
from host.driver.models import NicModelTransport
from host.driver.switch import SwitchInterface
from host.driver.udp import NoReplyError, UdpTransport
from host.golden import inceptionn, lhc

pytestmark = pytest.mark.slow

LOOP = "127.0.0.1"
IDENTITY = ("ip", "mac_high", "mac_low", "port_base", "services", "link")


def fresh_rng():
    seed = secrets.randbits(32)
    print(f"seed {seed}")
    return np.random.default_rng(seed)


def bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


def net(name, *args):
    entry = NET_REGISTERS[name]
    return network_address("net", entry.address(*args) if args else entry.address)


@pytest.fixture(scope="module")
def verilated():
    """A VerilatorBoard (the network top with the simulation key) served on free ports."""
    from sim.harness.board import VerilatorBoard
    backend = VerilatorBoard()
    with VirtualBoard(backend, port_base=None) as board:
        yield board


def golden_twin(backend):
    """The golden board built as the Verilated one is (key, addresses, ports, switch)."""
    p = backend.harness.switch_params
    return GoldenBoard(backend.key, ip=backend.ip, mac=backend.mac, port_base=backend.port_base,
                       slots=p["slots"], lanes=p["lanes"], max_workers=p["max_workers"],
                       jobs=p["jobs"])


def test_control_reads_and_writes_with_the_key(verilated):
    backend = verilated.backend
    twin = golden_twin(backend)
    rng = fresh_rng()
    with verilated.transport() as t:
        identity = t.read_many([net(n) for n in IDENTITY])
        assert identity == [twin.read(net(n)) for n in IDENTITY]
        assert identity[IDENTITY.index("link")] == 1        # the PHY's in-band status
        assert identity[IDENTITY.index("ip")] == ip_to_int(backend.ip)
        ip, port = int(rng.integers(1, 1 << 32)), int(rng.integers(1, 1 << 16))
        workers = int(rng.integers(1, 33))
        pairs = [(net("worker", 1 * 32 + 3, "ip"), ip), (net("worker", 1 * 32 + 3, "port"), port),
                 (network_address("switch", SWITCH_REGISTERS["job"].address(2, "workers")),
                  workers)]
        assert t.write_many(pairs) == [v for _, v in pairs]
        assert t.read_many([a for a, _ in pairs]) == [v for _, v in pairs]
    assert backend.stats["bad_frames"] == 0
    # the run's longest silence stays well inside the idle time that ends a delivery
    assert backend.stats["max_gap"] < backend.idle // 2


def test_a_wrong_key_is_refused_and_changes_nothing(verilated):
    address = net("worker", 0, "port")
    with verilated.transport() as t:
        before = t.read_many([address, net("counter", "drop_bad_key")])
    with UdpTransport(LOOP, port_base=verilated.port_base, key=verilated.key ^ 1 << 63,
                      retries=1, timeout=0.5, min_timeout=0.5, max_timeout=0.5) as wrong:
        with pytest.raises(NoReplyError, match="key"):
            wrong.write(address, before[0] ^ 0x5A5A)
    with verilated.transport() as t:
        after = t.read_many([address, net("counter", "drop_bad_key")])
    assert after[0] == before[0]
    assert after[1] - before[1] == 2        # the request and its one resend


def test_nic_round_trip_is_bit_exact_against_the_golden_model(verilated):
    rng = fresh_rng()
    x = (rng.standard_normal(900) * 0.05).astype(np.float32)
    x[:8] = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-40, -1e-45, 3.4e38]
    packets = inceptionn.tensor_to_packets(x, 7, packet_values=336)
    model = NicModelTransport()
    with verilated.transport(region="nic") as t:
        tx = t.exchange("tx", packets)
        assert [p.to_bytes() for p in tx] == [p.to_bytes() for p in model.exchange("tx", packets)]
        rx = t.exchange("rx", tx[::-1])
        assert [p.to_bytes() for p in rx] == \
            [p.to_bytes() for p in model.exchange("rx", tx[::-1])]
    got = inceptionn.packets_to_tensor(rx, x.size)
    assert np.array_equal(bits(got), bits(inceptionn.quantize(x, 7)))


def test_a_switch_round_of_two_workers_is_bit_exact(verilated):
    rng = fresh_rng()
    tensors = []
    for _ in range(2):
        t = np.zeros(1500, np.float32)
        hot = rng.random(t.size) < 0.05
        t[hot] = (rng.standard_normal(hot.sum()) * 0.01).astype(np.float32)
        tensors.append(t)
    with verilated.transport(region="switch") as t:
        switch = SwitchInterface(t)
        result, _ = switch.allreduce(tensors, job=1, slot_base=8, slot_count=4)
        table = [t.worker_address(1, w) for w in range(2)]
        counters = switch.counters()
    assert np.array_equal(bits(result), bits(lhc.allreduce(tensors)[0]))
    assert counters["results_multicast"] > 0
    with verilated.transport() as t:
        for w, (ip, port) in enumerate(table):
            assert t.read_many([net("worker", 32 + w, "ip"), net("worker", 32 + w, "port")]) \
                == [ip_to_int(ip), port]
        assert t.read(net("counter", "drop_bad_source")) == 0


# -- the cross-check: the same datagrams, the same replies ---------------------------------

def ctrl(key, op, pairs, *, seq, count=None):
    header = bytearray(Header(count=len(pairs) if count is None else count, seq=seq).pack())
    header[2] = PacketType.CTRL
    header[CTRL_OP_OFFSET] = op
    header[CTRL_KEY_OFFSET:CTRL_KEY_OFFSET + 8] = key.to_bytes(8, "little")
    return bytes(header) + b"".join(struct.pack("<II", a, v) for a, v in pairs)


def agg(job, worker, values, *, slot, seq, op=PacketType.AGG_ADD_I32, version=0):
    return Packet(Header(type=op, job=job, worker=worker, count=64, slot=slot,
                         slot_version=version, seq=seq, exponent=worker),
                  np.asarray(values, "<u4").tobytes()).to_bytes()


def cross_check_traffic(rng, board_ip, port_base, key):
    """``(source port, service, payload)`` of every kind the front end serves or drops."""
    ctrl_port, a, b = 40100, 40201, 40202
    ports = {s: port_base + i for i, s in enumerate((Service.NIC_TX, Service.NIC_RX,
                                                     Service.SWITCH, Service.CTRL))}
    x = (rng.standard_normal(400) * 0.05).astype(np.float32)
    x[:6] = [np.nan, -0.0, np.inf, 1e-40, 2.0 ** -20, -3.0]
    tx = inceptionn.tensor_to_packets(x, 9, packet_values=200)
    compressed = [p.to_bytes() for p in NicModelTransport().exchange("tx", tx)]
    job = SWITCH_REGISTERS["job"]
    sw = lambda *args: network_address("switch", job.address(*args))
    out = [
        (ctrl_port, Service.CTRL, ctrl(key, CtrlOp.READ, [(net(n), 0) for n in IDENTITY], seq=1)),
        (ctrl_port, Service.CTRL, ctrl(key ^ 1, CtrlOp.READ, [(net("ip"), 0)], seq=2)),
        (ctrl_port, Service.CTRL, ctrl(key, CtrlOp.READ, [], seq=3, count=0)),      # ERROR
        (ctrl_port, Service.CTRL, ctrl(key, 7, [(net("ip"), 0)], seq=4)),          # bad op
        (ctrl_port, Service.CTRL, ctrl(key, CtrlOp.WRITE, [
            (net("worker", 0, "ip"), ip_to_int(LOOP)), (net("worker", 0, "port"), a),
            (net("worker", 1, "ip"), ip_to_int(LOOP)), (net("worker", 1, "port"), b),
            (sw(0, "workers"), 2), (sw(0, "slot_base"), 0), (sw(0, "slot_count"), 4)], seq=5)),
        (ctrl_port, Service.CTRL, ctrl(key, CtrlOp.WRITE, [(sw(0, "commit"), COMMIT)], seq=6)),
        *[(40001, Service.NIC_TX, p.to_bytes()) for p in tx],
        (40001, Service.NIC_TX, tx[0].to_bytes()[:-4]),           # count disagrees: dropped
        (40001, Service.NIC_TX, bytes(range(20))),                # shorter than a header
        *[(40002, Service.NIC_RX, p) for p in compressed],
        (40002, Service.NIC_RX, compressed[0][:HEADER_BYTES + 5]),  # truncated bitstream
        (a, Service.SWITCH, agg(0, 0, rng.integers(0, 1 << 20, 64), slot=1, seq=10)),
        (b, Service.SWITCH, agg(0, 0, rng.integers(0, 1 << 20, 64), slot=1, seq=10)),  # not b's
        (b, Service.SWITCH, agg(0, 1, rng.integers(0, 1 << 20, 64), slot=1, seq=11)),  # result
        (b, Service.SWITCH, agg(0, 1, rng.integers(0, 1 << 20, 64), slot=1, seq=11)),  # unicast
        (a, Service.SWITCH, agg(0, 0, [1 << k for k in range(32)] * 2, slot=2, seq=12,
                                op=PacketType.AGG_OR32)),
        (b, Service.SWITCH, agg(0, 1, [3] * 64, slot=2, seq=13, op=PacketType.AGG_OR32)),
        (ctrl_port, Service.CTRL, ctrl(key, CtrlOp.READ, [
            (net("counter", n), 0) for n in NET_COUNTERS
            if n not in NET_CORE_DROPS and not n.startswith("arp_")], seq=14)),
    ]
    return [Datagram(LOOP, sport, board_ip, ports[service], payload)
            for sport, service, payload in out]


def test_the_golden_and_the_verilated_board_answer_the_same_datagrams_with_the_same_bytes():
    from sim.harness.board import VerilatorBoard
    rng = fresh_rng()
    backend = VerilatorBoard()
    try:
        twin = golden_twin(backend)
        traffic = cross_check_traffic(rng, backend.ip, backend.port_base, backend.key)
        for n, datagram in enumerate(traffic):
            want = twin.deliver([datagram])
            got = backend.deliver([datagram])
            assert got == want, f"datagram {n} (to port {datagram.dst_port}): replies differ"
        assert backend.stats["bad_frames"] == 0
        counters = backend.counters()
        assert {k: v for k, v in counters.items()
                if k not in NET_CORE_DROPS and not k.startswith("arp_")} == \
            {k: v for k, v in twin.counters.items()
             if k not in NET_CORE_DROPS and not k.startswith("arp_")}
        assert counters["arp_miss"] == 1            # one host on the wire: 127.0.0.1
    finally:
        backend.close()
