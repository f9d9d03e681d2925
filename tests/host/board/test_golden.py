"""The golden board (``host/board/golden.py``) against ``docs/network-contract.md``: every
service, every drop, every register, datagram by datagram (no sockets)."""
import struct

import numpy as np
import pytest

from contract.counters import NET_COUNTERS
from contract.header import HEADER_BYTES, WORKER_MULTICAST, Flags, Header, PacketType
from contract.network import (
    CTRL_KEY_OFFSET,
    CTRL_MAX_PAIRS,
    CTRL_OP_OFFSET,
    DEFAULT_IP,
    MAX_WORKERS_IN_TABLE,
    NET_REGISTERS,
    NIC_REGISTERS,
    SWITCH_REGISTERS,
    CtrlOp,
    Service,
    ip_to_int,
    mac_to_int,
    network_address,
    service_ports,
)
from contract.packet import Packet
from contract.registers import COMMIT, switch_params_word
from host.golden.aggregator import AggregatorModel
from host.board import Datagram, GoldenBoard
from host.golden import inceptionn
from tests.helpers import fresh_rng

KEY = 0x0123_4567_89AB_CDEF
HOST = "127.0.0.1"
PORTS = service_ports(40000)
TABLE = NET_REGISTERS["worker"]
JOB = SWITCH_REGISTERS["job"]


def board(**params):
    return GoldenBoard(KEY, port_base=40000, **params)


def to(service, payload, src=(HOST, 50000), dst_ip=DEFAULT_IP):
    return Datagram(src[0], src[1], dst_ip, PORTS[service], bytes(payload))


def ctrl_bytes(op, pairs, *, key=KEY, seq=7, count=None, raw_op=None):
    header = bytearray(Header(type=PacketType.CTRL, count=len(pairs) if count is None else count,
                              seq=seq).pack())
    header[CTRL_OP_OFFSET] = op if raw_op is None else raw_op
    header[CTRL_KEY_OFFSET:CTRL_KEY_OFFSET + 8] = key.to_bytes(8, "little")
    return bytes(header) + b"".join(struct.pack("<II", a, v) for a, v in pairs)


def ctrl(b, op, pairs, **kw):
    """Run one CTRL request; the reply's values (and check the reply's framing)."""
    request = ctrl_bytes(op, pairs, **kw)
    out = b.deliver([to(Service.CTRL, request, dst_ip=b.ip)])
    assert len(out) == 1
    reply = out[0]
    assert (reply.src_ip, reply.src_port, reply.dst_ip, reply.dst_port) == \
        (b.ip, PORTS[Service.CTRL], HOST, 50000)
    data = reply.payload
    assert data[3] == request[3] | Flags.RESULT
    assert data[:3] == request[:3] and data[4:HEADER_BYTES] == request[4:HEADER_BYTES]
    words = struct.unpack(f"<{2 * len(pairs)}I", data[HEADER_BYTES:])
    assert list(words[0::2]) == [a for a, _ in pairs]
    return list(words[1::2])


def read(b, *addresses):
    return ctrl(b, CtrlOp.READ, [(a, 0) for a in addresses])


def net(name):
    return network_address("net", NET_REGISTERS[name].address)


def table(job, worker, field):
    return network_address("net", TABLE.address(job * MAX_WORKERS_IN_TABLE + worker, field))


def register(b, job, worker, address):
    ctrl(b, CtrlOp.WRITE, [(table(job, worker, "ip"), ip_to_int(address[0])),
                           (table(job, worker, "port"), address[1])])


def configure(b, job, workers, base, count):
    ctrl(b, CtrlOp.WRITE, [(network_address("switch", JOB.address(job, f)), v)
                           for f, v in (("workers", workers), ("slot_base", base),
                                        ("slot_count", count), ("commit", COMMIT))])


# -- dispatch --------------------------------------------------------------------------

def test_closed_ports_other_addresses_and_missing_services_are_counted_drops():
    b = board(services=[Service.NIC_TX, Service.CTRL])
    packet = Packet(Header(), b"").to_bytes()
    assert b.deliver([Datagram(HOST, 1, DEFAULT_IP, 40004, packet),       # past the services
                      Datagram(HOST, 1, DEFAULT_IP, 39999, packet),
                      to(Service.NIC_RX, packet), to(Service.SWITCH, packet),  # not built
                      to(Service.NIC_TX, packet, dst_ip="10.0.0.9")]) == []
    assert b.counters["drop_closed_port"] == 4 and b.counters["ip_address"] == 1
    assert b.counters["nic_rx_in"] == b.counters["switch_in"] == 0
    assert b.nic.read(NIC_REGISTERS["rx"].address("packets")) == 0
    # a missing service's region reads 0; the services register says what is built
    services = read(b, net("services"))[0]
    assert services == 1 << 0 | 1 << 3
    assert read(b, network_address("switch", SWITCH_REGISTERS["params"].address)) == [0]


# -- NIC services ----------------------------------------------------------------------

def nasty_values(rng, n):
    x = (rng.standard_normal(n) * 0.05).astype(np.float32)
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-40, 2.0 ** -10, 1.0, -1.0],
                        np.float32)
    x[:specials.size] = specials
    x.view(np.uint32)[specials.size] = 0x7FC0_BEEF
    return x


@pytest.mark.parametrize("k", [1, 7, 10, 15])
def test_nic_services_are_the_golden_nic_byte_for_byte(k):
    rng = fresh_rng()
    b = board()
    values = nasty_values(rng, 1000)
    packets = inceptionn.tensor_to_packets(values, k, packet_values=336, seq=5, offset=3)
    out = b.deliver([to(Service.NIC_TX, p.to_bytes(), src=(HOST, 50001)) for p in packets])
    want = [inceptionn.nic_tx(p)[0].to_bytes() for p in packets]
    assert [d.payload for d in out] == want
    assert {(d.src_port, d.dst_ip, d.dst_port) for d in out} == \
        {(PORTS[Service.NIC_TX], HOST, 50001)}
    back = b.deliver([to(Service.NIC_RX, d.payload, src=(HOST, 50002)) for d in out])
    assert [d.payload for d in back] == \
        [inceptionn.nic_rx(Packet.from_bytes(d.payload))[0].to_bytes() for d in out]
    got = inceptionn.packets_to_tensor([Packet.from_bytes(d.payload) for d in back],
                                       values.size, offset=3)
    assert np.array_equal(got.view(np.uint32), inceptionn.quantize(values, k).view(np.uint32))
    c = b.counters
    assert c["nic_tx_in"] == c["nic_tx_out"] == c["nic_rx_in"] == c["nic_rx_out"] == len(packets)


def test_nic_receive_drops_send_nothing_and_short_datagrams_are_zero_completed():
    b = board()
    bad = Packet(Header(type=PacketType.INC_F32, k=10, count=64), bytes(8))  # truncated
    assert b.deliver([to(Service.NIC_RX, bad.to_bytes())]) == []
    assert b.counters["nic_rx_in"] == 1 and b.counters["nic_rx_out"] == 0
    assert b.nic.read(NIC_REGISTERS["rx"].address("drop_truncated")) == 1
    # 5 bytes: completed with zeros to a whole header: magic, version, RAW_F32 -> bypassed
    short = Header().pack()[:5]
    out = b.deliver([to(Service.NIC_TX, short)])
    assert [d.payload for d in out] == [short + bytes(HEADER_BYTES - 5)]
    # a partial last word is completed with zeros too (RAW_F32 + COMPRESS: length mismatch)
    raw = Packet(Header(flags=Flags.COMPRESS, k=10, count=1), np.float32([0.3]).tobytes())
    out = b.deliver([to(Service.NIC_TX, raw.to_bytes() + b"\x01")])
    want, cause = inceptionn.nic_tx(Packet(raw.header, raw.payload + b"\x01\0\0\0"))
    assert out[0].payload == want.to_bytes() and cause == "length_mismatch"
    assert b.nic.read(NIC_REGISTERS["tx"].address("length_mismatch")) == 1


# -- switch service --------------------------------------------------------------------

def agg(job, worker, slot, value, *, seq=0, version=0, lanes=64, op=PacketType.AGG_ADD_I32):
    return Packet(Header(type=op, job=job, worker=worker, count=lanes, slot=slot,
                         slot_version=version, seq=seq),
                  np.full(lanes, value, "<u4").tobytes())


def test_source_check_and_multicast_fan_out_to_the_worker_table():
    b = board(slots=8)
    addresses = [(HOST, 41000 + w) for w in range(3)]
    for w, address in enumerate(addresses):
        register(b, 1, w, address)
    configure(b, 1, 3, 2, 4)
    model = AggregatorModel(slots=8, lanes=64, max_workers=32, jobs=4)
    model.configure_job(1, 3, 2, 4)
    # from the wrong port, the wrong address, for another worker, another job, a worker
    # past the switch's: dropped before the engine
    bad = [to(Service.SWITCH, agg(1, 0, 2, 1).to_bytes(), src=(HOST, 41009)),
           to(Service.SWITCH, agg(1, 0, 2, 1).to_bytes(), src=("127.0.0.2", 41000)),
           to(Service.SWITCH, agg(1, 1, 2, 1).to_bytes(), src=addresses[0]),
           to(Service.SWITCH, agg(0, 0, 0, 1).to_bytes(), src=addresses[0]),
           to(Service.SWITCH, agg(1, 40, 2, 1).to_bytes(), src=addresses[0]),
           to(Service.SWITCH, agg(7, 0, 2, 1).to_bytes(), src=addresses[0])]
    assert b.deliver(bad) == []
    assert b.counters["drop_bad_source"] == len(bad)
    assert b.aggregator.counters["packets"] == 0
    out = []
    for w, address in enumerate(addresses):
        packet = agg(1, w, 3, 10 + w)
        out += b.deliver([to(Service.SWITCH, packet.to_bytes(), src=address)])
        want = model.process(packet)
    assert [(d.dst_ip, d.dst_port) for d in out] == addresses       # in worker order
    assert all(d.src_port == PORTS[Service.SWITCH] for d in out)
    assert {d.payload for d in out} == {want[0].to_bytes()}
    assert Header.parse(out[0].payload).worker == WORKER_MULTICAST
    # a retransmission of the complete round: unicast to the retransmitting worker only
    again = b.deliver([to(Service.SWITCH, agg(1, 2, 3, 12).to_bytes(), src=addresses[2])])
    assert [(d.dst_ip, d.dst_port) for d in again] == [addresses[2]]
    assert again[0].payload == model.process(agg(1, 2, 3, 12))[0].to_bytes()
    assert b.counters["switch_out"] == 4 and b.counters["switch_in"] == len(bad) + 4


def test_switch_short_datagrams_reach_the_engine_as_bad_length():
    b = board()
    assert b.deliver([to(Service.SWITCH, b"\x47\x01\x02")]) == []
    assert b.aggregator.counters["drop_bad_length"] == 1
    assert b.counters["drop_bad_source"] == 0
    # a whole header from a registered source with one byte too many is bad_length too
    register(b, 0, 0, (HOST, 42000))
    configure(b, 0, 1, 0, 4)
    packet = agg(0, 0, 0, 1).to_bytes() + b"\x00"
    assert b.deliver([to(Service.SWITCH, packet, src=(HOST, 42000))]) == []
    assert b.aggregator.counters["drop_bad_length"] == 2


def test_an_entry_whose_port_is_zero_gets_no_result():
    b = board()
    register(b, 0, 0, (HOST, 42000))
    register(b, 0, 1, (HOST, 42001))
    configure(b, 0, 2, 0, 4)
    b.deliver([to(Service.SWITCH, agg(0, 0, 0, 1).to_bytes(), src=(HOST, 42000))])
    register(b, 0, 0, (HOST, 0))                 # worker 0 leaves the table
    out = b.deliver([to(Service.SWITCH, agg(0, 1, 0, 1).to_bytes(), src=(HOST, 42001))])
    assert [(d.dst_ip, d.dst_port) for d in out] == [(HOST, 42001)]


# -- control service -------------------------------------------------------------------

def test_every_net_register_reads_as_built():
    b = GoldenBoard(KEY, ip="10.1.2.3", mac="02:00:00:ab:cd:ef", port_base=40000, link=False)
    assert read(b, net("mac_high"), net("mac_low"), net("ip"), net("port_base"),
                net("services"), net("link")) == [
        mac_to_int("02:00:00:ab:cd:ef") >> 32, mac_to_int("02:00:00:ab:cd:ef") & 0xFFFF_FFFF,
        ip_to_int("10.1.2.3"), 40000, 0b1111, 0]


def test_counters_read_over_control_including_the_request_itself():
    b = board()
    counters = NET_REGISTERS["counter"]
    values = read(b, *[network_address("net", a) for _, a in counters.items()])
    assert dict(zip(NET_COUNTERS, values)) == {**dict.fromkeys(NET_COUNTERS, 0), "ctrl_in": 1}
    assert b.counters["ctrl_out"] == 1


def test_every_engine_register_reads_what_the_engine_serves():
    b = board(slots=16, lanes=32, jobs=2)
    b.deliver([to(Service.NIC_TX, Packet(Header()).to_bytes())])
    configure(b, 1, 5, 3, 4)
    for region, registers, reference in (("nic", NIC_REGISTERS, b.nic.read),
                                         ("switch", SWITCH_REGISTERS, b.aggregator.read)):
        locals_ = [a for entry in registers for a, _, _ in entry.addresses()]
        values = []
        for i in range(0, len(locals_), CTRL_MAX_PAIRS):
            values += read(b, *[network_address(region, a)
                                for a in locals_[i:i + CTRL_MAX_PAIRS]])
        assert values == [reference(a) for a in locals_]
    assert read(b, network_address("switch", SWITCH_REGISTERS["params"].address)) == \
        [switch_params_word(slots=16, lanes=32)]
    assert read(b, network_address("switch", JOB.address(1, "workers"))) == [5]


def test_worker_table_writes_read_back_within_the_board_and_width():
    b = board(jobs=2, max_workers=4)
    assert ctrl(b, CtrlOp.WRITE, [(table(1, 3, "ip"), 0xDEADBEEF),
                                  (table(1, 3, "port"), 0x1_2345)]) == [0xDEADBEEF, 0x2345]
    assert b.worker_table[(1, 3)] == (0xDEADBEEF, 0x2345)
    # entries beyond the switch's jobs or workers do not exist: 0, writes ignored
    assert ctrl(b, CtrlOp.WRITE, [(table(2, 0, "port"), 5), (table(0, 4, "port"), 5)]) == [0, 0]
    # read-only registers, unmapped addresses, addresses outside every region
    assert ctrl(b, CtrlOp.WRITE, [(net("ip"), 1), (network_address("net", 0x0FFF), 9),
                                  (0x00FF_0000, 9),
                                  (network_address("nic", NIC_REGISTERS["tx"].base), 9)]) == \
        [ip_to_int(DEFAULT_IP), 0, 0, 0]


def test_wrong_key_gets_no_reply_and_changes_nothing():
    b = board()
    request = ctrl_bytes(CtrlOp.WRITE, [(table(0, 0, "port"), 1234)], key=KEY ^ 1)
    assert b.deliver([to(Service.CTRL, request)]) == []
    assert b.worker_table == {} and b.counters["drop_bad_key"] == 1
    assert b.counters["ctrl_out"] == 0


@pytest.mark.parametrize("change", ["count0", "count65", "op", "length", "magic", "type"])
def test_malformed_control_requests_are_refused_with_error(change):
    b = board()
    pairs = [(table(0, 0, "port"), 1234)]
    request = bytearray(ctrl_bytes(CtrlOp.WRITE, pairs))
    if change == "count0":
        request[8:12] = (0).to_bytes(4, "little")
    elif change == "count65":
        request = bytearray(ctrl_bytes(CtrlOp.WRITE, pairs * 65))
    elif change == "op":
        request[CTRL_OP_OFFSET] = 2
    elif change == "length":
        request += bytes(4)
    elif change == "magic":
        request[0] ^= 1
    else:
        request[2] = PacketType.AGG_OR32
    out = b.deliver([to(Service.CTRL, request)])
    assert len(out) == 1 and out[0].payload == \
        bytes(request[:3]) + bytes([request[3] | Flags.RESULT | Flags.ERROR]) + bytes(request[4:32])
    assert b.counters["drop_bad_ctrl"] == 1 and b.worker_table == {}


def test_control_shorter_than_a_header_is_dropped_without_a_reply():
    b = board()
    assert b.deliver([to(Service.CTRL, ctrl_bytes(CtrlOp.READ, [(0, 0)])[:31])]) == []
    assert b.counters["drop_bad_ctrl"] == 1


def test_a_write_reads_back_after_writing_and_pairs_run_in_order():
    b = board()
    address = table(0, 0, "port")
    assert ctrl(b, CtrlOp.WRITE, [(address, 1), (address, 2), (address, 3)]) == [1, 2, 3]
    assert read(b, address, address) == [3, 3]


# -- nothing a datagram carries breaks the board ----------------------------------------

def test_random_datagrams_never_raise_and_answer_only_the_sender_or_the_table():
    rng = fresh_rng()
    b = board(slots=8)
    register(b, 0, 0, (HOST, 43000))
    configure(b, 0, 1, 0, 8)
    ports = list(PORTS.values()) + [40004]
    for _ in range(3000):
        size = int(rng.choice([0, 1, 7, 31, 32, 33, 40, 288, 289, 600]))
        data = bytearray(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
        if size >= 32 and rng.random() < 0.7:         # mostly plausible headers
            data[0], data[1] = 0x47, 1
            data[2] = int(rng.integers(0, 6))
            if rng.random() < 0.5:
                data[5] = data[6] = 0
            if rng.random() < 0.3:
                data[24:32] = KEY.to_bytes(8, "little")
        src = (HOST, 43000) if rng.random() < 0.5 else (HOST, int(rng.integers(1, 65536)))
        d = Datagram(*src, DEFAULT_IP, int(rng.choice(ports)), bytes(data))
        for reply in b.deliver([d]):
            assert reply.src_ip == DEFAULT_IP
            assert (reply.dst_ip, reply.dst_port) == src or \
                (reply.src_port == PORTS[Service.SWITCH] and
                 (reply.dst_ip, reply.dst_port) == (HOST, 43000))
