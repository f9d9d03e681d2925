"""The two hardware paths as FSDP2's reduce-scatter (``torch.distributed.fsdp.fully_shard``).

- :class:`InceptionnReduceScatter`: the INCEPTIONN ring's reduce-scatter phase, each rank
  left with its own shard of the sum;
- :class:`LhcReduceScatter`: the LHC sum (sketch or dense), every rank keeping its shard;
- :func:`set_reduce_scatter`: one of them (a fresh object per module) on every FSDP2 module
  of a model.

::

    from host.fsdp import InceptionnReduceScatter, set_reduce_scatter
    fully_shard(layer) for each layer; fully_shard(model)
    set_reduce_scatter(model, lambda: InceptionnReduceScatter(k=10))

See :mod:`host.fsdp.reduce_scatter`.
"""
__all__ = ["InceptionnReduceScatter", "LhcReduceScatter", "set_reduce_scatter",
           "inceptionn_reduce_scatter", "lhc_reduce_scatter", "reduce_scatter_error_bound",
           "dense_reduce_scatter_bytes"]


def __getattr__(name):
    # torch is imported on first use (as host.ddp does).
    if name in __all__:
        from . import reduce_scatter
        return getattr(reduce_scatter, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
