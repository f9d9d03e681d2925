"""The registered pipeline stage, written once.

A stage holds one beat in ``dst``'s payload register. It takes a beat from ``src`` when its
register is empty or its beat leaves this clock, so back-pressure propagates one stage per
clock and no beat is lost or duplicated (the idiom of the house-style example ``lane_stage.py``).
"""
from contextlib import contextmanager

__all__ = ["register_stage"]


@contextmanager
def register_stage(m, src, dst):
    """Make ``dst`` a registered copy of stream ``src``.

    Drives ``src.ready`` and ``dst.valid``; the body of the ``with`` block adds the
    ``m.d.sync`` assignments of ``dst``'s payload, which load whenever the stage takes a
    beat (``src.ready``; also while ``src.valid`` is low, so the payload registers' enable
    is ``src.ready`` alone)::

        with register_stage(m, self.i, self.o):
            m.d.sync += self.o.p.data.eq(f(self.i.p.data))
    """
    m.d.comb += src.ready.eq(~dst.valid | dst.ready)
    with m.If(src.ready):
        m.d.sync += dst.valid.eq(src.valid)
        yield
