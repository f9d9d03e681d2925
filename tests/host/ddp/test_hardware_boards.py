"""``LhcHook(boards=[...])``: one job over two boards (``docs/protocol/network.md``
section 3), bit for bit the one-board run.

A two-process gloo group on 127.0.0.1 trains the hook tests' model (buckets of 1 to 5100
values) and all-reduces vectors of 1 to 5000 values (fewer chunks than boards, lengths that
are not a multiple of two chunks, the sketch and the dense paths) three ways: the golden
hook, ``LhcHook(board=A)`` and ``LhcHook(boards=[A, B])``. Board A is a golden virtual
board; board B is another golden one, or the Verilated network top (``VirtualBoard`` over
``sim.harness.board.VerilatorBoard``, its build cached). Every rank's parameters and
results must be the one-board run's; the ranks' first transmissions split about half and
half between the boards (together exactly the one-board run's), and each board's
``switch_in`` counter (datagrams into its switch port) is what the ranks sent it, resends
included (a slow board, the Verilated one, makes the ranks wait on the fast one too). Every wait is
bounded (the hooks' timeout, the group's timeout).
"""
from __future__ import annotations

import contextlib
import os

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed (it comes with the 'ddp' extra: "
                    "pip install -e '.[ddp]')")

import torch.distributed as dist  # noqa: E402

from contract.network import NET_REGISTERS, network_address  # noqa: E402
from host import ddp  # noqa: E402
from host.board import VirtualBoard  # noqa: E402
from tests.host.ddp.test_hardware import _bits, _sparse, _train  # noqa: E402

WORLD = 2
#: vector lengths of the direct all-reduces: fewer chunks than boards (1 index chunk),
#: not a multiple of two chunks, and larger
SIZES = (1, 3, 100, 2049, 5000)
#: environment variable that swaps the chunk-to-board mapping on rank 1 (the test's own
#: check that it catches a striping bug; see test_a_swapped_mapping_is_caught)
SWAP = "GRADWIRE_TEST_SWAP_BOARDS"


def _switch_in(settings) -> int:
    from host.driver.udp import UdpTransport
    address = network_address("net", NET_REGISTERS["counter"].address("switch_in"))
    with UdpTransport(settings[0], port_base=settings[1], key=settings[2], timeout=0.5,
                      max_timeout=5.0, retries=6) as t:
        return t.read(address)


def _direct(rank, hook):
    """The direct all-reduces (sketch, dense and auto paths) through ``hook``'s switch."""
    out = {}
    for n in SIZES:
        for path in ("sketch", "dense", "auto"):
            result, _ = ddp.lhc_allreduce(_sparse(rank, n), path=path,
                                          switch=None if hook is None else hook._hardware)
            out[n, path] = _bits(result).copy()
    return out


def _rank_main(rank, world, boards, timeout):
    if rank == 1 and os.environ.get(SWAP):
        # rank 1 alone sends its chunks to the wrong boards: the check must fail
        from host.driver import striped
        original = striped.StripedSwitchWorker.set_layout

        def swapped(self, layouts, first_chunk=0):
            self.workers.reverse()
            return original(self, layouts[::-1], first_chunk)
        striped.StripedSwitchWorker.set_layout = swapped
    (host_a, base_a, key_a), (host_b, base_b, key_b) = boards
    counts = {}

    def snapshot(name):
        dist.barrier()
        if rank == 0:
            counts[name] = [_switch_in(b) for b in boards]
        dist.barrier()

    golden = ddp.LhcHook(asynchronous=False)
    out = {"golden": _train(rank, golden, None), "golden-direct": _direct(rank, None)}
    snapshot("start")
    # A hook serves the one process group it started with: the direct all-reduces (on the
    # default group) and the training (on the hook's own group, under DDP) each get a hook,
    # the first closed (its job released) before the next takes the job.
    one = lambda: ddp.LhcHook(backend="udp", board=f"{host_a}:{base_a}", key=key_a,
                              timeout=timeout)
    with one() as hook:
        out["one-direct"] = _direct(rank, hook)
    snapshot("one-direct")
    out["one"] = _train(rank, one(), None)
    snapshot("one")
    two = lambda: ddp.LhcHook(backend="udp", boards=[f"{host_a}:{base_a}",
                                                     f"{host_b}:{base_b}"],
                              key=[key_a, key_b], timeout=timeout)
    with two() as hook:
        out["repr"] = repr(hook)
        out["two-direct"] = _direct(rank, hook)
        out["two-totals"] = hook.hardware_totals
    snapshot("two-direct")
    out["two"] = _train(rank, two(), None)
    snapshot("two")
    out["counts"] = counts
    return out


@contextlib.contextmanager
def _second_board(kind):
    if kind == "golden":
        with VirtualBoard("golden", port_base=None) as board:
            yield board
    else:
        from sim.harness.board import VerilatorBoard
        with VirtualBoard(VerilatorBoard(), port_base=None) as board:
            yield board


def _run(kind, *, swap=False, timeout=60.0):
    with VirtualBoard("golden", port_base=None) as a, _second_board(kind) as b:
        boards = [(x.host, x.port_base, x.key if x.key is not None else x.backend.key)
                  for x in (a, b)]
        if swap:
            os.environ[SWAP] = "1"
        try:
            ranks = ddp.run_local_group(_rank_main, WORLD, boards, timeout, timeout=600)
        finally:
            os.environ.pop(SWAP, None)
        # the closed hooks released their job on every board they used
        assert a.backend.aggregator.job_config(0) is None
        if kind == "golden":
            assert b.backend.aggregator.job_config(0) is None
        return ranks


def _check(ranks):
    for r in ranks:
        for step, (golden, one, two) in enumerate(zip(r["golden"]["params"], r["one"]["params"],
                                                      r["two"]["params"])):
            np.testing.assert_array_equal(one, golden, err_msg=f"one board, step {step}")
            np.testing.assert_array_equal(two, one, err_msg=f"two boards, step {step}")
        for key, golden in r["golden-direct"].items():
            np.testing.assert_array_equal(r["one-direct"][key], golden, err_msg=str(key))
            np.testing.assert_array_equal(r["two-direct"][key], golden, err_msg=str(key))
        assert r["repr"].endswith("backend='udp', boards=2)")
        hardware = r["two"]["stats"]["hardware"]
        assert hardware["boards"] == 2 and len(hardware["per_board"]) == 2
        assert hardware["backend"].startswith("udp (switch of 2 boards: ")
        assert hardware["packets"] == sum(b["packets"] for b in hardware["per_board"])
        assert r["two-totals"]["boards"] == 2
        assert r["two-totals"]["bytes_in"] == r["two-totals"]["bytes_in_board0"] \
            + r["two-totals"]["bytes_in_board1"]
    counts = ranks[0]["counts"]
    # the training's datagrams alone (each hook's statistics are its own)
    one = [after - before for before, after in zip(counts["one-direct"], counts["one"])]
    two = [after - before for before, after in zip(counts["two-direct"], counts["two"])]
    assert counts["one"][1] == counts["start"][1] and one[0] > 0
    # What the ranks sent (first transmissions, and resends after a timeout) is what each
    # board's switch port counted; the chunks of the job are the one-board run's, split
    # between the boards about half and half (a message of an odd number of chunks puts
    # one more on board 0).
    sent_one = [r["one"]["stats"]["hardware"] for r in ranks]
    packets_one = sum(h["packets"] for h in sent_one)
    assert packets_one <= one[0] <= packets_one + sum(h["resends"] for h in sent_one)
    per_board = [[r["two"]["stats"]["hardware"]["per_board"][b] for r in ranks]
                 for b in range(2)]
    packets_two = [sum(h["packets"] for h in board) for board in per_board]
    assert sum(packets_two) == packets_one
    for b, board in enumerate(per_board):
        assert 0.4 * packets_one <= packets_two[b] <= 0.6 * packets_one, (packets_one,
                                                                          packets_two)
        assert packets_two[b] <= two[b] <= packets_two[b] + sum(h["resends"] for h in board)
    return {"switch_in_one": one[0], "switch_in_two": two, "packets_one": packets_one,
            "packets_two": packets_two,
            "resends_two": [sum(h["resends"] for h in board) for board in per_board]}


def test_two_golden_boards_give_the_one_board_bits():
    print(_check(_run("golden")))


@pytest.mark.slow
def test_a_golden_board_and_the_verilated_network_top_give_the_one_board_bits():
    print(_check(_run("verilator", timeout=120.0)))


def test_a_swapped_mapping_is_caught():
    # rank 1 sends chunk c to board 1 - c mod 2: the boards never see a complete round
    # (rank 0's and rank 1's packets of a chunk meet on different boards), so the first
    # all-reduce fails on every rank within the hooks' timeout rather than give wrong bits
    with pytest.raises(Exception, match="no result from the board's switch|HookBackendError"):
        _run("golden", swap=True, timeout=3.0)


def test_boards_arguments_are_checked_where_the_caller_sees_them(monkeypatch):
    monkeypatch.delenv("GRADWIRE_BOARD", raising=False)
    monkeypatch.delenv("GRADWIRE_KEY", raising=False)
    two = ["127.0.0.1:20000", "127.0.0.1:20010"]
    hook = ddp.LhcHook(backend="udp", boards=two, key=[1, "2"])
    assert repr(hook) == "LhcHook(load=0.7, r_min=1, path='auto', backend='udp', boards=2)"
    assert [s["key"] for s in hook._hardware.boards] == [1, 2]
    assert hook._hardware.describe() == ("udp (switch of 2 boards: 127.0.0.1 ports "
                                         "20000-20003; 127.0.0.1 ports 20010-20013, job 0)")
    one = ddp.LhcHook(backend="udp", boards=two[:1], key=1)     # boards=[ADDR] is board=ADDR
    assert repr(one) == "LhcHook(load=0.7, r_min=1, path='auto', backend='udp')"
    for kwargs, message in (
            (dict(board=two[0], boards=two, key=1), "give board= .* or boards= .*, not both"),
            (dict(boards=[], key=1), "boards must be a non-empty list"),
            (dict(boards=two[0], key=1), "boards must be a non-empty list"),
            (dict(boards=[two[0], two[0]], key=1), "boards 0 and 1 are the same board"),
            (dict(boards=two, key=[1]), "1 keys for 2 boards"),
            (dict(boards=two), "needs the board's control key"),
            (dict(boards=["127.0.0.1:x", two[1]], key=1), "port base")):
        with pytest.raises(ValueError, match=message):
            ddp.LhcHook(backend="udp", **kwargs)
    with pytest.raises(ValueError, match="boards are for backend 'udp'"):
        ddp.LhcHook(boards=two)
    from host.ddp.hardware import UdpSwitch
    with pytest.raises(ValueError, match="do not fit 16 bits"):
        UdpSwitch("test", hook._hardware.boards, group="239.1.2.3:65535")
    with pytest.raises(ValueError, match="group are for backend 'udp'"):
        ddp.LhcHook(group="239.1.2.3:5000")
