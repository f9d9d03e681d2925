"""Training integration: the two hardware paths inside PyTorch DDP.

- :mod:`host.ddp.hooks`: :class:`InceptionnHook` and :class:`LhcHook`, DDP communication
  hooks whose arithmetic is the gateware's, bit for bit (the golden models);
- :mod:`host.ddp.hook_worker`: what makes them run as training runs them (asynchronously,
  on any process group and device, with mixed precision);
- :mod:`host.ddp.hardware`: their hardware backends (every rank's NIC, the job's switch);
- :mod:`host.ddp.accuracy`: the accuracy experiment (``gradwire accuracy``) that trains
  through them.

The hooks' API is this package's::

    from host.ddp import InceptionnHook, LhcHook
"""
__all__ = [
    "CallStats", "InceptionnHook", "LhcHook", "DEFAULT_HISTORY", "HookBackendError",
    "ring_chunk_bounds", "dense_ring_bytes", "inceptionn_ring_allreduce", "lhc_allreduce",
    "free_loopback_port", "run_local_group",
]


def __getattr__(name):
    # The hooks import torch; the package is imported without them too (the accuracy
    # experiment's tables build the CLI's --help), so they load on first use.
    if name in __all__:
        from . import hooks
        return getattr(hooks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
