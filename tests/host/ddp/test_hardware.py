"""DDP hooks on the gateware (host/ddp/hardware.py, issue 21): the same bits as the golden
models, through every rank's Verilated NIC, a board's NIC and a board's switch.

One 4-process gloo group on 127.0.0.1 does all the distributed work, with one virtual board
(golden backend, in this process) serving every rank:

* DDP training of a model whose buckets hold 1 to 5100 values, for world sizes 2, 3 and 4
  (subgroups of the four processes), a few steps each, with the golden hooks and with
  ``InceptionnHook(backend="verilator")``, ``InceptionnHook(backend="udp")`` (error feedback
  too) and ``LhcHook(backend="udp")``: the parameters after every step must be the golden
  run's, bit for bit;
* ring and sketch all-reduces of nasty values (NaN payloads, infinities, denormals, -0.0,
  every class boundary) and of sizes 1 to 5000 through the hardware, against the golden
  functions, the sketch also on its dense and per-tensor paths;
* a backend that cannot start (a Verilator build that fails, no board at the address, a
  wrong key), a NIC harness killed in the middle of a run, a switch worker that stops,
  bucket lengths that differ: every rank raises the same error, nobody hangs, nothing falls
  back to the golden models, and the group stays usable.
"""
from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed (it comes with the 'ddp' extra: "
                    "pip install -e '.[ddp]')")

import torch.distributed as dist  # noqa: E402

from host import ddp  # noqa: E402
from host.board import VirtualBoard, free_port_base  # noqa: E402
from tests.host.ddp.models import Buckets  # noqa: E402

WORLD = 4
STEPS = 4
SIZES = (1, 2, 3, 100, 300, 5000)          # parameter sizes (each its own bucket)
K = 10


# ---------------------------------------------------------------------------------------
# what every rank runs

def _train(rank, hook, group):
    """Train a few steps through ``hook``; the parameters' bits after every step."""
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(3)
    net = Buckets()
    model = DistributedDataParallel(net, process_group=group, bucket_cap_mb=1e-6)
    if hook is not None:
        model.register_comm_hook(state=group, hook=hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    generator = torch.Generator().manual_seed(40 + rank)
    after = []
    for _ in range(STEPS):
        optimizer.zero_grad()
        x = torch.randn(16, 6, generator=generator)
        # Gradients of every size, some >= 1 (raw words), some below 2^-k.
        loss = model(x).pow(2).mean() * (1 + 7 * rank)
        loss.backward()
        optimizer.step()
        after.append(torch.cat([p.detach().reshape(-1) for p in net.parameters()])
                     .numpy().view(np.uint32).copy())
    stats = None
    if hook is not None:
        stats = {"calls": [(c.numel, c.backend, c.hardware, c.bytes_sent, c.control_bytes)
                           for c in hook.calls],
                 "hardware": hook.hardware_stats, "backend": hook.backend}
        hook.close()
    return {"params": after, "stats": stats}


def _nasty(rank):
    np.seterr(invalid="ignore")
    words = [0x7FC00001, 0xFFC12345, 0x7F800001, 0x7F800000, 0xFF800000, 0x00000001,
             0x807FFFFF, 0x00000000, 0x80000000]
    for e in range(112, 131):                       # 2^-15 .. 2^3, the class boundaries
        for m in (0, 1, 0x7FFFFF):
            words += [(e << 23) | m, 0x80000000 | (e << 23) | m, ((e << 23) | m) - 1]
    base = np.array(words, dtype=np.uint32).view(np.float32)
    return np.roll(base, 7 * rank) * np.float32(1 + rank % 2)


def _sparse(rank, n):
    rng = np.random.default_rng(500 + rank)
    x = np.zeros(n, np.float32)
    hot = rng.choice(n, max(1, n // 20), replace=False)
    x[hot] = (rng.standard_normal(hot.size) * 2.0 ** rng.integers(-30, 4, hot.size)) \
        .astype(np.float32)
    return x


def _catch(call):
    try:
        call()
        return None
    except Exception as exc:                       # noqa: BLE001 (reported)
        return (type(exc).__name__, str(exc))


def _hooks(board, key):
    """name -> factory of the hooks compared (golden reference first)."""
    address = f"{board[0]}:{board[1]}"
    return {
        "inceptionn-golden": lambda: ddp.InceptionnHook(k=K),
        "inceptionn-verilator": lambda: ddp.InceptionnHook(k=K, backend="verilator"),
        "inceptionn-udp": lambda: ddp.InceptionnHook(k=K, backend="udp", board=address),
        "inceptionn-ef-golden": lambda: ddp.InceptionnHook(k=6, error_feedback=True),
        "inceptionn-ef-verilator": lambda: ddp.InceptionnHook(k=6, error_feedback=True,
                                                              backend="verilator"),
        "lhc-golden": lambda: ddp.LhcHook(),
        "lhc-udp": lambda: ddp.LhcHook(backend="udp", board=address, key=key),
    }


def _rank_main(rank, world, board, key, dead_base):
    address = f"{board[0]}:{board[1]}"
    out = {"train": {}, "direct": {}, "errors": {}}
    hooks = _hooks(board, key)
    # -- training, world sizes 2, 3, 4 ------------------------------------------------------
    for size in (2, 3, 4):
        group = dist.new_group(list(range(size))) if size < world else None
        for name, factory in hooks.items():
            if "-ef-" in name and size != 4:
                continue
            if rank < size:
                out["train"][size, name] = _train(rank, factory(), group)
        dist.barrier()
    # -- direct calls: nasty values and sizes 1 .. 5000 -------------------------------------
    nic = ddp.InceptionnHook(k=K, backend="verilator")
    # Two switch jobs side by side on the board, each on its own half of the slots.
    switch = ddp.LhcHook(backend="udp", board=address, key=key, slot_count=32)
    for k in (1, 10, 15):
        x = _nasty(rank)
        out["direct"]["nasty", k] = (ddp.inceptionn_ring_allreduce(x, k)[0],
                                     ddp.inceptionn_ring_allreduce(x, k, codec=nic._hardware)[0])
    for n in (1, 3, 5, 4096, 5000):
        x = _sparse(rank, n)
        out["direct"]["ring", n] = (ddp.inceptionn_ring_allreduce(x, K)[0],
                                    ddp.inceptionn_ring_allreduce(x, K, codec=nic._hardware)[0])
        out["direct"]["lhc", n] = (ddp.lhc_allreduce(x)[0],
                                   ddp.lhc_allreduce(x, switch=switch._hardware)[0])
        # The per-tensor paths: forced dense (phase A is one non-zero word) and the choice.
        for path in ("dense", "auto"):
            golden, golden_stats = ddp.lhc_allreduce(x, path=path)
            hardware, hardware_stats = ddp.lhc_allreduce(x, path=path, switch=switch._hardware)
            out["direct"][f"lhc-{path}", n] = (golden, hardware, golden_stats.details["path"],
                                               hardware_stats.details["path"])
    # A load far above 1: peeling stalls and the fallback round goes through the switch too.
    x = np.random.default_rng(rank).standard_normal(3000).astype(np.float32)
    golden, golden_stats = ddp.lhc_allreduce(x, load=6.0)
    heavy = ddp.LhcHook(load=6.0, backend="udp", board=address, key=key, job=1, slot_base=32)
    hardware, hardware_stats = ddp.lhc_allreduce(x, load=6.0, switch=heavy._hardware)
    out["direct"]["fallback"] = (golden, hardware, golden_stats.details["unpeeled"],
                                 hardware_stats.hardware)
    heavy.close()
    # -- bad input: bucket lengths that differ (the golden error, word for word) -------------
    uneven = np.ones(12 if rank == 1 else 10, np.float32)
    errors = out["errors"]
    errors["lengths-ring-golden"] = _catch(lambda: ddp.inceptionn_ring_allreduce(uneven, K))
    errors["lengths-ring-verilator"] = _catch(
        lambda: ddp.inceptionn_ring_allreduce(uneven, K, codec=nic._hardware))
    errors["lengths-lhc-golden"] = _catch(lambda: ddp.lhc_allreduce(uneven))
    errors["lengths-lhc-udp"] = _catch(lambda: ddp.lhc_allreduce(uneven,
                                                                 switch=switch._hardware))
    # The hooks still work after it.
    y = _sparse(rank, 777)
    out["direct"]["after-lengths"] = (
        ddp.inceptionn_ring_allreduce(y, K)[0],
        ddp.inceptionn_ring_allreduce(y, K, codec=nic._hardware)[0],
        ddp.lhc_allreduce(y)[0], ddp.lhc_allreduce(y, switch=switch._hardware)[0])
    # -- a NIC harness that dies in the middle of a run (rank 1's) ----------------------------
    if rank == 1:
        os.kill(nic._hardware.transport._proc.pid, signal.SIGKILL)
    started = time.monotonic()
    errors["killed"] = _catch(lambda: ddp.inceptionn_ring_allreduce(y, K, codec=nic._hardware))
    errors["killed-seconds"] = time.monotonic() - started
    errors["killed-again"] = _catch(lambda: ddp.inceptionn_ring_allreduce(y, K,
                                                                          codec=nic._hardware))
    nic.close()
    # -- a switch worker that stops (rank 2 closes its socket) ---------------------------------
    quick = ddp.LhcHook(backend="udp", board=address, key=key, timeout=1.0)
    ddp.lhc_allreduce(y, switch=quick._hardware)
    if rank == 2:
        quick._hardware.worker.close()
    started = time.monotonic()
    errors["stopped"] = _catch(lambda: ddp.lhc_allreduce(y, switch=quick._hardware))
    errors["stopped-seconds"] = time.monotonic() - started
    quick.close()
    switch.close()
    # -- backends that cannot start -------------------------------------------------------
    import sim.harness.build as harness_build
    flags = harness_build.VERILATOR_FLAGS
    harness_build.VERILATOR_FLAGS = flags + ["--no-such-flag-gradwire"]
    try:
        errors["no-build"] = _catch(lambda: ddp.inceptionn_ring_allreduce(
            y, K, codec=ddp.InceptionnHook(backend="verilator")._hardware))
    finally:
        harness_build.VERILATOR_FLAGS = flags
    started = time.monotonic()
    errors["no-board-nic"] = _catch(lambda: ddp.inceptionn_ring_allreduce(
        y, K, codec=ddp.InceptionnHook(backend="udp", board=f"127.0.0.1:{dead_base}")
        ._hardware))
    errors["no-board-switch"] = _catch(lambda: ddp.lhc_allreduce(
        y, switch=ddp.LhcHook(backend="udp", board=f"127.0.0.1:{dead_base}", key=key)
        ._hardware))
    errors["no-board-seconds"] = time.monotonic() - started
    errors["wrong-key-switch"] = _catch(lambda: ddp.lhc_allreduce(
        y, switch=ddp.LhcHook(backend="udp", board=address, key=key ^ 1)._hardware))
    errors["wrong-key-nic"] = _catch(lambda: ddp.inceptionn_ring_allreduce(
        y, K, codec=ddp.InceptionnHook(backend="udp", board=address, key=key ^ 1)._hardware))
    # The group is still in step: a last training step of each hardware hook works.
    out["after"] = {name: _train(rank, hooks[name](), None)["params"][0]
                    for name in ("inceptionn-golden", "inceptionn-verilator", "lhc-udp")}
    return out


@pytest.fixture(scope="module")
def ranks():
    with VirtualBoard("golden", port_base=None) as board:
        dead_base = free_port_base()
        results = ddp.run_local_group(_rank_main, WORLD, board.address, board.key, dead_base,
                                      timeout=300)
        return {"ranks": results, "board": board.backend.aggregator.counters.copy(),
                "nic": dict(board.backend.counters)}


def _bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


# ---------------------------------------------------------------------------------------
# identical bits

@pytest.mark.parametrize("family,hardware,size", [
    (family, hardware, size)
    for family, hardware in (("inceptionn", "verilator"), ("inceptionn", "udp"), ("lhc", "udp"))
    for size in (2, 3, 4)] + [("inceptionn-ef", "verilator", 4)])
def test_training_through_the_hardware_has_the_golden_bits_after_every_step(
        ranks, family, hardware, size):
    runs = [r["train"][size, f"{family}-{hardware}"] for r in ranks["ranks"][:size]]
    golden = [r["train"][size, f"{family}-golden"] for r in ranks["ranks"][:size]]
    for step in range(STEPS):
        reference = golden[0]["params"][step]
        for rank, (run, gold) in enumerate(zip(runs, golden)):
            np.testing.assert_array_equal(gold["params"][step], reference)
            np.testing.assert_array_equal(run["params"][step], reference,
                                          err_msg=f"rank {rank} step {step}")
    # The parameters moved (a test of a model that does not train would prove nothing).
    assert not np.array_equal(golden[0]["params"][0], golden[0]["params"][-1])
    for rank, run in enumerate(runs):
        stats = run["stats"]
        assert stats["backend"] == hardware
        numels = sorted({numel for numel, *_ in stats["calls"]})
        assert numels[0] == 1 and numels[-1] >= 5000          # buckets of 1 .. 5100 values
        for numel, backend, per_call, sent, control in stats["calls"]:
            assert backend.startswith(hardware)
            if family == "lhc":
                assert per_call["packets"] == per_call["results"] > 0
            else:
                assert per_call["tx_packets_in"] + per_call["rx_packets_in"] > 0


def test_the_hooks_count_what_went_through_the_hardware(ranks):
    for rank, r in enumerate(ranks["ranks"]):
        verilator = r["train"][4, "inceptionn-verilator"]["stats"]["hardware"]
        assert verilator["backend"] == "verilator"
        assert verilator["tx_packets_in"] == verilator["tx_packets_out"] > 0
        assert verilator["rx_packets_in"] == verilator["rx_packets_out"] > 0
        assert verilator["tx_cycles"] > 0 and verilator["rx_cycles"] > 0
        assert verilator["resends"] == 0
        # The gateware's own counters saw every one of them: nothing bypassed the NIC.
        device = verilator["device_counters"]
        assert device["tx"]["packets"] == device["tx"]["compressed"] == verilator["tx_packets_in"]
        assert device["rx"]["packets"] == device["rx"]["decompressed"] == \
            verilator["rx_packets_in"]
        udp = r["train"][4, "inceptionn-udp"]["stats"]["hardware"]
        assert udp["backend"].startswith("udp")
        # every packet a datagram (one more: the start-up check), resends on top
        assert udp["datagrams"] == udp["tx_packets_in"] + udp["rx_packets_in"] + 1 \
            + udp["resends"]
        lhc = r["train"][4, "lhc-udp"]["stats"]
        hardware = lhc["hardware"]
        assert hardware["packets"] == sum(c[2]["packets"] for c in lhc["calls"])
        assert hardware["bytes_out"] == (hardware["packets"] + hardware["resends"]) * (32 + 256)
        assert hardware["layout"] == {"job": 0, "workers": 4, "slot_base": 0,
                                      "slot_count": 64, "lanes": 64, "group": None,
                                      "epoch": None}      # a 64-bit key: no authentication
        # The wire bytes of a ring hop are its packets: compressed payload counted as sent,
        # headers and length words as control bytes.
        for numel, _, per_call, sent, control in r["train"][4, "inceptionn-verilator"]["stats"][
                "calls"]:
            assert sent == per_call["tx_bytes_out"] - 32 * per_call["tx_packets_out"]
    assert ranks["board"]["accepted"] > 0 and ranks["nic"]["drop_bad_source"] == 0


def test_nasty_values_and_every_size_match_the_golden_functions(ranks):
    for r in ranks["ranks"]:
        for key, (golden, hardware) in ((key, v[:2]) for key, v in r["direct"].items()
                                        if key != "fallback" and key != "after-lengths"):
            np.testing.assert_array_equal(_bits(hardware), _bits(golden), err_msg=str(key))
        for n in (1, 3, 5, 4096, 5000):
            assert r["direct"]["lhc-dense", n][2:] == ("dense", "dense")
            golden_path, hardware_path = r["direct"]["lhc-auto", n][2:]
            assert golden_path == hardware_path, n
        golden, hardware, unpeeled, per_call = r["direct"]["fallback"]
        np.testing.assert_array_equal(_bits(hardware), _bits(golden))
        assert unpeeled > 0                        # the fallback round ran, on the switch
        assert per_call["messages"] == 3
        ring_g, ring_h, lhc_g, lhc_h = r["direct"]["after-lengths"]
        np.testing.assert_array_equal(_bits(ring_h), _bits(ring_g))
        np.testing.assert_array_equal(_bits(lhc_h), _bits(lhc_g))
    # NaN payloads survived the NIC (raw words travel unchanged)
    assert np.isnan(ranks["ranks"][0]["direct"]["nasty", 10][1]).any()


# ---------------------------------------------------------------------------------------
# bad input

def _same_everywhere(ranks, name):
    errors = [r["errors"][name] for r in ranks["ranks"]]
    assert all(e is not None for e in errors), f"{name}: some rank raised nothing: {errors}"
    assert len(set(errors)) == 1, f"{name}: ranks raised different errors: {errors}"
    return errors[0]


@pytest.mark.parametrize("kind,hardware", [("ring", "verilator"), ("lhc", "udp")])
def test_bucket_lengths_that_differ_raise_the_golden_error(ranks, kind, hardware):
    golden = _same_everywhere(ranks, f"lengths-{kind}-golden")
    assert _same_everywhere(ranks, f"lengths-{kind}-{hardware}") == golden
    assert golden[0] == "ValueError" and "rank 0: 10, rank 1: 12" in golden[1]


def test_a_nic_that_dies_mid_run_fails_every_rank_with_one_error(ranks):
    kind, message = _same_everywhere(ranks, "killed")
    assert kind == "HookBackendError"
    assert "the hardware failed in this call" in message
    assert "rank 1: TransportError: the nic_top harness was killed by SIGKILL" in message
    assert "its ring neighbour's NIC failed" in message
    assert "every rank of the group raises this error" in message
    # no waiting for a timeout: the failure travels around the ring
    assert all(r["errors"]["killed-seconds"] < 30 for r in ranks["ranks"])
    # the hook stays failed (never a silent golden fall-back)
    assert _same_everywhere(ranks, "killed-again") == (kind, message)


def test_a_switch_worker_that_stops_fails_every_rank_within_the_timeout(ranks):
    kind, message = _same_everywhere(ranks, "stopped")
    assert kind == "HookBackendError"
    assert "rank 2: TransportError: the switch worker is closed" in message
    assert "NoReplyError: no result from the board's switch" in message
    assert all(r["errors"]["stopped-seconds"] < 20 for r in ranks["ranks"])


def test_a_verilator_build_that_fails_fails_every_rank_at_the_first_bucket(ranks):
    kind, message = _same_everywhere(ranks, "no-build")
    assert kind == "HookBackendError"
    assert "the hardware backend could not start" in message
    assert "ranks 0, 1, 2, 3: HarnessBuildError: building the nic_top harness failed" in message
    assert "Invalid option: --no-such-flag-gradwire" in message


def test_no_board_at_the_address_fails_every_rank_with_one_error(ranks):
    kind, message = _same_everywhere(ranks, "no-board-nic")
    assert kind == "HookBackendError"
    assert "ranks 0, 1, 2, 3: no reply from the board's NIC at 127.0.0.1 ports" in message
    kind, message = _same_everywhere(ranks, "no-board-switch")
    assert kind == "HookBackendError"
    assert "configuring job 0 on the board's switch failed" in message
    assert "no reply from the board at 127.0.0.1 ports" in message
    assert all(r["errors"]["no-board-seconds"] < 30 for r in ranks["ranks"])


def test_a_wrong_key_fails_every_rank_with_one_error(ranks):
    for name in ("wrong-key-switch", "wrong-key-nic"):
        kind, message = _same_everywhere(ranks, name)
        assert kind == "HookBackendError"
        assert "answers on its NIC port but not to control requests: the control key is " \
               "wrong" in message


def test_the_group_still_trains_after_every_error(ranks):
    first = [r["after"]["inceptionn-golden"] for r in ranks["ranks"]]
    for r in ranks["ranks"]:
        np.testing.assert_array_equal(r["after"]["inceptionn-verilator"], first[0])
        np.testing.assert_array_equal(r["after"]["inceptionn-golden"], first[0])
    lhc = [r["after"]["lhc-udp"] for r in ranks["ranks"]]
    for other in lhc[1:]:
        np.testing.assert_array_equal(other, lhc[0])


# ---------------------------------------------------------------------------------------
# arguments (no process group needed)

def test_hook_arguments_are_checked_where_the_caller_sees_them(monkeypatch):
    monkeypatch.delenv("GRADWIRE_BOARD", raising=False)
    monkeypatch.delenv("GRADWIRE_KEY", raising=False)
    with pytest.raises(ValueError, match="backend must be one of 'golden', 'verilator', 'udp'"):
        ddp.InceptionnHook(backend="fpga")
    with pytest.raises(ValueError, match="backend must be one of 'golden', 'udp'"):
        ddp.LhcHook(backend="verilator")
    with pytest.raises(ValueError, match="needs board=HOST"):
        ddp.InceptionnHook(backend="udp")
    with pytest.raises(ValueError, match="needs the board's control key"):
        ddp.LhcHook(backend="udp", board="127.0.0.1")
    with pytest.raises(ValueError, match="one board serves the whole job"):
        ddp.LhcHook(backend="udp", board=["127.0.0.1", "127.0.0.2"], key=1)
    with pytest.raises(ValueError, match="board, key and mtu are for backend 'udp'"):
        ddp.InceptionnHook(board="127.0.0.1")
    with pytest.raises(ValueError, match="board, key are for backend 'udp'"):
        ddp.LhcHook(board="127.0.0.1", key=3)
    with pytest.raises(ValueError, match="slot_count must be a positive integer"):
        ddp.LhcHook(backend="udp", board="127.0.0.1", key=1, slot_count=0)
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        ddp.LhcHook(backend="udp", board="127.0.0.1", key=1, timeout=0)
    with pytest.raises(ValueError, match="port base must be an integer"):
        ddp.InceptionnHook(backend="udp", board="127.0.0.1:x")
    monkeypatch.setenv("GRADWIRE_BOARD", "127.0.0.1:40000")
    monkeypatch.setenv("GRADWIRE_KEY", "abc")
    hook = ddp.LhcHook(backend="udp")
    assert hook.backend == "udp" and repr(hook) == "LhcHook(load=0.7, r_min=1, path='auto', backend='udp')"
    assert repr(ddp.InceptionnHook(8, backend="verilator")) == \
        "InceptionnHook(k=8, backend='verilator')"
    assert ddp.InceptionnHook().backend == "golden" and ddp.InceptionnHook().hardware_stats is None


def test_a_switch_path_counts_a_resent_packet_once_and_its_resend_apart():
    # One result per packet however often it went: the totals that ``make bench`` compares
    # (packets in == packets out) must not count the resend as another packet.
    from host.ddp.hardware import UdpSwitch
    from host.driver.udp_worker import WorkerStats

    switch = UdpSwitch("test", {"host": "127.0.0.1", "port_base": 1})

    class Worker:
        stats = WorkerStats(packets=7, resends=3, results=7, bytes_out=10 * 288,
                            bytes_in=7 * 288)

    switch.worker = Worker()
    totals = switch.totals()
    assert (totals["packets_in"], totals["packets_out"], totals["resends"]) == (7, 7, 3)
    assert (totals["bytes_in"], totals["bytes_out"]) == (10 * 288, 7 * 288)
