"""``LhcHook(tree=...)``: a training job on a tree of aggregators, unchanged
(``docs/protocol/aggregator-protocol.md`` section 4, :mod:`host.switchml.tree`).

Three golden virtual boards in this process, each with its own port base and its own control
key: a root and two leaves of two workers each. A four-process gloo group on 127.0.0.1
(ranks 0 and 1 on leaf 0, ranks 2 and 3 on leaf 1):

* all-reduces vectors of 1 to 5000 values (fewer chunks than one, odd numbers of chunks,
  the sketch, dense and auto paths) through ``LhcHook(tree=...)`` and checks every rank's
  result, bit for bit, against the golden flat LHC all-reduce of the four ranks' vectors
  (:func:`host.golden.lhc.allreduce`, one aggregator of four workers);
* trains the hook tests' model (buckets of 1 to 5100 values) with the golden hook and with
  the tree hook (asynchronous): the averaged gradients and the parameters after every step
  must be the golden run's, bit for bit;
* a subgroup of two ranks, and a tree with one wrong key: every rank raises one
  :class:`~host.ddp.hardware.HookBackendError` that says why.

Then, in this process: the leaves sent every slot up (``upstream_sent`` > 0, no result of
their own), the root aggregated them (its results are what each leaf sent up), and every job
of the tree was released. Every wait is bounded (the hook's timeout, the group's timeout).
"""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

from contract.registers import AUTH_FEATURE_UPSTREAM

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed (it comes with the 'ddp' extra: "
                    "pip install -e '.[ddp]')")

import torch.distributed as dist  # noqa: E402

from host import ddp  # noqa: E402
from host.board import VirtualBoard  # noqa: E402
from host.golden import lhc  # noqa: E402
from host.switchml.tree import BoardAddress, Tree  # noqa: E402
from tests.host.ddp.models import Buckets  # noqa: E402
from tests.host.ddp.test_hardware import _bits, _sparse  # noqa: E402

WORLD = 4
STEPS = 3
#: vector lengths of the direct all-reduces (one chunk is 64 values)
SIZES = (1, 3, 100, 2049, 5000)
#: the boards' control keys: root, leaf 0, leaf 1
KEYS = (0x1111, 0x2222, 0x3333)
#: seconds a round may go without a result (the hook), and the whole group may take
HOOK_TIMEOUT = 30.0
GROUP_TIMEOUT = 150.0


def _tree(boards):
    (root, leaf0, leaf1) = [BoardAddress(host, base) for host, base in boards]
    return Tree(root, [leaf0, leaf1], 2)


def _train(rank, hook):
    """A few DDP steps through ``hook``: the averaged gradients and the parameters' bits
    after every step, and the hook's statistics."""
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(3)
    net = Buckets()
    model = DistributedDataParallel(net, bucket_cap_mb=1e-6)
    model.register_comm_hook(state=None, hook=hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    generator = torch.Generator().manual_seed(40 + rank)
    grads, params = [], []
    for _ in range(STEPS):
        optimizer.zero_grad()
        x = torch.randn(16, 6, generator=generator)
        loss = model(x).pow(2).mean() * (1 + 7 * rank)
        loss.backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in net.parameters()])
                     .numpy().view(np.uint32).copy())
        optimizer.step()
        params.append(torch.cat([p.detach().reshape(-1) for p in net.parameters()])
                      .numpy().view(np.uint32).copy())
    stats = {"hardware": hook.hardware_stats, "backend": hook.backend,
             "paths": sorted({c.details.get("path") for c in hook.calls}),
             "numels": sorted({c.numel for c in hook.calls})}
    hook.close()
    return {"grads": grads, "params": params, "stats": stats}


def _catch(call):
    try:
        call()
        return None
    except Exception as exc:                       # noqa: BLE001 (reported)
        return (type(exc).__name__, str(exc))


def _rank_main(rank, world, boards, timeout):
    tree = _tree(boards)
    out = {}
    # -- direct all-reduces, against the golden flat all-reduce of the four ranks ---------
    # (the tree as a dict of Tree's arguments, the keys one per board)
    as_dict = {"root": f"{boards[0][0]}:{boards[0][1]}",
               "leaves": [f"{h}:{b}" for h, b in boards[1:]], "workers": 2}
    with ddp.LhcHook(backend="udp", tree=as_dict, key=list(KEYS), timeout=timeout) as hook:
        out["repr"] = repr(hook)
        mismatches = []
        for n in SIZES:
            for path in ("sketch", "dense", "auto"):
                got, _ = ddp.lhc_allreduce(_sparse(rank, n), path=path,
                                           switch=hook._hardware)
                want, _ = lhc.allreduce([_sparse(r, n) for r in range(world)], path=path)
                if not np.array_equal(_bits(got), _bits(want)):
                    mismatches.append((n, path, int(np.sum(_bits(got) != _bits(want)))))
        out["direct_mismatches"] = mismatches
        out["direct_stats"] = hook.hardware_stats
    # -- training: the golden hook, then the tree (keys as a dict) -------------------------
    out["golden"] = _train(rank, ddp.LhcHook(asynchronous=False))
    keys = {str(board): key for board, key in zip(tree.boards, KEYS)}
    out["tree"] = _train(rank, ddp.LhcHook(backend="udp", tree=tree, key=keys,
                                           timeout=timeout))
    # -- a group that is not the whole tree, and a wrong key: one error on every rank ------
    pair = dist.new_group([0, 1])
    if rank < 2:
        hook = ddp.LhcHook(backend="udp", tree=tree, key=list(KEYS), timeout=timeout)
        out["pair"] = _catch(lambda: ddp.lhc_allreduce(_sparse(rank, 10), pair,
                                                       switch=hook._hardware))
        hook.close()
    dist.barrier()
    wrong = ddp.LhcHook(backend="udp", tree=tree, key=[KEYS[0], KEYS[1], 0xBAD],
                        timeout=timeout)
    out["wrong_key"] = _catch(lambda: ddp.lhc_allreduce(_sparse(rank, 10),
                                                        switch=wrong._hardware))
    wrong.close()
    return out


def _run():
    with contextlib.ExitStack() as stack:
        boards = [stack.enter_context(VirtualBoard("golden", port_base=None, key=key))
                  for key in KEYS]
        ranks = ddp.run_local_group(_rank_main, WORLD, [(b.host, b.port_base) for b in boards],
                                    HOOK_TIMEOUT, timeout=GROUP_TIMEOUT)
        counters = [b.backend.aggregator.counters for b in boards]
        released = [b.backend.aggregator.job_config(0) is None for b in boards]
        tree = _tree([(b.host, b.port_base) for b in boards])
        return ranks, counters, released, tree


def _check(ranks, counters, released, tree):
    for rank, r in enumerate(ranks):
        assert r["direct_mismatches"] == [], f"rank {rank}"
        golden, through = r["golden"], r["tree"]
        for step in range(STEPS):
            np.testing.assert_array_equal(through["grads"][step], golden["grads"][step],
                                          err_msg=f"rank {rank} step {step}: gradients")
            np.testing.assert_array_equal(through["params"][step], golden["params"][step],
                                          err_msg=f"rank {rank} step {step}: parameters")
            # the average is the same on every rank
            np.testing.assert_array_equal(through["grads"][step],
                                          ranks[0]["tree"]["grads"][step])
        stats = through["stats"]
        assert stats["backend"] == "udp"
        assert stats["numels"][0] == 1 and stats["numels"][-1] >= 5000
        hardware = stats["hardware"]
        assert hardware["packets"] == hardware["results"] > 0
        assert hardware["tree"] == {"leaves": 2, "total_workers": 4, "leaf": rank // 2,
                                    "leaf_worker": rank % 2}
        assert hardware["backend"].startswith("udp (tree 2 x 2 = 4 workers: root ")
        assert hardware["backend"].endswith(f"this rank: leaf {rank // 2}, worker "
                                            f"{rank % 2})")
        assert r["repr"].endswith("backend='udp', tree=2 leaves/4 workers)")
        # the training moved the parameters (a model that does not train proves nothing)
        assert not np.array_equal(golden["params"][0], golden["params"][-1])
        if rank < 2:
            kind, message = r["pair"]
            assert kind == "HookBackendError", r["pair"]
            assert "the tree has 4 workers" in message
            assert "a process group of 2 ranks cannot run it" in message
        kind, message = r["wrong_key"]
        assert kind == "HookBackendError", r["wrong_key"]
        assert f"leaf 1 of the tree: the board at {tree.leaves[1].host} ports " \
               f"{tree.leaves[1].port_base}-" in message and "control key is wrong" in message
    root, leaves = counters[0], counters[1:]
    # traffic went up the tree: the leaves completed no slot themselves, they sent every
    # one up, and the root's results are what each leaf sent up
    for leaf in leaves:
        assert leaf["upstream_sent"] == leaf["results_upstream"] > 0, leaf
        assert leaf["results_multicast"] == 0 and leaf["results_unicast"] == 0, leaf
    assert root["packets"] > 0
    assert root["results_multicast"] == leaves[0]["upstream_sent"] \
        == leaves[1]["upstream_sent"], counters
    # every hook released the tree's jobs (also the one whose configuration failed)
    assert released == [True, True, True]
    return {"root": {k: root[k] for k in ("packets", "results_multicast")},
            "leaves": [{k: c[k] for k in ("packets", "upstream_sent", "upstream_resent")}
                       for c in leaves]}


def test_training_on_a_tree_of_aggregators_gives_the_flat_golden_bits():
    print(_check(*_run()))


def test_tree_arguments_are_checked_where_the_caller_sees_them(monkeypatch):
    monkeypatch.delenv("GRADWIRE_KEY", raising=False)
    tree = Tree("127.0.0.1:20000", ["127.0.0.1:20010", "127.0.0.1:20020"], 2)
    hook = ddp.LhcHook(backend="udp", tree=tree, key=[1, "2", 3])
    assert repr(hook) == ("LhcHook(load=0.7, r_min=1, path='auto', backend='udp', "
                          "tree=2 leaves/4 workers)")
    assert list(hook._hardware.keys.values()) == [1, 2, 3]
    assert hook._hardware.describe() == ("udp (tree 2 x 2 = 4 workers: root "
                                         "127.0.0.1:20000 job 0, leaves job 0)")
    as_dict = {"root": "127.0.0.1:20000", "leaves": ["127.0.0.1:20010", "127.0.0.1:20020"],
               "workers": 2}
    assert ddp.LhcHook(backend="udp", tree=as_dict, key="ab")._hardware.tree == tree
    monkeypatch.setenv("GRADWIRE_KEY", "0x77")
    assert set(ddp.LhcHook(backend="udp", tree=tree)._hardware.keys.values()) == {0x77}
    monkeypatch.delenv("GRADWIRE_KEY")
    for kwargs, message in (
            (dict(board="127.0.0.1:20030", key=1), "give tree= .* or board=, not both"),
            (dict(boards=["127.0.0.1:20030"], key=1), "give tree= .* or boards=, not both"),
            (dict(job=1, key=1), "without job=: the tree names its jobs"),
            (dict(slot_base=4, slot_count=4, key=1), "without slot_base=, slot_count="),
            (dict(group="239.1.2.3:5000", key=1), "without group="),
            (dict(key=[1, 2]), "2 keys for the tree's 3 boards"),
            (dict(key={"127.0.0.1:20000": 1}), "no control key for board"),
            (dict(key="xyz"), "hex digits"),
            (dict(), "a tree needs its boards' control keys")):
        with pytest.raises(ValueError, match=message):
            ddp.LhcHook(backend="udp", tree=tree, **kwargs)
    with pytest.raises(ValueError, match="tree are for backend 'udp'"):
        ddp.LhcHook(tree=tree)
    with pytest.raises(ValueError, match="LhcHook: tree: .*missing"):
        ddp.LhcHook(backend="udp", tree={"root": "127.0.0.1:20000"}, key=1)
    with pytest.raises(ValueError, match="LhcHook: tree: the root and leaf 0 are the same board"):
        ddp.LhcHook(backend="udp", tree={"root": "127.0.0.1:20000",
                                         "leaves": ["127.0.0.1:20000"], "workers": 1}, key=1)
    with pytest.raises(TypeError, match="tree must be a host.switchml.tree.Tree or a mapping"):
        ddp.LhcHook(backend="udp", tree="127.0.0.1:20000", key=1)


def test_a_tree_is_authenticated_only_where_every_board_authenticates_jobs():
    """UdpSwitch._tree_epoch: an epoch when every board has a 128-bit key and authenticated
    jobs; None when one has a 64-bit key; a board that does not answer its probe is named
    (the hook's diagnosis of the tree then says which)."""
    import types

    from host.ddp.hardware import UdpSwitch
    from host.driver.transport import TransportError

    keys = [bytes([k]) * 16 for k in (1, 2, 3)]
    with contextlib.ExitStack() as stack:
        boards = [stack.enter_context(VirtualBoard("golden", port_base=None, key=key))
                  for key in keys]
        tree = _tree([(b.host, b.port_base) for b in boards])
        epoch_of = lambda k: UdpSwitch._tree_epoch(types.SimpleNamespace(
            tree=tree, keys=dict(zip(tree.boards, k))))
        assert isinstance(epoch_of(keys), int)
        with pytest.raises(TransportError) as error:
            epoch_of([keys[0], keys[1], bytes(16)])      # leaf 1's key wrong: no reply
        assert error.value.board == tree.leaves[1]
    with contextlib.ExitStack() as stack:
        mixed = [keys[0], keys[1], 0x3333]
        boards = [stack.enter_context(VirtualBoard("golden", port_base=None, key=key))
                  for key in mixed]
        tree = _tree([(b.host, b.port_base) for b in boards])
        assert UdpSwitch._tree_epoch(types.SimpleNamespace(
            tree=tree, keys=dict(zip(tree.boards, mixed)))) is None


def test_a_tree_is_not_authenticated_where_a_board_lacks_upstream_keys(monkeypatch):
    """A board that authenticates jobs but has no upstream keys (the network top's
    gateware: ``auth_features`` 3) cannot tag what its leaf sends up: the tree runs
    without authentication rather than stall at its parent's tag check."""
    import types

    import host.driver.udp_worker as udp_worker
    from host.ddp.hardware import UdpSwitch

    keys = [bytes([k]) * 16 for k in (1, 2, 3)]
    with contextlib.ExitStack() as stack:
        boards = [stack.enter_context(VirtualBoard("golden", port_base=None, key=key))
                  for key in keys]
        tree = _tree([(b.host, b.port_base) for b in boards])
        epoch_of = lambda: UdpSwitch._tree_epoch(types.SimpleNamespace(
            tree=tree, keys=dict(zip(tree.boards, keys))))
        assert isinstance(epoch_of(), int)
        features = udp_worker.auth_features
        gateware_like = boards[2].port_base
        monkeypatch.setattr(udp_worker, "auth_features", lambda t: features(t) & (
            ~AUTH_FEATURE_UPSTREAM if t.port_base == gateware_like else ~0))
        assert epoch_of() is None
