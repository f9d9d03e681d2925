"""Section 7's authenticated jobs on the Verilated network top: what the tags cost the
switch.

The same aggregation rounds go to two builds of the network top in the same run: one with
section 4's 64-bit key (a job without authentication: the baseline) and one with section
7's 128-bit key and the job configured with ``job_auth`` (every ``AGG_*`` datagram's tag
and ``seq`` checked before the engine by ``JobGate``, every result tagged by
``ResultSeal``, ``hdl/net/front_end/job_auth.py``), each behind the C++ RGMII PHY of
``sim/harness/``. A job of two workers; each round is both workers' packets of one slot
(the switch's 64 lanes of 32-bit values each). Figures, in engine clock cycles (75 MHz on
the ECP5 boards):

- **one round alone**: from the first frame into the PHY to the last result out of it
  (the harness's quiet time after the results, the same on both builds, taken off);
- **rounds back to back**: ``rounds`` rounds (a slot each, the job's four slots in turn,
  each slot's two versions alternating) sent together, back to back at the wire's
  minimum gap: cycles per round, against the wire's own time for a round (its two
  datagrams in, and its two results out beside them) on a 1 Gb/s port at the ECPIX-5's
  engine clock.

Ratios: section 7 over section 4. Every result is checked against the golden board's (the
tags included: same key, same bytes).
"""
from __future__ import annotations

import numpy as np

from contract.header import Header, PacketType
from contract.network import NET_REGISTERS, Service, ip_to_int, network_address
from contract.packet import Packet
from contract.registers import AUTH_REGISTERS, COMMIT, SWITCH_REGISTERS
from sim.benchmarks.ctrl_auth import KEY, _request_of

LANES = (64,)      # the switch top's P: every packet carries all its lanes
EPOCH = 0x00C0FFEE
CTRL_PORT, WORKERS = 40100, (40201, 40202)
#: Ethernet, IPv4 and UDP around a datagram, with preamble and gap, in bytes on the wire
WIRE_OVERHEAD = 8 + 14 + 20 + 8 + 4 + 12


def _setup(key):
    """The control datagrams that configure job 0 (two workers on loopback, four slots;
    with a 128-bit key, authenticated under :data:`EPOCH`)."""
    from host.golden.ctrl_auth import is_authenticated
    net = lambda name, *args: network_address("net", NET_REGISTERS[name].address(*args))
    sw = lambda name: network_address("switch", SWITCH_REGISTERS["job"].address(0, name))
    pairs = []
    for w, port in enumerate(WORKERS):
        pairs += [(net("worker", w, "ip"), ip_to_int("127.0.0.1")),
                  (net("worker", w, "port"), port)]
    if is_authenticated(key):
        auth = lambda field: network_address("net", AUTH_REGISTERS["job_auth"].address(0, field))
        pairs += [(auth("enable"), 1), (auth("epoch"), EPOCH)]
    pairs += [(sw("workers"), len(WORKERS)), (sw("slot_base"), 0), (sw("slot_count"), 4)]
    return [_request_of(key, pairs, 1, write=True),
            _request_of(key, [(sw("commit"), COMMIT)], 2, write=True)]


def _round(key, chunk, lanes, rng):
    """Both workers' packets of chunk ``chunk`` (section 7's numbering: slot chunk mod 4,
    version (chunk div 4) mod 2, seq chunk), tagged under the job key where the key is
    section 7's."""
    from host.golden.ctrl_auth import is_authenticated
    from host.golden.siphash import job_key, tag_datagram
    out = []
    for w, port in enumerate(WORKERS):
        header = Header(type=PacketType.AGG_ADD_I32, job=0, worker=w, count=lanes,
                        slot=chunk % 4, slot_version=(chunk // 4) % 2, seq=chunk)
        data = Packet(header, rng.integers(0, 1 << 20, lanes).astype("<u4").tobytes())
        data = data.to_bytes()
        if is_authenticated(key):
            data = tag_datagram(job_key(KEY, 0, EPOCH), data)
        out.append((port, data))
    return out


def _measure(key, repeats, rounds):
    from host.board import Datagram, GoldenBoard
    from sim.harness.board import VerilatorBoard
    backend = VerilatorBoard(key=key)
    twin = GoldenBoard(key, ip=backend.ip, mac=backend.mac, port_base=backend.port_base)
    rng = np.random.default_rng(1)
    figures = {}
    try:
        def deliver(items):
            datagrams = [Datagram("127.0.0.1", port, backend.ip, backend.port_base + offset,
                                  payload) for port, offset, payload in items]
            before = backend.stats["cycles"]
            got = backend.deliver(datagrams)
            want = twin.deliver(datagrams)
            assert sorted(got) == sorted(want), "the results differ from the golden board's"
            # a delivery with switch datagrams ends after the harness's quiet time, the
            # same on both builds: not the gateware's
            return backend.stats["cycles"] - before - backend.idle, len(got)

        # the configuration (and the host's ARP exchange), one request at a time, to
        # both: not compared (a commit's read-back is BUSY on the gateware while it clears)
        for payload in _setup(key):
            setup = [Datagram("127.0.0.1", CTRL_PORT, backend.ip, backend.port_base + 3,
                              payload)]
            assert len(backend.deliver(setup)) == len(twin.deliver(setup)) == 1
        chunk = 0
        for lanes in LANES:
            alone = []
            for _ in range(repeats):
                cycles, results = deliver([(port, 2, data)
                                           for port, data in _round(key, chunk, lanes, rng)])
                assert results == len(WORKERS)
                alone.append(cycles)
                chunk += 1
            burst = []
            for _ in range(rounds):
                burst += [(port, 2, data) for port, data in _round(key, chunk, lanes, rng)]
                chunk += 1
            cycles, results = deliver(burst)
            assert results == len(WORKERS) * rounds
            figures[lanes] = {"alone_cycles": min(alone), "rounds": rounds,
                              "cycles_per_round": cycles / rounds}
    finally:
        backend.close()
    return figures


def run(quick: bool) -> dict:
    from hdl.board.boards import load_boards
    from hdl.net.top import SIMULATION_KEY
    mhz = load_boards()["ecpix5"].engine_clock_mhz("network")
    repeats, rounds = (1, 2) if quick else (3, 16)
    plain = _measure(SIMULATION_KEY, repeats, rounds)
    tagged = _measure(KEY, repeats, rounds)
    print(f"{'lanes':>5} {'alone s4':>9} {'alone s7':>9} {'ratio':>6}   "
          f"{'per round s4':>12} {'s7':>6} {'ratio':>6} {'wire':>6}   (engine cycles)")
    results = {}
    for lanes in LANES:
        a, b = plain[lanes], tagged[lanes]
        datagram = 32 + 4 * lanes
        # two datagrams in and two results out, each way on its own (full duplex)
        wire = 2 * (datagram + WIRE_OVERHEAD) * 8 * mhz / 1e3
        row = {"section4": a, "section7": b, "wire_cycles_per_round": wire,
               "alone_ratio": b["alone_cycles"] / a["alone_cycles"],
               "round_ratio": b["cycles_per_round"] / a["cycles_per_round"]}
        results[str(lanes)] = row
        print(f"{lanes:>5} {a['alone_cycles']:>9} {b['alone_cycles']:>9} "
              f"{row['alone_ratio']:>6.2f}   {a['cycles_per_round']:>12.0f} "
              f"{b['cycles_per_round']:>6.0f} {row['round_ratio']:>6.2f} {wire:>6.0f}")
    return {"lanes": results, "service": Service.SWITCH.value}
