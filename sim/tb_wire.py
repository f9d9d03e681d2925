"""cocotb benches of the NIC in the wire (``sim/wire_top.py``) through both ports' RGMII pins.

The gateware of a two-port board: both ports' LiteEth PHY and MAC (with
``sim/ecp5_models.v``) and the :class:`~hdl.wire.engine.WireEngine` between them, on one
62.5 MHz clock. cocotbext-eth's ``RgmiiSource``/``RgmiiSink`` play each port's PHY chip, on a
receive clock of its own: port 0's (the host side) 500 ppm slow, port 1's (the network side)
500 ppm fast, so that both of LiteEth's clock crossings really cross (and a port's transmit
clock, which LiteEth takes from its receive clock, runs at the same rate). Every frame goes
to a :class:`~host.board.wire_golden.GoldenWire` as well, and the frames out of each port are
compared with the golden model's byte for byte (the FCS checked, then stripped; the golden
model pads a short frame with zeros to 60 bytes as the MAC does, so the padding is compared
too), and every counter read back over ``ctrl`` (``contract.registers.WIRE_REGISTERS``) with
the golden model's. The board's own service answers on port 0 (ARP, ping, ``CTRL`` with the
simulation key); port 0's replies and the network's frames are each compared in order
(the golden model takes the ports' frames one after the other, the gateware at once).

The frames come from the stimulus the Amaranth-simulator tests share (``sim/frames.py``,
``sim/wire_stimulus.py``), so both kinds of bench see the same cases.

Launched from ``tests/hdl/wire/test_wire_top.py``, all tests in one simulator run; each
test's parameters are ``params[test name]`` (:func:`params_of`).
"""
from __future__ import annotations

import json
import random
import time

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, Event, RisingEdge, Timer, with_timeout
from cocotb.utils import get_sim_time
from cocotbext.eth import GmiiFrame, RgmiiSink, RgmiiSource
from scapy.layers.inet import ICMP, IP, UDP
from scapy.layers.l2 import ARP, Ether

from contract.network import SIMULATION_KEY, WIRE_PORTS, mac_to_int
from contract.registers import WIRE_REGISTERS
from hdl.net.core.liteeth import load_network_config
from host.board.wire_golden import FCS_BYTES, GoldenWire, with_fcs
from sim import frames as stim
from sim import wire_stimulus
from sim.runner import test_params

#: each port's PHY receive (and so transmit) clock: port 0 500 ppm slow, port 1 500 ppm fast
RGMII_PS = {0: 8004, 1: 7996}
#: bytes a frame takes on the wire besides its own (FCS excluded): preamble, SFD and the
#: minimum inter-frame gap; with the FCS, a frame of ``L`` bytes occupies ``L + 4 + 20``
WIRE_OVERHEAD = FCS_BYTES + 8 + 12
#: the control key of the simulation top (``hdl.wire.top.WireTop``'s default)
KEY = SIMULATION_KEY
BOARD = "versa"


def params_of(test):
    """One cocotb test's parameters: ``params[test]`` (one simulator run serves every test
    of this module, :mod:`tests.hdl.wire.test_wire_top`)."""
    return test_params().get(test, {})


def rng_of(test, default):
    return random.Random(params_of(test).get("seed", default))


class Sent:
    """One frame sent into a port: its bytes (FCS included), its name, and the source's copy
    of it once on the wire (``sim_time_start``/``sim_time_end`` in ps)."""

    def __init__(self, port, name, data):
        self.port, self.name, self.data = port, name, data
        self.wire = None

    def done(self, frame):
        self.wire = frame


class WireBench:
    """The wire top's clocks and reset, a PHY model (source and sink) per port, a collector
    per port, the golden model beside it, and the register port.

    :meth:`send` gives a frame to a port and to the golden model, which says what each port
    must send in answer (:attr:`expected`); the collectors gather what each port does send
    (:attr:`received`); :meth:`check` waits for them and compares.
    """

    def __init__(self, dut, board=BOARD):
        self.dut = dut
        self.config = load_network_config(board)
        self.sys_ps = round(1e12 / self.config.sys_clk_hz)
        cocotb.start_soon(Clock(dut.clk, self.sys_ps, unit="ps").start())
        self.sources, self.sinks = {}, {}
        for p in WIRE_PORTS:
            pins = {pin: getattr(dut, f"rgmii{p}_{pin}") for pin in
                    ("rx_clk", "rx_ctl", "rx_data", "tx_clk", "tx_ctl", "tx_data")}
            cocotb.start_soon(Clock(pins["rx_clk"], RGMII_PS[p], unit="ps").start())
            self.sources[p] = RgmiiSource(pins["rx_data"], pins["rx_ctl"], pins["rx_clk"])
            self.sinks[p] = RgmiiSink(pins["tx_data"], pins["tx_ctl"], pins["tx_clk"])
            for model in (self.sources[p], self.sinks[p]):
                model.log.setLevel("WARNING")
        dut.ctrl__re.value = 0
        dut.ctrl__addr.value = 0
        #: per port, what it sent: (frame bytes without the FCS, the sink's GmiiFrame)
        self.received = {p: [] for p in WIRE_PORTS}
        #: per port, frames it sent with a bad FCS or no SFD (raw, preamble included)
        self.bad = {p: [] for p in WIRE_PORTS}
        self._arrived = Event()
        for p in WIRE_PORTS:
            cocotb.start_soon(self._collect(p))
        self.new_golden()

    def new_golden(self):
        """A fresh golden model (after a reset): nothing expected, nothing received."""
        self.golden = GoldenWire(KEY, ip=self.config.ip_address, mac=self.config.mac_address)
        #: per port, what it must send: (frame bytes without the FCS, the Sent it answers)
        self.expected = {p: [] for p in WIRE_PORTS}
        self.sent = {p: [] for p in WIRE_PORTS}
        for p in WIRE_PORTS:
            self.received[p].clear()
            self.bad[p].clear()

    async def _collect(self, p):
        while True:
            frame = await self.sinks[p].recv()
            try:
                good = frame.check_fcs()
            except ValueError:          # no SFD: a frame cut short
                good = False
            if good:
                self.received[p].append((bytes(frame.get_payload()), frame))
            else:
                self.bad[p].append(bytes(frame.data))
            self._arrived.set()

    async def reset(self, cycles=10):
        self.dut.rst.value = 1
        await ClockCycles(self.dut.clk, cycles)
        self.dut.rst.value = 0
        await ClockCycles(self.dut.clk, 20)

    # -- frames ------------------------------------------------------------------------

    def send(self, port, name, data, *, error_at=None):
        """``data`` (a frame, FCS included) into ``port`` after whatever is queued there,
        with the minimum gap; the golden model's answers join :attr:`expected`. With
        ``error_at``, the PHY flags a receive error on that frame byte."""
        sent = Sent(port, name, bytes(data))
        self.sent[port].append(sent)
        for out_port, out in self.golden.receive(port, sent.data):
            self.expected[out_port].append((out[:-FCS_BYTES], sent))
        frame = GmiiFrame.from_raw_payload(sent.data, tx_complete=sent.done)
        if error_at is not None:
            frame.error = [0] * len(frame.data)
            frame.error[8 + error_at] = 1
        self.sources[port].send_nowait(frame)
        return sent

    def send_all(self, cases):
        """``cases[port]``: lists of ``(name, data)`` or ``(name, data, error_at)``."""
        for port in WIRE_PORTS:
            for case in cases[port]:
                self.send(port, case[0], case[1],
                          error_at=case[2] if len(case) > 2 else None)

    async def settle(self, *, quiet_ns=20_000, timeout_ns=None):
        """Wait until every port has sent as many frames as expected, then ``quiet_ns``
        more (nothing else may come)."""
        if timeout_ns is None:
            queued = sum(len(s.data) + WIRE_OVERHEAD for p in WIRE_PORTS for s in self.sent[p])
            timeout_ns = 50_000 + 40 * queued
        start = get_sim_time("ns")
        while any(len(self.received[p]) < len(self.expected[p]) for p in WIRE_PORTS):
            left = timeout_ns - (get_sim_time("ns") - start)
            if left <= 0:
                got, want = await self.counters(), self.golden_counters()
                differ = {f"{b}.{n}": (got[b][n], want[b][n]) for b in want for n in want[b]
                          if got[b][n] != want[b][n]}
                raise AssertionError(
                    f"frames out {[len(self.received[p]) for p in WIRE_PORTS]}, expected "
                    f"{[len(self.expected[p]) for p in WIRE_PORTS]} after {timeout_ns} ns; "
                    f"{self.describe_missing()}; counters (read, golden) that differ: {differ}")
            self._arrived.clear()
            try:
                await with_timeout(self._arrived.wait(), int(left) + 1, "ns")
            except cocotb.triggers.SimTimeoutError:
                pass
        for p in WIRE_PORTS:
            await self.sources[p].wait()
        await Timer(quiet_ns, "ns")

    def describe_missing(self):
        lines = []
        for p in WIRE_PORTS:
            n = len(self.received[p])
            if n < len(self.expected[p]):
                got = {g for g, _ in self.received[p]}
                missing = [s.name for w, s in self.expected[p] if w not in got]
                lines.append(f"port {p} missing: {missing}")
        return "; ".join(lines)

    def check_frames(self):
        """Every frame out of each port byte for byte the golden model's, none more, none
        with a bad FCS."""
        problems = []
        mac = mac_to_int(self.config.mac_address).to_bytes(6, "big")
        for p in WIRE_PORTS:
            if self.bad[p]:
                problems.append(f"port {p}: {len(self.bad[p])} frames with a bad FCS")
            for replies in (True, False):
                what = f"port {p}" + (" reply" if replies else "")
                want = [e for e in self.expected[p] if (e[0][6:12] == mac) == replies]
                got = [r for r in self.received[p] if (r[0][6:12] == mac) == replies]
                if len(got) != len(want):
                    problems.append(f"{what}: {len(got)} frames, golden {len(want)}")
                    problems.append(f"{what} golden: {[s.name for _, s in want]}; lengths "
                                    f"{[len(w) for w, _ in want]}, got "
                                    f"{[len(g) for g, _ in got]}")
                for n, ((w, sent), (g, _)) in enumerate(zip(want, got)):
                    if w != g:
                        at = next((i for i, (a, b) in enumerate(zip(w, g)) if a != b),
                                  min(len(w), len(g)))
                        problems.append(f"{what} frame {n} ({sent.name!r} from port "
                                        f"{sent.port}): {len(g)} bytes, golden {len(w)}, "
                                        f"first difference at byte {at}")
        assert not problems, "\n".join(problems[:20])

    # -- registers ---------------------------------------------------------------------

    async def read_register(self, address):
        """One read on the ctrl port: ``ctrl__rdata`` is valid the cycle after ``ctrl__re``
        (in a cycle the board's service leaves the registers free)."""
        dut = self.dut
        while not dut.ctrl_free.value:
            await RisingEdge(dut.clk)
        dut.ctrl__addr.value = address
        dut.ctrl__re.value = 1
        await RisingEdge(dut.clk)
        dut.ctrl__re.value = 0
        await RisingEdge(dut.clk)      # sampled right after the edge: the registered value
        return int(dut.ctrl__rdata.value)

    async def counters(self):
        """Every register of ``WIRE_REGISTERS``, by block and name."""
        await ClockCycles(self.dut.clk, 4)     # the last strobes land
        return {entry.name: {name: await self.read_register(address)
                             for name, address in entry.items()}
                for entry in WIRE_REGISTERS}

    def golden_counters(self):
        """The golden model's counters by ``WIRE_REGISTERS`` block."""
        return wire_stimulus.gateware_counters(self.golden)

    async def check_counters(self):
        """Every counter read back equal to the golden model's; returns them."""
        got, want = await self.counters(), self.golden_counters()
        wrong = [f"{block}.{name}: {got[block][name]}, golden {want[block][name]}"
                 for block in want for name in want[block] if got[block][name] != want[block][name]]
        assert not wrong, "counters differ: " + "; ".join(wrong)
        return want

    async def check(self, **kwargs):
        """:meth:`settle`, then frames and counters exact; returns the counters."""
        await self.settle(**kwargs)
        self.check_frames()
        return await self.check_counters()


async def started(dut):
    bench = WireBench(dut)
    await bench.reset()
    return bench


def log_speed(dut, name, sim_start_ns, wall_start):
    sim_ns = get_sim_time("ns") - sim_start_ns
    wall = time.perf_counter() - wall_start
    dut._log.warning("%s: %.0f us simulated in %.1f s (%.0f sys cycles/s)", name, sim_ns / 1000,
                     wall, sim_ns / 16 / max(wall, 1e-9))


def check_reframed(body):
    """A re-framed datagram's IPv4 total length, header checksum and UDP length are what
    scapy computes from its headers and payload, its UDP checksum 0."""
    pkt = Ether(body)
    ip, udp = pkt[IP], pkt[UDP]
    again = Ether(body)
    del again[IP].chksum, again[IP].len, again[UDP].len
    again = Ether(bytes(again))
    assert (ip.len, ip.chksum, udp.len) == (again[IP].len, again[IP].chksum, again[UDP].len), \
        f"re-framed headers: {(ip.len, ip.chksum, udp.len)}, scapy " \
        f"{(again[IP].len, again[IP].chksum, again[UDP].len)}"
    assert udp.chksum == 0, f"UDP checksum {udp.chksum:#x}, not 0"


# -- the cases -----------------------------------------------------------------------------
# (``stim``: sim/frames.py, the frames the Amaranth-simulator tests send too)

def pass_through_cases():
    """Every class of frame that passes unchanged, both directions."""
    cases = [(f"pass: {name}", stim.frame(pkt)) for name, pkt in stim.PASS_THROUGH.items()]
    cases += [
        ("minimum 60", stim.body_of(60)),
        ("icmp, non-zero padding", stim.padded(Ether(src=stim.A_MAC, dst=stim.B_MAC)
                                               / IP(src=stim.A_IP, dst=stim.B_IP) / ICMP()
                                               / b"pad", 15)),
        ("broadcast", stim.frame(Ether(src=stim.A_MAC, dst="ff:ff:ff:ff:ff:ff")
                                 / IP(src=stim.A_IP, dst="255.255.255.255") / UDP(dport=9)
                                 / b"all")),
        ("1514", stim.body_of(1514)),
    ]
    return cases


# -- tests ---------------------------------------------------------------------------------

@cocotb.test(timeout_time=3000, timeout_unit="us")
async def pass_through(dut):
    """Every pass-through class, both directions at once, back to back: out unchanged."""
    t0, s0 = time.perf_counter(), get_sim_time("ns")
    bench = await started(dut)
    rng = rng_of("pass_through", 1)
    cases = []
    for port in WIRE_PORTS:
        port_cases = pass_through_cases()
        rng.shuffle(port_cases)
        cases.append(port_cases)
    bench.send_all(cases)
    c = await bench.check()
    for port in WIRE_PORTS:
        counts = c[f"port{port}"]
        assert counts["passed"] == counts["frames_in"] == len(cases[port]), counts
        assert c[f"port{1 - port}"]["frames_out"] == len(cases[port])
    log_speed(dut, "pass_through", s0, t0)


def compress_cases(rng):
    """Host side: RAW_F32 + COMPRESS at several sizes up to the MTU and every k, values that
    do not compress, other types and flags."""
    np_rng = np.random.default_rng(rng.getrandbits(32))
    cases = wire_stimulus.gradient_cases("tx")
    def gradient(n, k):
        return wire_stimulus.checksummed(
            stim.gradient(stim.raw_packet(stim.values(np_rng, n), k)), rng)

    for k in range(1, 16):
        n = 3 + k
        cases.append((f"k={k} {n} values", gradient(n, k)))
    for n, k in ((360, 1), (360, 15), (359, 4), (200, 7), (120, 13)):
        cases.append((f"{n} values k={k}", gradient(n, k)))
    cases += [(f"tx pass: {name}", stim.frame(pkt)) for name, pkt in stim.TX_PASSES.items()]
    cases += [(f"pass: {name}", stim.frame(stim.PASS_THROUGH[name]))
              for name in ("not compress", "aggregator packet", "other udp port")]
    rng.shuffle(cases)
    return cases


@cocotb.test(timeout_time=3000, timeout_unit="us")
async def compress(dut):
    """Gradient datagrams from the host (port 0) compressed on their way to port 1, bit for
    bit the golden model's; incompressible ones raw, others unchanged; the re-framed
    headers as scapy computes them."""
    t0, s0 = time.perf_counter(), get_sim_time("ns")
    bench = await started(dut)
    rng = rng_of("compress", 2)
    cases = compress_cases(rng)
    bench.send_all([cases, []])
    c = await bench.check()
    reframed = [body for (body, sent) in bench.expected[1] if body != sent.data[:-FCS_BYTES]]
    assert len(reframed) == c["port0"]["compressed"]
    for body, _ in bench.received[1]:
        if body in reframed:
            check_reframed(body)
    counts = c["port0"]
    assert counts["compressed"] >= 25 and counts["incompressible"] >= 3, counts
    # (the NIC counts a packet whose payload disagrees with its count as length_mismatch,
    # compressed all the same)
    assert counts["passed"] >= 7 and c["tx"]["compressed"] + c["tx"]["length_mismatch"] \
        == counts["compressed"] + counts["incompressible"], c
    assert not bench.received[0]
    log_speed(dut, "compress", s0, t0)


def decompress_cases(rng):
    """Network side: INC_F32 datagrams the golden compressor made (sizes, k), the frames
    builders' INC_F32 cases, malformed ones and other types."""
    from host.golden.inceptionn import nic_tx
    from sim.nic_stimulus import value_mix
    from contract.header import Flags, Header, PacketType
    from contract.packet import Packet
    np_rng = np.random.default_rng(rng.getrandbits(32))
    cases = wire_stimulus.gradient_cases("rx") + wire_stimulus.malformed_cases()
    for n, k in ((360, 10), (360, 3), (250, 15), (100, 1), (17, 6), (1, 12)):
        raw = Packet(Header(type=PacketType.RAW_F32, flags=Flags.COMPRESS, k=k, count=n,
                            seq=n, offset=7), value_mix(np_rng, n, k))
        inc = nic_tx(raw)[0]
        cases.append((f"golden-compressed {n} k={k}",
                      wire_stimulus.checksummed(stim.gradient(inc.to_bytes()), rng)))
    cases += [(f"rx pass: {name}", stim.frame(pkt)) for name, pkt in stim.RX_PASSES.items()]
    rng.shuffle(cases)
    return cases


@cocotb.test(timeout_time=3000, timeout_unit="us")
async def decompress(dut):
    """INC_F32 datagrams from the network (port 1) decompressed on their way to the host,
    bit for bit; malformed ones dropped and counted, none reaching the host."""
    t0, s0 = time.perf_counter(), get_sim_time("ns")
    bench = await started(dut)
    rng = rng_of("decompress", 3)
    cases = decompress_cases(rng)
    bench.send_all([[], cases])
    c = await bench.check()
    counts = c["port1"]
    assert counts["drop_malformed"] >= len(wire_stimulus.malformed_cases()), counts
    assert not [s.name for _, s in bench.expected[0] if s.name.startswith("malformed")]
    assert counts["decompressed"] >= 15 and counts["passed"] >= 3, counts
    decompressed = [body for (body, sent) in bench.expected[0] if body != sent.data[:-FCS_BYTES]]
    for body in decompressed:
        check_reframed(body)
    assert not bench.received[1]
    log_speed(dut, "decompress", s0, t0)


def bad_frame_cases(port):
    """Bad FCS, runts, oversize, a receive error mid-frame, each followed by a good frame;
    frames for the board."""
    good = stim.frame(stim.gradient(stim.raw_packet(stim.SPECIALS, 10)))
    tcp = stim.frame(stim.PASS_THROUGH["tcp"])
    bad = [("bad fcs", stim.bad_fcs(good)),
           ("bad fcs, short", stim.bad_fcs(tcp)),
           ("runt 63", with_fcs(bytes(stim.gradient(bytes(17))).ljust(59, b"\0"))),
           ("runt 59", with_fcs(bytes(stim.gradient(bytes(5)))[:55])),
           ("runt 9 bytes", with_fcs(b"\x01\x02\x03\x04\x05")),
           ("oversize 9019", stim.body_of(9015)),
           ("oversize 9100", stim.body_of(9096)),
           ("receive error, bad fcs", stim.bad_fcs(good), 20)]
    cases = []
    for n, case in enumerate(bad):
        cases += [case, (f"after {case[0]}", good if n % 2 else tcp)]
    from contract.network import DEFAULT_IP, DEFAULT_MAC
    board_cases = [
        ("arp request for the board", stim.frame(Ether(src=stim.A_MAC, dst="ff:ff:ff:ff:ff:ff")
                                              / ARP(hwsrc=stim.A_MAC, psrc=stim.A_IP,
                                                    pdst=DEFAULT_IP))),
        ("ping the board", stim.frame(Ether(src=stim.A_MAC, dst=DEFAULT_MAC)
                                   / IP(src=stim.A_IP, dst=DEFAULT_IP) / ICMP() / b"ping")),
        ("udp to the board's mac", stim.frame(stim.gradient(stim.raw_packet(stim.SPECIALS, 10),
                                                      dst=(DEFAULT_MAC, stim.B_IP)))),
    ]
    return cases + board_cases + [("last", tcp)]


@cocotb.test(timeout_time=3000, timeout_unit="us")
async def bad_frames(dut):
    """Bad frames on both ports at once, back to back, each followed by a good frame that
    comes out exact; frames for the board answered on the host side, dropped on the network
    side (which cannot reach it)."""
    t0, s0 = time.perf_counter(), get_sim_time("ns")
    bench = await started(dut)
    bench.send_all([bad_frame_cases(0), bad_frame_cases(1)])
    c = await bench.check()
    for port in WIRE_PORTS:
        counts = c[f"port{port}"]
        assert (counts["drop_fcs"], counts["drop_runt"], counts["drop_oversize"]) == (3, 3, 2), \
            counts
    assert c["port0"]["answered"] == 2 and c["port0"]["drop_unanswered"] == 1
    assert c["port0"]["drop_board_address"] == 0
    assert c["port1"]["drop_board_address"] == 3 and c["port1"]["drop_unanswered"] == 0
    log_speed(dut, "bad_frames", s0, t0)


@cocotb.test(timeout_time=3000, timeout_unit="us")
async def board_service(dut):
    """The board's own address on the host side: ARP and ping among traffic both ways, then,
    the wire quiet, ``CTRL`` requests one at a time (every counter of the map, a write, a
    refused request, a wrong key): each reply byte for byte the golden model's, so the
    counters it carries are the golden model's as they stand."""
    from contract.network import CTRL_MAX_PAIRS, network_address
    t0, s0 = time.perf_counter(), get_sim_time("ns")
    bench = await started(dut)
    rng = rng_of("board_service", 8)
    host = stim.arp_cases()[:3] + stim.ping_cases(rng)[:8] + wire_stimulus.pass_cases("tx")[:6]
    rng.shuffle(host)
    bench.send_all([host, wire_stimulus.pass_cases("rx")[:6]
                    + wire_stimulus.gradient_cases("rx", mtu=False)[:6]])
    c = await bench.check()
    assert c["port0"]["answered"] == 3 + 8, c["port0"]
    addresses = [network_address("wire", a) for entry in WIRE_REGISTERS
                 for _, a in entry.items()][:CTRL_MAX_PAIRS]
    requests = [("read every counter", [(a, 0) for a in addresses], {}),
                ("write", [(a, rng.getrandbits(32)) for a in addresses[:5]], {"op": 1}),
                ("refused", [(addresses[0], 0)], {"count": 0}),
                ("wrong key", [(addresses[0], 0)], {"key": KEY ^ 1})]
    for name, pairs, options in requests:
        options = {"key": KEY} | options
        bench.send(0, name, stim.frame(stim.ctrl(pairs, **options)))
        await bench.check()
    assert bench.golden.counters[0]["answered"] == 3 + 8 + 3
    log_speed(dut, "board_service", s0, t0)


# -- line rate -----------------------------------------------------------------------------

def figures(bench, first, phase_ports):
    """Per direction of a burst: frames, bytes (no FCS), the measured and the wire's rates in
    and out, latency (last byte in on the RX pins to first byte out on the other port's TX
    pins). ``first[port]``: the port's first expected frame of the burst."""
    report = {}
    for out_port in phase_ports:
        pairs = list(zip(bench.expected[out_port][first[out_port]:],
                         bench.received[out_port][first[out_port]:]))
        if not pairs:
            continue
        ins = [sent for (_, sent), _ in pairs]
        outs = [frame for _, (_, frame) in pairs]
        n = len(pairs)
        bytes_in = sum(len(s.data) - FCS_BYTES for s in ins) / n
        bytes_out = sum(len(body) for _, (body, _) in pairs) / n
        # the wire's rate over the measured span (from the first frame's start to the last
        # one's: every frame but the last): for frames of one size L (no FCS), 1e9 / (8 *
        # (L + 24)) frames/s
        limit_in = (n - 1) * 1e9 / (8 * sum(len(s.data) + 20 for s in ins[:-1])) \
            if n > 1 else 1e9 / (8 * (bytes_in + WIRE_OVERHEAD))
        limit_out = (n - 1) * 1e9 / (8 * sum(len(b) + WIRE_OVERHEAD for (b, _), _ in pairs[:-1])) \
            if n > 1 else 1e9 / (8 * (bytes_out + WIRE_OVERHEAD))
        span_in = ins[-1].wire.sim_time_start - ins[0].wire.sim_time_start
        span_out = outs[-1].sim_time_start - outs[0].sim_time_start
        rate_in = (n - 1) * 1e12 / span_in if n > 1 else None
        rate_out = (n - 1) * 1e12 / span_out if n > 1 else None
        latency = [f.sim_time_start - s.wire.sim_time_end for s, f in zip(ins, outs)]
        report[f"{1 - out_port}->{out_port}"] = {
            "frames": n,
            "bytes_in": round(bytes_in, 1), "bytes_out": round(bytes_out, 1),
            "limit_in_per_s": round(limit_in), "limit_out_per_s": round(limit_out),
            "in_per_s": round(rate_in) if rate_in else None,
            "out_per_s": round(rate_out) if rate_out else None,
            "in_of_limit": round(rate_in / limit_in, 5) if rate_in else None,
            "out_of_limit": round(rate_out / limit_out, 5) if rate_out else None,
            "latency_ns": [round(min(latency) / 1000, 1), round(max(latency) / 1000, 1)],
            "latency_cycles": [round(min(latency) / bench.sys_ps, 1),
                               round(max(latency) / bench.sys_ps, 1)],
        }
    return report


def udp_frame(size, rng):
    """A UDP frame (not to the gradient port) of exactly ``size`` bytes without the FCS, its
    payload random."""
    payload = bytes(rng.getrandbits(8) for _ in range(size - 42))
    return stim.frame(stim.gradient(payload, dport=9))


def gradient_frame(np_rng, values, k, *, scale, seq):
    """A RAW_F32 + COMPRESS datagram of ``values`` gradient-like values (1514 bytes for 360)."""
    from sim.nic_stimulus import gradient_words
    # (raw_packet's header has seq 5 and offset 1234: the datagrams differ by their values)
    del seq
    return stim.frame(stim.gradient(stim.raw_packet(gradient_words(np_rng, values, scale), k)))


@cocotb.test(timeout_time=20000, timeout_unit="us")
async def line_rate(dut):
    """Both directions at line rate at once, back to back at the minimum gap: pass-through
    frames of 60 (64 with the FCS), 1514 and 9014 bytes, 360-value gradients compressed
    (k=10) one way while compressed ones are decompressed the other, then everything
    interleaved behind a jumbo frame; every frame exact, nothing dropped. The figures go to
    the report (:func:`figures`): a decompressed datagram is larger than the one that came
    in, so that direction's input outruns its output and the store takes up the
    difference, which bounds the burst (tens of frames)."""
    from host.golden.inceptionn import nic_tx
    from contract.packet import Packet
    t0, s0 = time.perf_counter(), get_sim_time("ns")
    bench = await started(dut)
    params = params_of("line_rate")
    rng = rng_of("line_rate", 6)
    np_rng = np.random.default_rng(rng.getrandbits(32))
    counts = {"pass_64": 40, "pass_1514": 16, "jumbo_9014": 6, "gradient": 16, "mixed": 24}
    counts.update(params.get("counts", {}))
    values, k, scale = 360, 10, 1e-2

    def compressed_frame(seq):
        raw = gradient_frame(np_rng, values, k, scale=scale, seq=seq)
        payload = bytes(Ether(raw[:-FCS_BYTES])[UDP].payload)
        inc = nic_tx(Packet.from_bytes(payload))[0]
        return stim.frame(stim.gradient(inc.to_bytes()))

    report = {}

    async def burst(name, cases, ports=WIRE_PORTS):
        first = {p: len(bench.expected[p]) for p in WIRE_PORTS}
        bench.send_all(cases)
        await bench.settle(quiet_ns=2_000)
        bench.check_frames()
        report[name] = figures(bench, first, ports)
        dut._log.warning("line rate %s: %s", name, json.dumps(report[name]))

    def tagged(cases):
        return [(f"{name} #{n}", data) for n, (name, data) in enumerate(cases)]

    for name, size in (("pass_64", 60), ("pass_1514", 1514), ("jumbo_9014", 9014)):
        await burst(name, [tagged([(name, udp_frame(size, rng)) for _ in range(counts[name])])
                           for _ in WIRE_PORTS])
    # compression one way, decompression the other, at once
    await burst("gradient", [
        tagged([("compress", gradient_frame(np_rng, values, k, scale=scale, seq=n))
                for n in range(counts["gradient"])]),
        tagged([("decompress", compressed_frame(n)) for n in range(counts["gradient"])])])
    report["compress_360_k10"] = {"0->1": report["gradient"].pop("0->1")}
    report["decompress_360_k10"] = {"1->0": report.pop("gradient")["1->0"]}
    # everything interleaved, both ways: a jumbo frame (the frames behind it wait for it
    # in the store), then passes of every size between gradients
    mixed = []
    for port in WIRE_PORTS:
        cases = [("pass 9014", udp_frame(9014, rng))]
        for n in range(counts["mixed"]):
            kind = n % 4
            if kind == 0:
                cases.append(("gradient", gradient_frame(np_rng, values, k, scale=scale, seq=n)
                              if port == 0 else compressed_frame(n)))
            elif kind == 1:
                cases.append(("pass 60", udp_frame(60, rng)))
            elif kind == 2:
                cases.append(("pass 1514", udp_frame(1514, rng)))
            else:
                cases.append(("pass random", udp_frame(rng.randint(60, 1514), rng)))
        mixed.append(tagged(cases))
    await burst("mixed", mixed)
    c = await bench.check_counters()
    for port in WIRE_PORTS:
        drops = {n: v for n, v in c[f"port{port}"].items() if n.startswith("drop_") and v}
        assert not drops, f"port {port} dropped: {drops}"
    assert not bench.bad[0] and not bench.bad[1]
    report["clocks"] = {"sys_ps": bench.sys_ps, "rgmii_ps": dict(RGMII_PS),
                        "note": "port 0's PHY clock 500 ppm slow, port 1's 500 ppm fast; a "
                                "frame of L bytes (no FCS) takes L + 24 bytes of wire"}
    if params.get("report_file"):
        with open(params["report_file"], "w") as f:
            json.dump(report, f, indent=1)
    log_speed(dut, "line_rate", s0, t0)


# -- reset -------------------------------------------------------------------------------

async def both_ports_busy(dut, limit_cycles=20_000):
    """Wait (at sys clock edges) until both ports receive and send a frame at once."""
    pins = [getattr(dut, f"rgmii{p}_{side}_ctl") for p in WIRE_PORTS for side in ("rx", "tx")]
    for _ in range(limit_cycles):
        await RisingEdge(dut.clk)
        if all(int(pin.value) for pin in pins):
            return
    raise AssertionError("the ports never received and sent at once")


@cocotb.test(timeout_time=3000, timeout_unit="us")
async def reset_mid_frame(dut):
    """Reset while both ports receive and send frames; after it, counters read zero and
    traffic is exact again."""
    t0, s0 = time.perf_counter(), get_sim_time("ns")
    bench = await started(dut)
    rng = rng_of("reset_mid_frame", 7)
    np_rng = np.random.default_rng(rng.getrandbits(32))
    first = [[("pass 1514", stim.body_of(1514))] * 2
             + [("gradient", gradient_frame(np_rng, 360, 10, scale=1e-2, seq=n))
                for n in range(3)] for _ in WIRE_PORTS]
    bench.send_all(first)
    await both_ports_busy(dut)
    dut.rst.value = 1
    for p in WIRE_PORTS:
        bench.sources[p].clear()            # what is not on the wire yet is not sent
    await ClockCycles(dut.clk, 8)
    for p in WIRE_PORTS:
        await bench.sources[p].wait()       # the frame being received ends in reset
    await ClockCycles(dut.clk, 8)
    dut.rst.value = 0
    await ClockCycles(dut.clk, 20)
    assert any(bench.bad[p] for p in WIRE_PORTS), "no frame was cut short by the reset"
    got = await bench.counters()
    nonzero = {f"{b}.{n}": v for b in got for n, v in got[b].items() if v}
    assert not nonzero, f"counters after reset: {nonzero}"
    await Timer(20_000, "ns")
    bench.new_golden()
    cases = []
    for port in WIRE_PORTS:
        port_cases = [("gradient", gradient_frame(np_rng, 360, 10, scale=1e-2, seq=n))
                      for n in range(3)] if port == 0 else \
            [("tcp", stim.frame(stim.PASS_THROUGH["tcp"]))]
        port_cases += pass_through_cases()[:6] + [("1514", stim.body_of(1514))]
        cases.append(port_cases)
    bench.send_all(cases)
    await bench.check()
    log_speed(dut, "reset_mid_frame", s0, t0)
