"""cocotb benches of the network top (``sim/network_top.py``) through its RGMII pins.

The same gateware as a board's: the LiteEth core (with ``sim/ecp5_models.v``), the clock
crossing, the front end, the NIC and switch engines. cocotbext-eth's RGMII models play
the PHY chip; scapy builds and parses every frame; the hosts on the wire (a controller and
the workers, each with its own IP and MAC) answer the board's ARP requests. Every reply is
compared byte for byte with the golden models (``host.golden.inceptionn`` for the NIC,
``host.golden.aggregator.AggregatorModel`` for the switch, the control service's contract), and
every counter with what the test sent.

Launched from ``tests/hdl/net/test_network_top.py``, all tests in one simulator run;
each test's parameters are ``params[test name]`` (:func:`params_of`).
"""
from __future__ import annotations

import json
import random
import struct

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, Timer, with_timeout
from scapy.layers.inet import ICMP, IP, UDP, IPOption_NOP
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw

from contract.counters import AGG_COUNTERS, NET_COUNTERS, NIC_RX_COUNTERS, NIC_TX_COUNTERS
from contract.header import HEADER_BYTES, Flags, Header, PacketType
from contract.network import (CTRL_KEY_OFFSET, CTRL_MAX_PAIRS, CTRL_OP_OFFSET, CTRL_TYPE,
                              GROUP_TTL, CtrlOp, Service, is_multicast, multicast_mac,
                              network_address)
from contract.packet import Packet
from contract.registers import COMMIT, NET_REGISTERS, NIC_REGISTERS, SWITCH_REGISTERS
from hdl.net.top import SIMULATION_KEY, port_base_of
from sim.network_top import engine_period_ps
from sim.runner import test_params
from sim.tb_eth import BROADCAST, HOST_IP, HOST_MAC, OTHER_IP, EthBench

ENGINE_PS = engine_period_ps()   # the engines' clock: the bitstream's default
RGMII_PS = 8004        # the PHY's receive clock, 500 ppm slow
#: Jumbo frames: the largest datagram (9000-byte IP packet).
MAX_DATAGRAM = 9000 - 28
#: The TTL of the board's datagrams to a host (LiteEth's).
UNICAST_TTL = 128


def worker_address(w):
    """IP and MAC of worker host ``w`` on the bench's wire."""
    return f"192.168.77.{100 + w}", f"02:00:00:00:01:{w:02x}"


class NetworkBench(EthBench):
    """The network top's clocks, the hosts on the wire, and its services as a host uses
    them: datagrams to each port, ``CTRL`` reads and writes with the key, counters."""

    def __init__(self, dut, board="ecpix5"):
        super().__init__(dut, board)
        self.ports = {service: port_base_of(self.config) + offset
                      for service, offset in ((Service.NIC_TX, 0), (Service.NIC_RX, 1),
                                              (Service.SWITCH, 2), (Service.CTRL, 3))}
        self.key = SIMULATION_KEY
        self.seq = 0
        self.stash = []         # frames that arrived while another was waited for

    def start_clocks(self):
        cocotb.start_soon(Clock(self.dut.clk, ENGINE_PS, unit="ps").start())
        cocotb.start_soon(Clock(self.dut.eth_clk, self.sys_ps, unit="ps").start())
        cocotb.start_soon(Clock(self.dut.rgmii_rx_clk, RGMII_PS, unit="ps").start())

    async def reset(self):
        self.dut.rst.value = 1
        self.dut.eth_rst.value = 1
        await ClockCycles(self.dut.eth_clk, 10)
        self.dut.rst.value = 0
        self.dut.eth_rst.value = 0
        # LiteEth's ARP cache clears its entries one per cycle after reset.
        await ClockCycles(self.dut.eth_clk, self.config.arp_entries + 50)

    # -- datagrams ---------------------------------------------------------------------

    async def request(self, service, payload, *, sport=40000, src_ip=HOST_IP, **kwargs):
        """Send one datagram to a service's port; returns a list that holds the frame as
        sent (with its wire times) once it has been sent."""
        port = self.ports[service] if isinstance(service, Service) else service
        if src_ip not in self.announced:
            await self.announce(src_ip)
        packet = self.udp(bytes(payload), sport=sport, dport=port, src_ip=src_ip, **kwargs)
        from cocotbext.eth import GmiiFrame
        sent = []     # the source sends a copy of the frame: that copy carries the times
        await self.source.send(GmiiFrame.from_payload(bytes(packet), min_len=60,
                                                      tx_complete=sent.append))
        return sent

    def udp_of(self, packet):
        """(destination IP, source port, destination port, payload) of a datagram from the
        board, after checking its framing (addresses, IPv4 checksum, lengths)."""
        assert IP in packet and UDP in packet, packet.summary()
        ip, udp = packet[IP], packet[UDP]
        assert packet.src == self.board_mac and ip.src == self.board_ip, packet.summary()
        if is_multicast(ip.dst):
            # a job's result group: the group's MAC, and the segment only
            assert packet.dst == multicast_mac(ip.dst), f"{packet.dst} for group {ip.dst}"
            assert ip.ttl == GROUP_TTL, f"TTL {ip.ttl} to group {ip.dst}"
        else:
            assert packet.dst == self.hosts.get(ip.dst), f"{packet.dst} is not {ip.dst}'s MAC"
            assert ip.ttl == UNICAST_TTL, f"TTL {ip.ttl} to {ip.dst}"
        assert (ip.proto, ip.ihl, ip.frag, ip.flags) == (17, 5, 0, 0), ip.summary()
        check = IP(bytes(ip))
        del check.chksum
        assert ip.chksum == IP(bytes(check)).chksum, "board's IPv4 checksum is wrong"
        payload = bytes(udp.payload)[:udp.len - 8]
        assert ip.len == 28 + len(payload) and udp.chksum == 0
        return ip.dst, udp.sport, udp.dport, payload

    async def next_udp(self, timeout_ns=200_000, match=None):
        """The next datagram from the board (for which ``match(udp tuple)`` holds), with
        its frame; others arriving meanwhile go to :attr:`stash`."""
        while True:
            for n, (udp, frame) in enumerate(self.stash):
                if match is None or match(udp):
                    return self.stash.pop(n)
            packet, frame = await with_timeout(self.frames.get(), timeout_ns, "ns")
            self.stash.append((self.udp_of(packet), frame))

    async def quiet(self, ns=20_000):
        """Nothing more comes (no datagram, nothing stashed)."""
        await Timer(ns, "ns")
        assert self.frames.empty() and not self.stash, \
            f"unexpected datagrams: {[u[:3] for u, _ in self.stash]} + {self.frames.qsize()}"

    # -- control -----------------------------------------------------------------------

    def ctrl_packet(self, op, pairs, *, key=None, count=None, seq=None):
        self.seq = (self.seq + 1) & 0xFFFFFFFF
        header = bytearray(Header(count=len(pairs) if count is None else count,
                                  seq=self.seq if seq is None else seq).pack())
        header[2] = CTRL_TYPE
        header[CTRL_OP_OFFSET] = op
        header[CTRL_KEY_OFFSET:CTRL_KEY_OFFSET + 8] = (self.key if key is None else key) \
            .to_bytes(8, "little")
        return bytes(header) + b"".join(struct.pack("<II", a, v) for a, v in pairs)

    async def ctrl(self, op, pairs, *, sport=40999, **kwargs):
        """One ``CTRL`` request; returns the values of the reply (checked: the request's
        header with RESULT, the same addresses)."""
        request = self.ctrl_packet(op, pairs, **kwargs)
        await self.request(Service.CTRL, request, sport=sport)
        (dst, src_port, dst_port, reply), _ = await self.next_udp(
            match=lambda u: u[1] == self.ports[Service.CTRL] and u[2] == sport)
        assert (dst, src_port, dst_port) == (HOST_IP, self.ports[Service.CTRL], sport)
        want_header = bytearray(request[:HEADER_BYTES])
        want_header[3] |= Flags.RESULT
        assert reply[:HEADER_BYTES] == bytes(want_header), "reply header"
        assert len(reply) == len(request)
        values = []
        for n, (addr, _) in enumerate(pairs):
            got_addr, value = struct.unpack_from("<II", reply, HEADER_BYTES + 8 * n)
            assert got_addr == addr
            values.append(value)
        return values

    async def read(self, addresses):
        values = []
        for start in range(0, len(addresses), CTRL_MAX_PAIRS):
            chunk = addresses[start:start + CTRL_MAX_PAIRS]
            values += await self.ctrl(CtrlOp.READ, [(a, 0) for a in chunk])
        return values

    async def write(self, pairs):
        values = []
        for start in range(0, len(pairs), CTRL_MAX_PAIRS):
            values += await self.ctrl(CtrlOp.WRITE, pairs[start:start + CTRL_MAX_PAIRS])
        return values

    async def net_counters(self):
        block = NET_REGISTERS["counter"]
        names = list(NET_COUNTERS)
        values = await self.read([network_address("net", block.address(n)) for n in names])
        # the register port and the top's counter outputs must agree (read after read)
        return dict(zip(names, values))

    async def nic_counters(self):
        names = [("tx", n) for n in NIC_TX_COUNTERS] + [("rx", n) for n in NIC_RX_COUNTERS]
        values = await self.read([network_address("nic", NIC_REGISTERS[p].address(n))
                                  for p, n in names])
        return dict(zip(names, values))

    async def switch_counters(self):
        block = SWITCH_REGISTERS["counter"]
        values = await self.read([network_address("switch", block.address(n))
                                  for n in AGG_COUNTERS])
        return dict(zip(AGG_COUNTERS, values))

    async def configure_job(self, job, workers, slot_base, slot_count, addresses):
        """A switch job over the network: the worker table, then the job and its commit."""
        table = NET_REGISTERS["worker"]
        pairs = []
        for w, (ip, port) in enumerate(addresses):
            entry = job * 32 + w
            ip_int = int.from_bytes(bytes(int(x) for x in ip.split(".")), "big")
            pairs += [(network_address("net", table.address(entry, "ip")), ip_int),
                      (network_address("net", table.address(entry, "port")), port)]
        jobs = SWITCH_REGISTERS["job"]
        pairs += [(network_address("switch", jobs.address(job, "workers")), workers),
                  (network_address("switch", jobs.address(job, "slot_base")), slot_base),
                  (network_address("switch", jobs.address(job, "slot_count")), slot_count),
                  (network_address("switch", jobs.address(job, "commit")), COMMIT)]
        values = await self.write(pairs)
        for (addr, value), got in zip(pairs[:-1], values[:-1]):
            assert got == value, f"read-back of {addr:#x}"
        commit = network_address("switch", jobs.address(job, "commit"))
        for _ in range(50):
            (status,) = await self.read([commit])
            if status == 0:
                return
        raise AssertionError(f"job {job} commit status {status}")


def delta(before, after):
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


async def started(dut):
    bench = NetworkBench(dut)
    await bench.reset()
    return bench


def params_of(test):
    """The parameters of one cocotb test: ``params[test]`` (one simulator run serves
    every test of this module, :mod:`tests.hdl.net.test_network_top`)."""
    return test_params().get(test, {})


def rng_of(test, default):
    return random.Random(params_of(test).get("seed", default))


# -- ARP and ping -------------------------------------------------------------------------

@cocotb.test(timeout_time=200, timeout_unit="us")
async def arp_and_ping(dut):
    """The network top answers ARP for its address (not for others) and ping."""
    bench = await started(dut)
    await bench.send(Ether(dst=BROADCAST, src=HOST_MAC) /
                     ARP(op=1, hwsrc=HOST_MAC, psrc=HOST_IP, pdst=bench.board_ip))
    reply = await bench.expect()
    assert ARP in reply and reply[ARP].op == 2, reply.summary()
    assert (reply[ARP].hwsrc, reply[ARP].psrc, reply[ARP].pdst) == (
        bench.board_mac, bench.board_ip, HOST_IP)
    await bench.send(Ether(dst=BROADCAST, src=HOST_MAC) /
                     ARP(op=1, hwsrc=HOST_MAC, psrc=HOST_IP, pdst=OTHER_IP))
    await bench.expect_nothing()
    rng = rng_of("arp_and_ping", 1)
    for seq in range(2):
        data = bytes(rng.getrandbits(8) for _ in range(56))
        await bench.send(Ether(dst=bench.board_mac, src=HOST_MAC) /
                         IP(src=HOST_IP, dst=bench.board_ip) /
                         ICMP(type=8, id=0x4747, seq=seq) / Raw(data))
        reply = await bench.expect()
        assert ICMP in reply and reply[ICMP].type == 0 and reply[ICMP].seq == seq
        assert bytes(reply[ICMP].payload)[:56] == data
    # the host's request made the board cache it (RFC 826's merge): no ARP from the board
    assert bench.arp_requests == 0


# -- NIC services ---------------------------------------------------------------------------

def nic_packets(rng, count, traffic, max_values):
    """Spec packets for a NIC path that fit one datagram, as (Packet, datagram bytes)."""
    from sim.nic_stimulus import rx_traffic, tx_traffic
    np_rng = np.random.default_rng(rng.getrandbits(32))
    make = tx_traffic if traffic == "tx" else rx_traffic
    out = []
    while len(out) < count:
        for packet in make(np_rng, count, **({"max_values": max_values} if traffic == "tx"
                                             else {"max_count": max_values})):
            raw = packet.to_bytes()
            if len(raw) <= MAX_DATAGRAM and len(out) < count:
                out.append(packet)
    return out


@cocotb.test(timeout_time=3000, timeout_unit="us")
async def nic_services(dut):
    """Spec packets to the NIC transmit and receive services: every reply byte for byte
    the golden model's, to the requester, every engine counter as the model's causes."""
    from host.golden.inceptionn import nic_rx, nic_tx
    bench = await started(dut)
    params = params_of("nic_services")
    rng = rng_of("nic_services", 2)
    count = params.get("packets", 12)
    max_values = params.get("max_values", 600)
    before = await bench.nic_counters()
    net_before = await bench.net_counters()
    causes = {("tx", n): 0 for n in NIC_TX_COUNTERS} | {("rx", n): 0 for n in NIC_RX_COUNTERS}
    replies = {Service.NIC_TX: 0, Service.NIC_RX: 0}
    cases = [(Service.NIC_TX, p) for p in nic_packets(rng, count, "tx", max_values)]
    cases += [(Service.NIC_RX, p) for p in nic_packets(rng, count, "rx", max_values)]
    if params.get("jumbo", True):
        from sim.nic_stimulus import tx_packet, value_mix
        big = tx_packet(value_mix(np.random.default_rng(5), 2048, 10), 10)
        cases += [(Service.NIC_TX, big), (Service.NIC_RX, nic_tx(big)[0])]
    rng.shuffle(cases)
    for n, (service, packet) in enumerate(cases):
        sport = 41000 + n
        golden, path = (nic_tx, "tx") if service is Service.NIC_TX else (nic_rx, "rx")
        want, cause = golden(packet)
        causes[path, "packets"] += 1
        causes[path, cause] += 1
        await bench.request(service, packet.to_bytes(), sport=sport)
        if want is None:
            continue
        replies[service] += 1
        (dst, src_port, dst_port, payload), _ = await bench.next_udp(
            match=lambda u, s=sport: u[2] == s)
        assert (dst, src_port, dst_port) == (HOST_IP, bench.ports[service], sport)
        if payload != want.to_bytes():
            where = next((i for i, (a, b) in enumerate(zip(payload, want.to_bytes()))
                          if a != b), None)
            raise AssertionError(f"case {n} ({service.value}, {cause}): {len(payload)} "
                                 f"bytes vs {len(want.to_bytes())}, first difference at {where}")
    await bench.quiet()
    after = await bench.nic_counters()
    assert delta(before, after) == {k: v for k, v in causes.items() if v}
    net = delta(net_before, await bench.net_counters())
    reads = net.pop("ctrl_in"), net.pop("ctrl_out")
    assert reads[0] == reads[1]
    assert net == {k: v for k, v in {
        "nic_tx_in": causes["tx", "packets"], "nic_tx_out": replies[Service.NIC_TX],
        "nic_rx_in": causes["rx", "packets"], "nic_rx_out": replies[Service.NIC_RX]}.items()
        if v}
    assert not bench.bad_frames


# -- control ----------------------------------------------------------------------------

@cocotb.test(timeout_time=500, timeout_unit="us")
async def control(dut):
    """CTRL reads and writes with the key: the board's registers, read-back after write,
    the engines' registers; a wrong key: no reply, nothing written, counted; a malformed
    request with the key: an ERROR reply, nothing done, counted."""
    bench = await started(dut)
    net = lambda name: network_address("net", NET_REGISTERS[name].address)
    mac = int(bench.board_mac.replace(":", ""), 16)
    ip = int.from_bytes(bytes(int(x) for x in bench.board_ip.split(".")), "big")
    values = await bench.read([net("mac_high"), net("mac_low"), net("ip"), net("port_base"),
                               net("services"), net("link"), 3 << 16])
    # (the PHY model sends no in-band status: the link bit is whatever the top says)
    assert values == [mac >> 32, mac & 0xFFFFFFFF, ip, bench.ports[Service.NIC_TX], 0b1111,
                      int(dut.link.value), 0]
    jobs = SWITCH_REGISTERS["job"]
    slot_base = network_address("switch", jobs.address(2, "slot_base"))
    params = network_address("switch", SWITCH_REGISTERS["params"].address)
    entry = network_address("net", NET_REGISTERS["worker"].address(2 * 32 + 7, "port"))
    assert await bench.write([(slot_base, 12), (entry, 0x1234), (net("ip"), 0)]) == \
        [12, 0x1234, ip]
    assert await bench.read([params]) == [64 | 64 << 16]
    c0 = await bench.net_counters()

    # wrong key: nothing comes back, nothing is written
    await bench.request(Service.CTRL, bench.ctrl_packet(CtrlOp.WRITE, [(slot_base, 99)],
                                                        key=bench.key ^ 1), sport=40999)
    await bench.quiet()
    # refused: the header alone comes back with ERROR
    for bad in (bench.ctrl_packet(CtrlOp.WRITE, [(slot_base, 98)], count=2),
                bench.ctrl_packet(7, [(slot_base, 97)]),
                bench.ctrl_packet(CtrlOp.READ, [], count=0)):
        await bench.request(Service.CTRL, bad, sport=40998)
        (dst, src_port, dst_port, reply), _ = await bench.next_udp(match=lambda u: u[2] == 40998)
        want = bytearray(bad[:HEADER_BYTES])
        want[3] |= Flags.RESULT | Flags.ERROR
        assert reply == bytes(want)
    # not a control packet, without the key: nothing (the key is checked first)
    await bench.request(Service.CTRL, b"\x47\x01\x02" + bytes(60), sport=40997)
    await bench.quiet()
    assert await bench.read([slot_base]) == [12]
    c1 = await bench.net_counters()
    d = delta(c0, c1)
    assert (d.pop("drop_bad_key"), d.pop("drop_bad_ctrl")) == (2, 3), d
    # A request counts in ctrl_in once it has entered, before it reads the counters; its
    # reply counts in ctrl_out after. In: wrong key, 3 refused, not control, the read of
    # slot_base, the read of c1. Out: the reply to the read of c0, 3 ERROR, slot_base's.
    assert d.pop("ctrl_in") == 1 + 3 + 1 + 1 + 1 and d.pop("ctrl_out") == 1 + 3 + 1, d
    assert not d, d


# -- switch -------------------------------------------------------------------------------

async def worker_round(bench, model, workers, packets_by_worker, rng, window):
    """Every worker sends its packets from its own address, ``window`` chunks (the job's
    slot count) at a time as the slot protocol allows, the workers' packets of a window
    interleaved; every result must reach every worker's address byte for byte as the
    model's. Returns every result datagram as received."""
    received = []
    chunks = max(len(ps) for ps in packets_by_worker)
    for start in range(0, chunks, window):
        expected = []
        sends = [(w, p) for w, ps in enumerate(packets_by_worker)
                 for p in ps[start:start + window]]
        rng.shuffle(sends)
        for w, packet in sends:
            ip, port = workers[w]
            for result in model.process(packet):
                targets = range(len(workers)) if result.header.worker == 0xFF else \
                    [result.header.worker]
                expected += [(workers[t], result.to_bytes()) for t in targets]
            await bench.request(Service.SWITCH, packet.to_bytes(), sport=port, src_ip=ip)
        got = []
        for _ in expected:
            (dst, src_port, dst_port, payload), _ = await bench.next_udp(
                match=lambda u: u[1] == bench.ports[Service.SWITCH])
            got.append(((dst, dst_port), payload))
        assert sorted(got) == sorted(expected)
        received += [payload for _, payload in got]
    return received


@cocotb.test(timeout_time=4000, timeout_unit="us")
async def lhc_round(dut):
    """A 4-worker LHC all-reduce (index OR, sketch ADD, fallback ADD) through the switch
    service: every result fanned out to the 4 workers' table entries, byte for byte the
    reference aggregator's; the decoded sum bit-exact with the golden all-reduce; a resend
    answered unicast; a stranger refused."""
    from host.golden.aggregator import AggregatorModel
    from host.golden import lhc
    from host.switchml.window import collect_results, make_packets
    bench = await started(dut)
    rng = rng_of("lhc_round", 4)
    n_workers, lanes, job, slot_base, slot_count = 4, 64, 1, 8, 8
    workers = []
    for w in range(n_workers):
        ip, mac = worker_address(w)
        bench.hosts[ip] = mac
        workers.append((ip, 50000 + w))
    await bench.configure_job(job, n_workers, slot_base, slot_count, workers)
    model = AggregatorModel()
    model.configure_job(job, n_workers, slot_base, slot_count)
    c0 = await bench.net_counters()
    s0 = await bench.switch_counters()

    np_rng = np.random.default_rng(rng.getrandbits(32))
    n = 1024
    grads = []
    for _ in range(n_workers):
        g = np.zeros(n, dtype=np.float32)
        idx = np_rng.choice(n, 40, replace=False)
        g[idx] = np_rng.normal(0, 1e-2, idx.size).astype(np.float32)
        grads.append(g)
    ws = [lhc.LhcWorker(g, n_workers) for g in grads]
    chunk = 0

    last_sent = {}

    async def phase(op, vectors, exponents):
        nonlocal chunk
        packets = [make_packets(v, op=op, job=job, worker=w, slot_base=slot_base,
                                slot_count=slot_count, lanes=lanes, first_chunk=chunk,
                                exponent=e) for w, (v, e) in enumerate(zip(vectors, exponents))]
        first_chunk = chunk
        chunk += len(packets[0])
        last_sent.update({w: ps[-1] for w, ps in enumerate(packets)})
        results = await worker_round(bench, model, workers, packets, rng, slot_count)
        # every worker got every result: duplicates must be identical
        assert len(results) == n_workers * len(packets[0])
        return collect_results([Packet.from_bytes(r) for r in results], len(vectors[0]),
                               lanes=lanes, first_chunk=first_chunk)

    union, e_max = await phase(PacketType.AGG_OR32, [w.index_words for w in ws],
                               [w.exponent for w in ws])
    sketches = [w.sketch_phase(union, e_max) for w in ws]
    sketch_sum, _ = await phase(PacketType.AGG_ADD_I32, sketches, [0] * n_workers)
    fallbacks = [w.fallback_phase(sketch_sum) for w in ws]
    if fallbacks[0].size:
        fallback_sum, _ = await phase(PacketType.AGG_ADD_I32, fallbacks, [0] * n_workers)
    else:
        fallback_sum = fallbacks[0]
    result, _ = ws[0].finish(fallback_sum)
    want, _ = lhc.allreduce(grads)
    assert np.array_equal(np.asarray(result).view(np.uint32), np.asarray(want).view(np.uint32))
    s1 = await bench.switch_counters()
    assert s1["results_multicast"] - s0["results_multicast"] == chunk
    c1 = await bench.net_counters()
    d = delta(c0, c1)
    d.pop("ctrl_in"), d.pop("ctrl_out")
    # (each worker asked for the board's MAC before its first datagram: no ARP miss)
    assert d == {"switch_in": n_workers * chunk, "switch_out": n_workers * chunk}, d

    # worker 2 resends its last packet: a unicast answer, to worker 2's entry only
    resend = last_sent[2]
    (answer,) = model.process(resend)
    assert answer.header.worker == 2
    await bench.request(Service.SWITCH, resend.to_bytes(), sport=workers[2][1],
                        src_ip=workers[2][0])
    (dst, src_port, dst_port, payload), _ = await bench.next_udp()
    assert ((dst, dst_port), payload) == (workers[2], answer.to_bytes())
    # worker 3 sends as worker 1: refused before the engine
    stranger = Packet(last_sent[1].header, last_sent[3].payload)
    await bench.request(Service.SWITCH, stranger.to_bytes(), sport=workers[3][1],
                        src_ip=workers[3][0])
    await bench.quiet()
    d = delta(c1, await bench.net_counters())
    d.pop("ctrl_in"), d.pop("ctrl_out")
    assert d == {"switch_in": 2, "switch_out": 1, "drop_bad_source": 1}, d
    assert delta(s1, await bench.switch_counters()) == {"packets": 1, "results_unicast": 1}


@cocotb.test(timeout_time=4000, timeout_unit="us")
async def drops(dut):
    """Every drop cause: dropped, counted once under its cause, and a good datagram after
    it still comes back exact."""
    from host.golden.inceptionn import nic_tx
    from sim.nic_stimulus import tx_packet, value_mix
    bench = await started(dut)
    rng = rng_of("drops", 5)
    np_rng = np.random.default_rng(rng.getrandbits(32))
    worker_ip, worker_mac = worker_address(0)
    bench.hosts[worker_ip] = worker_mac
    await bench.configure_job(0, 1, 0, 4, [(worker_ip, 50000)])

    async def good_round_trip(sport):
        packet = tx_packet(value_mix(np_rng, int(np_rng.integers(1, 100)), 9), 9)
        want, _ = nic_tx(packet)
        await bench.request(Service.NIC_TX, packet.to_bytes(), sport=sport)
        (dst, _, dport, payload), _ = await bench.next_udp(match=lambda u: u[2] == sport)
        assert payload == want.to_bytes()

    payload = lambda n=40: bytes(rng.getrandbits(8) for _ in range(n))
    good = tx_packet(value_mix(np_rng, 8, 9), 9).to_bytes()
    board = bench.board_mac
    port = bench.ports[Service.NIC_TX]
    cases = [
        ("rx_fcs", bench.udp(good, dport=port), {"corrupt_fcs": True}),
        ("rx_mac", bench.udp(good, dport=port, dst_mac="02:47:57:00:00:99"), {}),
        ("rx_ethertype", Ether(dst=board, src=HOST_MAC, type=0x86DD) / Raw(payload(60)), {}),
        ("ip_address", bench.udp(good, dport=port, dst_ip=OTHER_IP), {}),
        ("rx_fcs", bench.udp(payload(5), dport=port), {"corrupt_fcs": True}),  # padded
        ("ip_fragment", bench.udp(good, dport=port, flags="MF"), {}),
        ("ip_fragment", bench.udp(good, dport=port, frag=3), {}),
        ("ip_protocol", Ether(dst=board, src=HOST_MAC) / IP(src=HOST_IP, dst=bench.board_ip,
                                                           proto=6) / Raw(payload()), {}),
        ("ip_header", bench.udp(good, dport=port, ip_options=[IPOption_NOP()] * 4), {}),
        ("rx_runt", bench.udp(payload(4), dport=port), {"pad": False}),
        ("rx_oversize", bench.udp(payload(MAX_DATAGRAM + 1), dport=port), {}),
        ("drop_closed_port", bench.udp(good, dport=port + 4), {}),
        ("drop_closed_port", bench.udp(good, dport=port - 1), {}),
    ]
    bad_ip = bench.udp(good, dport=port)
    bad_ip[IP].chksum = IP(bytes(bad_ip[IP])).chksum ^ 0x8001
    cases.append(("ip_checksum", bad_ip, {}))
    bad_udp = bench.udp(good, dport=port)
    bad_udp[UDP].chksum = (Ether(bytes(bad_udp))[UDP].chksum ^ 0x8000) or 1
    cases.append(("udp_checksum", bad_udp, {}))
    long_udp = bench.udp(good, dport=port)
    long_udp[UDP].len = 8 + len(good) + 20                    # beyond the IP payload
    cases.append(("udp_length", long_udp, {}))
    agg = Header(type=PacketType.AGG_ADD_I32, job=0, worker=0, count=64).pack() + bytes(256)
    cases.append(("drop_bad_source", bench.udp(agg, dport=bench.ports[Service.SWITCH],
                                               sport=50001, src_ip=worker_ip), {}))
    cases.append(("drop_bad_source", bench.udp(agg, dport=bench.ports[Service.SWITCH],
                                               sport=50000), {}))
    cases.append(("drop_bad_key", bench.udp(bench.ctrl_packet(CtrlOp.READ, [(0, 0)],
                                                              key=bench.key ^ (1 << 40)),
                                            dport=bench.ports[Service.CTRL]), {}))
    rng.shuffle(cases)
    for n, (cause, packet, options) in enumerate(cases):
        before = await bench.net_counters()
        await bench.send(packet, **options)
        await bench.quiet(6000 + 10 * len(bytes(packet)))
        after = await bench.net_counters()
        d = delta(before, after)
        d.pop("ctrl_in"), d.pop("ctrl_out")
        # (a datagram the source check drops has reached the switch port: switch_in)
        want = {cause: 1} | ({"switch_in": 1} if cause == "drop_bad_source" else {})
        assert d == want, f"{cause}: counters changed {d}"
        await good_round_trip(42000 + n)

    # short datagrams reach their engine (zero-padded to a whole word), which drops them
    # as its contract says: the switch for their length, the receive path for what the
    # bytes say (47 01 01 00: INC_F32 with k 0, or 46: a bad magic)
    s0, n0 = await bench.switch_counters(), await bench.nic_counters()
    await bench.request(Service.SWITCH, b"\x47\x01", sport=50000, src_ip=worker_ip)
    await bench.request(Service.NIC_RX, b"\x47\x01\x01", sport=42100)
    await bench.request(Service.NIC_RX, b"\x46", sport=42101)
    await bench.request(Service.NIC_RX, b"", sport=42102)
    await bench.quiet()
    s1, n1 = await bench.switch_counters(), await bench.nic_counters()
    assert delta(s0, s1) == {"packets": 1, "drop_bad_length": 1}
    assert delta(n0, n1) == {("rx", "packets"): 3, ("rx", "drop_bad_k"): 1,
                             ("rx", "drop_bad_header"): 2}
    await good_round_trip(42200)
    assert not bench.bad_frames


# -- the golden board ------------------------------------------------------------------------

@cocotb.test(timeout_time=4000, timeout_unit="us")
async def golden_board(dut):
    """The same datagrams through the golden board (``host.board.golden.GoldenBoard``, the
    executable form of ``docs/network-contract.md``) and through the network top: the same
    replies, byte for byte, from the same ports to the same addresses, in the same order,
    and in the end the same counters (a ``CTRL`` read through both). Every service and
    every front-end corner of the contract: short and odd-length datagrams, the worker
    table and its widths, entries the board does not hold, multicast and unicast results,
    a result group, a stranger, every refused control request, a wrong key, closed ports, another IP."""
    from host.board.backend import Datagram
    from host.board.golden import GoldenBoard
    from host.golden.inceptionn import nic_tx
    from host.switchml.window import make_packets
    from sim.nic_stimulus import rx_traffic, tx_traffic
    bench = await started(dut)
    rng = rng_of("golden_board", 7)
    np_rng = np.random.default_rng(rng.getrandbits(32))
    golden = GoldenBoard(bench.key, ip=bench.board_ip, mac=bench.board_mac,
                         port_base=bench.ports[Service.NIC_TX], link=bool(int(dut.link.value)))
    workers = []
    for w in range(3):
        ip, mac = worker_address(w)
        bench.hosts[ip] = mac
        workers.append((ip, 51000 + w))
    jobs, table = SWITCH_REGISTERS["job"], NET_REGISTERS["worker"]
    net = lambda name: network_address("net", NET_REGISTERS[name].address)
    entry = lambda job, w, field: network_address("net", table.address(job * 32 + w, field))
    job_reg = lambda job, field: network_address("switch", jobs.address(job, field))
    # Job 3, slots 16..19 and worker table entries no other bench of this module writes:
    # the benches share one simulation, and the table keeps its entries through a reset.
    job, slot_base = 3, 16
    commit = job_reg(job, "commit")
    sent = 0

    async def both(payload, service, *, src=(HOST_IP, 40500), dst_ip=None):
        """One datagram to both boards; the board's replies must be the golden board's."""
        nonlocal sent
        sent += 1
        port = bench.ports[service] if isinstance(service, Service) else service
        dst_ip = dst_ip or bench.board_ip
        want = golden.deliver([Datagram(src[0], src[1], dst_ip, port, bytes(payload))])
        await bench.request(port, payload, sport=src[1], src_ip=src[0],
                            **({"dst_ip": dst_ip} if dst_ip != bench.board_ip else {}))
        for n, reply in enumerate(want):
            (dst, src_port, dst_port, got), _ = await bench.next_udp()
            assert (dst, src_port, dst_port) == (reply.dst_ip, reply.src_port,
                                                 reply.dst_port), f"datagram {sent} reply {n}"
            if got != reply.payload and payload[2:3] == bytes([CTRL_TYPE]) and \
                    len(got) == len(reply.payload):
                # a commit takes the gateware some cycles (its slots are cleared), the
                # model none: the commit's read-back may say BUSY
                pairs = [struct.unpack_from("<II", got, o) for o in range(32, len(got), 8)]
                fixed = bytearray(got)
                for k, (addr, value) in enumerate(pairs):
                    if addr == commit and value & ~1 == 0:
                        struct.pack_into("<I", fixed, 36 + 8 * k, 0)
                got = bytes(fixed)
            assert got == reply.payload, f"datagram {sent} reply {n}: {got.hex()} " \
                                         f"vs {reply.payload.hex()}"
        return want

    ctrl = bench.ctrl_packet
    # the board's own registers, unmapped and foreign addresses, the engines' registers
    await both(ctrl(CtrlOp.READ, [(a, 0) for a in (
        net("mac_high"), net("mac_low"), net("ip"), net("port_base"), net("services"),
        net("link"), network_address("net", 0xFFF0), 3 << 16, network_address("nic", 0),
        network_address("nic", 0x7FFF), network_address("switch", SWITCH_REGISTERS["params"]
                                                        .address))]), Service.CTRL)
    # the worker table (a 16-bit port keeps its low bits; entries beyond the switch's jobs
    # and workers ignore writes; read-only registers too), then a 2-worker job. Worker 3's
    # entry (the third host's address) is beyond the job's n = 2: a multicast result goes
    # to workers 0 and 1 only.
    ip_int = lambda ip: int.from_bytes(bytes(int(x) for x in ip.split(".")), "big")
    pairs = [(entry(job, w, field), value)
             for w, (ip, port) in ((0, workers[0]), (1, workers[1]), (3, workers[2]))
             for field, value in (("ip", ip_int(ip)), ("port", port))]
    pairs += [(entry(2, 5, "port"), 0x1_2345), (entry(4, 0, "port"), 7),
              (entry(0, 31, "ip"), 0xDEADBEEF), (net("ip"), 1), (net("port_base"), 9)]
    pairs += [(job_reg(job, "workers"), 2), (job_reg(job, "slot_base"), slot_base),
              (job_reg(job, "slot_count"), 4)]
    await both(ctrl(CtrlOp.WRITE, pairs), Service.CTRL)
    await both(ctrl(CtrlOp.WRITE, [(commit, COMMIT)]), Service.CTRL)
    await Timer(2000, "ns")        # the gateware clears the job's slots

    # NIC: spec packets, then a short and an odd-length datagram to each path
    for packet in tx_traffic(np_rng, 6, max_values=300)[:6]:
        if len(packet.to_bytes()) <= MAX_DATAGRAM:
            await both(packet.to_bytes(), Service.NIC_TX)
    for packet in rx_traffic(np_rng, 6, max_count=300)[:6]:
        if len(packet.to_bytes()) <= MAX_DATAGRAM:
            await both(packet.to_bytes(), Service.NIC_RX)
    good = tx_traffic(np_rng, 1, max_values=40)[0].to_bytes()
    for service in (Service.NIC_TX, Service.NIC_RX):
        for payload in (b"", b"\x47", good[:13], good + b"\x01\x02\x03",
                        nic_tx(Packet.from_bytes(good))[0].to_bytes()[:-1]):
            await both(payload, service)

    # switch: a window of chunks from both workers (multicast to both), a resend (unicast),
    # a stranger, a worker the board has no entry for, a job beyond the switch's, a
    # datagram shorter than a header, a length that is not 32 + 4 * P
    chunks = [make_packets(np_rng.integers(0, 2**32, 4 * 64, dtype=np.uint64)
                           .astype(np.uint32), op=PacketType.AGG_ADD_I32, job=job, worker=w,
                           slot_base=slot_base, slot_count=4, lanes=64) for w in range(2)]
    sends = [(w, p) for w in range(2) for p in chunks[w]]
    rng.shuffle(sends)
    for w, packet in sends:
        await both(packet.to_bytes(), Service.SWITCH, src=workers[w])
    await both(chunks[1][2].to_bytes(), Service.SWITCH, src=workers[1])
    await both(chunks[1][0].to_bytes(), Service.SWITCH, src=workers[0])
    for other_job, worker in ((job, 2), (job, 40), (6, 0)):
        h = Header(type=PacketType.AGG_OR32, job=other_job, worker=worker, count=64).pack()
        await both(h + bytes(256), Service.SWITCH, src=workers[0])
    await both(b"\x47\x01\x02", Service.SWITCH, src=workers[0])
    # shorter than a header but naming a (job, worker): checked, from a stranger too
    await both(chunks[0][0].to_bytes()[:20], Service.SWITCH, src=workers[0])
    await both(chunks[0][0].to_bytes()[:20], Service.SWITCH, src=(HOST_IP, 40777))
    await both(chunks[0][0].to_bytes()[:-2], Service.SWITCH, src=workers[0])

    # the job's result group (and one for a job beyond the switch's, which keeps none):
    # each multicast result once, to the group; a resend still answered to its worker
    group = NET_REGISTERS["group"]
    group_reg = lambda job, field: network_address("net", group.address(job, field))
    await both(ctrl(CtrlOp.WRITE, [(group_reg(job, "ip"), ip_int("239.77.0.3")),
                                   (group_reg(job, "port"), 0x1_BA5E),
                                   (group_reg(6, "ip"), ip_int("239.77.0.6")),
                                   (group_reg(6, "port"), 47706)]), Service.CTRL)
    chunks = [make_packets(np_rng.integers(0, 2**32, 4 * 64, dtype=np.uint64)
                           .astype(np.uint32), op=PacketType.AGG_ADD_I32, job=job, worker=w,
                           slot_base=slot_base, slot_count=4, lanes=64, first_chunk=4)
              for w in range(2)]
    sends = [(w, p) for w in range(2) for p in chunks[w]]
    rng.shuffle(sends)
    for w, packet in sends:
        await both(packet.to_bytes(), Service.SWITCH, src=workers[w])
    await both(chunks[0][1].to_bytes(), Service.SWITCH, src=workers[0])
    await both(ctrl(CtrlOp.READ, [(group_reg(j, f), 0) for j in (job, 6)
                                  for f in ("ip", "port")]), Service.CTRL)

    # a leaf of a tree (aggregator-protocol.md section 4): job 3 again, now with an upstream
    # (and still its result group). Completions and a resend of a pending round go
    # upstream; results from upstream make rounds final and go on to the group; a
    # duplicate, a round neither pending nor final, and results from strangers (another
    # job at the upstream, another port, a worker's address) are dropped; a final round
    # answers a resend.
    up_regs = SWITCH_REGISTERS["upstream"]
    up_reg = lambda job, field: network_address("switch", up_regs.address(job, field))
    up_host, up_mac = worker_address(5)
    bench.hosts[up_host] = up_mac
    up_port, up_job, up_worker = bench.ports[Service.SWITCH], 9, 4
    await both(ctrl(CtrlOp.WRITE, [(up_reg(job, "ip"), ip_int(up_host)),
                                   (up_reg(job, "port"), 1 << 16 | up_port),
                                   (up_reg(job, "job"), 1 << 8 | up_job),
                                   (up_reg(job, "worker"), up_worker),
                                   (commit, COMMIT)]), Service.CTRL)
    await Timer(2000, "ns")
    # read back from the upstream's host: it asks for the board's MAC first, so the board
    # knows its MAC when it first sends it an aggregate (the ARP counters stay 0)
    await both(ctrl(CtrlOp.READ, [(up_reg(job, f), 0) for f in ("ip", "port", "job", "worker")]
                    + [(up_reg(6, "ip"), 0)]), Service.CTRL, src=(up_host, 40600))
    chunks = [make_packets(np_rng.integers(0, 2**32, 4 * 64, dtype=np.uint64)
                           .astype(np.uint32), op=PacketType.AGG_ADD_I32, job=job, worker=w,
                           slot_base=slot_base, slot_count=4, lanes=64, first_chunk=8)
              for w in range(2)]
    sends = [(w, p) for w in range(2) for p in chunks[w][:3]]
    rng.shuffle(sends)
    for w, packet in sends:
        await both(packet.to_bytes(), Service.SWITCH, src=workers[w])
    await both(chunks[1][0].to_bytes(), Service.SWITCH, src=workers[1])     # pending: again
    await both(chunks[0][3].to_bytes(), Service.SWITCH, src=workers[0])     # round still open

    def from_upstream(packet, **changes):
        fields = dict(flags=Flags.RESULT, job=up_job, worker=0xFF,
                      exponent=rng.randrange(-128, 128))
        header = packet.header.replace(**{**fields, **changes})
        return Packet(header, bytes(rng.getrandbits(8) for _ in range(256))).to_bytes()

    upstream_src = (up_host, up_port)
    result = from_upstream(chunks[0][0])
    await both(result, Service.SWITCH, src=upstream_src)                     # final: to group
    await both(result, Service.SWITCH, src=upstream_src)                     # duplicate
    await both(from_upstream(chunks[0][1], worker=up_worker), Service.SWITCH, src=upstream_src)
    await both(from_upstream(chunks[0][3]), Service.SWITCH, src=upstream_src)  # open round
    for stranger, src in ((from_upstream(chunks[0][2], job=up_job + 1), upstream_src),
                          (from_upstream(chunks[0][2]), (up_host, up_port + 1)),
                          (from_upstream(chunks[0][2]), workers[0])):
        await both(stranger, Service.SWITCH, src=src)
    await both(chunks[1][0].to_bytes(), Service.SWITCH, src=workers[1])     # final: answered
    await both(chunks[0][2].to_bytes(), Service.SWITCH, src=workers[0])     # pending: again

    # control: short, wrong key, refused (count, op, type, payload length)
    request = ctrl(CtrlOp.READ, [(net("ip"), 0)])
    for bad in (request[:20], ctrl(CtrlOp.READ, [(net("ip"), 0)], key=bench.key ^ 1 << 63),
                ctrl(CtrlOp.READ, [(net("ip"), 0)], count=0),
                ctrl(CtrlOp.READ, [(net("ip"), 0)] * 2, count=1), ctrl(5, [(net("ip"), 0)]),
                b"\x47\x01\x00" + request[3:], request + b"\x00" * 4):
        await both(bad, Service.CTRL)
    # closed ports, another address
    for port in (bench.ports[Service.NIC_TX] - 1, bench.ports[Service.CTRL] + 1):
        await both(good, port)
    await both(good, Service.NIC_TX, dst_ip=OTHER_IP)

    # the counters, through both: the network's (all but the ARP ones: the golden board
    # works on datagrams and has no ARP cache), the NIC's and the switch's
    names = [n for n in NET_COUNTERS if not n.startswith("arp_")]
    block = NET_REGISTERS["counter"]
    await both(ctrl(CtrlOp.READ, [(network_address("net", block.address(n)), 0)
                                  for n in names]), Service.CTRL)
    nic = [network_address("nic", NIC_REGISTERS[p].address(n)) for p, names_ in
           (("tx", NIC_TX_COUNTERS), ("rx", NIC_RX_COUNTERS)) for n in names_]
    switch = [network_address("switch", SWITCH_REGISTERS["counter"].address(n))
              for n in AGG_COUNTERS]
    for start in range(0, len(nic + switch), CTRL_MAX_PAIRS):
        await both(ctrl(CtrlOp.READ, [(a, 0) for a in (nic + switch)[start:start +
                                                                     CTRL_MAX_PAIRS]]),
                   Service.CTRL)
    await bench.quiet()
    hardware = await bench.net_counters()
    # every host asked for the board's MAC before its first datagram: the board never did
    assert hardware["arp_miss"] == 0 and hardware["arp_unreachable"] == 0
    assert hardware["arp_busy_drop"] == 0
    assert not bench.bad_frames
    dut._log.info("golden board: %d datagrams, counters %s", sent,
                  {k: v for k, v in golden.counters.items() if v})


# -- line rate ------------------------------------------------------------------------------

#: Bytes a frame takes on the wire besides its payload: preamble and SFD, FCS, the gap.
WIRE_OVERHEAD = 8 + 4 + 12


def wire_bytes(frame):
    """Bytes on the wire of a cocotbext-eth frame (padded payload + overhead)."""
    return len(frame.get_payload()) + WIRE_OVERHEAD


async def burst(bench, sends):
    """Send ``sends`` (service, payload, src_ip, sport, key) back to back; wait for one
    reply per send, matched by ``key(udp tuple)``. Returns [(send, request frame, udp tuple,
    reply frame)] in send order."""
    frames = []
    for service, payload, ip, sport, key in sends:
        frames.append(await bench.request(service, payload, sport=sport, src_ip=ip))
    out = [None] * len(sends)
    keys = {send[4]: n for n, send in enumerate(sends)}
    for _ in sends:
        udp, frame = await bench.next_udp(1_000_000)
        k = (udp[0], udp[2]) if udp[2] != 50000 else (udp[0], udp[2],
                                                     Header.parse(udp[3]).seq)
        n = keys.pop(k)
        out[n] = (sends[n], frames[n], udp, frame)
    # every request has gone out by now (its reply came back)
    out = [(send, sent[0], udp, frame) for send, sent, udp, frame in out]
    return out


def rates(results):
    """Per-burst figures: the request and reply wire rates (datagrams/s at 1 Gb/s), the
    measured rates, and the latency of each datagram, last byte in to first byte out."""
    first_in = results[0][1].sim_time_start
    last_in = results[-1][1].sim_time_start
    outs = sorted(r[3].sim_time_start for r in results)
    n = len(results)
    ps_per_s = 1e12
    wire_in = sum(wire_bytes(r[1]) for r in results) / n
    wire_out = sum(wire_bytes(r[3]) for r in results) / n
    latency_ps = [r[3].sim_time_start - r[1].sim_time_end for r in results]
    return {
        "datagrams": n,
        "request_bytes": wire_in, "reply_bytes": wire_out,
        "limit_in_per_s": 1e9 / (8 * wire_in), "limit_out_per_s": 1e9 / (8 * wire_out),
        "sent_per_s": (n - 1) * ps_per_s / (last_in - first_in),
        "replies_per_s": (n - 1) * ps_per_s / (outs[-1] - outs[0]),
        "latency_cycles": [round(t / ENGINE_PS, 1) for t in latency_ps],
    }


@cocotb.test(timeout_time=3000, timeout_unit="us")
async def line_rate(dut):
    """Back-to-back datagrams at line rate, first to each service alone, then to all four
    at once: every reply exact and to its requester, no datagram dropped; the figures
    (datagrams per second against the 1 Gb/s wire, latency from the last byte of a
    request in to the first byte of its reply out, in engine cycles) go to the report."""
    from host.golden.aggregator import AggregatorModel
    from host.golden.inceptionn import nic_rx, nic_tx
    from host.switchml.window import chunk_slot
    from sim.nic_stimulus import tx_packet, value_mix
    bench = await started(dut)
    params = params_of("line_rate")
    rng = rng_of("line_rate", 6)
    np_rng = np.random.default_rng(rng.getrandbits(32))
    per_service = params.get("per_service", 6)
    values = params.get("values", 360)      # a standard 1500-byte MTU's worth
    worker_ip, worker_mac = worker_address(0)
    bench.hosts[worker_ip] = worker_mac
    slots = 16
    await bench.configure_job(0, 1, 0, slots, [(worker_ip, 50000)])
    model = AggregatorModel()
    model.configure_job(0, 1, 0, slots)
    board_ip = int.from_bytes(bytes(int(x) for x in bench.board_ip.split(".")), "big")
    ip_register = network_address("net", NET_REGISTERS["ip"].address)
    agg_seq = 0

    def make(service, n, rng=None):
        """(send, expected reply) of request ``n`` to ``service`` (a switch request's
        payload from ``rng``, default the bench's)."""
        nonlocal agg_seq
        if service is Service.NIC_TX:
            raw = tx_packet(value_mix(np_rng, values, 10), 10, seq=n)
            return (service, raw.to_bytes(), HOST_IP, 43000 + n, (HOST_IP, 43000 + n)), \
                nic_tx(raw)[0].to_bytes()
        if service is Service.NIC_RX:
            comp = nic_tx(tx_packet(value_mix(np_rng, values, 10), 10, seq=n))[0]
            return (service, comp.to_bytes(), HOST_IP, 44000 + n, (HOST_IP, 44000 + n)), \
                nic_rx(comp)[0].to_bytes()
        if service is Service.SWITCH:
            # one worker: every packet completes its slot; slots reused in turn
            seq, agg_seq = agg_seq, agg_seq + 1
            slot, version = chunk_slot(seq, 0, slots)
            agg = Packet(Header(type=PacketType.AGG_ADD_I32, job=0, worker=0, count=64,
                                slot=slot, slot_version=version, seq=seq,
                                offset=64 * seq), (rng or np_rng).bytes(256))
            return (service, agg.to_bytes(), worker_ip, 50000, (worker_ip, 50000, seq)), \
                model.process(agg)[0].to_bytes()
        ctrl = bench.ctrl_packet(CtrlOp.READ, [(ip_register, 0)] * 8)
        reply = bytearray(ctrl)
        reply[3] |= Flags.RESULT
        for p in range(8):
            struct.pack_into("<I", reply, HEADER_BYTES + 8 * p + 4, board_ip)
        return (service, ctrl, HOST_IP, 45000 + n, (HOST_IP, 45000 + n)), bytes(reply)

    async def run_burst(cases):
        results = await burst(bench, [send for send, _ in cases])
        for (send, want), (_, _, udp, _) in zip(cases, results):
            assert udp[1] == bench.ports[send[0]], udp[:3]
            assert udp[3] == want, f"{send[0].value} reply to {send[4]}"
        return results

    # The board resolves a host's MAC at its first datagram to it (LiteEth's ARP cache), and
    # the bench's ARP answer queues behind a burst's requests (one RGMII source), so the
    # switch's first burst would measure the worker's ARP exchange, not the switch path:
    # one datagram to the switch first puts the worker in the cache. (Its payload has a
    # generator of its own: the bursts' stimulus stays as it was.)
    await run_burst([make(Service.SWITCH, 0, np.random.default_rng(0))])
    c0 = await bench.net_counters()
    report = {}
    services = [Service.NIC_TX, Service.NIC_RX, Service.SWITCH, Service.CTRL]
    for service in services:
        report[service.value] = rates(await run_burst(
            [make(service, n) for n in range(per_service)]))
    mixed = [make(service, per_service + n) for n in range(per_service)
             for service in services]
    results = await run_burst(mixed)
    report["mixed"] = {"datagrams": len(results),
                       "latency_cycles": rates(results)["latency_cycles"]}
    dut._log.warning("line rate: %s", json.dumps(report))
    if params.get("report_file"):
        with open(params["report_file"], "w") as f:
            json.dump(report, f)
    d = delta(c0, await bench.net_counters())
    assert not any(d.get(k) for k in NET_COUNTERS if k.startswith(("drop", "rx_", "ip_"))), d
    assert not d.get("arp_miss"), f"an ARP exchange inside the measured bursts: {d}"
    assert not bench.bad_frames
