"""cocotb testbenches of the network core through its real RGMII path (``sim/eth_echo.py``).

cocotbext-eth's ``RgmiiSource``/``RgmiiSink`` play the PHY chip: DDR nibbles at 125 MHz on
a receive clock the test generates (slightly off the sys clock, so LiteEth's clock
crossing really crosses), the transmit clock coming back from the design. Frames are built
and parsed with scapy. A host coroutine answers the board's ARP requests, as a real host
would; every other frame the board sends is queued for the test to check.

Launched from ``tests/hdl/net/core/test_eth_echo.py``; parameters through
:func:`sim.runner.test_params`.
"""
from __future__ import annotations

import json
import random
import time

import cocotb
from cocotb.clock import Clock
from cocotb.queue import Queue
from cocotb.triggers import ClockCycles, Timer, with_timeout
from cocotb.utils import get_sim_time
from cocotbext.eth import GmiiFrame, RgmiiSink, RgmiiSource
from scapy.layers.inet import ICMP, IP, UDP, IPOption_NOP
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw

from hdl.net.core.liteeth import EVENTS, load_network_config
from sim.runner import test_params

RGMII_PS = 8004        # the PHY's receive clock, 500 ppm slow: the phases drift through
HOST_MAC = "02:00:00:00:00:10"
HOST_IP = "192.168.77.10"
OTHER_IP = "192.168.77.3"
BROADCAST = "ff:ff:ff:ff:ff:ff"
#: Longest a reply may take, per frame byte (generous: wire time is 8 ns per byte).
REPLY_NS_PER_BYTE = 40
REPLY_NS_MIN = 20_000
#: How long "no reply" is waited for: several times a good reply's latency.
SILENCE_NS_MIN = 4_000
SILENCE_NS_PER_BYTE = 16


class EthBench:
    """Clocks, the RGMII PHY model, a host that answers ARP, and frame helpers."""

    def __init__(self, dut, board="ecpix5"):
        self.dut = dut
        self.config = load_network_config(board)
        self.board_mac = self.config.mac_address
        self.board_ip = self.config.ip_address
        # LiteEth's sys clock runs at the configuration's sys_clk_hz (its ARP timers count it)
        self.sys_ps = round(1e12 / self.config.sys_clk_hz)
        self.start_clocks()
        self.source = RgmiiSource(dut.rgmii_rx_data, dut.rgmii_rx_ctl, dut.rgmii_rx_clk)
        self.sink = RgmiiSink(dut.rgmii_tx_data, dut.rgmii_tx_ctl, dut.rgmii_tx_clk)
        for model in (self.source, self.sink):
            model.log.setLevel("WARNING")
        self.frames = Queue()
        self.arp_requests = 0
        self.bad_frames = []
        #: the hosts on the wire: IP -> MAC (each answers ARP for its own address)
        self.hosts = {HOST_IP: HOST_MAC}
        #: hosts that asked for the board's MAC (:meth:`announce`), and the board's answers
        #: still due to them (taken off the wire, not handed to a test)
        self.announced = set()
        self._answers_due = {}
        cocotb.start_soon(self._host())

    def start_clocks(self):
        cocotb.start_soon(Clock(self.dut.clk, self.sys_ps, unit="ps").start())
        cocotb.start_soon(Clock(self.dut.rgmii_rx_clk, RGMII_PS, unit="ps").start())

    async def reset(self):
        self.dut.rst.value = 1
        await ClockCycles(self.dut.clk, 10)
        self.dut.rst.value = 0
        # LiteEth's ARP cache clears its entries one per cycle after reset.
        await ClockCycles(self.dut.clk, self.config.arp_entries + 50)

    async def _host(self):
        while True:
            frame = await self.sink.recv()
            if not frame.check_fcs():
                self.bad_frames.append(bytes(frame.get_payload(strip_fcs=False)))
                continue
            packet = Ether(bytes(frame.get_payload()))
            if ARP in packet and packet[ARP].op == 1 and packet[ARP].pdst in self.hosts:
                arp = packet[ARP]
                mac = self.hosts[arp.pdst]
                assert packet.dst == BROADCAST and packet.src == self.board_mac, packet.summary()
                assert arp.hwsrc == self.board_mac and arp.psrc == self.board_ip, arp.summary()
                self.arp_requests += 1
                await self.send(Ether(dst=self.board_mac, src=mac) /
                                ARP(op=2, hwsrc=mac, psrc=arp.pdst,
                                    hwdst=self.board_mac, pdst=self.board_ip))
            elif (ARP in packet and packet[ARP].op == 2
                  and self._answers_due.get(packet[ARP].pdst, 0)):
                self._answers_due[packet[ARP].pdst] -= 1
            else:
                await self.frames.put((packet, frame))

    async def announce(self, ip):
        """Host ``ip`` asks for the board's MAC, as a host does before its first datagram
        (the board caches the host from the request); the board's answer is not a test's."""
        mac = self.hosts.get(ip, HOST_MAC)
        self.announced.add(ip)
        self._answers_due[ip] = self._answers_due.get(ip, 0) + 1
        await self.send(Ether(dst=BROADCAST, src=mac) /
                        ARP(op=1, hwsrc=mac, psrc=ip, pdst=self.board_ip))

    async def send(self, packet, *, corrupt_fcs=False, pad=True):
        """Send one frame (scapy packet) into the board; FCS computed unless corrupted."""
        raw = bytes(packet)
        frame = GmiiFrame.from_payload(raw, min_len=60 if pad else 0)
        if corrupt_fcs:
            frame.data[-1] ^= 0x01
        await self.source.send(frame)

    async def expect(self, sent_bytes=64):
        """The next frame the board sends (not an ARP request), as a scapy packet."""
        timeout = max(REPLY_NS_MIN, REPLY_NS_PER_BYTE * sent_bytes)
        packet, _ = await with_timeout(self.frames.get(), timeout, "ns")
        return packet

    async def expect_nothing(self, sent_bytes=64):
        await Timer(SILENCE_NS_MIN + SILENCE_NS_PER_BYTE * sent_bytes, "ns")
        assert self.frames.empty(), f"unexpected frame: {self.frames.get_nowait()[0].summary()}"

    def counters(self):
        return {name: int(getattr(self.dut, f"count_{name}").value) for name in EVENTS}

    def udp(self, payload, *, sport=40000, dport=47570, dst_ip=None, dst_mac=None,
            checksum=True, ip_options=None, flags=0, frag=0, src_ip=HOST_IP):
        ip = IP(src=src_ip, dst=dst_ip or self.board_ip, flags=flags, frag=frag,
                **({"options": ip_options} if ip_options is not None else {}))
        udp = UDP(sport=sport, dport=dport)
        if not checksum:
            udp.chksum = 0
        src_mac = self.hosts.get(src_ip, HOST_MAC)
        return Ether(dst=dst_mac or self.board_mac, src=src_mac) / ip / udp / Raw(payload)

    def check_udp_reply(self, reply, request_payload, *, sport, dport):
        """A datagram from the board back to the host, payload byte for byte."""
        assert reply.dst == HOST_MAC and reply.src == self.board_mac, reply.summary()
        assert IP in reply and UDP in reply, reply.summary()
        ip, udp = reply[IP], reply[UDP]
        assert (ip.src, ip.dst, ip.proto, ip.ihl) == (self.board_ip, HOST_IP, 17, 5), ip.summary()
        assert ip.frag == 0 and ip.flags == 0
        # The IP checksum the board wrote must be the one scapy computes from the header.
        expected = IP(bytes(ip))
        del expected.chksum
        assert ip.chksum == IP(bytes(expected)).chksum, "board's IPv4 checksum is wrong"
        assert (udp.sport, udp.dport) == (dport, sport), udp.summary()
        assert udp.chksum == 0, "LiteEth sends UDP without checksum"
        assert udp.len == 8 + len(request_payload)
        assert ip.len == 28 + len(request_payload)
        got = bytes(udp.payload)[:len(request_payload)]
        if got != request_payload:
            where = next((i for i, (a, b) in enumerate(zip(got, request_payload)) if a != b),
                         min(len(got), len(request_payload)))
            raise AssertionError(f"{len(request_payload)}-byte payload differs from byte {where}")

    async def round_trip(self, payload, **kwargs):
        sport = kwargs.get("sport", 40000)
        dport = kwargs.get("dport", 47570)
        packet = self.udp(payload, **kwargs)
        await self.send(packet)
        reply = await self.expect(len(bytes(packet)))
        self.check_udp_reply(reply, payload, sport=sport, dport=dport)
        return reply


async def started(dut):
    bench = EthBench(dut)
    await bench.reset()
    return bench


@cocotb.test()
async def arp_and_ping(dut):
    """ARP request -> reply; ping -> echo reply (the board asks ARP for the host first)."""
    bench = await started(dut)
    await bench.send(Ether(dst=BROADCAST, src=HOST_MAC) /
                     ARP(op=1, hwsrc=HOST_MAC, psrc=HOST_IP, pdst=bench.board_ip))
    reply = await bench.expect()
    assert ARP in reply, reply.summary()
    arp = reply[ARP]
    assert reply.dst == HOST_MAC and reply.src == bench.board_mac
    assert (arp.op, arp.hwsrc, arp.psrc, arp.hwdst, arp.pdst) == (
        2, bench.board_mac, bench.board_ip, HOST_MAC, HOST_IP), arp.summary()

    # An ARP request for another address gets no reply.
    await bench.send(Ether(dst=BROADCAST, src=HOST_MAC) /
                     ARP(op=1, hwsrc=HOST_MAC, psrc=HOST_IP, pdst=OTHER_IP))
    await bench.expect_nothing()

    rng = random.Random(test_params().get("seed", 1))
    for seq in range(3):
        data = bytes(rng.getrandbits(8) for _ in range(56))
        await bench.send(Ether(dst=bench.board_mac, src=HOST_MAC) /
                         IP(src=HOST_IP, dst=bench.board_ip) /
                         ICMP(type=8, id=0x4747, seq=seq) / Raw(data))
        reply = await bench.expect()
        assert ICMP in reply, reply.summary()
        icmp = reply[ICMP]
        assert (reply[IP].src, reply[IP].dst) == (bench.board_ip, HOST_IP)
        assert (icmp.type, icmp.code, icmp.id, icmp.seq) == (0, 0, 0x4747, seq), icmp.summary()
        assert bytes(icmp.payload)[:56] == data
        check = ICMP(bytes(icmp))
        del check.chksum
        assert icmp.chksum == ICMP(bytes(check)).chksum, "ICMP checksum of the reply is wrong"
    # The host asked for the board first: the board cached it from that request (RFC 826's
    # merge), so no reply needed an ARP exchange.
    assert bench.arp_requests == 0, bench.arp_requests
    counts = bench.counters()
    assert counts["arp_miss"] == 0, counts
    assert not bench.bad_frames


@cocotb.test()
async def udp_round_trip(dut):
    """Datagrams of every tail length, padded and not, up to jumbo size, come back exact."""
    bench = await started(dut)
    params = test_params()
    rng = random.Random(params.get("seed", 2))
    sizes = list(range(1, 24)) + [31, 32, 33, 100, 255, 1472, 1473]
    sizes += [rng.randint(34, 1472) for _ in range(params.get("random", 4))]
    if params.get("jumbo", True):
        sizes.append(9000 - 28)           # largest datagram in a 9018-byte frame
    start_ns, start_wall = get_sim_time("ns"), time.perf_counter()
    for n, size in enumerate(sizes):
        payload = bytes(rng.getrandbits(8) for _ in range(size))
        await bench.round_trip(payload, sport=rng.randint(1024, 65535),
                               dport=rng.choice(list(bench.config.udp_ports.values())),
                               checksum=bool(n % 2))
    sim_ns, wall = get_sim_time("ns") - start_ns, time.perf_counter() - start_wall
    counts = bench.counters()
    assert int(dut.echoed.value) == len(sizes) and int(dut.echo_dropped.value) == 0
    assert int(dut.rx_contract_violations.value) == 0
    assert sum(v for k, v in counts.items() if k != "arp_miss") == 0, counts
    assert bench.arp_requests == 1 and not bench.bad_frames
    speed = {"sys_cycles": sim_ns * 1000 / bench.sys_ps, "wall_s": wall,
             "cycles_per_s": sim_ns * 1000 / bench.sys_ps / wall, "datagrams": len(sizes),
             "bytes": sum(sizes)}
    dut._log.warning("simulation speed: %.0f sys cycles/s (%d cycles in %.1f s)",
                     speed["cycles_per_s"], speed["sys_cycles"], wall)
    if params.get("speed_file"):
        with open(params["speed_file"], "w") as f:
            json.dump(speed, f)


@cocotb.test()
async def drops(dut):
    """Each drop cause is dropped, counted once, and a good datagram after it still comes back."""
    bench = await started(dut)
    rng = random.Random(test_params().get("seed", 3))
    await bench.round_trip(b"warm up: learn the host's MAC")

    def payload(n=40):
        return bytes(rng.getrandbits(8) for _ in range(n))

    board = bench.board_mac
    cases = [
        ("rx_fcs", bench.udp(payload()), {"corrupt_fcs": True}),
        ("rx_fcs", bench.udp(payload(5)), {"corrupt_fcs": True}),      # padded: FCS after the end
        ("rx_mac", bench.udp(payload(), dst_mac="02:47:57:00:00:99"), {}),
        ("rx_ethertype", Ether(dst=board, src=HOST_MAC, type=0x86DD) / Raw(payload(60)), {}),
        ("ip_address", bench.udp(payload(), dst_ip=OTHER_IP), {}),
        ("ip_fragment", bench.udp(payload(), flags="MF"), {}),
        ("ip_fragment", bench.udp(payload(), frag=3), {}),
        ("ip_header", bench.udp(payload(), ip_options=[IPOption_NOP()] * 4), {}),
        ("ip_protocol", Ether(dst=board, src=HOST_MAC) / IP(src=HOST_IP, dst=bench.board_ip,
                                                           proto=6) / Raw(payload()), {}),
        ("rx_runt", bench.udp(payload(4)), {"pad": False}),
        ("rx_oversize", bench.udp(payload(9000 - 28 + 1)), {}),
    ]
    bad_ip = bench.udp(payload())
    bad_ip[IP].chksum = IP(bytes(bad_ip[IP])).chksum ^ 0x8001
    cases.append(("ip_checksum", bad_ip, {}))
    bad_udp = bench.udp(payload(64))
    bad_udp[UDP].chksum = (Ether(bytes(bad_udp))[UDP].chksum ^ 0x8000) or 1
    cases.append(("udp_checksum", bad_udp, {}))
    long_udp = bench.udp(payload())
    long_udp[UDP].len = 8 + 40 + 20                           # beyond the IP payload
    cases.append(("udp_length", long_udp, {}))
    rng.shuffle(cases)
    #: Causes found at the datagram's end: the core hands it out flagged, the echo drops it.
    flagged = {"rx_fcs", "rx_runt", "rx_oversize", "udp_checksum", "udp_length"}

    for cause, packet, options in cases:
        before = bench.counters()
        await bench.send(packet, **options)
        await bench.expect_nothing(len(bytes(packet)))
        after = bench.counters()
        changed = {k: after[k] - before[k] for k in after if after[k] != before[k]}
        assert changed == {cause: 1}, f"{cause}: counters changed {changed}"
        good = payload(rng.randint(1, 200))
        await bench.round_trip(good, sport=rng.randint(1024, 65535))
    assert int(dut.echo_dropped.value) == sum(cause in flagged for cause, _, _ in cases)
    assert int(dut.rx_contract_violations.value) == 0
    assert bench.arp_requests == 1 and not bench.bad_frames
