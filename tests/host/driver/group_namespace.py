"""Result groups over real multicast: the virtual board (golden backend) and its workers in a
network namespace of their own.

Run by ``tests/host/driver/test_udp_group.py`` as ``unshare -n python
tests/host/driver/group_namespace.py OUT.json``: it refuses to run anywhere but in a fresh
namespace (only ``lo``), so it never configures the machine's own interfaces. There it
enables multicast on loopback and routes 224.0.0.0/4 through it (``ip link set lo up; ip
link set lo multicast on; ip route add 224.0.0.0/4 dev lo``), then runs each scenario
against a fresh :class:`~host.board.VirtualBoard` and records what it saw in ``OUT.json``
(one entry per scenario, or the scenario's error):

- ``unicast``, ``group``: the same messages from N workers (:class:`UdpSwitchWorker`, one
  thread each) on a job without, then with, a result group: each run's results (a digest),
  the board's counters read over CTRL before and after, the workers' statistics, the
  memberships the kernel lists in ``/proc/net/igmp``;
- ``resend``: a job with a group whose first group datagram the board's wire loses: every
  worker's resend gets a unicast answer at its own socket;
- ``shared``: two jobs with the same group address and port: each job's workers see the
  other's results on the group and count them as foreign, never take them;
- ``forged``: a result sent to the group from another port than the board's switch port
  is foreign to every worker;
- ``transport``, ``transport_unicast``: :class:`~host.driver.udp.UdpTransport` carrying
  every worker of a job (``SwitchInterface.allreduce``), with and without a group;
- ``hook``: the DDP hooks' switch backend (``host.ddp.hardware.UdpSwitch``, one rank) with
  a group; ``ranks``: the same in three processes of a gloo group, as training runs it
  (skipped without torch).

Every wait is bounded (the workers' timeouts, joined threads); the caller bounds the whole
run and kills it if it hangs.
"""
from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from contract.header import PacketType  # noqa: E402
from contract.network import NET_REGISTERS, network_address  # noqa: E402

GROUP = ("239.77.0.1", 47580)
WORKERS = 4
SLOTS, LANES = 8, 64
#: message sizes (words): around a packet, around the window, and many windows
SIZES = (1, 64, 65, SLOTS * LANES + 1, 3000)
FAST = dict(rto=0.05, min_rto=0.01, max_rto=0.2, timeout=20.0)
THREAD_JOIN = 60
_NET_COUNTERS = dict(NET_REGISTERS["counter"].items())
COUNTERS = ("switch_in", "switch_out", "switch_group_out")


def fresh_namespace() -> bool:
    return [name for _, name in socket.if_nameindex()] == ["lo"]


def sh(*argv):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if r.returncode:
        raise RuntimeError(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr.strip()}")
    return r.stdout


def messages(seed: int, n: int):
    """Per worker, one OR and one ADD message of every size; and the expected results."""
    rng = np.random.default_rng(seed)
    per_worker, expected = [[] for _ in range(n)], []
    for size in SIZES:
        for op in (PacketType.AGG_OR32, PacketType.AGG_ADD_I32):
            vectors = [rng.integers(0, 2**32, size, dtype=np.uint64).astype(np.uint32)
                       for _ in range(n)]
            exponents = [int(e) for e in rng.integers(-128, 128, n)]
            if op == PacketType.AGG_OR32:
                total = np.bitwise_or.reduce(np.stack(vectors), axis=0)
            else:
                total = (np.stack(vectors).astype(np.uint64).sum(axis=0) % 2**32) \
                    .astype(np.uint32)
            expected.append((total, max(exponents)))
            for w in range(n):
                per_worker[w].append((vectors[w], op, exponents[w]))
    return per_worker, expected


def digest(results) -> str:
    h = hashlib.sha256()
    for vector, exponent in results:
        h.update(np.ascontiguousarray(vector, dtype="<u4").tobytes())
        h.update(str(exponent).encode())
    return h.hexdigest()


def read_counters(board) -> dict:
    """The board's network counters, read over CTRL (as ``gradwire board status`` does)."""
    with board.transport() as control:
        values = control.read_many([network_address("net", _NET_COUNTERS[name])
                                    for name in COUNTERS])
    return dict(zip(COUNTERS, values))


def make_workers(board, n, *, job=0, group=None, slot_base=0, slot_count=None):
    from host.driver.udp_worker import UdpSwitchWorker, configure_job
    workers = [UdpSwitchWorker(board.host, port_base=board.port_base, job=job, worker=w,
                               **FAST) for w in range(n)]
    with board.transport(region="switch") as control:
        layout = configure_job(control, job, [w.address for w in workers], group=group,
                               slot_base=slot_base, slot_count=slot_count)
    for w in workers:
        w.set_layout(layout)
    return workers, layout


def in_threads(workers, per_worker):
    """Each worker aggregates its own messages in a thread of its own; every worker's
    results (or the first error)."""
    results, errors = [None] * len(workers), []

    def run(w):
        try:
            results[w] = [workers[w].aggregate(words, op, exponent=e, name=f"message {i}")
                          for i, (words, op, e) in enumerate(per_worker[w])]
        except BaseException as exc:       # noqa: BLE001 (re-raised below)
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(w,), daemon=True)
               for w in range(len(workers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=THREAD_JOIN)
    if any(t.is_alive() for t in threads):
        raise TimeoutError(f"a worker thread did not finish within {THREAD_JOIN} s")
    if errors:
        raise errors[0]
    return results


def check_exact(results, expected) -> bool:
    for worker_results in results:
        if len(worker_results) != len(expected):
            return False
        for (vector, exponent), (total, e_max) in zip(worker_results, expected):
            if not np.array_equal(vector, total) or exponent != e_max:
                return False
    return True


def igmp_memberships() -> list[str]:
    """Groups the kernel lists as joined on ``lo`` (``/proc/net/igmp``: hex, little-endian)."""
    out, device = [], None
    for line in Path("/proc/net/igmp").read_text().splitlines()[1:]:
        fields = line.split()
        if not line.startswith(("\t", " ")):
            device = fields[1] if len(fields) > 1 else None
        elif device == "lo" and fields:
            out.append(socket.inet_ntoa(int(fields[0], 16).to_bytes(4, "little")))
    return out


def run_workers(group, seed=5, board_options=None, backend=None):
    from host.board import VirtualBoard
    board = VirtualBoard(backend or "golden", port_base=None,
                         **({} if backend else dict(slots=SLOTS, lanes=LANES)),
                         **(board_options or {})).start()
    try:
        workers, layout = make_workers(board, WORKERS, group=group)
        try:
            memberships = igmp_memberships()
            per_worker, expected = messages(seed, WORKERS)
            before = read_counters(board)
            results = in_threads(workers, per_worker)
            after = read_counters(board)
            stats = [w.stats.as_dict() for w in workers]
        finally:
            for w in workers:
                w.close()
        return {"exact": check_exact(results, expected),
                "digests": [digest(r) for r in results],
                "layout_group": list(layout.group) if layout.group else None,
                "counters": {k: after[k] - before[k] for k in COUNTERS},
                "results": stats[0]["results"], "stats": stats,
                "memberships": memberships, "board": dict(board.stats)}
    finally:
        board.stop()


def scenario_unicast(out):
    out["unicast"] = run_workers(None)


def scenario_group(out):
    out["group"] = run_workers(GROUP)


def scenario_resend(out):
    """The wire loses the first group datagram once: every worker's resend is answered at
    its own socket (unicast)."""
    from host.board.golden import GoldenBoard

    class LoseFirstGroupResult(GoldenBoard):
        lost = 0

        def deliver(self, datagrams):
            sent = super().deliver(datagrams)
            if not self.lost:
                for i, d in enumerate(sent):
                    if d.dst_ip == GROUP[0]:
                        self.lost += 1
                        return sent[:i] + sent[i + 1:]
            return sent

    backend = LoseFirstGroupResult(0x6772_6f75_7021, slots=SLOTS, lanes=LANES)
    result = run_workers(GROUP, seed=6, backend=backend)
    result["lost"] = backend.lost
    out["resend"] = result


def scenario_shared(out):
    """Jobs 0 and 1 share the group's address and port: each job's workers see the other's
    results on the group and ignore them. Job 1 runs, then job 0 (whose group socket holds
    job 1's results by then), then job 1 again."""
    from host.board import VirtualBoard
    board = VirtualBoard("golden", port_base=None, slots=SLOTS, lanes=LANES).start()
    workers = {}
    try:
        workers[0], _ = make_workers(board, 3, job=0, group=GROUP, slot_base=0, slot_count=4)
        workers[1], _ = make_workers(board, 2, job=1, group=GROUP, slot_base=4, slot_count=4)
        exact = []
        for job, seed in ((1, 11), (0, 12), (1, 13)):
            per_worker, expected = messages(seed, len(workers[job]))
            exact.append(check_exact(in_threads(workers[job], per_worker), expected))
        out["shared"] = {"exact": exact,
                         "stats": {job: [w.stats.as_dict() for w in ws]
                                   for job, ws in workers.items()}}
    finally:
        for ws in workers.values():
            for w in ws:
                w.close()
        board.stop()


def scenario_forged(out):
    """A result for the job's first chunk sent to the group from another port than the
    board's switch port (before the round): every worker counts it as foreign and takes the
    board's."""
    from contract.header import Header
    from host.board import VirtualBoard
    board = VirtualBoard("golden", port_base=None, slots=SLOTS, lanes=LANES).start()
    forger = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        workers, _ = make_workers(board, WORKERS, group=GROUP)
        try:
            forger.bind(("127.0.0.1", 0))
            forger.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF,
                              socket.inet_aton("127.0.0.1"))
            forger.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
            fake = Header(type=PacketType.AGG_ADD_I32, flags=2, job=0, worker=0xFF,
                          count=LANES, slot=0, seq=0).pack() + b"\xff" * (4 * LANES)
            forger.sendto(fake, GROUP)
            time.sleep(0.05)
            per_worker = [[(np.full(LANES, w + 1, np.uint32), PacketType.AGG_ADD_I32, 0)]
                          for w in range(WORKERS)]
            results = in_threads(workers, per_worker)
            out["forged"] = {
                "exact": all(np.array_equal(r[0][0], np.full(LANES, WORKERS * (WORKERS + 1)
                                                             // 2, np.uint32))
                             for r in results),
                "stats": [w.stats.as_dict() for w in workers]}
        finally:
            for w in workers:
                w.close()
    finally:
        forger.close()
        board.stop()


def rank_entry(rank, world, settings):
    """One rank of ``scenario_ranks``: the hooks' switch backend on a job with a group."""
    import torch.distributed as dist
    from host.ddp.hardware import UdpSwitch
    switch = UdpSwitch("ranks", settings, job=0, group=GROUP, timeout=20)
    try:
        switch.start(dist.group.WORLD, rank, world, lambda r: r)
        values = np.arange(4000, dtype=np.int32) * (rank + 1)
        total = switch.add(values, "values")
        return {"total": hashlib.sha256(total.tobytes()).hexdigest(),
                "stats": switch.stats()}
    finally:
        switch.close()


def scenario_ranks(out):
    try:
        import torch  # noqa: F401
    except ImportError:
        out["ranks"] = {"skipped": "no torch"}
        return
    _scenario_ranks(out)


def _scenario_ranks(out):
    """Three processes (a gloo group), one worker each, as a training job runs them: each
    binds the group's port in its own process and joins the group."""
    from host.board import VirtualBoard
    from host.ddp.launch import run_local_group
    board = VirtualBoard("golden", port_base=None, slots=SLOTS, lanes=LANES).start()
    try:
        settings = {"host": board.host, "port_base": board.port_base, "key": board.key,
                    "mtu": 1500}
        before = read_counters(board)
        ranks = run_local_group(rank_entry, 3, settings, timeout=120)
        after = read_counters(board)
        want = np.arange(4000, dtype=np.int32) * 6
        out["ranks"] = {"totals": [r["total"] for r in ranks],
                        "want": hashlib.sha256(want.tobytes()).hexdigest(),
                        "stats": [r["stats"] for r in ranks],
                        "counters": {k: after[k] - before[k] for k in COUNTERS}}
    finally:
        board.stop()


def board_rank_entry(rank, world, boards):
    """One rank of ``scenario_boards``: the hooks' switch backend on a job striped over
    two boards with a group (board b's results to the group's address at port + b)."""
    import torch.distributed as dist
    from host.ddp.hardware import UdpSwitch
    switch = UdpSwitch("boards", boards, job=0, group=GROUP, timeout=20)
    try:
        switch.start(dist.group.WORLD, rank, world, lambda r: r)
        values = np.arange(5000, dtype=np.int32) * (rank + 1)
        total = switch.add(values, "values")
        return {"total": hashlib.sha256(total.tobytes()).hexdigest(),
                "per_board": switch.stats()["per_board"]}
    finally:
        switch.close()


def scenario_boards(out):
    """Two ranks (a gloo group) and a job over two boards, each with its result group."""
    try:
        import torch  # noqa: F401
    except ImportError:
        out["boards"] = {"skipped": "no torch"}
        return
    from host.board import VirtualBoard
    from host.ddp.launch import run_local_group
    boards = [VirtualBoard("golden", port_base=None, slots=SLOTS, lanes=LANES).start()
              for _ in range(2)]
    try:
        settings = [{"host": b.host, "port_base": b.port_base, "key": b.key, "mtu": 1500}
                    for b in boards]
        before = [read_counters(b) for b in boards]
        ranks = run_local_group(board_rank_entry, 2, settings, timeout=120)
        after = [read_counters(b) for b in boards]
        want = np.arange(5000, dtype=np.int32) * 3
        out["boards"] = {"totals": [r["total"] for r in ranks],
                         "want": hashlib.sha256(want.tobytes()).hexdigest(),
                         "per_board": [r["per_board"] for r in ranks],
                         "counters": [{k: a[k] - b[k] for k in COUNTERS}
                                      for a, b in zip(after, before)]}
    finally:
        for b in boards:
            b.stop()


def run_transport(group, seed=21):
    from host.board import VirtualBoard
    from host.driver.switch import SwitchInterface
    from host.driver.udp_worker import write_group
    rng = np.random.default_rng(seed)
    tensors = [(rng.standard_normal(3000) * 0.01).astype(np.float32) for _ in range(WORKERS)]
    board = VirtualBoard("golden", port_base=None, slots=SLOTS, lanes=LANES).start()
    try:
        before = read_counters(board)
        with board.transport(region="switch", timeout=0.05, max_timeout=0.2) as t:
            write_group(t, 0, group)
            switch = SwitchInterface(t)
            result, stats = switch.allreduce(tensors, job=0)
            joined = sorted(g for g, _ in t._groups.values())
            network = t.network_stats().get("switch", {})
        after = read_counters(board)
        return {"digest": hashlib.sha256(result.tobytes()).hexdigest(),
                "counters": {k: after[k] - before[k] for k in COUNTERS},
                "joined": [list(g) for g in joined], "switch": network,
                "board": dict(board.stats)}
    finally:
        board.stop()


def scenario_transport(out):
    out["transport_unicast"] = run_transport(None)
    out["transport"] = run_transport(GROUP)


def scenario_hook(out):
    """The DDP hooks' switch backend (``host.ddp.hardware.UdpSwitch``, one rank: no process
    group needed) with a group: rank 0 writes it, the layout carries it, the rank joins."""
    from host.board import VirtualBoard
    from host.ddp.hardware import UdpSwitch
    board = VirtualBoard("golden", port_base=None, slots=SLOTS, lanes=LANES).start()
    try:
        settings = {"host": board.host, "port_base": board.port_base, "key": board.key,
                    "mtu": 1500}
        switch = UdpSwitch("test", settings, job=1, group=GROUP, timeout=20)
        try:
            switch.start(None, 0, 1, lambda r: r)
            values = np.arange(-500, 500, dtype=np.int32)
            total = switch.add(values, "values")
            stats = switch.stats()
            group = list(board.backend.groups.get(1, (0, 0)))
        finally:
            switch.close()
        out["hook"] = {"exact": bool(np.array_equal(total, values)), "stats": stats,
                       "board_group": group, "cleared": board.backend.aggregator.job_config(1)
                       is None}
    finally:
        board.stop()


SCENARIOS = {"unicast": scenario_unicast, "group": scenario_group, "resend": scenario_resend,
             "shared": scenario_shared, "transport": scenario_transport,
             "forged": scenario_forged, "hook": scenario_hook, "ranks": scenario_ranks,
             "boards": scenario_boards}


def main(argv):
    target = Path(argv[0])
    steps = argv[1:] or list(SCENARIOS)
    if not fresh_namespace():
        print("refusing to run outside a fresh network namespace (unshare -n): this script "
              "configures lo's multicast and routes", file=sys.stderr)
        return 2
    sh("ip", "link", "set", "lo", "up")
    sh("ip", "link", "set", "lo", "multicast", "on")
    sh("ip", "route", "add", "224.0.0.0/4", "dev", "lo")
    out = {"errors": {}}
    for name in steps:
        started = time.monotonic()
        try:
            SCENARIOS[name](out)
        except Exception:                  # noqa: BLE001 (recorded for the test to show)
            out["errors"][name] = traceback.format_exc()[-3000:]
        out.setdefault("seconds", {})[name] = round(time.monotonic() - started, 3)
    target.write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
