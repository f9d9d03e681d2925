"""The description of a tree of aggregators and its configuration
(``host/switchml/tree.py``, ``aggregator-protocol.md`` section 4): what each worker needs,
the checks on a tree, and :func:`configure_tree` over the boards' control (in-process golden
boards here; the UDP test is ``test_tree_udp.py``): the root's worker table holds the leaf
boards' switch ports, every leaf's job has the root as its upstream, the root first."""
import pytest

from contract.network import ip_to_int
from contract.registers import SWITCH_REGISTERS
from host.board.control import BackendControl
from host.driver.switch import NoUpstreamError
from host.golden.aggregator import Upstream
from host.switchml.tree import BoardAddress, Tree, TreeWorker, configure_tree
from host.switchml.tree_network import TreeNetwork, worker_address
from tests.host.driver.test_switch_upstream import BoardWithoutUpstream

ROOT = "10.0.0.1"
LEAVES = ["10.0.1.1", "10.0.1.2:47600", "10.0.1.3"]


def test_a_tree_numbers_its_workers_leaf_by_leaf():
    tree = Tree(ROOT, LEAVES, [2, 3, 1], root_job=1, leaf_job=2, slot_base=4, slot_count=8)
    assert tree.total_workers == 6
    assert tree.root == BoardAddress("10.0.0.1", 47570)
    assert tree.leaves[1] == BoardAddress("10.0.1.2", 47600)
    assert tree.leaves[1].switch_address == ("10.0.1.2", 47602)
    assert [tree.leaf_ranks(leaf) for leaf in range(3)] == [range(0, 2), range(2, 5),
                                                           range(5, 6)]
    assert tree.worker(3) == TreeWorker(rank=3, leaf=1, board=tree.leaves[1], job=2, worker=1,
                                        total_workers=6)
    assert tree.worker(5, world=6).leaf == 2
    assert tree.upstream(2) == Upstream(ip_to_int(ROOT), 47572, 1, 2)
    assert Tree(ROOT, LEAVES, 4).workers == (4, 4, 4)
    assert tree.describe() == "tree 3 leaves of 2/3/1 = 6 workers: root 10.0.0.1:47570 job 1, " \
                              "leaves job 2"
    assert Tree(ROOT, LEAVES, 4).describe().startswith("tree 3 x 4 = 12 workers")


def test_the_hook_side_check_the_group_is_the_whole_tree():
    tree = Tree(ROOT, LEAVES, 4)
    with pytest.raises(ValueError, match="a process group of 4 ranks cannot run it: one rank "
                                         "per worker of the tree"):
        tree.worker(0, world=4)
    with pytest.raises(ValueError, match=r"rank must be an integer in 0\.\.11"):
        tree.worker(12)


@pytest.mark.parametrize("kwargs, message", [
    (dict(leaves=[ROOT, "10.0.1.2"]), "the root and leaf 0 are the same board"),
    (dict(leaves=["10.0.1.1", "10.0.1.1:47570"]), "leaf 0 and leaf 1 are the same board"),
    (dict(leaves=[]), r"number of leaves must be an integer in 1\.\.32"),
    (dict(leaves=[f"10.0.2.{i}" for i in range(1, 34)]), r"1\.\.32, not 33"),
    (dict(workers=33), r"leaf 0's workers must be an integer in 1\.\.32"),
    (dict(workers=[1, 2]), "2 worker counts for 3 leaves"),
    (dict(root_job=64), r"root_job must be an integer in 0\.\.63"),
    (dict(slot_count=0), r"slot_count must be an integer in 1\.\."),
    (dict(groups=["239.1.1.1:5000"]), "1 result groups for 3 leaves"),
    (dict(groups=["10.1.1.1:5000", None, None]), "not IPv4 multicast"),
    (dict(root="not a host name.invalid"), "not an IPv4 address or a name"),
    (dict(leaves="10.0.1.1"), "leaves is a sequence of boards"),
])
def test_a_bad_tree_is_refused_in_one_line(kwargs, message):
    args = dict(root=ROOT, leaves=LEAVES, workers=2)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message) as info:
        Tree(**args)
    assert "\n" not in str(info.value)


def _network(tree, **params):
    return TreeNetwork.golden(tree, **{"slots": 16, "lanes": 64, "jobs": 4, **params})


def test_configure_tree_writes_the_root_then_every_leaf_with_its_upstream():
    tree = Tree(ROOT, LEAVES, [2, 3, 1], root_job=1, leaf_job=2, slot_base=4, slot_count=8,
                groups=["239.7.0.1:5000", None, "239.7.0.3:5000"])
    network = _network(tree)
    order = []
    controls = {}
    for board in tree.boards:
        control = network.control(board)
        original = control.write_many

        def write_many(pairs, *, board=board, original=original, **kw):
            order.append(board)
            return original(pairs, **kw)

        control.write_many = write_many
        controls[board] = control
    addresses = [("192.168.5.1", 40000 + r) for r in range(6)]
    layout = configure_tree(tree, controls, addresses)
    assert order[0] == tree.root and set(order) == set(tree.boards)
    root = network.boards[tree.root]
    assert root.aggregator.job_config(1).workers == 3
    assert root.aggregator.job_config(1).upstream is None
    assert [root.worker_table[(1, leaf)] for leaf in range(3)] == \
        [(ip_to_int(b.host), b.port_base + 2) for b in tree.leaves]
    for leaf, board in enumerate(tree.leaves):
        backend = network.boards[board]
        config = backend.aggregator.job_config(2)
        assert (config.workers, config.slot_base, config.slot_count) == \
            (tree.workers[leaf], 4, 8)
        assert config.upstream == Upstream(ip_to_int(ROOT), 47572, 1, leaf)
        assert [backend.worker_table[(2, w)] for w in range(tree.workers[leaf])] == \
            [(ip_to_int(a[0]), a[1]) for a in addresses[tree.leaf_ranks(leaf).start:
                                                        tree.leaf_ranks(leaf).stop]]
    assert layout.leaves[0].group == ("239.7.0.1", 5000) and layout.leaves[1].group is None
    assert network.boards[tree.leaves[2]].groups[2] == (ip_to_int("239.7.0.3"), 5000)
    plan, leaf_layout = layout.worker_layout(4)
    assert (plan.leaf, plan.worker, leaf_layout.workers, leaf_layout.job) == (1, 2, 3, 2)
    assert layout.root.workers == 3 and layout.root.slot_base == 4


def test_configure_tree_takes_the_rest_of_the_roots_pool_and_a_callable():
    tree = Tree(ROOT, LEAVES[:2], 2, slot_base=6)
    network = _network(tree)
    layout = configure_tree(tree, network.control,
                            [worker_address(0, tree.worker(r).leaf, tree.worker(r).worker, 0)
                             for r in range(4)])
    assert layout.tree.slot_count == 10 and layout.root.slot_count == 10
    assert all(leaf.slot_count == 10 for leaf in layout.leaves)


def test_configure_tree_refuses_wrong_addresses_and_a_leaf_without_upstream_registers():
    tree = Tree(ROOT, LEAVES[:2], 2, slot_count=4)
    network = _network(tree)
    with pytest.raises(ValueError, match="3 worker addresses for a tree of 4 workers"):
        configure_tree(tree, network.control, [("10.9.0.1", 1)] * 3)
    old = BoardWithoutUpstream(0x77, ip=tree.leaves[1].host, slots=16)
    controls = {tree.root: network.control(tree.root),
                tree.leaves[0]: network.control(tree.leaves[0]),
                tree.leaves[1]: BackendControl(old, region="switch")}
    with pytest.raises(NoUpstreamError, match="predates trees"):
        configure_tree(tree, controls, [("10.9.0.1", 40000 + r) for r in range(4)])
    assert old.aggregator.job_config(0) is None


def test_leaves_that_disagree_on_lanes_are_refused():
    tree = Tree(ROOT, LEAVES[:2], 1, slot_count=4)
    network = _network(tree)
    from host.board.golden import GoldenBoard
    network.boards[tree.leaves[1]] = GoldenBoard(0x6772616477697265, ip=tree.leaves[1].host,
                                                 slots=16, lanes=32)
    with pytest.raises(ValueError, match="leaf 1 .* has 32 lanes per slot, the root 64"):
        network.configure(tree, [("10.9.0.1", 40000), ("10.9.0.2", 40000)])


def test_the_upstream_registers_of_a_configured_leaf_read_back_over_control():
    tree = Tree(ROOT, LEAVES[:1], 1, root_job=3, leaf_job=0, slot_count=4)
    network = _network(tree)
    network.configure(tree, [("10.9.0.1", 40000)])
    control = network.control(tree.leaves[0])
    regs = SWITCH_REGISTERS["upstream"]
    assert [control.read(regs.address(0, f)) for f in ("ip", "port", "job", "worker")] == \
        [ip_to_int(ROOT), 47572, 3, 0]
