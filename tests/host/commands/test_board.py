"""``gradwire board``: serve (a real process: ready line, SIGTERM, SIGINT), status,
wire-status, ping,
configure-job, compress and decompress against a virtual board on 127.0.0.1, and the
one-line errors (unreachable, wrong key, missing service, no key)."""
import json
import os
import re
import select
import signal
import socket
import threading
import time

import numpy as np
import pytest

from contract.counters import AGG_COUNTERS, NET_COUNTERS, NIC_TX_COUNTERS
from contract.network import NET_REGISTERS, Service, network_address, service_ports
from contract.registers import SWITCH_REGISTERS, WIRE_REGISTERS, decode_switch_params
from host.board import VirtualBoard, free_port_base
from host.cli import main
from host.driver.settings import format_key
from host.driver.udp import UdpTransport
from tests.helpers import serve_board

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))


def run(capsys, *argv):
    status = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture
def board(monkeypatch):
    for name in ("GRADWIRE_BOARD", "GRADWIRE_PORT_BASE", "GRADWIRE_KEY", "GRADWIRE_MTU"):
        monkeypatch.delenv(name, raising=False)
    with VirtualBoard("golden", port_base=None, slots=16) as b:
        yield b


def where(b, key=True):
    args = ["--board", f"127.0.0.1:{b.port_base}", "--timeout", "1"]
    return args + (["--key", format_key(b.key)] if key else [])


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_serve_prints_ready_answers_and_stops_cleanly(signum):
    base = free_port_base()
    process, lines = serve_board("--port-base", str(base), "--fault-rate", "0.05", "--slots", "8")
    try:
        key = int(re.search(r"control key ([0-9a-f]{16})", "".join(lines)).group(1), 16)
        with UdpTransport("127.0.0.1", port_base=base, key=key, region="switch",
                          retries=30) as t:
            params = decode_switch_params(t.read(SWITCH_REGISTERS["params"].address))
        assert params["slots"] == 8
        process.send_signal(signum)
        out, err = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err
    assert "stopped after" in out and "wire faults" in out
    # its ports are free again
    VirtualBoard("golden", port_base=base).open().stop()


def test_serve_uses_the_given_key_and_refuses_a_bad_one(capsys):
    base = free_port_base()
    process, lines = serve_board("--port-base", str(base), "--key", "00000000000000ff",
                           "--without", "switch")
    try:
        assert not any("control key" in line for line in lines)     # not printed when given
        with UdpTransport("127.0.0.1", port_base=base, key=0xFF) as t:
            services = t.read(network_address("net", NET_REGISTERS["services"].address))
        assert services == 0b1011
    finally:
        process.terminate()
        process.communicate(timeout=20)
    status, _, err = run(capsys, "board", "serve", "--key", "nothex")
    assert status == 2 and "hex digits" in err


def test_status_reads_everything(board, capsys):
    from host.driver.switch import SwitchInterface
    with board.transport(region="switch") as t:
        SwitchInterface(t).configure_job(1, 2, 4, 4)
        t.worker_address(1, 0)
    status, out, _ = run(capsys, "board", "status", "--json", *where(board))
    assert status == 0
    s = json.loads(out)
    assert s["board"] == {"mac": "02:47:57:00:00:01", "ip": "192.168.77.2",
                          "port_base": board.port_base, "link": True,
                          "services": ["nic_tx", "nic_rx", "switch", "ctrl"]}
    assert s["switch"]["slots"] == 16 and s["switch"]["lanes"] == 64
    job = s["switch"]["jobs"]["1"]
    assert (job["workers"], job["slot_base"], job["slot_count"]) == (2, 4, 4)
    assert job["worker_table"]["0"].startswith("127.0.0.1:") and job["worker_table"]["1"] is None
    assert list(s["counters"]["net"]) == list(NET_COUNTERS)
    assert list(s["counters"]["nic_tx"]) == list(NIC_TX_COUNTERS)
    assert list(s["counters"]["switch"]) == list(AGG_COUNTERS)
    assert s["counters"]["net"]["ctrl_in"] >= s["control_packets"] > 1
    status, out, _ = run(capsys, "board", "status", *where(board))
    assert status == 0 and "link up" in out and "drop_bad_source" in out and "job 1" in out


def test_wire_status_reads_the_wire_counters(capsys, monkeypatch):
    """A golden wire's control service behind UDP sockets: frames through it, then
    ``wire-status`` reads each port's and the NIC engines' counters, exactly the golden
    model's; a network board reads the wire's region as 0 and the command says so."""
    from host.board.wire_golden import GoldenWire
    from sim.frames import KEY, PASS_THROUGH, frame, gradient, raw_packet, values
    for name in ("GRADWIRE_BOARD", "GRADWIRE_PORT_BASE", "GRADWIRE_KEY", "GRADWIRE_MTU"):
        monkeypatch.delenv(name, raising=False)
    wire = GoldenWire(KEY)
    rng = np.random.default_rng(5)
    for n in range(3):
        wire.receive(0, frame(gradient(raw_packet(values(rng, 40 * n + 1), 10))))
    wire.receive(1, frame(PASS_THROUGH["tcp"]))
    wire.receive(1, frame(PASS_THROUGH["tcp"])[:-1])        # bad FCS
    with VirtualBoard(wire.board, port_base=None) as b:
        b.key = KEY
        status, out, _ = run(capsys, "board", "wire-status", "--json", *where(b))
        assert status == 0
        counters = json.loads(out)["counters"]
        assert counters == {entry.name: {name: wire.read(network_address("wire", local))
                                         for name, local in entry.items()}
                            for entry in WIRE_REGISTERS}
        assert counters["port0"]["frames_in"] == 3 and counters["port0"]["compressed"] >= 2
        assert counters["port1"]["drop_fcs"] == 1 and counters["tx"]["packets"] == 3
        status, out, _ = run(capsys, "board", "wire-status", *where(b))
        assert status == 0 and "port 1 (network)" in out and "drop_fcs" in out
    with VirtualBoard("golden", port_base=None) as b:
        status, out, _ = run(capsys, "board", "wire-status", *where(b))
        assert status == 0 and "every counter reads 0" in out


def test_ping_times_round_trips(board, capsys):
    status, out, _ = run(capsys, "board", "ping", "-c", "3", "-i", "0", *where(board))
    assert status == 0 and out.count("reply in") == 3 and "0% lost" in out



class SlowControlRelay:
    """A control port in front of ``board``'s that holds every reply after the first back
    for ``delay`` seconds: a round trip that grows after the first one."""

    def __init__(self, board, delay):
        self.port_base = free_port_base()
        self.delay = delay
        self.front = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.front.bind(("127.0.0.1", service_ports(self.port_base)[Service.CTRL]))
        self.back = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.back.connect(("127.0.0.1", service_ports(board.port_base)[Service.CTRL]))
        self.replies = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        client = None
        while not self._stop.is_set():
            ready, _, _ = select.select([self.front, self.back], [], [], 0.05)
            if self.front in ready:
                data, client = self.front.recvfrom(1 << 16)
                self.back.send(data)
            if self.back in ready:
                data = self.back.recv(1 << 16)
                self.replies += 1
                delay = 0.0 if self.replies == 1 else self.delay
                threading.Timer(delay, self.front.sendto, (data, client)).start()

    def close(self):
        self._stop.set()
        self._thread.join()
        time.sleep(self.delay)               # the held replies' timers
        self.front.close()
        self.back.close()


def test_ping_waits_its_timeout_for_a_round_trip_slower_than_the_last(board, capsys):
    """A reply within ``--timeout`` is a reply, however fast the ones before it came."""
    relay = SlowControlRelay(board, delay=0.15)
    try:
        status, out, _ = run(capsys, "board", "ping", "-c", "3", "-i", "0", "--board",
                             f"127.0.0.1:{relay.port_base}", "--timeout", "1", "--key",
                             format_key(board.key))
    finally:
        relay.close()
    assert status == 0 and out.count("reply in") == 3 and "0% lost" in out, out
    assert "no reply" not in out

def test_a_wrong_key_and_an_unreachable_board_are_one_line_errors_in_bounded_time(
        board, capsys):
    wrong = where(board, key=False) + ["--key", format_key(board.key ^ 1)]
    started = time.monotonic()
    status, _, err = run(capsys, "board", "status", *wrong)
    assert status == 2 and "control key is wrong" in err and err.count("\n") == 1
    base = free_port_base()
    status, _, err = run(capsys, "board", "ping", "-c", "1", "--board", f"127.0.0.1:{base}",
                         "--key", "1", "--timeout", "0.5")
    assert status == 2 and "no reply from the board at 127.0.0.1 ports" in err
    assert time.monotonic() - started < 30
    status, _, err = run(capsys, "board", "status", *where(board, key=False))
    assert status == 2 and "no control key" in err


def test_configure_job_with_worker_addresses(board, capsys):
    status, out, _ = run(capsys, "board", "configure-job", "2", "--workers", "2", "--slots",
                         "8:4", "--worker", "127.0.0.1:41000", "--worker", "127.0.0.1:41001",
                         *where(board))
    assert status == 0 and "job 2: 2 workers, slots 8..11" in out
    assert board.backend.aggregator.job_config(2).slot_range == range(8, 12)
    assert board.backend.worker_table[(2, 1)][1] == 41001
    status, _, err = run(capsys, "board", "configure-job", "3", "--workers", "1", "--slots",
                         "10:2", *where(board))
    assert status == 2 and "rejected" in err
    status, _, err = run(capsys, "board", "configure-job", "3", "--workers", "2", "--worker",
                         "127.0.0.1:1", *where(board))
    assert status == 2 and "one --worker address per worker" in err
    status, out, _ = run(capsys, "board", "configure-job", "2", "--clear", *where(board))
    assert status == 0 and board.backend.aggregator.job_config(2) is None


def test_compress_and_decompress_through_the_board_match_the_software_codec(
        board, tmp_path, capsys):
    rng = np.random.default_rng(8)
    x = (rng.standard_normal((30, 101)) * 0.01).astype(np.float32)
    x.reshape(-1)[:3] = [np.nan, -0.0, 7.0]
    np.save(tmp_path / "x.npy", x)
    status, out, _ = run(capsys, "board", "compress", tmp_path / "x.npy", tmp_path / "b.gwz",
                         "-k", "9", *where(board, key=False))
    assert status == 0 and "values/s" in out and "resends" in out
    assert run(capsys, "compress", tmp_path / "x.npy", tmp_path / "s.gwz", "-k", "9",
               "--packet-values", "336")[0] == 0
    assert (tmp_path / "b.gwz").read_bytes() == (tmp_path / "s.gwz").read_bytes()
    status, out, _ = run(capsys, "board", "decompress", tmp_path / "b.gwz",
                         tmp_path / "b.npy", *where(board, key=False))
    assert status == 0
    assert run(capsys, "decompress", tmp_path / "s.gwz", tmp_path / "s.npy")[0] == 0
    a, b = np.load(tmp_path / "b.npy"), np.load(tmp_path / "s.npy")
    assert a.shape == x.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))
    # a file of jumbo packets needs jumbo frames
    assert run(capsys, "compress", tmp_path / "x.npy", tmp_path / "j.gwz", "-k", "9")[0] == 0
    status, _, err = run(capsys, "board", "decompress", tmp_path / "j.gwz", tmp_path / "j.npy",
                         *where(board, key=False))
    assert status == 2 and "--mtu 9000" in err
    status, _, _ = run(capsys, "board", "decompress", tmp_path / "j.gwz", tmp_path / "j.npy",
                       "--mtu", "9000", *where(board, key=False))
    assert status == 0 and np.array_equal(np.load(tmp_path / "j.npy").view(np.uint32),
                                          b.view(np.uint32))


def test_a_board_built_without_a_service_says_so(tmp_path, capsys, monkeypatch):
    np.save(tmp_path / "x.npy", np.ones(10, np.float32))
    with VirtualBoard("golden", port_base=None,
                      services=[Service.NIC_RX, Service.CTRL]) as b:
        status, _, err = run(capsys, "board", "compress", tmp_path / "x.npy",
                             tmp_path / "x.gwz", *where(b))
        assert status == 2 and "built without the NIC transmit path" in err
        # from the environment, without the key: the request goes unanswered, in bounded time
        monkeypatch.setenv("GRADWIRE_BOARD", f"127.0.0.1:{b.port_base}")
        status, _, err = run(capsys, "board", "compress", tmp_path / "x.npy",
                             tmp_path / "x.gwz", "--timeout", "0.5")
        assert status == 2 and "no reply from the board's nic_tx service" in err
        assert not (tmp_path / "x.gwz").exists()
