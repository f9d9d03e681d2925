"""Replicated registers: copies of one register that synthesis must keep apart.

A register whose value fans out to hundreds of loads is a slow net. The usual cure is a few
copies of it, each loaded with the same value and driving part of the loads. Yosys merges
flip-flops with the same input and the same initial value, and it does so bit by bit after
it has split the registers, so distinct reset values do not keep more than two copies of a
bit apart (a bit has only two initial values). A copy therefore carries the
:data:`REPLICA_ATTR` attribute, and every synthesis script of the project runs
:data:`KEEP_REPLICAS` after reading the design: it marks the flip-flops driving such signals
``keep``, which Yosys's merging respects.
"""
from amaranth import Signal

__all__ = ["REPLICA_ATTR", "KEEP_REPLICAS", "replica", "replicas"]

#: Attribute on a signal whose driving flip-flops must not be merged with any other.
REPLICA_ATTR = "gradwire_replica"

#: Yosys commands (run after reading the design, before ``synth_ecp5``): the flip-flops whose
#: output is a signal marked :data:`REPLICA_ATTR` get ``keep``. ``proc`` first, so that a
#: design read from Verilog has its flip-flops as cells too.
KEEP_REPLICAS = "\n".join([
    "proc",
    f"select -set gradwire_replicas w:* a:{REPLICA_ATTR} %i %ci1:+$dff,$adff[Q] "
    "t:$dff t:$adff %u %i",
    "setattr -set keep 1 @gradwire_replicas",
])


def replicas(count, shape, *, name, **kwargs):
    """``count`` registers of ``shape`` that synthesis keeps as distinct flip-flops.

    Parameters
    ----------
    count : int
        Number of copies (at least 1).
    shape : shape-castable
        Shape of each copy.
    name : str
        Copy ``i`` is named ``f"{name}{i}"``.
    **kwargs
        Passed to each :class:`~amaranth.hdl.Signal` (``init``, ``reset_less``...).

    Returns
    -------
    list of Signal
    """
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise TypeError(f"count must be a positive integer, not {count!r}")
    return [replica(shape, name=f"{name}{i}", **kwargs) for i in range(count)]


def replica(shape, *, name, **kwargs):
    """One register of ``shape`` that synthesis keeps apart from every other (a copy of a
    register made elsewhere, see :func:`replicas`)."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty string, not {name!r}")
    attrs = {**kwargs.pop("attrs", {}), REPLICA_ATTR: 1}
    return Signal(shape, name=name, attrs=attrs, **kwargs)
