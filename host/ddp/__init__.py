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
from .hooks import (DEFAULT_HISTORY, CallStats, HookBackendError, InceptionnHook, LhcHook,
                    dense_ring_bytes, free_loopback_port, inceptionn_ring_allreduce,
                    lhc_allreduce, ring_chunk_bounds, run_local_group)

__all__ = [
    "CallStats", "InceptionnHook", "LhcHook", "DEFAULT_HISTORY", "HookBackendError",
    "ring_chunk_bounds", "dense_ring_bytes", "inceptionn_ring_allreduce", "lhc_allreduce",
    "free_loopback_port", "run_local_group",
]
