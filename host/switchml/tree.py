"""Trees of aggregators (``docs/protocol/aggregator-protocol.md`` section 4): what a tree is,
how it is configured, and what each of its workers needs.

One aggregator serves at most 32 workers of a job. A **tree** of two levels serves up to
32 x 32 = 1024: each **leaf** board holds a job of up to 32 workers whose upstream is the
**root** board's job, and the root's job has the leaves as its workers. :class:`Tree`
describes one: the root board, the leaf boards, the workers of each leaf, the job numbers
(the root's; the leaves', the same on every leaf board), the slot range (the same on every
board: the parent's job uses the slots of its leaves, ``aggregator-protocol.md`` section 4)
and, optionally, a result group per leaf (``network.md`` section 3: the leaf sends each
result once to its workers' group).

There is no result group at the root level: the root's workers are boards, and a board
takes datagrams to its own address only (``network.md`` section 1), never a group's.

:func:`configure_tree` writes the whole tree over the boards' control transports (any
transport :func:`host.driver.udp_worker.configure_job` takes: a
:class:`~host.driver.udp.UdpTransport` with the board's key and ``region="switch"``, or an
in-process :class:`~host.board.control.BackendControl`):

- the root's job: one worker per leaf, worker ``l`` the leaf board ``l`` at its switch port
  (its address and port base + 2), no upstream;
- each leaf's job: its workers' addresses, its group if any, and the upstream: the root's
  address and switch port, the root's job, worker number ``l``.

The root goes first, so that a leaf never sends upstream to a job that is not there yet.

Over a real network (the DDP hook's side, one call each): :func:`open_tree_worker` gives
rank ``r`` its :class:`~host.driver.udp_worker.UdpSwitchWorker` on its leaf (and checks
that the process group is the whole tree), :func:`configure_tree_over_udp` configures
every board from one rank with the boards' control keys (:func:`tree_keys`), and
:func:`release_tree` unconfigures the tree's jobs again.

The hosts see no change (section 3 of the protocol): worker ``rank`` of the tree is worker
:meth:`Tree.worker` ``.worker`` of its leaf's job and talks to its leaf board alone, with
the leaf's :class:`~host.driver.udp_worker.JobLayout`. The only thing a tree changes for a
host is the LHC scale: the sum is over every worker of the tree
(:attr:`Tree.total_workers`, what :class:`host.golden.lhc.LhcWorker` must be given), not
over one leaf's.
"""
from __future__ import annotations

import collections.abc
import dataclasses
import ipaddress
import numbers
import socket

from contract.network import (MAX_JOBS_IN_TABLE, MAX_WORKERS_IN_TABLE, PORT_BASE, Service,
                              ip_to_int, service_ports)

__all__ = ["BoardAddress", "Tree", "TreeWorker", "TreeLayout", "configure_tree",
           "tree_keys", "configure_tree_over_udp", "open_tree_worker", "release_tree"]


def _integer(name, value, low, high):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) \
            or not low <= value <= high:
        raise ValueError(f"{name} must be an integer in {low}..{high}, not {value!r}")
    return int(value)


@dataclasses.dataclass(frozen=True)
class BoardAddress:
    """A board as the others reach it: its IPv4 address and its first service port.

    ``host`` is the address the leaves send to and the root's worker table holds (a real
    board's own address; ``127.0.0.1`` for virtual boards, which differ by port base).
    """
    host: str
    port_base: int = PORT_BASE

    def __post_init__(self):
        service_ports(self.port_base)       # a base that leaves room for the four ports
        try:
            ip = ipaddress.IPv4Address(socket.gethostbyname(str(self.host)))
        except (OSError, UnicodeError, ValueError):
            raise ValueError(f"board address {self.host!r} is not an IPv4 address or a name "
                             f"that resolves to one") from None
        object.__setattr__(self, "host", str(ip))

    @property
    def switch_address(self) -> tuple[str, int]:
        """``(host, port base + 2)``: where the board's aggregator takes datagrams, and
        where its results come from."""
        return self.host, service_ports(self.port_base)[Service.SWITCH]

    @classmethod
    def parse(cls, text) -> "BoardAddress":
        """``"HOST"``, ``"HOST:PORT_BASE"``, ``(host, port_base)`` or a BoardAddress."""
        if isinstance(text, BoardAddress):
            return text
        if isinstance(text, str):
            host, sep, base = text.rpartition(":")
            if not sep:
                return cls(text)
            try:
                return cls(host, int(base))
            except ValueError as exc:
                if "base" in str(exc) or not base.isdigit():
                    raise ValueError(f"give a board as HOST or HOST:PORT_BASE, not "
                                     f"{text!r}") from None
                raise
        host, base = text
        return cls(host, int(base))

    def __str__(self):
        return f"{self.host}:{self.port_base}"


@dataclasses.dataclass(frozen=True)
class TreeWorker:
    """What worker ``rank`` of a tree needs: its leaf (index and board), the leaf's job and
    its worker number there, and the number of workers in the sum (for the LHC scale)."""
    rank: int
    leaf: int
    board: BoardAddress
    job: int
    worker: int
    total_workers: int


@dataclasses.dataclass(frozen=True)
class Tree:
    """A tree of aggregators of two levels (see the module docstring).

    Parameters
    ----------
    root : BoardAddress or str
        The root board (``"HOST"`` or ``"HOST:PORT_BASE"`` as well).
    leaves : sequence of BoardAddress or str
        The leaf boards, in the order of their worker numbers in the root's job (1..32).
    workers : int or sequence of int
        Workers of each leaf (1..32), one number for every leaf or one per leaf. Worker
        ranks count leaf by leaf: leaf 0's workers first.
    root_job, leaf_job : int
        The job on the root board, and the job on every leaf board.
    slot_base : int
        First slot of the jobs, the same on every board.
    slot_count : int or None
        Slots of the jobs, the same on every board; None: the rest of the root's pool from
        ``slot_base`` (resolved by :func:`configure_tree`).
    groups : sequence or None
        One result group per leaf (``(ip, port)``, ``"IP:PORT"`` or None for none), for
        the leaf's workers; None: no groups.

    Raises
    ------
    ValueError
        A board twice (a leaf's job and the root's use the same slots, so they cannot share
        a board; two leaves neither), counts, jobs or slots out of range, a bad group.
    """
    root: BoardAddress
    leaves: tuple
    workers: tuple
    root_job: int = 0
    leaf_job: int = 0
    slot_base: int = 0
    slot_count: int | None = None
    groups: tuple | None = None

    def __post_init__(self):
        from ..driver.sockets import parse_group

        root = BoardAddress.parse(self.root)
        if isinstance(self.leaves, (str, BoardAddress)):
            raise ValueError("leaves is a sequence of boards, one per leaf")
        leaves = tuple(BoardAddress.parse(leaf) for leaf in self.leaves)
        _integer("the number of leaves", len(leaves), 1, MAX_WORKERS_IN_TABLE)
        workers = (self.workers,) * len(leaves) if isinstance(self.workers, numbers.Integral) \
            else tuple(self.workers)
        if len(workers) != len(leaves):
            raise ValueError(f"{len(workers)} worker counts for {len(leaves)} leaves")
        workers = tuple(_integer(f"leaf {leaf}'s workers", n, 1, MAX_WORKERS_IN_TABLE)
                        for leaf, n in enumerate(workers))
        seen = {}
        for name, board in [("the root", root)] + [(f"leaf {i}", b) for i, b in
                                                   enumerate(leaves)]:
            if board in seen:
                raise ValueError(f"{seen[board]} and {name} are the same board {board}: the "
                                 f"jobs of a tree use the same slots, so each needs a board "
                                 f"of its own")
            seen[board] = name
        object.__setattr__(self, "root", root)
        object.__setattr__(self, "leaves", leaves)
        object.__setattr__(self, "workers", workers)
        _integer("root_job", self.root_job, 0, MAX_JOBS_IN_TABLE - 1)
        _integer("leaf_job", self.leaf_job, 0, MAX_JOBS_IN_TABLE - 1)
        _integer("slot_base", self.slot_base, 0, 0xFFFF)
        if self.slot_count is not None:
            _integer("slot_count", self.slot_count, 1, 0x10000)
        if self.groups is not None:
            groups = tuple(self.groups)
            if len(groups) != len(leaves):
                raise ValueError(f"{len(groups)} result groups for {len(leaves)} leaves (one "
                                 f"per leaf, None for a leaf without one)")
            object.__setattr__(self, "groups", tuple(parse_group(g) for g in groups))

    @property
    def total_workers(self) -> int:
        """Every worker of the tree: the ``n`` of the LHC scale."""
        return sum(self.workers)

    @property
    def boards(self) -> tuple:
        """The root, then the leaves."""
        return (self.root,) + self.leaves

    def leaf_ranks(self, leaf: int) -> range:
        """The ranks of leaf ``leaf``'s workers."""
        first = sum(self.workers[:leaf])
        return range(first, first + self.workers[leaf])

    def worker(self, rank: int, world: int | None = None) -> TreeWorker:
        """What worker ``rank`` needs (:class:`TreeWorker`). With ``world`` (the size of the
        process group that runs the tree's workers), check that the group is the whole tree:
        its sum is over every worker, and so is the LHC scale."""
        total = self.total_workers
        if world is not None and world != total:
            raise ValueError(f"the tree has {total} workers ({len(self.leaves)} leaves of "
                             f"{', '.join(map(str, sorted(set(self.workers))))}); a process "
                             f"group of {world} ranks cannot run it: one rank per worker of "
                             f"the tree")
        _integer("rank", rank, 0, total - 1)
        leaf = 0
        while rank >= sum(self.workers[:leaf + 1]):
            leaf += 1
        return TreeWorker(rank=rank, leaf=leaf, board=self.leaves[leaf], job=self.leaf_job,
                          worker=rank - sum(self.workers[:leaf]), total_workers=total)

    def upstream(self, leaf: int):
        """Leaf ``leaf``'s upstream: the root's switch, the root's job, worker ``leaf``."""
        from ..golden.aggregator import Upstream
        host, port = self.root.switch_address
        return Upstream(ip_to_int(host), port, self.root_job, leaf)

    def describe(self) -> str:
        counts = sorted(set(self.workers))
        shape = f"{len(self.leaves)} x {counts[0]}" if len(counts) == 1 else \
            f"{len(self.leaves)} leaves of {'/'.join(map(str, self.workers))}"
        return (f"tree {shape} = {self.total_workers} workers: root {self.root} job "
                f"{self.root_job}, leaves job {self.leaf_job}")


@dataclasses.dataclass(frozen=True)
class TreeLayout:
    """A configured tree: the root's job and every leaf's job as the boards hold them."""
    tree: Tree
    root: object        # host.driver.udp_worker.JobLayout
    leaves: tuple       # one JobLayout per leaf

    def worker_layout(self, rank: int):
        """``(TreeWorker, JobLayout)`` of worker ``rank``: where it sends, and the layout
        its :class:`~host.driver.udp_worker.UdpSwitchWorker` takes (its leaf's job)."""
        plan = self.tree.worker(rank)
        return plan, self.leaves[plan.leaf]

    def leaf_job_key(self, leaf: int, keys) -> bytes:
        """The job key of leaf ``leaf``'s job (a tree configured with an ``epoch``): what
        the leaf's workers take (``set_layout(..., job_key=)``), derived from that leaf
        board's control key (``keys`` as :func:`tree_keys` takes them)."""
        from ..driver.udp_worker import job_key_for

        board = self.tree.leaves[leaf]
        return job_key_for(tree_keys(self.tree, keys)[board], self.leaves[leaf])


def configure_tree(tree: Tree, controls, addresses, *, epoch: int | None = None) -> TreeLayout:
    """Configure every job of ``tree`` (the module docstring says what, root first).

    Parameters
    ----------
    tree : Tree
    controls : mapping or callable
        The control transport of each board: ``controls[board]`` or ``controls(board)`` for
        each :class:`BoardAddress` of the tree (region ``"switch"``, with the board's key).
    addresses : sequence of (str, int)
        Every worker's result address (its worker table entry), by rank.
    epoch : int or None
        Authenticate every job of the tree (``network.md`` section 7; boards with 128-bit
        keys): the root's job and each leaf's under this epoch, each leaf given the root
        job's key as its upstream key (written wrapped), so that the aggregates going up
        and the root's results coming down carry the root job's tags, and each leaf's
        results its own (:meth:`TreeLayout.leaf_job_key`).

    Returns
    -------
    TreeLayout

    Raises
    ------
    ValueError
        Addresses that do not match the tree, slots beyond a board's pool, boards that
        disagree on lanes; a rejected configuration.
    host.driver.switch.NoUpstreamError
        A leaf board whose switch predates trees (nothing is committed on it).
    """
    from ..driver.switch import SwitchInterface
    from ..driver.udp_worker import configure_job

    addresses = [tuple(a) for a in addresses]
    if len(addresses) != tree.total_workers:
        raise ValueError(f"{len(addresses)} worker addresses for a tree of "
                         f"{tree.total_workers} workers (one per rank)")

    def control(board):
        if isinstance(controls, collections.abc.Mapping):
            return controls[board]
        return controls(board)

    root_control = control(tree.root)
    slot_count = tree.slot_count
    if slot_count is None:
        slot_count = SwitchInterface(root_control).slots - tree.slot_base
    root = configure_job(root_control, tree.root_job,
                         [leaf.switch_address for leaf in tree.leaves],
                         slot_base=tree.slot_base, slot_count=slot_count, epoch=epoch)
    root_key = None
    if epoch is not None:
        from ..driver.udp_worker import job_key_for
        root_key = job_key_for(root_control.key, root)
    leaves = []
    for leaf, board in enumerate(tree.leaves):
        layout = configure_job(control(board), tree.leaf_job,
                               [addresses[r] for r in tree.leaf_ranks(leaf)],
                               slot_base=tree.slot_base, slot_count=slot_count,
                               group=tree.groups[leaf] if tree.groups else None,
                               upstream=tree.upstream(leaf), epoch=epoch,
                               upstream_key=root_key)
        if layout.lanes != root.lanes:
            raise ValueError(f"leaf {leaf} ({board}) has {layout.lanes} lanes per slot, the "
                             f"root {root.lanes}: the boards of a tree must agree")
        leaves.append(layout)
    return TreeLayout(tree=dataclasses.replace(tree, slot_count=slot_count), root=root,
                      leaves=tuple(leaves))


def tree_keys(tree: Tree, keys) -> dict:
    """Every board's control key: ``keys`` is one key (an int or hex digits, the same for
    every board) or a mapping from a board (:class:`BoardAddress` or ``"HOST:PORT_BASE"``)
    to its key."""
    from ..driver.settings import parse_key

    def key_of(value, board):
        if isinstance(value, str):
            return parse_key(value)
        if isinstance(value, (bytes, bytearray)) and len(value) == 16:
            return bytes(value)                 # section 7's 128-bit key
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) \
                or not 0 <= value < 1 << 64:
            raise ValueError(f"board {board}'s control key must be 64 bits (an integer or "
                             f"hex digits) or 16 bytes, not {value!r}")
        return int(value)

    if not isinstance(keys, collections.abc.Mapping):
        return {board: key_of(keys, board) for board in tree.boards}
    given = {BoardAddress.parse(board): key for board, key in keys.items()}
    missing = [str(board) for board in tree.boards if board not in given]
    if missing:
        raise ValueError(f"no control key for board(s) {', '.join(missing)}")
    return {board: key_of(given[board], board) for board in tree.boards}


def configure_tree_over_udp(tree: Tree, keys, addresses, *, mtu: int | None = None,
                            epoch: int | None = None, **transport_options) -> TreeLayout:
    """:func:`configure_tree` over each board's control port (a
    :class:`~host.driver.udp.UdpTransport` per board with its key from :func:`tree_keys`,
    closed again). ``transport_options`` go to the transports (timeouts, retries).

    Raises what :func:`configure_tree` raises, and
    :class:`~host.driver.transport.TransportError` naming the board that did not answer
    (also as its ``board`` attribute, the :class:`BoardAddress`).
    """
    from ..driver.transport import TransportError
    from ..driver.udp import UdpTransport

    keys = tree_keys(tree, keys)
    controls = {}
    options = {"timeout": 0.1, "min_timeout": 0.02, "max_timeout": 1.0, "retries": 4,
               **transport_options}
    if mtu is not None:
        options["mtu"] = mtu

    def control(board):
        if board not in controls:
            controls[board] = UdpTransport(board.host, port_base=board.port_base,
                                           key=keys[board], region="switch", **options)
        return controls[board]

    current = [None]

    def tracked(board):
        current[0] = board
        return control(board)

    try:
        return configure_tree(tree, tracked, addresses, epoch=epoch)
    except TransportError as exc:
        error = type(exc)(*((exc.service,) if hasattr(exc, "service") else ()),
                          f"board {current[0]} ({'root' if current[0] == tree.root else 'leaf'}) "
                          f"of the tree: {exc}")
        error.board = current[0]          # the BoardAddress, for a caller's diagnosis
        raise error from None
    finally:
        for transport in controls.values():
            transport.close()


def open_tree_worker(tree: Tree, rank: int, world: int | None = None, **worker_options):
    """Rank ``rank``'s worker of ``tree``: ``(TreeWorker, UdpSwitchWorker)``, the socket
    bound (its address is what :func:`configure_tree_over_udp` needs from every rank), on
    its leaf's job. ``world`` (the process group's size) must be the tree's worker count
    (the sum, and the LHC scale, are over all of them). ``worker_options`` go to
    :class:`~host.driver.udp_worker.UdpSwitchWorker` (``timeout``, ...)."""
    from ..driver.udp_worker import UdpSwitchWorker

    plan = tree.worker(rank, world)
    worker = UdpSwitchWorker(plan.board.host, port_base=plan.board.port_base, job=plan.job,
                             worker=plan.worker, **worker_options)
    return plan, worker


def release_tree(tree: Tree, keys, **transport_options) -> None:
    """Unconfigure the tree's jobs, leaves first (best effort: a board that is gone has
    nothing to free)."""
    from ..driver.switch import SwitchInterface
    from ..driver.udp import UdpTransport

    keys = tree_keys(tree, keys)
    options = {"timeout": 0.05, "min_timeout": 0.02, "max_timeout": 0.2, "retries": 2,
               **transport_options}
    for board, job in [(leaf, tree.leaf_job) for leaf in tree.leaves] + \
            [(tree.root, tree.root_job)]:
        try:
            with UdpTransport(board.host, port_base=board.port_base, key=keys[board],
                              region="switch", **options) as control:
                SwitchInterface(control).clear_job(job)
        except Exception:                     # noqa: BLE001 (nothing to free, or no board)
            pass
