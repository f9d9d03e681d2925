"""The clock-domain crossing between the LiteEth core's domain and the engines' domain.

Why two domains: the engines need 125 MHz (one 256-bit beat per clock, the rate their
contracts give) and meet it with little slack, while LiteEth's logic (ARP cache search, IP
checksums, its packetisers) is long and does not need the speed: its 32-bit datapath at
62.5 MHz is 2 Gb/s, twice the line rate. So the core runs in a domain of its own and only
its two user streams, its event strobes and the link bit cross, at their narrowest point
(32-bit words), through Amaranth's ``AsyncFIFO`` and ``PulseSynchronizer``: the engines'
domain carries nothing of LiteEth's timing.

Receive: the engine side reads every clock (the front end never stalls), twice as fast as
the core can write, so the FIFO never fills and the core is never stalled.
Transmit: a datagram's metadata is held on the core's side from its first word to its
last (the core reads it throughout, also while the FIFO momentarily runs dry).
"""
from __future__ import annotations

from amaranth import Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.cdc import FFSynchronizer, PulseSynchronizer
from amaranth.lib.fifo import AsyncFIFO
from amaranth.lib.wiring import In, Out

from hdl.net.core.eth_core import CoreEvents, RxBeat, TxBeat, UdpMeta

__all__ = ["EthCrossing"]


class EthCrossing(wiring.Component):
    """Streams, events and link status between ``eth_domain`` and ``domain``.

    Parameters
    ----------
    eth_domain : str
        The core's domain.
    domain : str
        The front end's (and engines') domain.
    depth : int
        Words of each FIFO (a power of two).

    Members
    -------
    core_rx : In(stream.Signature(RxBeat))      (eth_domain)
    core_tx : Out(stream.Signature(TxBeat))     (eth_domain)
    core_events : In(CoreEvents)                (eth_domain)
    core_link : In(1)                           (any domain)
    rx : Out(stream.Signature(RxBeat))          (domain)
    tx : In(stream.Signature(TxBeat))           (domain)
    events : Out(CoreEvents)                    (domain; one strobe per core event)
    link : Out(1)                               (domain)
    """

    def __init__(self, *, eth_domain="eth", domain="sync", depth=16):
        self._eth, self._sync, self._depth = eth_domain, domain, depth
        super().__init__({
            "core_rx": In(stream.Signature(RxBeat)),
            "core_tx": Out(stream.Signature(TxBeat)),
            "core_events": In(CoreEvents),
            "core_link": In(1),
            "rx": Out(stream.Signature(RxBeat)),
            "tx": In(stream.Signature(TxBeat)),
            "events": Out(CoreEvents),
            "link": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        eth, sync = self._eth, self._sync

        m.submodules.rx_fifo = rx_fifo = AsyncFIFO(width=RxBeat.size, depth=self._depth,
                                                   w_domain=eth, r_domain=sync)
        m.d.comb += [
            rx_fifo.w_data.eq(self.core_rx.p),
            rx_fifo.w_en.eq(self.core_rx.valid),
            self.core_rx.ready.eq(rx_fifo.w_rdy),
            self.rx.p.eq(rx_fifo.r_data),
            self.rx.valid.eq(rx_fifo.r_rdy),
            rx_fifo.r_en.eq(self.rx.ready),
        ]

        m.submodules.tx_fifo = tx_fifo = AsyncFIFO(width=TxBeat.size, depth=self._depth,
                                                   w_domain=sync, r_domain=eth)
        head = data.View(TxBeat, tx_fifo.r_data)
        held = Signal(UdpMeta)
        inside = Signal()                 # between a datagram's first and last word
        core_tx = self.core_tx
        m.d.comb += [
            tx_fifo.w_data.eq(self.tx.p),
            tx_fifo.w_en.eq(self.tx.valid),
            self.tx.ready.eq(tx_fifo.w_rdy),
            core_tx.valid.eq(tx_fifo.r_rdy),
            core_tx.p.data.eq(head.data),
            core_tx.p.last.eq(head.last),
            core_tx.p.last_be.eq(head.last_be),
            core_tx.p.meta.eq(Mux(inside, held, head.meta)),
            tx_fifo.r_en.eq(core_tx.ready),
        ]
        with m.If(core_tx.valid & core_tx.ready):
            m.d[eth] += inside.eq(~head.last)
            with m.If(~inside):
                m.d[eth] += held.eq(head.meta)

        for name, _ in CoreEvents:
            pulse = PulseSynchronizer(i_domain=eth, o_domain=sync)
            m.submodules[f"event_{name}"] = pulse
            m.d.comb += [pulse.i.eq(self.core_events[name]), self.events[name].eq(pulse.o)]
        m.submodules.link_sync = FFSynchronizer(self.core_link, self.link, o_domain=sync)
        return m
