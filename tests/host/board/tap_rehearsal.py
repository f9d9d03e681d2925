"""The bring-up of docs/bring-up.md, run against the TAP board inside a network namespace of
its own.

Run by ``tests/host/board/test_tap.py`` as ``unshare -n python tests/host/board/tap_rehearsal.py
OUT.json [STEPS...]``: it refuses to run anywhere but in a fresh namespace (only ``lo``), so
it can never configure the machine's own interfaces. It creates ``tap0`` there, gives the
host 192.168.77.1/24, starts ``gradwire board serve --backend verilator --tap tap0`` and
takes that page's steps with the host's own tools and sockets, recording what each saw
(frames on the TAP are captured with scapy, which also parses them). The namespace, the
TAP and every process go away when it exits.

Steps (default: all): ``ping`` (ICMP echo through the kernel, and the kernel's ARP entry
for the board), ``status`` (``gradwire board status --json``), ``compress``
(``gradwire board compress`` and ``decompress``), ``udp`` (a burst of NIC datagrams from a
kernel UDP socket, timed), ``train`` (a training run with ``backend="udp"``: two ranks,
``InceptionnHook`` and ``LhcHook``), ``refusals`` (``serve --tap`` as another user,
without ``CAP_NET_ADMIN``, on a busy TAP and on an interface that is not a TAP), ``auth``
(last: the board served again, built with a 128-bit key, then ``board status`` and the
training run on it: section 7's tags on every control datagram, and on the aggregation of
the job ``LhcHook`` authenticates; the frames on the TAP searched for key bytes).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

TAP = "tap0"
HOST_IP, BOARD_IP = "192.168.77.1", "192.168.77.2"
BOARD_MAC = "02:47:57:00:00:01"
ALL_STEPS = ("ping", "status", "compress", "udp", "train", "refusals", "auth")
#: The ``auth`` step's board: the Verilated top built with this 128-bit key (section 7's
#: gateware, as ``make bitstream`` builds it by default). The key of the Verilated section 7
#: tests and bench (``sim/benchmarks/ctrl_auth.py``): one harness build serves them all.
AUTH_KEY = "5a17c3e08b94d2f61e0d7c3ba2958406"
SWITCH_PORT = 47572
#: seconds any one tool may take (the simulation answers in tens of milliseconds; the
#: first run of a fresh harness build is not done here)
TOOL_TIMEOUT = 120


def sh(*argv, timeout=TOOL_TIMEOUT, check=True):
    r = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout,
                       cwd=REPO)
    if check and r.returncode:
        raise RuntimeError(f"{' '.join(map(str, argv))} failed ({r.returncode}): "
                           f"{r.stdout[-2000:]} {r.stderr[-2000:]}")
    return r


def gradwire(*argv, **kw):
    return sh(sys.executable, "-m", "host.cli", *argv, **kw)


def fresh_namespace() -> bool:
    """Only ``lo`` here: a namespace of our own (``if_nameindex`` asks the current
    namespace; ``/sys/class/net`` would show the one sysfs was mounted in)."""
    return [name for _, name in socket.if_nameindex()] == ["lo"]


def step_ping(out, key):
    from scapy.layers.inet import ICMP, IP
    result = {}
    if shutil.which("ping"):
        r = sh("ping", "-n", "-c", "3", "-i", "0.2", "-W", "10", BOARD_IP, check=False)
        result["ping_output"] = r.stdout.strip().splitlines()[-2:]
        result["ping_rc"] = r.returncode
        m = re.search(r"= ([\d.]+)/([\d.]+)/([\d.]+)", r.stdout)
        result["ping_rtt_ms"] = [float(v) for v in m.groups()] if m else None
    # the same through a raw kernel socket (the message built by scapy), so that the step
    # does not depend on the ping binary
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP) as s:
        s.settimeout(10)
        s.sendto(bytes(ICMP(type=8, id=0x4757, seq=1) / b"gradwire"), (BOARD_IP, 0))
        started = time.perf_counter()
        while True:
            data, (src, _) = s.recvfrom(2048)
            reply = IP(data)
            if src == BOARD_IP and ICMP in reply and reply[ICMP].type == 0:
                break
        result["icmp_socket"] = {"src": src, "id": reply[ICMP].id, "seq": reply[ICMP].seq,
                                 "payload": bytes(reply[ICMP].payload).decode(errors="replace"),
                                 "ms": (time.perf_counter() - started) * 1e3}
    r = sh("ip", "neigh", "show", BOARD_IP, "dev", TAP)
    result["neigh"] = r.stdout.strip()
    out["ping"] = result


def step_status(out, key):
    r = gradwire("board", "status", "--board", BOARD_IP, "--key", key, "--json", check=False)
    out["status"] = {"rc": r.returncode, "stderr": r.stderr.strip()[-500:],
                     "json": json.loads(r.stdout) if r.returncode == 0 else None}
    r = gradwire("board", "ping", "--board", BOARD_IP, "--key", key, "-c", "3", check=False)
    out["board_ping"] = {"rc": r.returncode, "summary": r.stdout.strip().splitlines()[-1:]}


def step_compress(out, key):
    import numpy as np
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        x = (np.random.default_rng(8).standard_normal(2000) * 0.01).astype(np.float32)
        x[:3] = [np.nan, -0.0, 7.0]
        np.save(tmp / "x.npy", x)
        r = gradwire("board", "compress", tmp / "x.npy", tmp / "b.gwz", "-k", "9",
                     "--board", BOARD_IP, check=False)
        result = {"rc": r.returncode, "stdout": r.stdout.strip().splitlines(),
                  "stderr": r.stderr.strip()[-500:]}
        if r.returncode == 0:
            # the software codec with the board's packet size: the same file, bit for bit
            values = re.search(r"packets of <= (\d+) values", r.stdout).group(1)
            gradwire("compress", tmp / "x.npy", tmp / "s.gwz", "-k", "9", "--packet-values",
                     values)
            result["same_as_software"] = (tmp / "b.gwz").read_bytes() == \
                (tmp / "s.gwz").read_bytes()
            d = gradwire("board", "decompress", tmp / "b.gwz", tmp / "b.npy",
                         "--board", BOARD_IP, check=False)
            result["decompress_rc"] = d.returncode
            if d.returncode == 0:
                gradwire("decompress", tmp / "s.gwz", tmp / "s.npy")
                result["decompressed_same"] = bool(np.array_equal(
                    np.load(tmp / "b.npy").view(np.uint32), np.load(tmp / "s.npy").view(np.uint32)))
    out["compress"] = result


def step_udp(out, key):
    """NIC datagrams from an ordinary kernel UDP socket (the driver's transport): a window
    of small packets through the transmit path and back through the receive path, timed;
    the values must come back as the golden codec quantises them."""
    import numpy as np
    from contract.network import Service
    from host.driver.nic import NicInterface
    from host.driver.udp import UdpTransport
    from host.golden import inceptionn as inc
    x = (np.random.default_rng(9).standard_normal(64 * 32) * 0.01).astype(np.float32)
    with UdpTransport(BOARD_IP, key=int(key, 16), region="nic", timeout=5.0, min_timeout=1.0,
                      max_timeout=30.0) as t:
        nic = NicInterface(t, packet_values=32)
        started = time.perf_counter()
        packets = nic.transmit(x, 10)
        tx_seconds = time.perf_counter() - started
        started = time.perf_counter()
        y = nic.receive(packets, x.size)
        rx_seconds = time.perf_counter() - started
        tx, rx = t.network[Service.NIC_TX], t.network[Service.NIC_RX]
    out["udp"] = {"packets": len(packets), "tx_seconds": tx_seconds, "rx_seconds": rx_seconds,
                  "tx_datagrams": tx.datagrams, "rx_datagrams": rx.datagrams,
                  "resends": tx.resends + rx.resends,
                  "datagrams_per_s": (tx.datagrams + rx.datagrams) / (tx_seconds + rx_seconds),
                  "same_as_golden": bool(np.array_equal(
                      y.view(np.uint32), inc.quantize(x, 10).view(np.uint32)))}


TRAIN = r"""
import json, os, sys
import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
sys.path.insert(0, os.environ["REPO"])
from host import ddp

def main(rank, world, key, results):
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29517", rank=rank,
                            world_size=world)
    out = {}
    for name, make in (("inceptionn", lambda: ddp.InceptionnHook(k=10, backend="udp",
                                                                  board="192.168.77.2")),
                       ("lhc", lambda: ddp.LhcHook(backend="udp", board="192.168.77.2",
                                                   key=key))):
        torch.manual_seed(3)
        net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        model = DistributedDataParallel(net)
        hook = make()
        model.register_comm_hook(state=None, hook=hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(40 + rank)
        losses = []
        for _ in range(3):
            opt.zero_grad()
            x = torch.randn(32, 8, generator=g)
            loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
            loss.backward()
            opt.step()
            losses.append(float(loss))
        params = torch.cat([p.detach().reshape(-1) for p in net.parameters()]).numpy()
        out[name] = {"losses": losses, "backend": hook.backend,
                     "stats": {k: v for k, v in (hook.hardware_stats or {}).items()
                               if isinstance(v, (int, float, str))},
                     "param_bits": params.view(np.uint32).tolist()}
        hook.close()
    dist.destroy_process_group()
    with open(results + f".{rank}", "w") as f:
        json.dump(out, f)

if __name__ == "__main__":
    world, key, results = 2, sys.argv[1], sys.argv[2]
    torch.multiprocessing.spawn(main, args=(world, key, results), nprocs=world)
"""


def step_train(out, key):
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "train.py"
        script.write_text(TRAIN)
        results = Path(tmp) / "r"
        started = time.perf_counter()
        r = subprocess.run([sys.executable, str(script), key, str(results)], capture_output=True,
                           text=True, timeout=TOOL_TIMEOUT * 2, env={**os.environ,
                                                                    "REPO": str(REPO)})
        result = {"rc": r.returncode, "seconds": time.perf_counter() - started,
                  "stderr": r.stderr[-1500:]}
        if r.returncode == 0:
            ranks = [json.loads(Path(f"{results}.{i}").read_text()) for i in range(2)]
            result["ranks"] = ranks
            # data parallel: every rank holds the same parameters after every step
            result["same_on_both_ranks"] = {
                name: ranks[0][name]["param_bits"] == ranks[1][name]["param_bits"]
                for name in ranks[0]}
    out["train"] = result


def step_refusals(out, key):
    """``serve --tap`` where it cannot work: one line on stderr, exit status 2, at once
    (the TAP is opened before the harness is built). Run while the board serves tap0."""
    serve = [sys.executable, "-m", "host.cli", "board", "serve", "--backend", "verilator",
             "--tap"]
    cases = {
        # /dev/net/tun is root's (0600 here): another user cannot open it
        "other_user": ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                       *serve, "tap9"],
        # root without CAP_NET_ADMIN may open it but not create an interface
        "no_net_admin": ["setpriv", "--inh-caps=-net_admin", "--bounding-set=-net_admin",
                         *serve, "tap9"],
        # tap0 is the serving board's
        "busy": [*serve, TAP],
    }
    if sh("ip", "link", "add", "dummy0", "type", "dummy", check=False).returncode == 0:
        cases["not_a_tap"] = [*serve, "dummy0"]
    result = {}
    for name, argv in cases.items():
        t = time.perf_counter()
        r = sh(*argv, check=False, timeout=60)
        result[name] = {"rc": r.returncode, "stderr": r.stderr.strip(),
                        "seconds": round(time.perf_counter() - t, 2)}
    out["refusals"] = result


def step_auth(out, key):
    """On the board built with the 128-bit ``key`` (served by :func:`main`): its status,
    the training run, its counters after."""
    def status():
        r = gradwire("board", "status", "--board", BOARD_IP, "--key", key, "--json",
                     check=False)
        return {"rc": r.returncode, "stderr": r.stderr.strip()[-500:],
                "json": json.loads(r.stdout) if r.returncode == 0 else None}
    result = {"status": status()}
    trained = {}
    step_train(trained, key)
    result["train"] = trained["train"]
    result["status_after"] = status()
    out["auth"] = result


def _serve(key=None):
    """``board serve --tap`` (with ``--key``: that key's build); the process and its lines
    up to ``ready``."""
    from host.board.process import start_module
    argv = ["host.cli", "board", "serve", "--backend", "verilator", "--tap", TAP]
    return start_module(argv + (["--key", key] if key else []), timeout=600, cwd=REPO)


def _stop(serve, out, prefix=""):
    serve.send_signal(signal.SIGTERM)
    try:
        rest, err = serve.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        serve.kill()
        rest, err = serve.communicate()
    out[f"{prefix}serve_rc"] = serve.returncode
    out[f"{prefix}serve_tail"] = (rest or "").strip().splitlines()[-3:]
    out[f"{prefix}serve_stderr"] = (err or "")[-1500:]


def _auth_frames(packets, since):
    """What the ``auth`` step's frames show: the switch datagrams (both ways) and whether
    each carries a tag (header bytes 24..31 not zero: an unauthenticated job's are), and
    any frame that holds a fragment of the control key."""
    from scapy.layers.inet import UDP
    from host.golden.ctrl_auth import key_fragments
    fragments = key_fragments(bytes.fromhex(AUTH_KEY))
    frames = [p for p in packets if float(p.time) >= since]
    switch = [bytes(p[UDP].payload) for p in frames if UDP in p
              and SWITCH_PORT in (p[UDP].sport, p[UDP].dport)]
    return {"frames": len(frames), "switch_datagrams": len(switch),
            "switch_untagged": sum(1 for d in switch if len(d) >= 32 and not any(d[24:32])),
            "key_bytes_seen": sum(1 for p in frames for f in fragments if f in bytes(p))}


def main():
    target = Path(sys.argv[1])
    steps = sys.argv[2:] or list(ALL_STEPS)
    out = {"steps": steps}
    if not fresh_namespace():
        out["refused"] = ("not in a fresh network namespace (interfaces "
                          f"{[n for _, n in socket.if_nameindex()]}): run under unshare -n")
        target.write_text(json.dumps(out))
        return 3
    sh("ip", "link", "set", "lo", "up")
    sh("ip", "tuntap", "add", "dev", TAP, "mode", "tap")
    sh("ip", "addr", "add", f"{HOST_IP}/24", "dev", TAP)
    sh("ip", "link", "set", TAP, "up")
    from scapy.all import AsyncSniffer
    sniffer = AsyncSniffer(iface=TAP, filter=None, store=True)
    sniffer.start()
    serve = None
    auth_since = None

    def run(step, key):
        t = time.perf_counter()
        try:
            globals()[f"step_{step}"](out, key)
        except Exception as exc:                  # noqa: BLE001 (reported)
            out.setdefault("errors", {})[step] = f"{type(exc).__name__}: {exc}"
        out.setdefault("step_seconds", {})[step] = round(time.perf_counter() - t, 2)

    try:
        started = time.perf_counter()
        serve, lines = _serve()
        out["serve_lines"] = [line.rstrip() for line in lines]
        out["serve_start_s"] = time.perf_counter() - started
        key = re.search(r"control key ([0-9a-f]{16})", "".join(lines)).group(1)
        for step in steps:
            if step != "auth":
                run(step, key)
        if "auth" in steps:
            # the same TAP, now the board built with a 128-bit key
            _stop(serve, out)
            serve = None
            started = time.perf_counter()
            serve, lines = _serve(AUTH_KEY)
            out["auth_serve_lines"] = [line.rstrip() for line in lines]
            out["auth_serve_start_s"] = time.perf_counter() - started
            auth_since = time.time()
            run("auth", AUTH_KEY)
    finally:
        if serve is not None:
            _stop(serve, out, "auth_" if auth_since is not None else "")
        packets = sniffer.stop() or []
    if auth_since is not None:
        out["auth_frames"] = _auth_frames(packets, auth_since)
    from scapy.layers.l2 import ARP
    out["arp"] = [{"op": p[ARP].op, "hwsrc": p[ARP].hwsrc, "psrc": p[ARP].psrc,
                   "pdst": p[ARP].pdst} for p in packets if ARP in p]
    out["captured_frames"] = len(packets)
    target.write_text(json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
