"""A host that never answers ARP stalls nothing (issue 33, item 7), on the Verilated top.

The network top is built with a short ARP period (``arp_timeout_s``, a key of
``constraints/network.toml``; a bitstream keeps LiteEth's 0.1 s), so that the board's give-up
on a silent host (8 requests, then the datagram is dropped) takes 800 us of simulated time.
The wire is played here frame by frame with scapy through the PHY harness
(:class:`sim.harness.network.NetworkHarness`): a job of two workers, one live (it answers the
board's ARP requests), one that never answers until the test decides it does. Every result
is compared byte for byte with the frame the golden board's datagram makes.
"""
import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw

from contract.network import SERVICE_OFFSETS, CtrlOp, Service, ip_to_int, network_address
from contract.registers import COMMIT, SWITCH_REGISTERS
from hdl.net.top import SIMULATION_KEY
from host.board import Datagram, GoldenBoard
from sim.harness.board import host_mac
from sim.network_top import engine_period_ps
from tests.helpers import fresh_rng
from tests.sim.harness.test_network_board import agg, ctrl, net

pytestmark = pytest.mark.slow

KEY = SIMULATION_KEY
#: the time between two ARP requests for a silent host: 8 of them are 800 us
ARP_PERIOD_S = 100e-6
#: the harness's engine clock (the bitstream's, sim.network_top.engine_period_ps)
ENGINE_HZ = 1e12 / engine_period_ps()
PERIOD_CYCLES = round(ARP_PERIOD_S * ENGINE_HZ)
LIVE_IP, DEAD_IP = "192.168.77.10", "192.168.77.66"
CTRL_PORT, LIVE_PORT, DEAD_PORT = 40100, 40201, 40202
BROADCAST = "ff:ff:ff:ff:ff:ff"
#: a live result's round trip (two 288-byte datagrams in, one out, on a 1 Gb/s wire) takes
#: about 10 us; one ARP period is 100 us, the whole give-up 800 us
LIVE_ROUND_CYCLES = 3000


class Wire:
    """The harness and its golden twin, with the hosts of the test on the wire."""

    def __init__(self, harness):
        self.h = harness
        config = harness.config
        self.ip, self.mac = config.ip_address, config.mac_address
        self.ports = {s: harness.port_base + o for s, o in SERVICE_OFFSETS.items()}
        p = harness.switch_params
        self.golden = GoldenBoard(KEY, ip=self.ip, mac=self.mac, port_base=harness.port_base,
                                  slots=p["slots"], lanes=p["lanes"],
                                  max_workers=p["max_workers"], jobs=p["jobs"])
        #: pdst of every ARP request the board sent, in order
        self.arp_requests = []

    def datagram(self, src_ip, src_port, service, payload):
        return Datagram(src_ip, src_port, self.ip, self.ports[service], payload)

    def frame_in(self, d):
        return bytes(Ether(dst=self.mac, src=host_mac(d.src_ip)) /
                     IP(src=d.src_ip, dst=d.dst_ip) /
                     UDP(sport=d.src_port, dport=d.dst_port) / Raw(d.payload))

    def frame_out(self, d):
        """The frame that carries the golden board's datagram ``d``, byte for byte as the
        core sends it (TTL 128, identification 0, no UDP checksum)."""
        return bytes(Ether(dst=host_mac(d.dst_ip), src=self.mac) /
                     IP(src=d.src_ip, dst=d.dst_ip, id=0, ttl=128) /
                     UDP(sport=d.src_port, dport=d.dst_port, chksum=0) / Raw(d.payload))

    def arp_request(self, ip):
        """Host ``ip`` asks for the board's MAC."""
        return bytes(Ether(dst=BROADCAST, src=host_mac(ip)) /
                     ARP(op=1, hwsrc=host_mac(ip), psrc=ip, pdst=self.ip))

    def arp_reply(self, ip):
        mac = host_mac(ip)
        return bytes(Ether(dst=self.mac, src=mac) /
                     ARP(op=2, hwsrc=mac, psrc=ip, hwdst=self.mac, pdst=self.ip))

    def split(self, frames):
        """``frames`` less the board's ARP requests (recorded), checked as such."""
        out = []
        for raw in frames:
            packet = Ether(raw)
            if ARP in packet and packet[ARP].op == 1:
                arp = packet[ARP]
                assert (packet.dst, arp.op, arp.hwsrc, arp.psrc) == (
                    BROADCAST, 1, self.mac, self.ip), packet.summary()
                self.arp_requests.append(arp.pdst)
            else:
                out.append(raw)
        return out

    def run(self, datagrams=(), frames=(), **options):
        """Send ``frames`` then ``datagrams`` (also to the golden twin); returns (frames the
        board sent but ARP requests, golden replies, the run's result)."""
        golden = self.golden.deliver(list(datagrams))
        result = self.h.run([*frames, *(self.frame_in(d) for d in datagrams)], **options)
        assert result.bad_frames == 0
        return self.split(result.frames), golden, result

    def counters(self):
        return self.h.counters()


def switch_round(wire, i, rng):
    """Both workers' contributions to round ``i`` (slot i % 4, alternating versions)."""
    slot, version = i % 4, (i // 4) % 2
    return [wire.datagram(ip, port, Service.SWITCH,
                          agg(0, w, rng.integers(0, 1 << 32, 64, dtype="u8"), slot=slot,
                              seq=100 + 2 * i + w, version=version))
            for w, (ip, port) in enumerate(((LIVE_IP, LIVE_PORT), (DEAD_IP, DEAD_PORT)))]


def to(golden, ip):
    [d] = [d for d in golden if d.dst_ip == ip]
    return d


@pytest.fixture(scope="module")
def harness():
    from sim.harness.network import NetworkHarness
    h = NetworkHarness(key=KEY, network={"arp_timeout_s": ARP_PERIOD_S})
    try:
        yield h
    finally:
        h.close()


def test_a_silent_worker_stalls_nothing_and_its_datagram_is_dropped_and_counted(harness):
    wire = Wire(harness)
    rng = fresh_rng()
    sw = lambda name: network_address("switch", SWITCH_REGISTERS["job"].address(0, name))

    # -- the live host asks for the board's MAC first, as a host does: the board caches it
    # from that request (RFC 826's merge), so replies to it never miss
    got, _, _ = wire.run(frames=[wire.arp_request(LIVE_IP)])
    assert [Ether(f)[ARP].op for f in got] == [2] and wire.arp_requests == []

    # -- a job of two workers: the live one is also the controller; the other never
    # answers ARP
    setup = [
        wire.datagram(LIVE_IP, CTRL_PORT, Service.CTRL, ctrl(KEY, CtrlOp.WRITE, [
            (net("worker", 0, "ip"), ip_to_int(LIVE_IP)), (net("worker", 0, "port"), LIVE_PORT),
            (net("worker", 1, "ip"), ip_to_int(DEAD_IP)), (net("worker", 1, "port"), DEAD_PORT),
            (sw("workers"), 2), (sw("slot_base"), 0), (sw("slot_count"), 4)], seq=1)),
        wire.datagram(LIVE_IP, CTRL_PORT, Service.CTRL,
                      ctrl(KEY, CtrlOp.WRITE, [(sw("commit"), COMMIT)], seq=2)),
    ]
    got, golden, _ = wire.run(setup)
    assert len(got) == len(golden) == 2
    assert wire.arp_requests == []
    harness.idle(2000)                               # the commit clears the job's slots
    assert wire.counters()["arp_miss"] == 0

    # -- round 0: the live worker's result goes out, the silent one's is parked and the
    # board asks for its address
    got, golden, _ = wire.run(switch_round(wire, 0, rng))
    assert got == [wire.frame_out(to(golden, LIVE_IP))]
    assert wire.arp_requests == [DEAD_IP]
    first_request = harness.cycle

    # -- while that ARP exchange runs, results to the live worker keep coming, each within
    # a few microseconds; every result for the silent one finds the slot taken: dropped
    busy_rounds = 4
    for i in range(1, 1 + busy_rounds):
        got, golden, result = wire.run(switch_round(wire, i, rng), expect=1,
                                       max_cycles=PERIOD_CYCLES)
        assert got == [wire.frame_out(to(golden, LIVE_IP))], f"round {i}"
        assert result.cycles < LIVE_ROUND_CYCLES, f"round {i}: {result.cycles} cycles"
        print(f"round {i}: the live worker's result after {result.cycles} engine cycles")
        harness.idle(1000)          # the silent worker's copy: looked up, dropped, counted
        counters = wire.counters()
        assert counters["arp_unreachable"] == 0
        assert counters["arp_busy_drop"] == i
    # ... and the other services too: a control read is answered meanwhile
    read = wire.datagram(LIVE_IP, CTRL_PORT, Service.CTRL,
                         ctrl(KEY, CtrlOp.READ, [(net("ip"), 0)], seq=3))
    got, golden, result = wire.run([read], expect=1, max_cycles=PERIOD_CYCLES)
    assert got == [wire.frame_out(golden[0])]
    assert result.cycles < LIVE_ROUND_CYCLES
    assert harness.cycle - first_request < 2 * PERIOD_CYCLES     # all within the exchange
    assert wire.counters()["arp_unreachable"] == 0

    # -- the board gives up after 8 requests: the parked datagram is dropped and counted
    got, _, _ = wire.run(idle=2 * PERIOD_CYCLES, max_cycles=12 * PERIOD_CYCLES)
    assert got == []
    assert wire.arp_requests == [DEAD_IP] * 8
    elapsed = harness.cycle - first_request
    assert 8 * PERIOD_CYCLES <= elapsed <= 8 * PERIOD_CYCLES + 3 * PERIOD_CYCLES, elapsed
    counters = wire.counters()
    assert (counters["arp_miss"], counters["arp_unreachable"], counters["arp_busy_drop"]) == (
        1, 1, busy_rounds)

    # -- afterwards a round is exact again; the silent worker's result is parked anew, and
    # this time its host answers late (after two requests): the parked datagram goes out
    # with the learned MAC, byte for byte the golden one
    wire.arp_requests.clear()
    i = 1 + busy_rounds
    got, golden, _ = wire.run(switch_round(wire, i, rng))
    assert got == [wire.frame_out(to(golden, LIVE_IP))]
    assert wire.arp_requests == [DEAD_IP]
    parked = wire.frame_out(to(golden, DEAD_IP))
    harness.idle(PERIOD_CYCLES + PERIOD_CYCLES // 2)
    got, _, _ = wire.run(frames=[wire.arp_reply(DEAD_IP)], expect=1,
                         max_cycles=PERIOD_CYCLES)
    assert got == [parked]
    assert wire.arp_requests == [DEAD_IP] * 2
    counters = wire.counters()
    assert (counters["arp_miss"], counters["arp_unreachable"], counters["arp_busy_drop"]) == (
        2, 1, busy_rounds)

    # -- both workers cached now: the next round's results both come at once, exact
    got, golden, result = wire.run(switch_round(wire, i + 1, rng), expect=2,
                                   max_cycles=PERIOD_CYCLES)
    assert got == [wire.frame_out(to(golden, LIVE_IP)), wire.frame_out(to(golden, DEAD_IP))]
    assert result.cycles < LIVE_ROUND_CYCLES
    assert wire.arp_requests == [DEAD_IP] * 2
    counters = wire.counters()
    assert (counters["arp_miss"], counters["arp_unreachable"], counters["arp_busy_drop"]) == (
        2, 1, busy_rounds)
