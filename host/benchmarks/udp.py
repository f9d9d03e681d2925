"""UDP transport on loopback: datagrams per second and payload Gb/s, against the software
ceiling measured in the same run, and through the virtual board at each fault rate.

Everything runs on 127.0.0.1, the peer in a process of its own (so the two sides get the
machine's two cores):

- **echo ceiling**: a plain socket client keeping ``WINDOW`` datagrams in flight against a
  plain echo process (:func:`_echo_main`), for NIC packets at the standard MTU (336 values,
  1376 B) and jumbo (2048 values, 8224 B): what Python sockets on this machine carry at all;
- **transport vs echo**: ``UdpTransport.exchange("tx", ...)`` of the same packets against the
  same echo (the packets do not ask for compression, and an echo answers like a NIC that
  passes them through), so the ratio to the ceiling is the transport's own cost (seq
  rewriting, windowing, timers, matching);
- **transport vs virtual board**: ``gradwire board serve`` (golden backend) in a process:
  NIC compress of gradients (``tx``), decompress (``rx``), and an LHC all-reduce of 4
  workers through the switch (``agg``), at wire fault rates 0, 1 %, 10 % and 30 %, with the
  datagrams, resends and discarded replies counted by the transport; the result of every
  run is checked bit for bit against the golden models before it is reported;
- **transport vs Verilated board** (the simulation ceiling): the virtual board with
  ``BOARD_BACKENDS["verilator"]`` behind it (LiteEth, the front end and the engines,
  Verilated, behind a C++ RGMII PHY; its harness is a child process), with a smaller
  workload of the same kinds, and the golden board in the same way (in this process) on
  the same workload as its baseline; besides datagrams/s and Gb/s, the simulated engine
  cycles per datagram and the simulator's cycles per second.

Payload Gb/s counts the datagrams' bytes both ways (request and reply) per second.
"""
from __future__ import annotations

import select
import socket
import sys
import time

import numpy as np

from contract.header import Header, PacketType
from contract.network import MTU_DEFAULT, MTU_JUMBO, SERVICE_OFFSETS, Service
from contract.packet import Packet
from host.board.process import start_module, stop_module

__all__ = ["run"]

WINDOW = 16
FAULT_RATES = (0.0, 0.01, 0.1, 0.3)
KEY = 0x6772_6164_7769_7265


def _echo_main(port_base):
    """Echo every datagram on four ports back to its sender until stdin closes."""
    sockets = []
    for offset in range(len(SERVICE_OFFSETS)):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        s.bind(("127.0.0.1", port_base + offset))
        s.setblocking(False)
        sockets.append(s)
    print("echo ready", flush=True)
    while True:
        ready, _, _ = select.select(sockets + [sys.stdin], [], [], 1.0)
        if sys.stdin in ready and not sys.stdin.readline():
            return
        for s in ready:
            if s is sys.stdin:
                continue
            while True:
                try:
                    data, address = s.recvfrom(1 << 16)
                except BlockingIOError:
                    break
                s.sendto(data, address)


def _raw_client(port, size, count):
    """Datagrams per second of a plain socket with WINDOW in flight against the echo."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    s.bind(("127.0.0.1", 0))
    s.settimeout(2.0)
    payload = bytes(size)
    address = ("127.0.0.1", port)
    sent = received = 0
    started = time.perf_counter()
    try:
        while sent < min(WINDOW, count):
            s.sendto(payload, address)
            sent += 1
        while received < sent:
            try:
                s.recvfrom(1 << 16)
            except socket.timeout:
                break                                  # lost on loopback: count what came
            received += 1
            if sent < count:
                s.sendto(payload, address)
                sent += 1
    finally:
        s.close()
    return received, time.perf_counter() - started


def _bypass_packets(values, count):
    rng = np.random.default_rng(1)
    return [Packet(Header(type=PacketType.RAW_F32, count=values, seq=i),
                   rng.standard_normal(values).astype("<f4").tobytes()) for i in range(count)]


def _figures(datagrams, byte_count, seconds):
    return {"datagrams_per_s": datagrams / seconds, "gbps": 8 * byte_count / seconds / 1e9,
            "seconds": seconds}


def _echo_section(quick):
    from host.board import free_port_base
    from host.driver.udp import UdpTransport

    base = free_port_base()
    echo, _ = start_module(["host.benchmarks.udp", "--echo", str(base)])
    out = {}
    try:
        for mtu, values in ((MTU_DEFAULT, 336), (MTU_JUMBO, 2048)):
            count = 2000 if quick else 20000
            size = 32 + 4 * values
            received, seconds = _raw_client(base, size, count)
            raw = _figures(2 * received, 2 * received * size, seconds)
            packets = _bypass_packets(values, count)
            with UdpTransport("127.0.0.1", port_base=base, mtu=mtu, window=WINDOW) as t:
                started = time.perf_counter()
                got = t.exchange("tx", packets)
                seconds = time.perf_counter() - started
                stats = t.network[Service.NIC_TX]
            if [p.to_bytes() for p in got] != [p.to_bytes() for p in packets]:
                raise AssertionError("the echo came back different through the transport")
            transport = _figures(stats.datagrams + stats.replies,
                                 stats.bytes_out + stats.bytes_in, seconds)
            transport["resends"] = stats.resends
            transport["ratio_to_ceiling"] = transport["datagrams_per_s"] / raw["datagrams_per_s"]
            # what every transport pays for the API's Packet objects (header pack and parse,
            # once each way), without any socket: the part of the gap that is not the network
            started = time.perf_counter()
            for p in packets:
                Packet.from_bytes(p.to_bytes())
            codec = 2 * len(packets) / (time.perf_counter() - started)
            out[f"mtu{mtu}"] = {"packet_values": values, "datagram_bytes": size,
                                "echo_ceiling": raw, "transport": transport,
                                "packet_objects_per_s": codec}
    finally:
        stop_module(echo)
    return out


def _board_run(rate, quick, seed=1):
    """One virtual board process at ``rate``: compress, decompress, all-reduce."""
    from host.board import free_port_base
    from host.driver.nic import NicInterface
    from host.driver.switch import SwitchInterface
    from host.driver.rtt import retries_for_loss
    from host.driver.settings import format_key
    from host.driver.udp import UdpTransport
    from host.golden import inceptionn, lhc

    base = free_port_base()
    board, _ = start_module(["host.cli", "board", "serve", "--port-base", str(base), "--key",
                    format_key(KEY), "--fault-rate", str(rate), "--fault-seed", str(seed)])
    rng = np.random.default_rng(seed)
    values = 200_000 if quick else 2_000_000
    x = (rng.standard_normal(values) * 0.01).astype(np.float32)
    n = 20_000 if quick else 200_000
    tensors = []
    for _ in range(4):
        t = np.zeros(n, np.float32)
        hot = rng.random(n) < 0.05
        t[hot] = (rng.standard_normal(hot.sum()) * 0.01).astype(np.float32)
        tensors.append(t)
    out = {}
    retries = retries_for_loss(rate)
    try:
        for mtu in (MTU_DEFAULT, MTU_JUMBO):
            with UdpTransport("127.0.0.1", port_base=base, key=KEY, mtu=mtu, region="nic",
                              window=WINDOW, retries=retries) as t:
                nic = NicInterface(t)
                started = time.perf_counter()
                wire = nic.transmit(x, 10)
                tx_seconds = time.perf_counter() - started
                started = time.perf_counter()
                got = nic.receive(wire, x.size)
                rx_seconds = time.perf_counter() - started
                if not np.array_equal(got.view(np.uint32),
                                      inceptionn.quantize(x, 10).view(np.uint32)):
                    raise AssertionError(f"NIC round trip differs at fault rate {rate}")
                for service, seconds in ((Service.NIC_TX, tx_seconds),
                                         (Service.NIC_RX, rx_seconds)):
                    s = t.network[service]
                    out[f"{service.value}_mtu{mtu}"] = {
                        **_figures(s.datagrams + s.replies, s.bytes_out + s.bytes_in, seconds),
                        "values_per_s": values / seconds, "requests": s.requests,
                        "datagrams": s.datagrams, "resends": s.resends,
                        "discarded": s.discarded}
        with UdpTransport("127.0.0.1", port_base=base, key=KEY, region="switch",
                          retries=retries) as t:
            switch = SwitchInterface(t)
            started = time.perf_counter()
            result, _ = switch.allreduce(tensors)
            seconds = time.perf_counter() - started
            if not np.array_equal(result.view(np.uint32),
                                  lhc.allreduce(tensors)[0].view(np.uint32)):
                raise AssertionError(f"all-reduce differs at fault rate {rate}")
            s = t.network[Service.SWITCH]
            results_in = s.bytes_in // (32 + 4 * switch.lanes)     # result datagrams taken
            out["switch"] = {**_figures(s.datagrams + results_in, s.bytes_out + s.bytes_in,
                                        seconds),
                             "values_per_s": 4 * n / seconds, "packets": s.requests,
                             "datagrams": s.datagrams, "resends": s.resends,
                             "discarded": s.discarded, "rebuilt": s.rebuilt}
    finally:
        stop_module(board)
    return out


def _in_process_board_run(backend_name, quick, seed=2):
    """The Verilated board's workload (NIC compress and decompress at the standard MTU, an
    all-reduce of 2 workers) through a virtual board served from this process."""
    from host.board import VirtualBoard, open_board_backend
    from host.driver.nic import NicInterface
    from host.driver.switch import SwitchInterface
    from host.golden import inceptionn, lhc

    rng = np.random.default_rng(seed)
    values = 336 * (8 if quick else 48)
    x = (rng.standard_normal(values) * 0.01).astype(np.float32)
    n = 2000 if quick else 8000
    tensors = []
    for _ in range(2):
        t = np.zeros(n, np.float32)
        hot = rng.random(n) < 0.05
        t[hot] = (rng.standard_normal(hot.sum()) * 0.01).astype(np.float32)
        tensors.append(t)
    params = {} if backend_name == "verilator" else {"key": KEY}
    backend = open_board_backend(backend_name, **params)
    out = {}
    with VirtualBoard(backend, port_base=None) as board:
        stats = getattr(backend, "stats", None)

        def cycles():
            return (stats["cycles"], stats["datagrams_in"]) if stats else (0, 0)

        with board.transport(region="nic", window=WINDOW) as t:
            nic = NicInterface(t)
            for service, step in ((Service.NIC_TX, lambda: nic.transmit(x, 10)),
                                  (Service.NIC_RX, lambda: nic.receive(wire, x.size))):
                c0, d0 = cycles()
                started = time.perf_counter()
                result = step()
                seconds = time.perf_counter() - started
                c1, d1 = cycles()
                if service is Service.NIC_TX:
                    wire = result
                elif not np.array_equal(result.view(np.uint32),
                                        inceptionn.quantize(x, 10).view(np.uint32)):
                    raise AssertionError(f"NIC round trip through the {backend_name} board "
                                         f"differs")
                s = t.network[service]
                out[service.value] = {
                    **_figures(s.datagrams + s.replies, s.bytes_out + s.bytes_in, seconds),
                    "values_per_s": values / seconds, "datagrams": s.datagrams,
                    "resends": s.resends, "cycles_per_datagram": (c1 - c0) / max(1, d1 - d0)}
        with board.transport(region="switch") as t:
            switch = SwitchInterface(t)
            c0, d0 = cycles()
            started = time.perf_counter()
            result, _ = switch.allreduce(tensors)
            seconds = time.perf_counter() - started
            c1, d1 = cycles()
            if not np.array_equal(result.view(np.uint32),
                                  lhc.allreduce(tensors)[0].view(np.uint32)):
                raise AssertionError(f"all-reduce through the {backend_name} board differs")
            s = t.network[Service.SWITCH]
            results_in = s.bytes_in // (32 + 4 * switch.lanes)
            out["switch"] = {**_figures(s.datagrams + results_in, s.bytes_out + s.bytes_in,
                                        seconds),
                             "values_per_s": 2 * n / seconds, "datagrams": s.datagrams,
                             "resends": s.resends,
                             "cycles_per_datagram": (c1 - c0) / max(1, d1 - d0)}
        if stats:
            counters = backend.counters()
            out["board_drops"] = {k: v for k, v in counters.items()
                                  if k.startswith("drop_") and v}
            harness = backend.harness
            out["simulator"] = {"cycles": harness.cycles, "loop_seconds": harness.loop_seconds,
                                "cycles_per_s": harness.cycles / max(harness.loop_seconds,
                                                                     1e-9),
                                "build_seconds": harness.build.seconds,
                                "max_gap": stats["max_gap"], "idle": backend.idle}
    return out


def run(quick=False):
    results = {"window": WINDOW, "echo": _echo_section(quick), "board": {}}
    print(f"UdpTransport on loopback, window {WINDOW}; datagrams/s and Gb/s count both "
          f"directions")
    print(f"  {'peer':<28} {'datagram':>8} {'dgrams/s':>10} {'Gb/s':>7} {'vs ceiling':>10}")
    for name, e in results["echo"].items():
        c, t = e["echo_ceiling"], e["transport"]
        print(f"  {'plain socket -> echo':<28} {e['datagram_bytes']:>7}B "
              f"{c['datagrams_per_s']:>10,.0f} {c['gbps']:>7.3f} {'1.00':>10}")
        print(f"  {'UdpTransport -> echo':<28} {e['datagram_bytes']:>7}B "
              f"{t['datagrams_per_s']:>10,.0f} {t['gbps']:>7.3f} "
              f"{t['ratio_to_ceiling']:>10.2f}")
        print(f"  {'  (Packet pack+parse alone)':<28} {'':>8} "
              f"{e['packet_objects_per_s']:>10,.0f}")
    print("\n  virtual board (golden backend, its own process), by wire fault rate")
    print(f"  {'rate':>5} {'stream':<14} {'dgrams/s':>10} {'Gb/s':>7} {'Mval/s':>7} "
          f"{'datagrams':>9} {'resends':>8} {'discarded':>9}")
    for rate in FAULT_RATES:
        board = results["board"][str(rate)] = _board_run(rate, quick)
        for name, f in board.items():
            print(f"  {rate:>5g} {name:<14} {f['datagrams_per_s']:>10,.0f} {f['gbps']:>7.3f} "
                  f"{f['values_per_s'] / 1e6:>7.2f} {f['datagrams']:>9,} {f['resends']:>8,} "
                  f"{f['discarded']:>9,}", flush=True)
    print("\n  Verilated network top behind the virtual board (the simulation ceiling), against "
          "the golden board on the same workload")
    print(f"  {'board':<10} {'stream':<8} {'dgrams/s':>10} {'Gb/s':>8} {'Mval/s':>7} "
          f"{'vs golden':>9} {'cycles/dgram':>12} {'at 125 MHz':>10}")
    golden = _in_process_board_run("golden", quick)
    verilated = _in_process_board_run("verilator", quick)
    results["verilated_board"] = {"golden": golden, "verilator": verilated}
    for name, board in (("golden", golden), ("verilator", verilated)):
        for stream in ("nic_tx", "nic_rx", "switch"):
            f = board[stream]
            ratio = f["datagrams_per_s"] / golden[stream]["datagrams_per_s"]
            # cycles per datagram in and, at the engines' 125 MHz, the board's own rate in
            # simulated time (the gateware's, not the simulator's)
            cycles = (f"{f['cycles_per_datagram']:>12,.0f} "
                      f"{125e6 / f['cycles_per_datagram']:>10,.0f}/s"
                      if name == "verilator" and f["cycles_per_datagram"] else "")
            print(f"  {name:<10} {stream:<8} {f['datagrams_per_s']:>10,.1f} {f['gbps']:>8.4f} "
                  f"{f['values_per_s'] / 1e6:>7.3f} {ratio:>9.4f} {cycles}", flush=True)
    sim = verilated["simulator"]
    print(f"  simulator: {sim['cycles']:,} engine cycles in {sim['loop_seconds']:.1f} s of "
          f"clock loop ({sim['cycles_per_s']:,.0f} cycles/s); longest silence "
          f"{sim['max_gap']} cycles (a delivery ends after {sim['idle']}); the gateware's "
          f"drops: {verilated['board_drops'] or 'none'}")
    return results


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--echo":
        _echo_main(int(sys.argv[2]))
    else:
        import json
        print(json.dumps(run(quick="--quick" in sys.argv), indent=2, default=float))
