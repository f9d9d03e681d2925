"""Training integration: the two hardware paths inside PyTorch DDP.

- :mod:`host.ddp.hooks`: :class:`InceptionnHook` and :class:`LhcHook`, DDP communication
  hooks whose arithmetic is the gateware's, bit for bit (the golden models);
- :mod:`host.ddp.collectives`: what they run on every bucket, the two paths as exchanges over
  a process group (:func:`inceptionn_ring_allreduce`, :func:`lhc_allreduce`), and
  :mod:`host.ddp.call_stats`: what each call sent (:class:`CallStats`);
- :mod:`host.ddp.hook_worker`: what makes them run as training runs them (asynchronously,
  on any process group and device, with mixed precision);
- :mod:`host.ddp.hardware`: their hardware backends (every rank's NIC, the job's switch);
- :mod:`host.ddp.launch`: a process group on this machine (:func:`run_local_group`) and
  the rules every command that starts processes keeps;
- :mod:`host.ddp.accuracy`: the accuracy experiment (``gradwire accuracy``) that trains
  through them.

The hooks' API is this package's::

    from host.ddp import InceptionnHook, LhcHook
"""
import importlib

__all__ = [
    "CallStats", "InceptionnHook", "LhcHook", "DEFAULT_HISTORY", "HookBackendError",
    "ring_chunk_bounds", "dense_ring_bytes", "inceptionn_ring_allreduce", "lhc_allreduce",
    "free_loopback_port", "run_local_group",
]

#: The module of this package that holds each public name.
_HOMES = {
    "CallStats": "call_stats",
    "InceptionnHook": "hooks", "LhcHook": "hooks", "DEFAULT_HISTORY": "hooks",
    "HookBackendError": "hardware",
    "ring_chunk_bounds": "collectives", "dense_ring_bytes": "collectives",
    "inceptionn_ring_allreduce": "collectives", "lhc_allreduce": "collectives",
    "free_loopback_port": "launch", "run_local_group": "launch",
}


def __getattr__(name):
    # The hooks import torch; the package is imported without them too (the accuracy
    # experiment's tables build the CLI's --help), so they load on first use.
    if name in _HOMES:
        return getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
