"""Block-RAM storage with a two-cycle read that never returns stale data.

The aggregator keeps its slot pool in block RAM and reads a row a few cycles before the
previous packet's commit writes the same row (packets to one slot arrive back to back).
Instead of stalling on that read-modify-write hazard, :class:`ForwardedMemory` forwards: a
read issued in cycle ``t`` returns, in cycle ``t + 2``, the row as it is after every write
issued up to and including cycle ``t + 1``.

How: the block RAM read port is synchronous and *not* transparent (it returns the row as it
was before a write in the same cycle), so two writes can be missed: the one in cycle ``t``
(compared with the read address in ``t``, its data kept in a register) and the one in
``t + 1`` (compared with the registered read address). Two 2:1 multiplexers pick the newest
and a register closes the stage, so the block RAM output itself feeds only one mux level.
"""
from amaranth import Module, Mux, Shape, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

__all__ = ["ForwardedMemory"]


class ForwardedMemory(wiring.Component):
    """One write port and one two-cycle read port that forwards in-flight writes.

    Parameters
    ----------
    shape : shape-castable
        Shape of one row (``unsigned(256)``, a ``data.StructLayout``, ...).
    depth : int
        Number of rows.

    Attributes
    ----------
    read_addr : Signal, in
        Row to read; always enabled (the pipelines that use it never stall).
    read_data : Signal(shape), out
        Row ``read_addr`` of two cycles earlier, including every write issued up to the
        previous cycle.
    write_en, write_addr, write_data : Signal, in
        One row write per clock.
    """

    def __init__(self, *, shape, depth):
        if not isinstance(depth, int) or depth < 1:
            raise ValueError(f"Memory depth must be a positive integer, not {depth!r}")
        Shape.cast(shape)   # raises a clear TypeError for a bad shape
        self._shape, self._depth = shape, depth
        addr_bits = ceil_log2(depth)
        super().__init__({
            "read_addr": In(addr_bits),
            "read_data": Out(shape),
            "write_en": In(1),
            "write_addr": In(addr_bits),
            "write_data": In(shape),
        })

    @property
    def depth(self):
        return self._depth

    @property
    def bits(self):
        """Block RAM bits this memory holds (rows x row width)."""
        return self._depth * Shape.cast(self._shape).width

    def elaborate(self, platform):
        m = Module()
        m.submodules.storage = storage = Memory(shape=self._shape, depth=self._depth, init=[])
        wr = storage.write_port()
        rd = storage.read_port()   # not transparent: what synthesis maps onto plain BRAM
        width = Shape.cast(self._shape).width

        m.d.comb += [
            wr.en.eq(self.write_en),
            wr.addr.eq(self.write_addr),
            wr.data.eq(self.write_data),
            rd.addr.eq(self.read_addr),
            rd.en.eq(1),
        ]
        write_data = Signal(width)
        m.d.comb += write_data.eq(self.write_data)

        # Cycle t: a write to the row being read is invisible to the non-transparent port.
        addr_1 = Signal.like(self.read_addr)
        hit_0 = Signal()
        data_0 = Signal(width)
        m.d.sync += [
            addr_1.eq(self.read_addr),
            hit_0.eq(self.write_en & (self.write_addr == self.read_addr)),
            data_0.eq(write_data),
        ]
        # Cycle t + 1: the block RAM data, the write of cycle t, or the write of this cycle.
        from_ram = Mux(hit_0, data_0, rd.data)
        hit_1 = self.write_en & (self.write_addr == addr_1)
        out = Signal(width)
        m.d.sync += out.eq(Mux(hit_1, write_data, from_ram))
        m.d.comb += self.read_data.eq(out)
        return m
