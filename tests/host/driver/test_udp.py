"""UdpTransport against the virtual board on 127.0.0.1: every service, every control
register, the key, MTU sizes, loss/duplication/reordering at 1, 10 and 30 %, a board that
stops answering, two jobs at once. Loopback only; every loop is bounded by the transport's
retry limit."""
import socket
import threading
import time

import numpy as np
import pytest

from contract.header import HEADER_BYTES, WORKER_MULTICAST, Header, PacketType
from contract.network import (
    MAX_WORKERS_IN_TABLE,
    MTU_JUMBO,
    NET_REGISTERS,
    NETWORK_REGIONS,
    NIC_REGISTERS,
    SWITCH_REGISTERS,
    Service,
    ip_to_int,
    network_address,
)
from contract.packet import Packet
from host.golden.aggregator import AggregatorModel
from host.board import GoldenBoard, VirtualBoard, WireFaults, free_port_base
from host.driver.lockstep import LockstepTransport
from host.driver.models import NicModelTransport, SwitchModelTransport
from host.driver.nic import NicInterface, open_nic
from host.driver.switch import SwitchInterface, open_switch
from host.driver.rtt import ResendTimer, RttEstimator, retries_for_loss
from host.driver.settings import board_settings, inc_max_bytes, nic_packet_values, parse_key
from host.driver.transport import NoReplyError, TransportError
from host.driver.udp import UdpTransport
from host.golden import inceptionn, lhc
from tests.helpers import bits, fresh_rng

LOOP = "127.0.0.1"
#: short timeouts: the board is in this process, a round trip takes about a millisecond
FAST = dict(timeout=0.05, min_timeout=0.01, max_timeout=0.2)


def sparse(rng, workers, n, density):
    out = []
    for _ in range(workers):
        t = np.zeros(n, np.float32)
        hot = rng.random(n) < density
        t[hot] = (rng.standard_normal(hot.sum()) * 0.01).astype(np.float32)
        out.append(t)
    return out


@pytest.fixture
def board():
    with VirtualBoard("golden", port_base=None, slots=16) as b:
        yield b


# -- NIC services ----------------------------------------------------------------------

def test_nic_streams_return_the_engines_packets_byte_for_byte(board):
    rng = fresh_rng()
    x = (rng.standard_normal(3000) * 0.05).astype(np.float32)
    x[:5] = [np.nan, np.inf, -0.0, 1e-40, 1.0]
    # every packet with the same caller seq: the transport's own seq tells replies apart
    packets = [Packet(p.header.replace(seq=77), p.payload)
               for p in inceptionn.tensor_to_packets(x, 10, packet_values=336)]
    model = NicModelTransport()
    with board.transport(region="nic", **FAST) as t:
        tx = t.exchange("tx", packets)
        assert [p.to_bytes() for p in tx] == [p.to_bytes() for p in model.exchange("tx", packets)]
        rx = t.exchange("rx", tx[::-1])
        assert [p.to_bytes() for p in rx] == \
            [p.to_bytes() for p in model.exchange("rx", tx[::-1])]
        assert t.network[Service.NIC_TX].datagrams >= len(packets)
    assert board.backend.counters["nic_tx_in"] >= len(packets)


def test_nic_interface_runs_unchanged_with_packets_sized_for_the_mtu(board):
    rng = fresh_rng()
    x = (rng.standard_normal(5000) * 0.05).astype(np.float32)
    with board.transport(region="nic", **FAST) as t:
        nic = NicInterface(t)
        assert nic.packet_values == 336 == t.max_packet_values
        wire = nic.transmit(x, 9, worker=3, offset=100)
        assert [p.header.offset for p in wire] == [100 + 336 * i for i in range(len(wire))]
        got = nic.receive(wire[::-1], x.size, offset=100)
        assert np.array_equal(bits(got), bits(inceptionn.quantize(x, 9)))
        counters = nic.counters()
    assert counters["tx"]["packets"] >= counters["tx"]["compressed"] >= len(wire)
    assert counters["rx"]["decompressed"] >= len(wire)


def test_packet_sizes_from_the_mtu():
    assert nic_packet_values(1500) == 336 and nic_packet_values(MTU_JUMBO) == 2048
    for mtu in (576, 1500, 4000, 9000):
        n = nic_packet_values(mtu)
        assert n % 8 == 0 and 32 + 4 * n <= mtu - 28 and inc_max_bytes(n) <= mtu - 28
        assert n == 2048 or inc_max_bytes(n + 8) > mtu - 28
    # the worst case is exactly what the NIC emits for all-raw values
    raw = inceptionn.tensor_to_packets(np.full(336, 3.0, np.float32), 10, packet_values=336)
    assert len(inceptionn.nic_tx(raw[0])[0].to_bytes()) == inc_max_bytes(336)


def test_a_packet_that_does_not_fit_the_mtu_is_refused_before_it_is_sent(board):
    big = inceptionn.tensor_to_packets(np.zeros(2048, np.float32), 10, packet_values=2048)
    with board.transport(region="nic", **FAST) as t:
        with pytest.raises(ValueError, match="MTU of 1500"):
            t.exchange("tx", big)
        assert t.network[Service.NIC_TX].datagrams == 0
        # 344 raw values fit a 1500-byte datagram, but their compressed reply may not
        with pytest.raises(ValueError, match="the reply"):
            t.exchange("tx", inceptionn.tensor_to_packets(np.zeros(344, np.float32), 10,
                                                          packet_values=344))
    with board.transport(region="nic", mtu=MTU_JUMBO, **FAST) as t:
        assert len(t.exchange("tx", big)) == 1


def test_receive_path_drops_are_errors_unless_allowed(board):
    bad = Packet(Header(type=PacketType.INC_F32, k=10, count=64), bytes(8))   # truncated
    good = inceptionn.tensor_to_packets(np.ones(8, np.float32) * 0.3, 10, compress=True)
    with board.transport(region="nic", retries=2, **FAST) as t:
        with pytest.raises(NoReplyError, match="allow_drops"):
            t.exchange("rx", [bad])
        got = t.exchange("rx", [bad, good[0], bad], allow_drops=True)
        assert [p.header.type for p in got] == [PacketType.RAW_F32]
        assert t.network[Service.NIC_RX].unanswered == 2
        with pytest.raises(ValueError, match="no option"):
            t.exchange("rx", good, allow_drop=True)
        assert len(t.exchange("rx", good, idle=32)) == 1        # a clock option: ignored
        with pytest.raises(ValueError, match="streams"):
            t.exchange("ctrl", good)


# -- control ---------------------------------------------------------------------------

def every_address():
    out = []
    for region in NETWORK_REGIONS:
        for entry in region.registers:
            for local, name, register in entry.addresses():
                out.append((network_address(region.name, local), name, register))
    return out


def test_every_control_register_reads_over_the_network_in_batches(board):
    addresses = every_address()
    with board.transport(**FAST) as t:
        board.backend.aggregator.configure_job(2, 7, 4, 3)
        values = t.read_many([a for a, _, _ in addresses])
        packets = -(-len(addresses) // 64)
        # reading the control counters changes them: each packet counts itself on arrival
        moving = {network_address("net", NET_REGISTERS["counter"].address(c))
                  for c in ("ctrl_in", "ctrl_out")}
        assert [v for (a, _, _), v in zip(addresses, values) if a not in moving] == \
            [board.backend.read(a) for a, _, _ in addresses if a not in moving]
        ctrl_in = [v for (a, n, _), v in zip(addresses, values) if n == "counter.ctrl_in"]
        assert 1 <= ctrl_in[0] <= packets
        ctrl = t.network[Service.CTRL]
        assert ctrl.requests == packets and ctrl.replies >= ctrl.requests
        assert t.read(network_address("net", NET_REGISTERS["port_base"].address)) == \
            board.port_base


def test_every_writable_register_writes_and_reads_back(board):
    rng = fresh_rng()
    jobs, workers = board.backend.params["jobs"], board.backend.params["max_workers"]
    pairs = []
    for address, name, register in every_address():
        region, local = address >> 16, address & 0xFFFF
        if not register.access.writable or register.name == "commit":
            continue
        decoded = NETWORK_REGIONS[region].registers.decode(local)
        if name.startswith(("job[", "group[", "upstream[")):
            if decoded.index >= jobs:
                continue
        elif name.startswith("worker["):
            job, worker = divmod(decoded.index, MAX_WORKERS_IN_TABLE)
            if job >= jobs or worker >= workers:
                continue
        pairs.append((address, int(rng.integers(0, 1 << register.width))))
    # job, group, upstream, worker table
    assert len(pairs) == 3 * jobs + 2 * jobs + 4 * jobs + 2 * jobs * workers
    with board.transport(**FAST) as t:
        assert t.write_many(pairs) == [v for _, v in pairs]
        assert t.read_many([a for a, _ in pairs]) == [v for _, v in pairs]
        assert t.network[Service.CTRL].requests == 2 * -(-len(pairs) // 64)
        # a read-only register, a value wider than its register: clear errors
        with pytest.raises(TransportError, match=r"net\.ip .*reads back"):
            t.write(network_address("net", NET_REGISTERS["ip"].address), 1)
        entry = NET_REGISTERS["worker"].address(0, "port")
        with pytest.raises(TransportError, match=r"worker\[0\]\.port"):
            t.write(network_address("net", entry), 0x1_0000)
        with pytest.raises(TransportError, match=r"nic\.tx\.packets"):
            t.write(network_address("nic", NIC_REGISTERS["tx"].address("packets")), 3)


def test_the_wrong_key_is_refused_and_changes_nothing(board):
    address = network_address("net", NET_REGISTERS["worker"].address(0, "port"))
    with UdpTransport(LOOP, port_base=board.port_base, key=board.key ^ 1, retries=2,
                      **FAST) as t:
        with pytest.raises(NoReplyError, match="key") as error:
            t.write(address, 1234)
        assert error.value.service is Service.CTRL
    assert board.backend.counters["drop_bad_key"] == 3
    assert board.backend.worker_table == {}
    with UdpTransport(LOOP, port_base=board.port_base, **FAST) as t:
        with pytest.raises(TransportError, match="no control key"):
            t.read(address)


# -- switch ----------------------------------------------------------------------------

def test_switch_interface_runs_unchanged_and_registers_its_workers(board):
    rng = fresh_rng()
    tensors = sparse(rng, 4, 6000, 0.05)
    with board.transport(region="switch", **FAST) as t:
        switch = SwitchInterface(t)
        result, stats = switch.allreduce(tensors, slot_base=2, slot_count=6)
        assert np.array_equal(bits(result), bits(lhc.allreduce(tensors)[0]))
        again, _ = switch.allreduce(tensors[::-1], slot_base=2, slot_count=6, configure=False)
        assert np.array_equal(bits(again), bits(lhc.allreduce(tensors[::-1])[0]))
        table = board.backend.worker_table
        for w in range(4):
            ip, port = t.worker_address(0, w)
            assert table[(0, w)] == (ip_to_int(ip), port)
        assert switch.counters()["results_multicast"] > 0
        assert board.backend.counters["drop_bad_source"] == 0


def test_raw_exchanges_match_the_reference_aggregator_unicasts_included(board):
    model = AggregatorModel(slots=16, lanes=64, max_workers=32, jobs=4)
    with board.transport(region="switch", **FAST) as t:
        switch = SwitchInterface(t)
        switch.configure_job(1, 2, 0, 4)
        model.configure_job(1, 2, 0, 4)

        def packet(worker, value, slot=1, version=0, seq=5, op=PacketType.AGG_ADD_I32):
            return Packet(Header(type=op, job=1, worker=worker, count=64, slot=slot,
                                 slot_version=version, seq=seq, exponent=worker),
                          np.full(64, value, "<u4").tobytes())

        batches = [[packet(0, 3)],                       # incomplete: nothing
                   [packet(0, 3)],                       # resend of an incomplete round
                   [packet(1, 4), packet(1, 4)],         # completes, then a resend: unicast
                   [packet(0, 3)],                       # unicast to worker 0
                   [packet(0, 1, slot=9)],               # bad slot: dropped
                   [packet(0, 1, version=1, op=PacketType.AGG_OR32),
                    packet(1, 2, version=1, op=PacketType.AGG_OR32)]]
        for batch in batches:
            got = t.exchange("agg", batch)
            want = [p for q in batch for p in model.process(q)]
            assert [p.to_bytes() for p in got] == [p.to_bytes() for p in want]
        # one outstanding packet per (slot, version): a new seq while one waits is refused
        t.exchange("agg", [packet(0, 1, slot=2, seq=20)])
        with pytest.raises(TransportError, match="outstanding"):
            t.exchange("agg", [packet(0, 1, slot=2, seq=24)])


class DropMulticastOnce(GoldenBoard):
    """Loses every copy of every multicast result (the board sends them, the wire eats
    them): the workers must resend and take the switch's unicast answers."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.eaten = 0

    def deliver(self, datagrams):
        out = []
        for d in super().deliver(datagrams):
            h = Header.parse(d.payload) if len(d.payload) >= HEADER_BYTES else None
            if h is not None and d.src_port == self.ports[Service.SWITCH] \
                    and h.worker == WORKER_MULTICAST:
                self.eaten += 1
                continue
            out.append(d)
        return out


def test_lost_multicasts_are_recovered_by_unicast_answers_and_returned_as_multicast():
    rng = fresh_rng()
    tensors = sparse(rng, 3, 2000, 0.05)
    base = free_port_base()
    backend = DropMulticastOnce(key=99, port_base=base, slots=8)
    with VirtualBoard(backend, port_base=base) as board:
        with board.transport(region="switch", **FAST) as t:
            lockstep = LockstepTransport(t, SwitchModelTransport(slots=8), SWITCH_REGISTERS)
            result, stats = SwitchInterface(lockstep).allreduce(tensors)
            net = t.network[Service.SWITCH]
    assert np.array_equal(bits(result), bits(lhc.allreduce(tensors)[0]))
    assert backend.eaten > 0 and net.rebuilt * 3 == backend.eaten    # 3 copies a round
    assert net.resends >= backend.eaten
    assert backend.aggregator.counters["results_unicast"] >= backend.eaten


class StaleBeforeCommit(GoldenBoard):
    """Before serving a job's commit, sends every worker a copy of the last result of the
    previous message: what a wire delivers late (the fault injector delivers everything
    it holds before a control request, so stale copies arrive exactly then)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.results = {}
        self.stale_sent = 0

    def deliver(self, datagrams):
        out = []
        for d in datagrams:
            if d.dst_port == self.ports[Service.CTRL] and self.results:
                for copy in self.results.values():
                    out.append(copy)
                    self.stale_sent += 1
                self.results.clear()
            for reply in super().deliver([d]):
                if reply.src_port == self.ports[Service.SWITCH]:
                    h = Header.parse(reply.payload)
                    # the first message's results, keyed so that every chunk keeps one
                    self.results.setdefault((h.slot, h.slot_version, h.seq, reply.dst_port),
                                            reply)
                out.append(reply)
        return out


def test_results_left_from_before_a_commit_are_discarded():
    rng = fresh_rng()
    first, second = sparse(rng, 2, 1500, 0.05), sparse(rng, 2, 1500, 0.05)
    base = free_port_base()
    backend = StaleBeforeCommit(key=5, port_base=base, slots=8)
    with VirtualBoard(backend, port_base=base) as board:
        with board.transport(region="switch", **FAST) as t:
            switch = SwitchInterface(t)
            switch.allreduce(first)
            result, _ = switch.allreduce(second)          # reconfigures: chunks from 0 again
            discarded = t.network[Service.SWITCH].discarded
    assert np.array_equal(bits(result), bits(lhc.allreduce(second)[0]))
    assert backend.stale_sent > 0 and discarded >= backend.stale_sent


# -- faults ----------------------------------------------------------------------------

@pytest.mark.parametrize("rate", [0.01, 0.1, 0.3])
def test_loss_duplication_and_reordering_leave_the_result_identical(rate):
    rng = fresh_rng()
    x = (rng.standard_normal(4000) * 0.05).astype(np.float32)
    tensors = sparse(rng, 3, 3000, 0.05)
    faults = WireFaults(rate, seed=int(rng.integers(1 << 30)))
    with VirtualBoard("golden", port_base=None, slots=8, faults=faults) as board:
        with board.transport(region="nic", **FAST) as t:
            nic = NicInterface(LockstepTransport(t, NicModelTransport(), NIC_REGISTERS))
            wire = nic.transmit(x, 10)
            got = nic.receive(wire, x.size)
            nic_stats = t.network_stats()
        with board.transport(region="switch", **FAST) as t:
            switch = SwitchInterface(
                LockstepTransport(t, SwitchModelTransport(slots=8), SWITCH_REGISTERS))
            result, _ = switch.allreduce(tensors)
            again, _ = switch.allreduce(tensors[::-1], configure=False)
            switch_stats = t.network[Service.SWITCH]
    assert np.array_equal(bits(got), bits(inceptionn.quantize(x, 10)))
    assert np.array_equal(bits(result), bits(lhc.allreduce(tensors)[0]))
    assert np.array_equal(bits(again), bits(lhc.allreduce(tensors[::-1])[0]))
    assert faults.lost + faults.duplicated + faults.delayed > 0
    if rate >= 0.1:
        assert nic_stats["nic_tx"]["resends"] + nic_stats["nic_rx"]["resends"] > 0
        assert switch_stats.resends > 0 and switch_stats.discarded > 0


def test_duplicates_and_late_replies_are_discarded():
    faults = WireFaults(dup=0.5, reorder=0.5, max_delay=0.05, seed=3)
    x = np.linspace(-1, 1, 3000, dtype=np.float32)
    with VirtualBoard("golden", port_base=None, faults=faults) as board:
        # a timeout shorter than the wire's delays: replies come after their resend
        with board.transport(region="nic", timeout=0.005, min_timeout=0.005,
                             max_timeout=0.02, retries=20) as t:
            nic = NicInterface(t)
            got = nic.receive(nic.transmit(x, 12), x.size)
            stats = t.network[Service.NIC_TX]
    assert np.array_equal(bits(got), bits(inceptionn.quantize(x, 12)))
    assert stats.resends > 0 and stats.discarded > 0 and stats.replies == stats.requests


# -- a board that stops answering ------------------------------------------------------

def worst_wait(t):
    """Upper bound of the time one request can take before its error."""
    timeout, total = t.max_timeout, 0.0
    for _ in range(t.retries + 1):
        total += timeout
    return total


@pytest.mark.parametrize("what", ["tx", "ctrl", "agg"])
def test_a_board_that_stops_answering_gives_a_clear_error_after_the_retry_limit(what):
    board = VirtualBoard("golden", port_base=None, slots=8).start()
    t = board.transport(region="switch" if what == "agg" else "nic", retries=3, **FAST)
    try:
        packets = inceptionn.tensor_to_packets(np.ones(16, np.float32), 10)
        if what == "agg":
            switch = SwitchInterface(t)
            switch.configure_job(0, 2, 0, 4)
            packets = [Packet(Header(type=PacketType.AGG_OR32, worker=w, count=64),
                              bytes(256)) for w in range(2)]
        t.exchange("agg" if what == "agg" else "tx", packets)
        board.stop()
        started = time.monotonic()
        with pytest.raises(NoReplyError, match="after 4 attempts"):
            if what == "ctrl":
                t.read(NIC_REGISTERS["tx"].address("packets"))
            elif what == "agg":
                t.exchange("agg", [Packet(p.header.replace(slot_version=1), p.payload)
                                   for p in packets])
            else:
                t.exchange("tx", packets)
        assert time.monotonic() - started <= worst_wait(t) + 1.0
    finally:
        t.close()
        board.stop()


# -- two jobs at once ------------------------------------------------------------------

def test_two_jobs_at_once_cannot_touch_each_others_slots(board):
    rng = fresh_rng()
    a_tensors, b_tensors = sparse(rng, 3, 4000, 0.05), sparse(rng, 2, 4000, 0.05)
    results, errors = {}, []
    with board.transport(region="switch", **FAST) as a, \
            board.transport(region="switch", **FAST) as b, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as intruder:
        sa, sb = SwitchInterface(a), SwitchInterface(b)
        sa.configure_job(0, 3, 0, 8)
        sb.configure_job(1, 2, 8, 6)
        with pytest.raises(ValueError, match="rejected"):
            sb.configure_job(1, 2, 6, 4)                 # overlaps job 0: refused
        sb.configure_job(1, 2, 8, 6)
        # the intruder is the one worker of job 2 (registered by a controller with the key)
        sb.configure_job(2, 1, 14, 2)
        intruder.bind((LOOP, 0))
        entry = 2 * MAX_WORKERS_IN_TABLE
        b.write_many([(network_address("net", NET_REGISTERS["worker"].address(entry, f)), v)
                      for f, v in (("ip", ip_to_int(LOOP)),
                                   ("port", intruder.getsockname()[1]))], full=True)

        def run(name, switch, tensors, job, base, count):
            try:
                results[name] = switch.allreduce(tensors, job=job, slot_base=base,
                                                 slot_count=count, configure=False,
                                                 max_ticks=100_000)[0]
            except Exception as exc:       # reported below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=("a", sa, a_tensors, 0, 0, 8)),
                   threading.Thread(target=run, args=("b", sb, b_tensors, 1, 8, 6))]
        for thread in threads:
            thread.start()
        # while they run, it tries the others' slots: as job 0's worker 0, as job 2 in job
        # 0's range, as job 1's worker 0
        switch_port = board.port_base + 2
        for header in (Header(type=PacketType.AGG_ADD_I32, job=0, worker=0, count=64, slot=1),
                       Header(type=PacketType.AGG_ADD_I32, job=2, worker=0, count=64, slot=1),
                       Header(type=PacketType.AGG_ADD_I32, job=1, worker=0, count=64, slot=9)):
            intruder.sendto(Packet(header, np.full(64, 7, "<u4").tobytes()).to_bytes(),
                            (LOOP, switch_port))
        for thread in threads:
            thread.join(timeout=60)
        assert not errors, errors
    assert np.array_equal(bits(results["a"]), bits(lhc.allreduce(a_tensors)[0]))
    assert np.array_equal(bits(results["b"]), bits(lhc.allreduce(b_tensors)[0]))
    counters = board.backend.aggregator.counters
    assert board.backend.counters["drop_bad_source"] == 2
    assert counters["drop_bad_slot"] == 1


# -- settings and timing ---------------------------------------------------------------

def test_board_settings_from_the_environment():
    env = {"GRADWIRE_BOARD": "127.0.0.1:30000", "GRADWIRE_KEY": "00ff", "GRADWIRE_MTU": "9000"}
    assert board_settings(environ=env) == {"host": LOOP, "port_base": 30000, "key": 255,
                                           "mtu": 9000}
    # an address given replaces GRADWIRE_BOARD whole (its port base too)
    assert board_settings("127.0.0.1", key="0x10", mtu=1500, environ=env) == \
        {"host": LOOP, "port_base": 47570, "key": 16, "mtu": 1500}
    assert board_settings("127.0.0.1", environ={})["port_base"] == 47570
    assert board_settings(environ={"GRADWIRE_PORT_BASE": "31000"})["port_base"] == 31000
    with pytest.raises(ValueError, match="GRADWIRE_KEY"):
        board_settings(environ={"GRADWIRE_KEY": "xyz"})
    with pytest.raises(ValueError, match="port base"):
        board_settings("127.0.0.1:70000", environ={})
    assert parse_key("01:23:45:67:89:ab:cd:ef") == 0x0123456789ABCDEF
    with pytest.raises(ValueError):
        parse_key("1" * 17)


def test_rtt_estimator_follows_rfc_6298_and_backs_off_to_its_cap():
    est = RttEstimator(1.0, 0.01, 2.0)
    assert est.rto == 1.0
    est.sample(0.1)
    assert est.srtt == 0.1 and est.rttvar == 0.05 and est.rto == pytest.approx(0.3)
    est.sample(0.2)
    assert est.rttvar == pytest.approx(0.0625) and est.srtt == pytest.approx(0.1125)
    for _ in range(10):
        est.backoff()
    assert est.rto == 2.0


def test_retries_for_loss():
    assert retries_for_loss(0.0) == retries_for_loss(0.01) == 8
    for loss in (0.1, 0.3, 0.5):
        r = retries_for_loss(loss)
        assert (1 - (1 - loss) ** 2) ** (r + 1) <= 1e-12 < (1 - (1 - loss) ** 2) ** r


def test_open_switch_udp_starts_and_stops_its_virtual_board():
    transport = open_switch("udp", check=True, slots=8)
    assert isinstance(transport, LockstepTransport)
    board = transport.device.owns
    switch = SwitchInterface(transport)
    assert (switch.slots, switch.lanes) == (8, 64)
    transport.close()
    assert board._sockets == []
    with pytest.raises(ValueError, match="waveforms"):
        open_nic("udp", waves=True)


def test_timeouts_double_only_while_the_board_is_silent():
    with UdpTransport(LOOP, port_base=40000, timeout=0.1, min_timeout=0.01,
                      max_timeout=1.0) as t:
        est = t._rtt[Service.NIC_TX]
        now = time.monotonic()
        entry = ResendTimer(0, now - 1.0, now - 0.5, 0.1)
        # nothing heard since it was sent: a slow or gone board, both timeouts double
        t._expired(Service.NIC_TX, {0: entry})
        assert est.rto == pytest.approx(0.2)
        t._resend_timer(Service.NIC_TX, entry)
        assert entry.timeout == pytest.approx(0.2) and entry.attempt == 1
        # the board answered something since: it loses datagrams, resend on the estimate
        t._heard[Service.NIC_TX] = time.monotonic()
        entry.last_sent -= 1.0
        t._expired(Service.NIC_TX, {0: entry})
        assert est.rto == pytest.approx(0.2)
        t._resend_timer(Service.NIC_TX, entry)
        assert entry.timeout == est.rto and entry.attempt == 2
        for _ in range(3):
            entry.last_sent, entry.timeout = time.monotonic() - 10, entry.timeout
            t._heard[Service.NIC_TX] = float("-inf")
            t._resend_timer(Service.NIC_TX, entry)
        assert entry.timeout == 1.0                   # capped
