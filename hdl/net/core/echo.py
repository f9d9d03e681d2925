"""UDP echo: every good datagram goes back to its sender, payload unchanged.

For bring-up (a board that answers ``nc -u``) and for the network core's tests. It also
shows the receive contract of :class:`hdl.net.core.eth_core.LiteEthCore`: ``rx`` is never
stalled, a datagram is stored as it arrives and only queued for sending once its last beat
has come without ``error``; whatever does not fit is dropped and counted.
"""
from __future__ import annotations

from amaranth import Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from hdl.net.core.eth_core import DATA_WIDTH, RxBeat, TxBeat, UdpMeta

__all__ = ["UdpEcho"]

BYTES = DATA_WIDTH // 8


class UdpEcho(wiring.Component):
    """Store-and-forward UDP echo.

    The reply goes to the request's source IP and port, from the port it was sent to.
    Dropped (and counted in ``dropped``): datagrams with ``error`` on their last beat, empty
    ones, and those that do not fit in the free buffer or the queue when they start.

    Parameters
    ----------
    depth : int
        Buffer size in 32-bit words (a power of two); the longest echoed datagram.
    queue : int
        Datagrams waiting to be sent, at most.

    Members
    -------
    rx : In(stream.Signature(RxBeat))
        From the core; always ready.
    tx : Out(stream.Signature(TxBeat))
        To the core.
    echoed, dropped : Out(32)
        Datagrams sent back / dropped.
    """

    def __init__(self, *, depth=4096, queue=16):
        if not isinstance(depth, int) or depth < 2 or depth & (depth - 1):
            raise ValueError(f"Echo buffer depth must be a power of two >= 2 words, not {depth!r}")
        if not isinstance(queue, int) or queue < 1:
            raise ValueError(f"Echo queue must hold at least 1 datagram, not {queue!r}")
        self._depth, self._queue = depth, queue
        super().__init__({
            "rx": In(stream.Signature(RxBeat)),
            "tx": Out(stream.Signature(TxBeat)),
            "echoed": Out(32),
            "dropped": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        rx, tx = self.rx, self.tx
        depth = self._depth
        aw = exact_log2(depth)

        m.submodules.buffer = buffer = Memory(shape=DATA_WIDTH, depth=depth, init=[])
        wr = buffer.write_port()
        rd = buffer.read_port(transparent_for=(wr,))
        m.submodules.queue = queue = SyncFIFO(width=UdpMeta.size, depth=self._queue)

        # Pointers count words with one extra bit, so full and empty differ.
        wr_commit = Signal(aw + 1)   # end of the last datagram queued
        wr_cur = Signal(aw + 1)      # next word of the datagram arriving
        rd_free = Signal(aw + 1)     # first word not yet sent
        rd_cur = Signal(aw + 1)

        # --- receive: store, then queue or roll back -------------------------------------
        first = Signal(init=1)
        dropping = Signal()
        words = Signal(16)
        free = Signal(aw + 2)
        accept = Signal()
        m.d.comb += [
            rx.ready.eq(1),
            words.eq((rx.p.meta.length + BYTES - 1) >> exact_log2(BYTES)),
            free.eq(depth - (wr_commit - rd_free)[:aw + 1]),
            accept.eq(Mux(first, (words != 0) & (words <= free) & queue.w_rdy, ~dropping)),
            wr.addr.eq(wr_cur[:aw]),
            wr.data.eq(rx.p.data),
            wr.en.eq(rx.valid & accept),
            queue.w_data.eq(rx.p.meta),
        ]
        with m.If(rx.valid):
            m.d.sync += first.eq(rx.p.last)
            with m.If(first):
                m.d.sync += dropping.eq(~accept)
            with m.If(rx.p.last):
                with m.If(accept & ~rx.p.error):
                    m.d.comb += queue.w_en.eq(1)
                    m.d.sync += [wr_commit.eq(wr_cur + 1), wr_cur.eq(wr_cur + 1)]
                with m.Else():
                    m.d.sync += [wr_cur.eq(wr_commit), self.dropped.eq(self.dropped + 1)]
            with m.Elif(accept):
                m.d.sync += wr_cur.eq(wr_cur + 1)

        # --- transmit: one queued datagram at a time ------------------------------------
        meta = Signal(UdpMeta)
        remaining = Signal(16)
        sending = Signal()
        fire = Signal()
        m.d.comb += [
            fire.eq(tx.valid & tx.ready),
            # Address the word that will be on tx.p.data next cycle (sync read, latency 1).
            rd.addr.eq(Mux(fire, rd_cur + 1, rd_cur)[:aw]),
            tx.valid.eq(sending),
            tx.p.data.eq(rd.data),
            tx.p.last.eq(remaining == 1),
            tx.p.meta.ip_address.eq(meta.ip_address),
            tx.p.meta.src_port.eq(meta.dst_port),
            tx.p.meta.dst_port.eq(meta.src_port),
            tx.p.meta.length.eq(meta.length),
        ]
        with m.If(tx.p.last):
            with m.Switch(meta.length[:exact_log2(BYTES)]):
                for tail in range(BYTES):
                    with m.Case(tail):
                        m.d.comb += tx.p.last_be.eq(1 << ((tail - 1) % BYTES))
        with m.If(~sending & queue.r_rdy):
            head = data.View(UdpMeta, queue.r_data)
            m.d.comb += queue.r_en.eq(1)
            m.d.sync += [
                meta.eq(queue.r_data),
                remaining.eq((head.length + BYTES - 1) >> exact_log2(BYTES)),
                sending.eq(1),
            ]
        with m.If(fire):
            m.d.sync += [rd_cur.eq(rd_cur + 1), remaining.eq(remaining - 1)]
            with m.If(tx.p.last):
                m.d.sync += [sending.eq(0), rd_free.eq(rd_cur + 1),
                             self.echoed.eq(self.echoed + 1)]
        return m
