"""Running a process group on this machine (tests, the accuracy experiment, benchmarks):
:func:`run_local_group`, and the rules every command that starts processes keeps.

A launcher that stops when asked
    * The rendezvous is bounded: before any process starts, the launcher checks that it
      can connect to the rendezvous address (a listening socket on ``127.0.0.1``), and
      fails at once in one line, naming the address, if it cannot (a loopback interface
      that is down answers "Network is unreachable"). Each rank's connection to the
      rendezvous store is bounded by ``rendezvous_timeout`` (default
      :data:`RENDEZVOUS_TIMEOUT`), not by the group's collective timeout; a rank that cannot
      connect ends its process, and the launcher raises :class:`RendezvousError` (one line,
      with the address) and stops the other ranks.
    * Ctrl-C (SIGINT) and SIGTERM stop every process the launcher started within seconds:
      the ranks ignore SIGINT (the launcher decides; a rank blocked in C++ would not see it
      anyway), the launcher turns SIGTERM into ``SystemExit(143)`` while it waits (only in
      the main thread), and on any exception, interrupt or exit it terminates the ranks
      (SIGTERM, then SIGKILL after :data:`STOP_GRACE` seconds) before it re-raises. Each rank
      also dies with the launcher (``PR_SET_PDEATHSIG``), should the launcher be killed.
"""
from __future__ import annotations

import contextlib
import ctypes
import datetime
import gc
import numbers
import os
import pickle
import signal
import socket
import sys
import tempfile
import threading
import time

__all__ = ["RENDEZVOUS_TIMEOUT", "STOP_GRACE", "RendezvousError", "free_loopback_port",
           "check_rendezvous_address", "stop_processes", "sigterm_raises", "raise_on_sigterm",
           "run_local_group",
           "init_process_group_from_env"]

#: Seconds a rank may take to connect to the rendezvous store (and the first rank to see
#: every other one arrive): generous for spawned interpreters that import torch on a busy
#: machine, bounded.
RENDEZVOUS_TIMEOUT = 120.0
#: Seconds the ranks get to end after SIGTERM before they are killed.
STOP_GRACE = 3.0
#: The rendezvous address of a local group.
LOOPBACK = "127.0.0.1"


class RendezvousError(RuntimeError):
    """The ranks could not meet: one line that says which address."""


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def check_rendezvous_address(address: str = LOOPBACK, timeout: float = 5.0) -> None:
    """Raise :class:`RendezvousError` (one line) unless a TCP connection to a listening
    socket on ``address`` succeeds within ``timeout`` seconds."""
    port = None
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
            server.bind((address, 0))
            server.listen(1)
            port = server.getsockname()[1]
            with socket.create_connection((address, port), timeout=timeout):
                pass
    except OSError as exc:
        where = f"{address}:{port}" if port is not None else address
        reason = exc.strerror or str(exc) or type(exc).__name__
        hint = " (is the loopback interface up?)" if address.startswith("127.") else ""
        raise RendezvousError(f"cannot connect to the rendezvous address {where}: "
                              f"{reason}{hint}") from None


def stop_processes(processes, grace: float = STOP_GRACE) -> None:
    """Terminate ``processes`` (``multiprocessing`` or ``subprocess`` objects): SIGTERM,
    then SIGKILL for those still alive after ``grace`` seconds; reaps them."""
    def alive(p):
        return p.is_alive() if hasattr(p, "is_alive") else p.poll() is None

    for p in processes:
        if alive(p):
            with contextlib.suppress(OSError, ValueError):
                p.terminate()
    deadline = time.monotonic() + grace
    for p in processes:
        remaining = max(0.0, deadline - time.monotonic())
        with contextlib.suppress(Exception):
            if hasattr(p, "is_alive"):
                p.join(remaining)
            else:
                p.wait(remaining)
    for p in processes:
        if alive(p):
            with contextlib.suppress(OSError, ValueError):
                p.kill()
            with contextlib.suppress(Exception):
                p.join(5.0) if hasattr(p, "is_alive") else p.wait(5.0)


def _raise_exit(signum, frame):
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def sigterm_raises():
    """While inside: SIGTERM raises ``SystemExit(143)`` in the main thread (so that the
    ``finally`` clauses that stop child processes run); outside the main thread, nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def raise_on_sigterm() -> None:
    """From now on SIGTERM raises ``SystemExit(143)`` in the main thread (for a command's
    whole run; :func:`sigterm_raises` for a block). Outside the main thread: nothing."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_exit)


def _die_with_parent() -> None:
    """Linux: this process gets SIGKILL when the process that started it ends."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))          # PR_SET_PDEATHSIG


def _local_group_entry(rank, world_size, port, timeout, rendezvous_timeout, out_dir, fn, args):
    import torch
    import torch.distributed as dist

    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # the launcher stops the ranks
    os.environ["MASTER_ADDR"] = LOOPBACK
    os.environ["MASTER_PORT"] = str(port)
    # Keep gloo's pairwise connections on the loopback interface too.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    try:
        if rank != 0:
            wait_for_listener(LOOPBACK, port, rendezvous_timeout)
        store = dist.TCPStore(LOOPBACK, port, world_size, is_master=rank == 0,
                              timeout=datetime.timedelta(seconds=rendezvous_timeout),
                              wait_for_workers=True)
    except Exception as exc:                         # noqa: BLE001 (reported in one line)
        if isinstance(exc, RendezvousError):
            exc = str(exc).split(" (", 1)[-1].rstrip(")")
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        with open(os.path.join(out_dir, f"rendezvous{rank}.txt"), "w") as f:
            f.write(f"rank {rank} could not reach the rendezvous at {LOOPBACK}:{port} within "
                    f"{rendezvous_timeout:.0f} s ({first[:200]})")
        os._exit(3)
    # From here on the group's own timeout bounds every wait on the store.
    store.set_timeout(datetime.timedelta(seconds=timeout))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout))
    # Keep the cyclic garbage collector off the objects of the imports (torch alone brings
    # hundreds of thousands): otherwise a full collection stops a rank for 0.2-0.3 s here,
    # and ranks that do the same work stop at the same moment, which a hardware backend's
    # timeouts see as a board that went silent.
    gc.freeze()
    try:
        result = fn(rank, world_size, *args)
        # Nobody tears down its connections while a peer may still use them.
        dist.barrier()
        # Free what still holds the group (DDP reducers in reference cycles) now, not
        # during interpreter shutdown.
        gc.collect()
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.pkl"), "wb") as f:
        pickle.dump(result, f)
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave without interpreter finalisation: gloo's worker threads can otherwise be torn
    # down while joinable, and the process aborts ("terminate called without an active
    # exception", SIGABRT) now and then although its work is done.
    os._exit(0)


def wait_for_listener(address: str, port: int, timeout: float) -> None:
    """Connect (and close again) to ``address:port`` until it accepts, at most ``timeout``
    seconds; :class:`RendezvousError` with the last reason otherwise. Done before a store
    client connects, whose own retries print C++ traces for every try."""
    deadline = time.monotonic() + timeout
    reason = "nobody accepted"
    while True:
        try:
            with socket.create_connection((address, port),
                                          timeout=max(0.1, min(2.0, timeout))):
                return
        except OSError as exc:
            reason = exc.strerror or str(exc) or type(exc).__name__
        if time.monotonic() + 0.2 > deadline:
            raise RendezvousError(f"nothing answered at {address}:{port} within "
                                  f"{timeout:.0f} s ({reason})")
        time.sleep(0.2)


def _rendezvous_failure(out_dir):
    lines = []
    for name in sorted(os.listdir(out_dir)):
        if name.startswith("rendezvous"):
            with open(os.path.join(out_dir, name)) as f:
                lines.append(f.read().strip())
    return lines[0] if lines else None


def run_local_group(fn, world_size: int, *args, timeout: float = 300.0,
                    rendezvous_timeout: float = RENDEZVOUS_TIMEOUT) -> list:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` fresh processes that form a
    gloo process group on 127.0.0.1, and return their return values, in rank order.

    ``fn`` must be importable (a module-level function) and its return value picklable.
    Each process uses one intra-op thread. ``timeout`` (seconds) bounds every collective and
    the whole run: a hung group is terminated and :class:`TimeoutError` raised.
    ``rendezvous_timeout`` bounds the ranks' meeting: :class:`RendezvousError` (one line,
    with the address) when they cannot. A worker's exception is re-raised here
    (``torch.multiprocessing.ProcessRaisedException``). Ctrl-C, SIGTERM (in the main
    thread) and any other exception stop every rank (see the module docstring).
    """
    import torch.multiprocessing as mp

    if isinstance(world_size, bool) or not isinstance(world_size, numbers.Integral) \
            or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, not {world_size!r}")
    check_rendezvous_address(LOOPBACK)
    with tempfile.TemporaryDirectory(prefix="gradwire-ddp-") as out_dir, sigterm_raises():
        context = mp.start_processes(
            _local_group_entry, args=(world_size, free_loopback_port(), timeout,
                                      rendezvous_timeout, out_dir, fn, args),
            nprocs=world_size, join=False, start_method="spawn")
        try:
            deadline = time.monotonic() + timeout + rendezvous_timeout + 60.0
            while True:
                try:
                    if context.join(timeout=1.0):
                        break
                except mp.ProcessExitedException:
                    failure = _rendezvous_failure(out_dir)
                    if failure is not None:
                        raise RendezvousError(failure) from None
                    raise
                if time.monotonic() > deadline:
                    raise TimeoutError(f"process group of {world_size} did not finish within "
                                       f"{timeout:.0f} s")
        except BaseException:
            stop_processes(context.processes)
            raise
        results = []
        for rank in range(world_size):
            with open(os.path.join(out_dir, f"rank{rank}.pkl"), "rb") as f:
                results.append(pickle.load(f))
        return results


def init_process_group_from_env(backend: str, *, timeout: float = 1800.0,
                                rendezvous_timeout: float = RENDEZVOUS_TIMEOUT) -> None:
    """``dist.init_process_group(backend)`` from torchrun's environment (``RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), with the connection to the rendezvous
    store bounded by ``rendezvous_timeout`` seconds instead of the group's ``timeout``.

    Raises :class:`RendezvousError` (one line, naming the address) when the store cannot
    be reached in time. The examples use it.
    """
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    address = os.environ.get("MASTER_ADDR", LOOPBACK)
    port = int(os.environ.get("MASTER_PORT", "29500"))
    # torchrun hosts the store in its agent (TORCHELASTIC_USE_AGENT_STORE=True); otherwise
    # rank 0 does.
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    master = rank == 0 and not agent_store
    try:
        if not master:
            wait_for_listener(address, port, rendezvous_timeout)
        store = dist.TCPStore(address, port, world, is_master=master,
                              timeout=datetime.timedelta(seconds=rendezvous_timeout),
                              wait_for_workers=master,
                              multi_tenant=not agent_store)
    except Exception as exc:                         # noqa: BLE001 (one line)
        if isinstance(exc, RendezvousError):
            exc = str(exc).split(" (", 1)[-1].rstrip(")")
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise RendezvousError(f"rank {rank} could not reach the rendezvous at "
                              f"{address}:{port} within {rendezvous_timeout:.0f} s "
                              f"({first[:200]})") from None
    store.set_timeout(datetime.timedelta(seconds=timeout))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout))


def start_example(prog: str, device: str, rendezvous_timeout: float):
    """The examples' start under torchrun: the device (``"cpu"``, ``"cuda"`` or ``"auto"``)
    and the process group (NCCL on CUDA, gloo on the CPU; the hooks and the FSDP2 objects
    make their own gloo groups), or the exit status after one line on stderr that says why
    not (no torchrun, no CUDA, a rendezvous that cannot be reached).

    Returns
    -------
    torch.device or int
    """
    import sys

    import torch

    if "RANK" not in os.environ:
        print(f"run me with torchrun: torchrun --nproc_per_node=2 examples/{prog} ...",
              file=sys.stderr)
        return 2
    if device == "cuda" and not torch.cuda.is_available():
        print(f"{prog}: error: --device cuda, but CUDA is not available here "
              f"(use --device cpu or auto)", file=sys.stderr)
        return 2
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    try:
        if use_cuda:
            torch.cuda.set_device(local_rank)
            init_process_group_from_env("nccl", rendezvous_timeout=rendezvous_timeout)
            return torch.device("cuda", local_rank)
        torch.set_num_threads(1)
        init_process_group_from_env("gloo", rendezvous_timeout=rendezvous_timeout)
        return torch.device("cpu")
    except RendezvousError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2


def bytes_compared(sent: int, dense: int) -> str:
    """``sent`` bytes against ``dense`` in words that read right either way: "31.2 % of the
    dense bytes, 3.21x fewer" or "103.0 % of the dense bytes, 1.03x more"."""
    if dense <= 0:
        return "no dense bytes to compare with"
    share = f"{100.0 * sent / dense:.1f} % of the dense bytes"
    if sent == dense:
        return share + ", as many"
    if sent < dense:
        return share + (f", {dense / sent:.2f}x fewer" if sent else ", none sent")
    return share + f", {sent / dense:.2f}x more"
