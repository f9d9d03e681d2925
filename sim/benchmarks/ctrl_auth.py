"""Section 7's authenticated control on the Verilated network top: what the tags cost.

The same ``CTRL`` reads go to two builds of the network top in the same run, one with
section 4's 64-bit key (in clear: the baseline) and one with section 7's 128-bit key (every
request's tag checked before the service, every reply tagged:
``hdl/net/front_end/ctrl_auth.py``), each behind the C++ RGMII PHY of
``sim/harness/``. Figures, in engine clock cycles (75 MHz on the ECP5 boards):

- **one request alone**: from its first frame into the PHY to the end of the run that its
  reply ends (the harness stops a short quiet time after the expected reply), per pair count
  (1, 8 and 64 pairs: the shortest, a typical and the longest request);
- **a burst**: ``burst`` requests sent back to back: how many are answered (the service
  takes one at a time and its input buffer holds 1 KiB, so a burst of the longest requests
  overflows it on either build, counted ``drop_service_full``) and cycles per reply.

Ratios: section 7 over section 4 for each. Every reply is checked against the golden
board's and its tag checked.
"""
from __future__ import annotations

import struct

from contract.header import Header, PacketType
from contract.network import CTRL_KEY_OFFSET, CTRL_OP_OFFSET, NET_REGISTERS, CtrlOp, Service, \
    network_address

#: section 7's key of the measured build (public: a benchmark's; the Verilated tests of
#: section 7, tests/sim/harness/test_network_board_auth.py, share it and so its build)
KEY = bytes.fromhex("5a17c3e08b94d2f61e0d7c3ba2958406")
PAIRS = (1, 8, 64)


def _request_of(key, pairs, counter, *, write=False):
    """A ``CTRL`` request of ``pairs`` under ``key``: section 7's tag and ``counter`` for a
    128-bit key, section 4's key in clear for a 64-bit one."""
    from host.golden.ctrl_auth import is_authenticated, seal, with_counter
    header = bytearray(Header(type=PacketType.CTRL, count=len(pairs)).pack())
    header[CTRL_OP_OFFSET] = CtrlOp.WRITE if write else CtrlOp.READ
    raw = bytes(header) + b"".join(struct.pack("<II", a, v) for a, v in pairs)
    if is_authenticated(key):
        return seal(key, with_counter(raw, counter))
    return raw[:CTRL_KEY_OFFSET] + key.to_bytes(8, "little") + raw[CTRL_KEY_OFFSET + 8:]


def _request(key, pairs, counter):
    """A read of the board's address ``pairs`` times."""
    address = network_address("net", NET_REGISTERS["ip"].address)
    return _request_of(key, [(address, 0)] * pairs, counter)


def _measure(key, repeats, burst):
    from host.board import Datagram, GoldenBoard
    from sim.harness.board import VerilatorBoard
    backend = VerilatorBoard(key=key)
    twin = GoldenBoard(key, ip=backend.ip, mac=backend.mac, port_base=backend.port_base)
    ctrl_port = backend.port_base + 3
    counter = 1
    figures = {}
    try:
        def deliver(payloads):
            """Cycles and replies of ``payloads`` sent together; every reply one of the
            golden board's (a burst may overflow the control service's input buffer)."""
            datagrams = [Datagram("127.0.0.1", 40100, backend.ip, ctrl_port, p)
                         for p in payloads]
            before = backend.stats["cycles"]
            got = backend.deliver(datagrams)
            want = twin.deliver(datagrams)
            assert all(d in want for d in got), "a reply differs from the golden board's"
            return backend.stats["cycles"] - before, len(got)

        deliver([_request(key, 1, 0)])          # the host's ARP exchange, not measured
        for pairs in PAIRS:
            alone = []
            for _ in range(repeats):
                counter += 1
                cycles, replies = deliver([_request(key, pairs, counter)])
                assert replies == 1
                alone.append(cycles)
            payloads = []
            for _ in range(burst):
                counter += 1
                payloads.append(_request(key, pairs, counter))
            cycles, replies = deliver(payloads)
            figures[pairs] = {"alone_cycles": min(alone), "burst": burst,
                              "burst_replies": replies,
                              "burst_cycles_per_reply": cycles / max(1, replies)}
    finally:
        backend.close()
    return figures


def run(quick: bool) -> dict:
    from hdl.net.top import SIMULATION_KEY
    repeats, burst = (1, 2) if quick else (3, 8)
    plain = _measure(SIMULATION_KEY, repeats, burst)
    tagged = _measure(KEY, repeats, burst)
    print(f"{'pairs':>5} {'alone s4':>9} {'alone s7':>9} {'ratio':>6}   "
          f"{'burst':>5} {'answered s4/s7':>14} {'per reply s4':>12} {'s7':>6} {'ratio':>6}"
          f"   (engine cycles)")
    results = {}
    for pairs in PAIRS:
        a, b = plain[pairs], tagged[pairs]
        row = {"section4": a, "section7": b,
               "alone_ratio": b["alone_cycles"] / a["alone_cycles"],
               "burst_ratio": b["burst_cycles_per_reply"] / a["burst_cycles_per_reply"]}
        results[str(pairs)] = row
        print(f"{pairs:>5} {a['alone_cycles']:>9} {b['alone_cycles']:>9} "
              f"{row['alone_ratio']:>6.2f}   {burst:>5} "
              f"{a['burst_replies']:>6}/{b['burst_replies']:<7} "
              f"{a['burst_cycles_per_reply']:>12.0f} {b['burst_cycles_per_reply']:>6.0f} "
              f"{row['burst_ratio']:>6.2f}")
    return {"pairs": results, "service": Service.CTRL.value}
