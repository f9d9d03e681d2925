# amaranth: UnusedElaboratable=no
"""The whole NIC in the wire (``hdl/wire/engine.py``) against the golden wire
(``host/board/wire_golden.py``): frames into both ports at once, the frames each port sends
byte for byte the golden model's (less the FCS the MAC appends), and every counter read back
over ``ctrl`` (the NIC engine's and each port's, ``contract.registers.WIRE_REGISTERS``)
equal to the golden model's.

Frames for the board (host side) are answered on port 0 by its service, the replies
byte for byte the golden model's; a ``CTRL`` request after the traffic reads the counters
back over the network. The MAC sides are driven as LiteEth MACs do (never stalled,
``error`` with a bad FCS), the outputs with random back-pressure.
"""
import random
import struct

import pytest
from amaranth.back import verilog
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from contract.network import (CTRL_MAX_PAIRS, DEFAULT_IP, DEFAULT_MAC, PORT_BASE,
                              SERVICE_OFFSETS, WIRE_PORTS, Service, mac_to_int,
                              network_address)
from contract.registers import ADDRESS_BITS, WIRE_REGISTERS, CounterBlock
from hdl.wire.classify import MIN_BODY_BYTES
from hdl.wire.engine import WireEngine
from host.board.wire_golden import FCS_BYTES, GoldenWire
from sim.frames import A_IP, A_MAC, KEY, PASS_THROUGH, ctrl_request, frame
from sim.wire_stimulus import (MAX_COUNT, FrameCollector, bad_cases, beat_schedule,
                               gateware_counters, gradient_cases, malformed_cases, pass_cases,
                               same_frames, spaced)
from tests.amaranth_sim import RegisterPort, run

#: addresses where the map has nothing, each read after a block (so a read from the NIC
#: engine's port is followed by one that is not), and the last address
UNMAPPED = [entry.end for entry in WIRE_REGISTERS] + [(1 << ADDRESS_BITS) - 1]
#: the last frame into each port: once it is out, every frame before it has had its fate
#: counted (each direction deals with its frames in order)
MARKER = ("marker", frame(PASS_THROUGH["tcp"]))


def simulate(cases, want, *, seed, p_idle=0.5, gap=(4, 40), p_ready=0.7, engine_args=None,
             final=None):
    """``cases[port]`` into each port of a :class:`WireEngine` at once (as
    :func:`sim.wire_stimulus.beat_schedule` schedules them), outputs ready with
    probability ``p_ready``, until ``want[port]`` frames have left each port and a while
    after; then every register of the map and :data:`UNMAPPED` read over ``ctrl``.
    ``final``, a case into port 0 once everything else is done (:data:`SETTLE` cycles after
    the last beat into either port). Returns the frames out of each port and the registers'
    values by block and name (and ``"unmapped"``: address -> value)."""
    rng = random.Random(seed)
    dut = WireEngine(key=KEY, max_count=MAX_COUNT, **(engine_args or {}))
    rx, tx = (dut.port0_rx, dut.port1_rx), (dut.port0_tx, dut.port1_tx)
    schedules = [beat_schedule(cases[port], rng, rx[port].p.shape(), p_idle=p_idle, gap=gap)
                 for port in WIRE_PORTS]
    if final is not None:
        schedules[0] += [None] * (max(map(len, schedules)) + SETTLE - len(schedules[0]))
        schedules[0] += beat_schedule([final], rng, rx[0].p.shape(), p_idle=0, gap=(0, 0))
    outs = [FrameCollector(tx[port].p.shape()) for port in WIRE_PORTS]
    registers = {}
    # (the longest a frame can take after the last beat in: a jumbo through the NIC path
    # and out, twice over)
    limit = max(map(len, schedules)) + 20_000

    async def bench(ctx):
        payloads = [port.p.as_value() for port in rx]
        cycle = quiet = 0
        # (one testbench that drives and watches every cycle: beats as integers)
        while cycle < max(map(len, schedules)) or quiet < 100:
            for port in WIRE_PORTS:
                beat = schedules[port][cycle] if cycle < len(schedules[port]) else None
                ctx.set(rx[port].valid, beat is not None)
                ctx.set(payloads[port],
                        beat if beat is not None else rng.getrandbits(len(payloads[port])))
                ctx.set(tx[port].ready, rng.random() < p_ready)
            sampled = await ctx.tick().sample(*(s for port in tx
                                                for s in (port.valid, port.ready,
                                                          port.p.as_value())))
            for port in WIRE_PORTS:
                valid, ready, value = sampled[2 + 3 * port:5 + 3 * port]
                if valid and ready:
                    outs[port].word(value)
            done = all(len(outs[port].frames) >= want[port] for port in WIRE_PORTS)
            quiet = quiet + 1 if done else 0
            cycle += 1
            assert cycle < limit, (f"no progress: frames out {[len(o.frames) for o in outs]}, "
                                   f"want {want}")
        for port in WIRE_PORTS:
            ctx.set(rx[port].valid, 0)
        reg = RegisterPort(ctx, dut)
        registers["unmapped"] = {}
        for entry, after in zip(WIRE_REGISTERS, UNMAPPED):
            registers[entry.name] = {name: await reg.read(address)
                                     for name, address in entry.items()}
            registers["unmapped"][after] = await reg.read(after)
        last = UNMAPPED[-1]
        registers["unmapped"][last] = await reg.read(last)

    run(dut, bench)
    assert not any(out.unfinished for out in outs), "a frame left unfinished"
    return [out.frames for out in outs], registers


#: cycles from the last beat into either port to the ``final`` case: every frame before it
#: has gone out (no jumbo gradients among the cases that use it)
SETTLE = 6000


def golden(cases, final=None):
    """The frames (FCS stripped) each port of the golden wire sends for ``cases[port]``
    (then ``final`` into port 0) and its counters, by ``WIRE_REGISTERS`` block."""
    wire = GoldenWire(KEY, max_count=MAX_COUNT)
    frames = {port: [] for port in WIRE_PORTS}
    arrivals = [(port, case) for port in WIRE_PORTS for case in cases[port]]
    for port, case in arrivals + ([(0, final)] if final is not None else []):
        if isinstance(case[1], int):             # ("pause", cycles)
            continue
        for out_port, data in wire.receive(port, case[1]):
            frames[out_port].append(data[:-FCS_BYTES])
    return [frames[port] for port in WIRE_PORTS], gateware_counters(wire)


def board_replies(frames):
    """Port 0's frames split into the board's replies (from its MAC) and the network's,
    each in order: the golden model sends port 0's frames in the order it takes the
    ports' frames, the engine in the order they become ready."""
    mac = mac_to_int(DEFAULT_MAC).to_bytes(6, "big")
    return ([f for f in frames if f[6:12] == mac], [f for f in frames if f[6:12] != mac])


def check(cases, *, seed, final=None, **kwargs):
    """``cases[port]`` (each ending with :data:`MARKER`) through the engine and the golden
    model: every frame out of each port and every counter equal, unmapped addresses 0.
    Returns the golden counters and port 0's replies."""
    cases = [list(cases[port]) + [MARKER] for port in WIRE_PORTS]
    want_frames, want_counters = golden(cases, final)
    got_frames, got = simulate(cases, [len(f) for f in want_frames], seed=seed, final=final,
                               **kwargs)
    assert got.pop("unmapped") == dict.fromkeys(UNMAPPED, 0)
    assert got == want_counters
    got_replies, got_frames[0] = board_replies(got_frames[0])
    want_replies, want_frames[0] = board_replies(want_frames[0])
    # (the MAC pads a reply to 60 bytes)
    same_frames([r.ljust(MIN_BODY_BYTES, b"\0") for r in got_replies], want_replies, "reply")
    for port in WIRE_PORTS:
        same_frames(got_frames[port], want_frames[port], f"port {port} frame")
    return want_counters, want_replies


# -- tests ---------------------------------------------------------------------------------

def test_both_directions_at_once():
    """Gradients (sizes, k, incompressible, odd sizes, junk) and pass-through frames
    interleaved, both ways at once: compressed from the host, INC_F32 decompressed and
    malformed datagrams dropped from the network, frames for the board on both sides."""
    rng = random.Random(20)
    cases = []
    for direction in ("tx", "rx"):
        port_cases = gradient_cases(direction) + malformed_cases() + pass_cases(direction)
        rng.shuffle(port_cases)
        cases.append(spaced(port_cases, 5000))
    c, replies = check(cases, seed=21)
    assert c["port0"]["compressed"] >= 10 and c["port0"]["incompressible"] >= 3
    assert c["port1"]["decompressed"] >= 10 and c["port1"]["drop_malformed"] >= 5
    assert c["port0"]["answered"] == len(replies) >= 2
    assert c["port1"]["drop_board_address"] >= 2
    assert c["port0"]["passed"] and c["port1"]["passed"]
    assert c["tx"]["compressed"] and c["rx"]["decompressed"] and c["rx"]["drop_bad_header"]
    # each port sends what the other lets through
    assert c["port1"]["frames_out"] == sum(c["port0"][n] for n in (
        "passed", "compressed", "incompressible"))
    assert c["port0"]["frames_out"] == sum(c["port1"][n] for n in ("passed", "decompressed")) \
        + c["port0"]["answered"]


def test_ctrl_reads_the_counters_after_the_traffic():
    """Traffic both ways, then a ``CTRL`` request from the host that reads every register
    of the map (and addresses outside it): the reply holds the golden model's counters as
    they stand when it arrives, byte for byte."""
    rng = random.Random(23)
    cases = []
    for direction in ("tx", "rx"):
        port_cases = gradient_cases(direction, mtu=False) + pass_cases(direction)
        rng.shuffle(port_cases)
        cases.append(port_cases)
    addresses = [network_address("wire", a) for entry in WIRE_REGISTERS
                 for _, a in entry.items()]
    addresses += [network_address("wire", a) for a in UNMAPPED] + [network_address("nic", 0)]
    pairs = [(address, rng.getrandbits(32)) for address in addresses][:CTRL_MAX_PAIRS]
    final = ("ctrl", frame(Ether(src=A_MAC, dst=DEFAULT_MAC) / IP(src=A_IP, dst=DEFAULT_IP)
                           / UDP(sport=40001, dport=PORT_BASE + SERVICE_OFFSETS[Service.CTRL])
                           / Raw(ctrl_request(pairs))))
    c, replies = check(cases, seed=23, final=final)
    values = struct.unpack(f"<{2 * len(pairs)}I", bytes(Ether(replies[-1])[UDP].payload)[32:])
    assert sum(1 for value in values[1::2] if value) >= 15      # counters, not zeros
    assert c["port0"]["answered"] == len(replies) >= 3


def test_bad_frames_on_both_ports_then_good_ones():
    """Bad FCS, runts, oversize, a receive error mid-frame on both ports at once, back to
    back, each followed by a good frame."""
    c, _ = check([bad_cases(), bad_cases()], seed=22, p_idle=0, gap=(0, 0), p_ready=1)
    for port in WIRE_PORTS:
        counts = c[f"port{port}"]
        assert (counts["drop_fcs"], counts["drop_runt"], counts["drop_oversize"]) == (2, 2, 1)


def test_elaborates_to_verilog():
    dut = WireEngine(max_count=64, store_bytes=4096, frames=4)
    # the always-ready members are constants, which cannot be ports: name the others
    ports = [dut.port0_rx.valid, dut.port0_rx.p.as_value(), dut.port1_rx.valid,
             dut.port1_rx.p.as_value(), dut.ctrl.addr, dut.ctrl.re, dut.ctrl.rdata,
             dut.ctrl_free]
    for out in (dut.port0_tx, dut.port1_tx):
        ports += [out.valid, out.ready, out.p.as_value()]
    assert "module wire_engine" in verilog.convert(dut, name="wire_engine", ports=ports)


def test_register_map_covers_both_ports_and_the_nic():
    """The map the engine serves: the NIC engine's blocks where the NIC top has them, each
    port's counters after."""
    names = [entry.name for entry in WIRE_REGISTERS]
    assert names == ["tx", "rx", "port0", "port1"]
    assert all(isinstance(entry, CounterBlock) for entry in WIRE_REGISTERS)
    assert all(WIRE_REGISTERS.decode(address) is None for address in UNMAPPED)


@pytest.mark.parametrize("kwargs, match", [
    ({"store_bytes": 2048}, "store_bytes"),
    ({"store_bytes": 5000}, "store_bytes"),
    ({"frames": 1}, "frames"),
    ({"max_count": 0}, "max_count"),
    ({"max_count": 4096}, "max_count"),
    ({"max_count": True}, "max_count"),
    ({"gradient_port": 0}, "gradient_port"),
    ({"gradient_port": PORT_BASE + SERVICE_OFFSETS[Service.CTRL]}, "control port"),
    ({"mac": "02:47:57:00:00"}, "mac"),
    ({"ip": "192.168.77"}, "ip"),
    ({"key": 1 << 64}, "control key"),
])
def test_parameters_checked(kwargs, match):
    with pytest.raises(ValueError, match=match):
        WireEngine(**kwargs)
