"""``gradwire board serve --backend verilator --tap NAME``: the Verilated network top on a
Linux TAP interface, reached by the host's own network stack.

The end-to-end tests run ``tap_rehearsal.py`` once under ``unshare -n``: a network namespace
of its own, with the TAP inside it (never in the machine's namespace), where it takes the
bring-up steps of docs/bring-up.md (ping and ARP, ``board status``, ``board compress``, NIC
datagrams from a kernel socket, a two-rank training run with ``backend="udp"``) and the
refusals; they are skipped, saying why, where the machine allows no namespace or has no
TUN/TAP.
The loop's idle ticks, the batch classification and the option checks are tested here
directly, without a namespace."""
import os
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from scapy.layers.inet import ICMP, IP, UDP
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw

from contract.network import PORT_BASE, SERVICE_OFFSETS, Service
from host.board import tap as tapmod
from host.cli import main
from tests.helpers import namespace_command, run_in_namespace

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
DRIVER = HERE / "tap_rehearsal.py"
BOARD_IP, BOARD_MAC, HOST_IP = "192.168.77.2", "02:47:57:00:00:01", "192.168.77.1"
#: the driver's bound: the harness built from scratch takes minutes (two builds: the
#: simulation key's and the ``auth`` step's 128-bit key's), a cached one seconds
DRIVER_TIMEOUT = 1500


def _namespace_command():
    """``unshare -n`` (root) or ``unshare -rn`` (a user namespace), or why neither works."""
    if not os.path.exists("/dev/net/tun"):
        return None, "no /dev/net/tun (TUN/TAP driver not loaded, or not in this container)"
    return namespace_command("ip tuntap add dev probe0 mode tap", "a TAP")


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    command, why = _namespace_command()
    if command is None:
        pytest.skip(why)
    result = run_in_namespace(command, DRIVER, tmp_path_factory.mktemp("tap") /
                              "rehearsal.json", DRIVER_TIMEOUT)
    result["as_root"] = os.geteuid() == 0
    return result


def _no_errors(r, step):
    assert step not in r.get("errors", {}), r["errors"][step]


# ---- end to end, in a namespace of its own ----------------------------------------------

def test_serve_says_ready_with_the_simulation_key_and_stops_cleanly(rehearsal):
    from contract.network import SIMULATION_KEY
    lines = "\n".join(rehearsal["serve_lines"])
    assert f"control key {SIMULATION_KEY:016x}" in lines
    assert f"ready on TAP tap0: board {BOARD_IP} ({BOARD_MAC}) ports {PORT_BASE}-" \
           f"{PORT_BASE + 3}" in lines
    # the interface was configured before serve: no hint about it
    assert "has no IPv4 address" not in lines and "is down" not in lines
    assert rehearsal["serve_rc"] == 0, rehearsal["serve_stderr"]
    assert "stopped after" in rehearsal["serve_tail"][-1]
    assert "Traceback" not in rehearsal["serve_stderr"]


def test_ping_reaches_the_board_and_arp_resolves(rehearsal):
    _no_errors(rehearsal, "ping")
    p = rehearsal["ping"]
    if "ping_rc" in p:                               # the ping binary, where there is one
        assert p["ping_rc"] == 0 and "3 received" in p["ping_output"][0], p
    echo = p["icmp_socket"]                          # an ICMP echo from a raw kernel socket
    assert (echo["src"], echo["id"], echo["seq"], echo["payload"]) == \
        (BOARD_IP, 0x4757, 1, "gradwire")
    assert f"lladdr {BOARD_MAC}" in p["neigh"]       # the kernel's ARP resolved the board
    arp = {(a["op"], a["hwsrc"], a["psrc"], a["pdst"]) for a in rehearsal["arp"]}
    # the board answered the kernel's request ...
    assert (2, BOARD_MAC, BOARD_IP, HOST_IP) in arp
    # ... and took the host's address from it (RFC 826's merge rule, docs/network-contract.md):
    # its echo replies needed no ARP exchange of its own
    assert not any(op == 1 and src == BOARD_IP for op, _, src, _ in arp), arp


def test_status_reads_the_board_over_kernel_sockets(rehearsal):
    _no_errors(rehearsal, "status")
    s = rehearsal["status"]
    assert s["rc"] == 0, s["stderr"]
    board = s["json"]["board"]
    assert (board["ip"], board["mac"], board["port_base"], board["link"]) == \
        (BOARD_IP, BOARD_MAC, PORT_BASE, True)
    assert set(board["services"]) == {"nic_tx", "nic_rx", "switch", "ctrl"}
    assert s["json"]["counters"]["net"]["ctrl_in"] >= 1
    # `board ping` waits its --timeout (3 s) for each reply: the simulation's 5-60 ms round
    # trips all come back
    assert rehearsal["board_ping"]["rc"] == 0
    assert "3 requests, 3 replies" in rehearsal["board_ping"]["summary"][0]


def test_board_compress_and_decompress_match_the_software_codec(rehearsal):
    _no_errors(rehearsal, "compress")
    c = rehearsal["compress"]
    assert c["rc"] == 0, c["stderr"]
    assert c["same_as_software"] and c["decompress_rc"] == 0 and c["decompressed_same"]


def test_nic_datagrams_from_a_kernel_socket_come_back_as_the_golden_codec(rehearsal):
    _no_errors(rehearsal, "udp")
    u = rehearsal["udp"]
    assert u["packets"] == 64 and u["tx_datagrams"] >= 64 and u["rx_datagrams"] >= 64
    assert u["same_as_golden"]


def test_a_training_run_with_the_udp_backend_trains_through_the_tap(rehearsal):
    _no_errors(rehearsal, "train")
    t = rehearsal["train"]
    if t["rc"] != 0 and "No module named 'torch'" in t["stderr"]:
        pytest.skip("no torch")
    assert t["rc"] == 0, t["stderr"]
    assert t["same_on_both_ranks"] == {"inceptionn": True, "lhc": True}
    for rank in t["ranks"]:
        inc, lhc = rank["inceptionn"], rank["lhc"]
        assert inc["backend"] == lhc["backend"] == "udp"
        assert inc["stats"]["backend"].startswith("udp (192.168.77.2")
        assert lhc["stats"]["backend"].startswith("udp (switch of 192.168.77.2")
        # the gradients went through the board: its NIC paths and its switch
        assert inc["stats"]["tx_packets_out"] > 0 and inc["stats"]["rx_packets_out"] > 0
        assert lhc["stats"]["results"] > 0 and lhc["stats"]["packets"] > 0


def test_section_7s_gateware_serves_control_and_an_authenticated_job_through_the_tap(rehearsal):
    """The board served again, built with a 128-bit key (``make bitstream``'s default): its
    status over kernel sockets, and the training run, whose ``LhcHook`` job the board
    authenticates (every switch datagram on the TAP tagged), bit-identical on both ranks; no
    key byte in any frame."""
    _no_errors(rehearsal, "auth")
    lines = "\n".join(rehearsal["auth_serve_lines"])
    assert "control key as given (128 bits" in lines and "5a17c3e0" not in lines
    a = rehearsal["auth"]
    assert a["status"]["rc"] == 0, a["status"]["stderr"]
    assert a["status"]["json"]["counters"]["auth"] == {"drop_bad_tag": 0, "drop_replay": 0}
    t = a["train"]
    if t["rc"] != 0 and "No module named 'torch'" in t["stderr"]:
        pytest.skip("no torch")
    assert t["rc"] == 0, t["stderr"]
    assert t["same_on_both_ranks"] == {"inceptionn": True, "lhc": True}
    assert all(rank["lhc"]["stats"]["results"] > 0 for rank in t["ranks"])
    frames = rehearsal["auth_frames"]
    assert frames["switch_datagrams"] > 10 and frames["switch_untagged"] == 0, frames
    assert frames["key_bytes_seen"] == 0
    after = a["status_after"]["json"]["counters"]["auth"]
    assert after["drop_bad_tag"] == 0
    assert rehearsal["auth_serve_rc"] == 0, rehearsal["auth_serve_stderr"]


def test_serve_tap_refuses_in_one_line_where_it_cannot_attach(rehearsal):
    if not rehearsal["as_root"]:
        pytest.skip("the refusals are staged as root (setpriv to another user, caps dropped)")
    _no_errors(rehearsal, "refusals")
    r = rehearsal["refusals"]
    expected = {"other_user": "cannot open /dev/net/tun: permission denied",
                "no_net_admin": "cannot attach to TAP tap9: operation not permitted",
                "busy": "cannot attach to TAP tap0: it is busy",
                "not_a_tap": "it exists and is not a TAP interface"}
    if os.stat("/dev/net/tun").st_mode & 0o006:
        del expected["other_user"]       # a device open to every user: that case passes
    for case, text in expected.items():
        if case not in r:
            assert case == "not_a_tap"   # no dummy interfaces in this kernel
            continue
        assert r[case]["rc"] == 2, (case, r[case])
        assert r[case]["stderr"].count("\n") == 0 and text in r[case]["stderr"], (case, r[case])
        assert "Errno" not in r[case]["stderr"]
        assert r[case]["seconds"] < 30          # before the harness is built


# ---- the option checks (no namespace: nothing here opens a TAP) ---------------------------

@pytest.mark.parametrize("argv,text", [
    (["--tap", "tap0"], "give --backend verilator (not golden)"),
    (["--tap", "a/b", "--backend", "verilator", "--key", "0123456789abcdef0"],
     "--key: "),
    (["--tap", "tap0", "--backend", "verilator", "--fault-rate", "0.1"], "tc netem"),
    (["--tap", "tap0", "--backend", "verilator", "--port-base", "40000"],
     f"the ports it is built with, {PORT_BASE}-{PORT_BASE + 3}"),
    (["--tap", "a/b", "--backend", "verilator"], "bad interface name 'a/b'"),
    (["--tap", "x" * 16, "--backend", "verilator"], "bad interface name"),
])
def test_serve_tap_options_are_checked_in_one_line(argv, text, capsys, monkeypatch):
    for name in ("GRADWIRE_KEY", "GRADWIRE_PORT_BASE"):
        monkeypatch.delenv(name, raising=False)
    assert main(["board", "serve", *argv]) == 2
    err = capsys.readouterr().err
    assert text in err and err.count("\n") == 1, err


def test_serve_tap_checks_the_key_from_the_environment_too(capsys, monkeypatch):
    monkeypatch.setenv("GRADWIRE_KEY", "0123456789abcdef0")          # 17 digits: no key
    assert main(["board", "serve", "--backend", "verilator", "--tap", "a/b"]) == 2
    assert "GRADWIRE_KEY" in capsys.readouterr().err
    # a key (any: its own build) passes on to the next check (here: the interface name)
    for key in ("53494d554c415445", "5a17c3e08b94d2f61e0d7c3ba2958406"):
        monkeypatch.setenv("GRADWIRE_KEY", key)
        assert main(["board", "serve", "--backend", "verilator", "--tap", "a/b"]) == 2
        assert "bad interface name" in capsys.readouterr().err


# ---- the loop, with stand-ins for the TAP and the harness ---------------------------------

class _Device:
    """One end of a SOCK_SEQPACKET pair: frames keep their boundaries, as on a TAP."""

    def __init__(self):
        self.board_end, self.wire_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.board_end.setblocking(False)
        self.name = "fake0"

    def fileno(self):
        return self.board_end.fileno()

    def read_frames(self, limit=256):
        frames = []
        while len(frames) < limit:
            try:
                frames.append(self.board_end.recv(1 << 16))
            except BlockingIOError:
                break
        return frames

    written = 0

    def write(self, frame):
        self.board_end.send(frame)
        self.written += 1
        return True

    def close(self):
        self.board_end.close()
        self.wire_end.close()


class _Harness:
    """Records every run; answers each frame with its reversal."""

    def __init__(self):
        self.runs = []
        self.written_before = []
        self.device = None

    def run(self, frames, *, idle, stop_on_arp, expect):
        self.runs.append((time.monotonic(), list(frames), expect))
        self.written_before.append(self.device.written if self.device else 0)
        out = [f[::-1] for f in frames]
        return SimpleNamespace(frames=out, cycles=idle, loop_seconds=0.001)


def _fake_board():
    harness = _Harness()
    backend = SimpleNamespace(harness=harness, key=1, ip=BOARD_IP, mac=BOARD_MAC,
                              port_base=PORT_BASE, idle=2000, describe=lambda: "fake",
                              close=lambda: None)
    device = harness.device = _Device()
    return tapmod.TapBoard("fake0", device=device, backend=backend), device, harness


def test_a_quiet_wire_still_runs_the_gateware_ever_less_often():
    board, device, harness = _fake_board()
    try:
        board.serve_forever(deadline=time.monotonic() + 1.5)
        ticks = [t for t, frames, _ in harness.runs if not frames]
        assert len(ticks) == board.stats["ticks"] >= 5
        gaps = [b - a for a, b in zip(ticks, ticks[1:])]
        # from MIN_TICK doubling up to MAX_TICK: the last gaps are far longer than the first
        assert gaps[0] < 0.05 and max(gaps) >= 0.2 and max(gaps) < tapmod.MAX_TICK + 0.2
        assert len(ticks) < 20
    finally:
        board.close()


@pytest.mark.parametrize("count,size", [(2, 10), (9, 1400), (40, 100)])
def test_frames_go_in_a_few_at_a_time_and_their_replies_go_out_before_the_next(count, size):
    board, device, harness = _fake_board()
    frames = [bytes(Ether(dst=BOARD_MAC) / IP(dst=BOARD_IP) /
                    UDP(dport=PORT_BASE + SERVICE_OFFSETS[Service.CTRL]) /
                    Raw(bytes([n]) * size)) for n in range(count)]
    chunk = tapmod.CHUNK_BYTES // len(frames[0])          # frames of one chunk
    for f in frames:
        device.wire_end.send(f)
    thread = threading.Thread(target=board.serve_forever,
                              kwargs={"deadline": time.monotonic() + 5})
    thread.start()
    try:
        device.wire_end.settimeout(5)
        back = [device.wire_end.recv(1 << 16) for _ in frames]
    finally:
        board.request_stop()
        thread.join(10)
        board.close()
    assert not thread.is_alive()
    assert back == [f[::-1] for f in frames]
    runs = [(frames_in, expect, written) for (_, frames_in, expect), written
            in zip(harness.runs, harness.written_before) if frames_in]
    # control requests, a chunk at a time: one reply each at most, and every earlier
    # chunk's replies already on the wire when the next one runs
    assert runs == [(frames[i:i + chunk], len(frames[i:i + chunk]), i)
                    for i in range(0, count, chunk)]
    assert board.stats["frames_in"] == count and board.stats["frames_out"] == count


def test_only_a_batch_of_nic_and_control_requests_expects_one_reply_each():
    ports = {PORT_BASE + SERVICE_OFFSETS[s] for s in (Service.NIC_TX, Service.NIC_RX,
                                                      Service.CTRL)}

    def udp(port, dst=BOARD_IP):
        return bytes(Ether(dst=BOARD_MAC) / IP(dst=dst) / UDP(dport=port) / Raw(b"p"))

    nic, ctrl = udp(PORT_BASE), udp(PORT_BASE + SERVICE_OFFSETS[Service.CTRL])
    classify = tapmod._classify
    assert classify([nic, ctrl, nic], BOARD_IP, ports) == 3
    # the switch sends any number of results; ICMP and ARP answers are no UDP; a frame for
    # another host brings nothing: each makes the run wait out the idle time
    for other in (udp(PORT_BASE + SERVICE_OFFSETS[Service.SWITCH]), udp(PORT_BASE, "10.0.0.1"),
                  bytes(Ether(dst=BOARD_MAC) / IP(dst=BOARD_IP) / ICMP()),
                  bytes(Ether(dst="ff:ff:ff:ff:ff:ff") / ARP(pdst=BOARD_IP))):
        assert classify([nic, other], BOARD_IP, ports) is None
