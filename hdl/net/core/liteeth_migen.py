"""The Migen half of the LiteEth cores: builds ``liteeth_core.v`` (or, for a configuration of
``kind`` ``wire``, ``liteeth_wire.v``: :class:`GradwireWireCore`) from one JSON configuration.

Run by :func:`hdl.net.core.liteeth.generate` in a subprocess (``python -m hdl.net.core.liteeth_migen
CONFIG.json OUT.v``), so that Migen and LiteX never share a process with Amaranth and a
generation always starts from fresh Migen naming state.

The core is put together from LiteEth's own building blocks (PHY, MAC core, ARP, IPv4,
ICMP, UDP TX), the way ``LiteEthUDPIPCore`` does, with these changes that
``network.md`` section 1 needs and stock LiteEth 2024.12 does not do:

* **MAC address filter.** In crossbar mode LiteEth passes frames for any destination MAC
  (its filter exists only in the Wishbone "hybrid" mode). :class:`FilteringMAC` drops every
  frame whose destination is neither the board nor broadcast, and marks runts (under 64
  bytes with FCS) and frames longer than the jumbo limit as errored.
* **IPv4 fragments** are not checked by LiteEth's IP receiver; they are dropped here (the
  receiver's own decision point gets one more condition). ``with_broadcast=False`` makes
  the receiver drop datagrams for other IP addresses (LiteEth's generator leaves it on, and
  then any destination address is accepted).
* **UDP receive** (:class:`UDPReceiver`, replaces ``LiteEthUDPRX``): LiteEth cuts a datagram
  at its UDP length and drops the rest of the frame, so a bad FCS, which is only known at
  the frame's end, is lost for every datagram followed by Ethernet padding. This receiver
  holds the datagram's last beat until the frame has ended, flags it ``error`` when the
  frame was bad, the lengths disagree or the UDP checksum (when non-zero) is wrong, and
  derives ``last_be`` from the UDP length (LiteEth takes the frame's, which counts padding).
* **One raw UDP port for every destination port.** No UDP crossbar: the receiver and
  ``LiteEthUDPTX`` connect straight to the pins, so the Amaranth front end sees every
  datagram with its destination port and dispatches (and counts closed ports) itself.
* **ARP cache answers with the hit entry's MAC** (:func:`fix_arp_cache_response`): stock
  LiteEth's cache reads its memory asynchronously at the search counter only while it
  searches; in the state that answers, the address falls back to entry 0, so every
  datagram went to the MAC of the first host in the cache, whatever its IP. Harmless with
  one peer, wrong with two (a controller and workers).
* **An ARP miss parks its datagram instead of stalling the transmit path**
  (:class:`ParkingARPTable`, :class:`ParkingIPTX`, replace ``LiteEthARPTable`` and
  ``LiteEthIPTX``): stock LiteEth holds every datagram behind one whose destination is
  being resolved, up to 8 x 100 ms for a host that never answers, so one dead worker
  stopped every reply of every service. Here the missed datagram moves into a one-datagram
  slot (block RAM) while its ARP exchange runs, and datagrams to cached destinations keep
  going; a second miss while the slot is taken is dropped at once and counted. The table
  also caches the sender of an ARP request for the board (RFC 826's merge; LiteEth learns
  only from replies to its own requests), so a host that asked for the board is no miss,
  and its request period is ``arp_timeout_s`` (LiteEth's 0.1 s; simulations shorten it).
  A datagram to an IPv4 multicast address (a job's result group, ``docs/protocol/network.md``
  section 3) needs no ARP: it leaves to ``01:00:5e`` and the address's low 23 bits, as
  LiteEth sends it, with TTL ``GROUP_TTL`` (1) instead of LiteEth's 128.

Every drop the core makes is reported by a one-cycle ``ev_*`` strobe in the sys domain (see
:data:`hdl.net.core.liteeth.EVENTS`), by the layer that decided; a datagram handed out with
``error`` set has already been counted by one of them. A frame with a bad FCS is always
counted by ``rx_fcs``, and also by the layer that dropped it for its header before its end
(the FCS is only known then).
"""
from __future__ import annotations

import dataclasses
import json
import sys

from migen import (Cat, ClockDomain, FSM, If, Memory, Mux, NextState, NextValue, Replicate,
                   Signal)
from litex.build.generic_platform import Pins, Subsignal
from litex.build.lattice.platform import LatticePlatform
from litex.gen import ClockDomainsRenamer, LiteXContext, LiteXModule
from litex.soc.interconnect import stream

from liteeth.common import (bcast_ip_mask, bcast_mac_address, convert_ip, eth_fcs_length,
                            eth_ipv4_user_description, eth_mac_description, eth_phy_description,
                            eth_min_frame_length, ethernet_type_arp, ethernet_type_ip,
                            icmp_protocol, ipv4_header, mac_header_length, mcast_ip_mask,
                            mcast_oui, udp_header, udp_protocol)
from liteeth.core.arp import (LiteEthARPCache, LiteEthARPRX, LiteEthARPTX,
                              _arp_table_layout)
from liteeth.core.icmp import LiteEthICMP
from liteeth.core.ip import (LiteEthIPRX, LiteEthIPV4Checksum, LiteEthIPV4Crossbar,
                             LiteEthIPV4Packetizer)
from liteeth.core.udp import LiteEthUDPDepacketizer, LiteEthUDPTX
from liteeth.mac.common import (LiteEthMACCrossbar, LiteEthMACDepacketizer,
                                LiteEthMACPacketizer)
from liteeth.mac.core import LiteEthMACCore
from liteeth.mac.crc import LiteEthMACCRC32Checker
from liteeth.mac.last_be import LiteEthMACTXLastBE
from liteeth.mac.preamble import LiteEthMACPreambleChecker
from liteeth.phy.ecp5rgmii import LiteEthPHYRGMII

from contract.network import GROUP_TTL, WIRE_PORTS
from hdl.net.core.liteeth import CORE_MODULES, EVENTS

DATA_WIDTH = 32



def rx_layout(dw=DATA_WIDTH):
    """The receive stream: payload plus per-datagram parameters (constant per datagram)."""
    return stream.EndpointDescription(
        [("data", dw), ("last_be", dw // 8), ("error", 1)],
        [("ip_address", 32), ("src_port", 16), ("dst_port", 16), ("length", 16)])


class FilteringMAC(LiteXModule):
    """LiteEth's crossbar-mode MAC plus a destination-MAC filter and runt/oversize marking.

    Same wiring as ``LiteEthMAC(interface="crossbar")``; between the MAC depacketizer and
    the crossbar, a frame whose destination MAC is neither ``mac_address`` nor broadcast is
    dropped (the MAC depacketizer holds the header fields for the whole frame, so one
    comparison decides every beat of it), and the last beat of a frame shorter than the
    Ethernet minimum or longer than ``max_frame`` (both with FCS) gets ``error`` set.
    """

    def __init__(self, phy, mac_address, max_frame, dw=DATA_WIDTH):
        self.core = LiteEthMACCore(phy=phy, dw=dw, with_sys_datapath=True,
                                   tx_cdc_depth=32, tx_cdc_buffered=True,
                                   rx_cdc_depth=32, rx_cdc_buffered=True)
        self.crossbar = LiteEthMACCrossbar(dw)
        self.packetizer = LiteEthMACPacketizer(dw)
        self.depacketizer = LiteEthMACDepacketizer(dw)
        self.comb += [
            self.crossbar.master.source.connect(self.packetizer.sink),
            self.packetizer.source.connect(self.core.sink),
            self.core.source.connect(self.depacketizer.sink),
        ]

        self.ev_mac = Signal()
        self.ev_ethertype = Signal()
        self.ev_runt = Signal()
        self.ev_oversize = Signal()

        src, dst = self.depacketizer.source, self.crossbar.master.sink
        accept = Signal()
        first = Signal(reset=1)
        # Payload bytes after the 14-byte MAC header, FCS already removed; saturating.
        min_payload = eth_min_frame_length - eth_fcs_length - mac_header_length
        max_payload = max_frame - eth_fcs_length - mac_header_length
        count = Signal(max=max_payload + 2 * dw // 8 + 1)
        count_limit = max_payload + 1
        last_bytes = Signal(max=dw // 8 + 1)
        total = Signal.like(count)
        runt, oversize = Signal(), Signal()
        self.comb += [
            accept.eq((src.target_mac == mac_address) | (src.target_mac == bcast_mac_address)),
            # last_be is one-hot on the last beat: its position gives that beat's bytes.
            last_bytes.eq(dw // 8),
            *[If(src.last_be[i], last_bytes.eq(i + 1)) for i in reversed(range(dw // 8))],
            total.eq(count + last_bytes),
            runt.eq(total < min_payload),
            oversize.eq(total > max_payload),
            src.connect(dst, omit={"valid", "ready", "error"}),
            dst.valid.eq(src.valid & accept),
            src.ready.eq(dst.ready | ~accept),
            dst.error.eq(src.error | Replicate(src.last & (runt | oversize), dw // 8)),
        ]
        beat = Signal()
        bad_fcs = Signal()
        self.comb += [
            beat.eq(src.valid & src.ready),
            bad_fcs.eq(src.error != 0),
            self.ev_mac.eq(beat & first & ~accept),
            self.ev_ethertype.eq(beat & first & accept &
                                 (src.ethernet_type != ethernet_type_ip) &
                                 (src.ethernet_type != ethernet_type_arp)),
            # One cause per frame: a bad FCS is counted by the CRC checker, not again here.
            self.ev_runt.eq(beat & src.last & accept & runt & ~bad_fcs),
            self.ev_oversize.eq(beat & src.last & accept & oversize & ~bad_fcs),
        ]
        self.sync += If(beat,
            first.eq(src.last),
            If(src.last,
                count.eq(0)
            ).Elif(count < count_limit,
                count.eq(count + dw // 8)
            )
        )

        # LiteEth's own MAC checkers pulse `error` (sys domain with the sys datapath).
        self.ev_preamble = Signal()
        self.ev_fcs = Signal()
        for module in self.core.rx_datapath.pipeline:
            if isinstance(module, LiteEthMACPreambleChecker):
                self.comb += self.ev_preamble.eq(module.error)
            if isinstance(module, LiteEthMACCRC32Checker):
                self.comb += self.ev_fcs.eq(module.error)


class UDPReceiver(LiteXModule):
    """UDP receive: datagram out with its parameters, last beat held until the frame ends.

    ``source.length`` is the UDP payload length in bytes (UDP length minus 8) and
    ``last_be`` marks the last payload byte per that length. The last beat carries
    ``error``: the frame had a bad FCS or was a runt/oversize, the UDP length is under 8 or
    beyond the IP payload, the frame ended before the datagram did, or a non-zero UDP
    checksum is wrong. A datagram of length 0 is one beat with ``last_be == 0``.
    """

    def __init__(self, ip_address, dw=DATA_WIDTH):
        assert dw == 32
        self.sink = sink = stream.Endpoint(eth_ipv4_user_description(dw))
        self.source = source = stream.Endpoint(rx_layout(dw))
        self.ev_length = Signal()
        self.ev_checksum = Signal()

        # # #

        self.depacketizer = depacketizer = LiteEthUDPDepacketizer(dw)
        self.comb += sink.connect(depacketizer.sink)
        d = depacketizer.source

        length = Signal(16)          # UDP payload bytes
        count = Signal(17)           # payload bytes before the current beat
        bad_length = Signal()
        self.comb += [
            length.eq(d.length - udp_header.length),
            bad_length.eq((d.length < udp_header.length) | (d.length > sink.length)),
            source.ip_address.eq(sink.ip_address),
            source.src_port.eq(d.src_port),
            source.dst_port.eq(d.dst_port),
            source.length.eq(Mux(bad_length, 0, length)),
        ]

        # Big-endian 16-bit halves of a beat (byte 0 of the datagram is data[0:8]),
        # with the bytes past the datagram's end masked to zero.
        valid_bytes = Signal(3)
        remaining = Signal(17)
        self.comb += [
            remaining.eq(length - count),
            If(bad_length | (count >= length),
                valid_bytes.eq(0)
            ).Elif(remaining >= dw // 8,
                valid_bytes.eq(dw // 8)
            ).Else(
                valid_bytes.eq(remaining)
            ),
        ]
        masked = [Signal(8) for _ in range(dw // 8)]
        for i, byte in enumerate(masked):
            self.comb += byte.eq(Replicate(valid_bytes > i, 8) & d.data[8 * i:8 * i + 8])
        beat_sum = Signal(18)
        self.comb += beat_sum.eq(Cat(masked[1], masked[0]) + Cat(masked[3], masked[2]))

        # Pseudo header (source IP, our IP, protocol, UDP length) plus the UDP header
        # itself, checksum field included: a correct datagram sums to 0xffff.
        our_ip = convert_ip(ip_address)
        header_sum = Signal(20)
        self.comb += header_sum.eq(
            sink.ip_address[16:] + sink.ip_address[:16] + (our_ip >> 16) + (our_ip & 0xffff)
            + udp_protocol + d.length + d.src_port + d.dst_port + d.length + d.checksum)
        total = Signal(32)
        folded = Signal(17)
        folded2 = Signal(17)
        self.comb += [
            folded.eq(total[:16] + total[16:]),
            folded2.eq(folded[:16] + folded[16]),
        ]

        held_data = Signal(dw)
        held_bytes = Signal(3)
        frame_error = Signal()
        truncated = Signal()
        datagram_end = Signal()
        self.comb += datagram_end.eq(bad_length | (count + dw // 8 >= length))

        self.fsm = fsm = FSM(reset_state="IDLE")
        fsm.act("IDLE",
            NextValue(count, 0),
            NextValue(total, 0),
            NextValue(frame_error, 0),
            NextValue(truncated, 0),
            If(d.valid,
                NextValue(total, header_sum),
                NextState("DROP"),
                If(sink.protocol == udp_protocol,
                    NextState("RECEIVE")
                )
            )
        )
        # Beats before the datagram's last one go straight out; the last one is held.
        fsm.act("RECEIVE",
            If(datagram_end | d.last,
                d.ready.eq(1),
                If(d.valid,
                    NextValue(held_data, d.data),
                    NextValue(held_bytes, valid_bytes),
                    NextValue(total, total + beat_sum),
                    NextValue(frame_error, d.error != 0),
                    NextValue(truncated, ~datagram_end),
                    If(d.last,
                        NextState("LAST")
                    ).Else(
                        NextState("PADDING")
                    )
                )
            ).Else(
                source.valid.eq(d.valid),
                d.ready.eq(source.ready),
                source.data.eq(d.data),
                source.last_be.eq(0),
                If(d.valid & source.ready,
                    NextValue(count, count + dw // 8),
                    NextValue(total, total + beat_sum),
                )
            )
        )
        fsm.act("PADDING",
            d.ready.eq(1),
            If(d.valid,
                If(d.error != 0, NextValue(frame_error, 1)),
                If(d.last, NextState("LAST"))
            )
        )
        checksum_bad = Signal()
        self.comb += checksum_bad.eq((d.checksum != 0) & (folded2[:16] != 0xffff))
        fsm.act("LAST",
            source.valid.eq(1),
            source.last.eq(1),
            source.data.eq(held_data),
            source.error.eq(frame_error | truncated | bad_length | checksum_bad),
            # last_be: one-hot marker of the last payload byte (zero for an empty datagram).
            *[If(held_bytes == i + 1, source.last_be.eq(1 << i)) for i in range(dw // 8)],
            If(source.ready,
                # Exactly one cause per datagram; a bad FCS was counted by the MAC.
                self.ev_length.eq(~frame_error & (truncated | bad_length)),
                self.ev_checksum.eq(~frame_error & ~truncated & ~bad_length & checksum_bad),
                NextState("IDLE")
            )
        )
        fsm.act("DROP",
            d.ready.eq(1),
            If(d.valid & d.last,
                NextState("IDLE")
            )
        )


def fix_arp_cache_response(cache):
    """Hold the cache's read address on the hit entry while the cache answers.

    ``LiteEthARPCache`` drives its asynchronous read port's address from its search counter
    in ``MEM_SEARCH`` only; ``RESPONSE`` presents the port's data as the answer, by then
    read at address 0. The statement added here keeps the address on the counter in
    ``RESPONSE`` (the counter stops on the hit).
    """
    from migen.fhdl.structure import _Assign
    from migen.fhdl.specials import _MemoryPort
    ports = [p for p in cache._fragment.specials if isinstance(p, _MemoryPort) and p.async_read]
    assert len(ports) == 1, "LiteEthARPCache changed: expected one asynchronous read port"
    port = ports[0]
    counters = [stmt.r for stmt in cache.fsm.actions["MEM_SEARCH"]
                if isinstance(stmt, _Assign) and stmt.l is port.adr]
    assert len(counters) == 1, "LiteEthARPCache changed: MEM_SEARCH no longer sets the address"
    cache.fsm.act("RESPONSE", port.adr.eq(counters[0]))


#: The ARP table's lookup interface (the IP transmitter asks, once per unicast datagram).
_lookup_layout = [("ip_address", 32), ("resolve", 1)]
#: Its answer: ``miss`` without ``started``: not cached, and no exchange was started for it.
_lookup_response_layout = [("mac_address", 48), ("miss", 1), ("started", 1)]
#: The end of an exchange: the MAC learned, or ``failed`` after the last request.
_resolved_layout = [("mac_address", 48), ("failed", 1)]


class ParkingARPTable(LiteXModule):
    """LiteEth's ARP table with the lookup split from the exchange, so a miss needs no wait.

    ``LiteEthARPTable`` answers a lookup only once the exchange for a missed address is over
    (up to 8 requests 100 ms apart), so its caller waits that long. Here ``lookup`` always
    answers at once (a cache search): a hit with its MAC, or a miss; on a miss with
    ``resolve`` set and no exchange running, the table starts one (``started``) and later
    presents its end on ``resolved`` (the learned MAC, or ``failed`` after ``max_requests``
    unanswered requests ``timeout_s`` apart), held until taken. One exchange at a time: a
    miss while one runs is answered ``miss`` without ``started``.

    Requests for the board's address are answered as LiteEth does, and their sender is
    cached (RFC 826's merge: a host asks for the board before it sends to it, so replies to
    it do not miss). ``sink`` (from the ARP
    receiver) must come through a FIFO: the receiver presents each ARP frame for one cycle
    only, and this table takes it when it is free.
    """

    def __init__(self, clk_freq, entries, timeout_s, max_requests=8):
        self.sink = sink = stream.Endpoint(_arp_table_layout)      # from the ARP receiver
        self.source = source = stream.Endpoint(_arp_table_layout)  # to the ARP transmitter
        self.lookup = lookup = stream.Endpoint(_lookup_layout)
        self.response = response = stream.Endpoint(_lookup_response_layout)
        self.resolved = resolved = stream.Endpoint(_resolved_layout)
        self.ev_miss = Signal()       # a lookup missed and started an exchange

        # # #

        self.cache = cache = LiteEthARPCache(entries=entries, clk_freq=clk_freq)

        pending = Signal()                           # an exchange runs
        pending_ip = Signal(32)
        sent = Signal(max=max_requests + 1)          # requests sent in this exchange
        period = max(1, int(round(timeout_s * clk_freq)))
        timer = Signal(max=period + 1, reset=period)
        reload = Signal()
        # The timer waits for the table rather than pulsing once (LiteEth's WaitTimer), so
        # that a busy table delays a retry by cycles, not by a whole period.
        self.sync += If(~pending | reload,
            timer.eq(period)
        ).Elif(timer != 0,
            timer.eq(timer - 1)
        )
        set_resolved, set_failed = Signal(), Signal()
        self.sync += If(set_resolved | set_failed,
            resolved.valid.eq(1),
            resolved.failed.eq(set_failed),
            resolved.mac_address.eq(sink.mac_address),
        ).Elif(resolved.ready,
            resolved.valid.eq(0)
        )

        self.fsm = fsm = FSM(reset_state="IDLE")
        fsm.act("IDLE",
            If(sink.valid & sink.request,
                NextState("SEND_REPLY")
            ).Elif(sink.valid & sink.reply,
                NextState("UPDATE_TABLE")
            ).Elif(sink.valid,
                sink.ready.eq(1)
            ).Elif(lookup.valid,
                NextState("CHECK_TABLE")
            ).Elif(pending & (timer == 0),
                NextState("CHECK_REQUEST")
            )
        )
        fsm.act("SEND_REPLY",
            source.valid.eq(1),
            source.reply.eq(1),
            source.ip_address.eq(sink.ip_address),
            source.mac_address.eq(sink.mac_address),
            If(source.ready,
                NextState("MERGE_CHECK")
            )
        )
        # RFC 826's merge, for requests to the board: the requester is about to send to
        # the board, and the board's reply to it would otherwise miss. Added when not
        # cached (an entry already there keeps its MAC: the cache cannot rewrite in place);
        # a requester being resolved is resolved by its own request.
        fsm.act("MERGE_CHECK",
            cache.request.valid.eq(1),
            cache.request.ip_address.eq(sink.ip_address),
            If(cache.response.valid,
                If(cache.response.error,
                    NextState("MERGE_UPDATE")
                ).Else(
                    sink.ready.eq(1),
                    NextState("IDLE")
                )
            )
        )
        fsm.act("MERGE_UPDATE",
            cache.update.valid.eq(1),
            cache.update.ip_address.eq(sink.ip_address),
            cache.update.mac_address.eq(sink.mac_address),
            If(cache.update.ready,
                sink.ready.eq(1),
                If(pending & (pending_ip == sink.ip_address),
                    set_resolved.eq(1),
                    NextValue(pending, 0)
                ),
                NextState("IDLE")
            )
        )
        fsm.act("UPDATE_TABLE",
            If(pending & (pending_ip == sink.ip_address),
                cache.update.valid.eq(1),
                cache.update.ip_address.eq(sink.ip_address),
                cache.update.mac_address.eq(sink.mac_address),
                If(cache.update.ready,
                    sink.ready.eq(1),
                    set_resolved.eq(1),
                    NextValue(pending, 0),
                    NextState("IDLE")
                )
            ).Else(
                sink.ready.eq(1),
                NextState("IDLE")
            )
        )
        fsm.act("CHECK_REQUEST",
            reload.eq(1),
            If(sent == max_requests,
                set_failed.eq(1),
                NextValue(pending, 0),
                NextState("IDLE")
            ).Else(
                NextState("SEND_REQUEST")
            )
        )
        start = Signal()
        self.comb += start.eq(cache.response.error & lookup.resolve & ~pending & ~resolved.valid)
        fsm.act("CHECK_TABLE",
            cache.request.valid.eq(1),
            cache.request.ip_address.eq(lookup.ip_address),
            If(cache.response.valid,
                lookup.ready.eq(1),
                NextValue(response.mac_address, cache.response.mac_address),
                NextValue(response.miss, cache.response.error),
                NextValue(response.started, start),
                If(start,
                    self.ev_miss.eq(1),
                    NextValue(pending, 1),
                    NextValue(pending_ip, lookup.ip_address),
                    NextValue(sent, 0),
                ),
                NextState("PRESENT_RESPONSE")
            )
        )
        fsm.act("PRESENT_RESPONSE",
            response.valid.eq(1),
            If(response.ready,
                If(response.started,
                    NextState("SEND_REQUEST")
                ).Else(
                    NextState("IDLE")
                )
            )
        )
        fsm.act("SEND_REQUEST",
            source.valid.eq(1),
            source.request.eq(1),
            source.ip_address.eq(pending_ip),
            If(source.ready,
                NextValue(sent, sent + 1),
                NextState("IDLE")
            )
        )


class ParkingARP(LiteXModule):
    """``LiteEthARP`` with :class:`ParkingARPTable` (and a FIFO in front of it)."""

    def __init__(self, mac, mac_address, ip_address, clk_freq, entries, timeout_s, dw=8):
        self.tx = tx = LiteEthARPTX(mac_address, ip_address, dw)
        self.rx = rx = LiteEthARPRX(mac_address, ip_address, dw)
        self.table = table = ParkingARPTable(clk_freq, entries=entries, timeout_s=timeout_s)
        # The receiver's output is valid for one cycle whatever ``ready`` says; the table is
        # busy for up to ``entries`` cycles per lookup, and a reply lost there would cost a
        # whole retry period.
        self.rx_fifo = rx_fifo = stream.SyncFIFO(_arp_table_layout, 2)
        self.comb += [
            rx.source.connect(rx_fifo.sink),
            rx_fifo.source.connect(table.sink),
            table.source.connect(tx.sink),
        ]
        mac_port = mac.crossbar.get_port(ethernet_type_arp, dw=dw)
        self.comb += [
            tx.source.connect(mac_port.sink),
            mac_port.source.connect(rx.sink),
        ]


@dataclasses.dataclass(frozen=True)
class _SlotFSM:
    """The signals of :class:`ParkingIPTX` that its state machine's states use."""
    sink: object
    source: object
    p: object
    wr: object
    rd: object
    slot_busy: Signal
    wr_ptr: Signal
    rd_ptr: Signal
    last_ptr: Signal
    last_be: Signal
    resolved: object
    lookup: object
    response: object
    target_mac: Signal
    parked_last: Signal
    slot_words: int


class ParkingIPTX(LiteXModule):
    """``LiteEthIPTX`` that parks a datagram whose destination misses the ARP cache.

    The datagram (IPv4 header and payload, as the packetizer makes it) is copied into a
    slot of ``slot_words`` words while :class:`ParkingARPTable` resolves its address; the
    datagrams behind it keep flowing to cached destinations, one whole frame at a time.
    When the exchange ends the slot is sent with the learned MAC (ahead of the next
    datagram, at a frame boundary) or dropped (``target_unreachable``). A miss while the
    slot is taken is dropped at once (``busy_drop``): no state waits on it.

    The header checksum restarts at the end of every datagram the packetizer emits,
    whatever took it (LiteEth restarts it only at the end of a sent frame, so the datagram
    after a dropped one went out with the dropped one's header checksum).
    """

    def __init__(self, mac_address, ip_address, arp_table, slot_words, dw=8):
        self.sink = sink = stream.Endpoint(eth_ipv4_user_description(dw))
        self.source = source = stream.Endpoint(eth_mac_description(dw))
        self.target_unreachable = Signal()
        self.busy_drop = Signal()

        # # #

        self.buffer = buffer = stream.Buffer(eth_ipv4_user_description(dw))
        self.comb += sink.connect(buffer.sink)
        sink = buffer.source

        self.checksum = checksum = LiteEthIPV4Checksum(skip_checksum=True)
        self.packetizer = packetizer = LiteEthIPV4Packetizer(dw)
        p = packetizer.source
        self.comb += [
            checksum.ce.eq(sink.valid),
            checksum.reset.eq(p.valid & p.last & p.ready),
            sink.connect(packetizer.sink, keep={"last", "last_be", "protocol", "data"}),
            packetizer.sink.valid.eq(sink.valid & checksum.done),
            sink.ready.eq(packetizer.sink.ready & checksum.done),
            packetizer.sink.target_ip.eq(sink.ip_address),
            packetizer.sink.total_length.eq(ipv4_header.length + sink.length),
            packetizer.sink.version.eq(0x4),
            packetizer.sink.ihl.eq(ipv4_header.length // 4),
            packetizer.sink.identification.eq(0),
            # A multicast datagram (a job's result group) stays on the board's segment.
            packetizer.sink.ttl.eq(Mux(sink.ip_address[28:] == mcast_ip_mask, GROUP_TTL, 0x80)),
            packetizer.sink.sender_ip.eq(ip_address),
            checksum.header.eq(packetizer.header),
            packetizer.sink.checksum.eq(checksum.value),
            source.ethernet_type.eq(ethernet_type_ip),
            source.sender_mac.eq(mac_address),
        ]

        # The slot: data words in block RAM, the last word's index and byte enables beside.
        mem = Memory(dw, slot_words)
        wr = mem.get_port(write_capable=True)
        rd = mem.get_port()                  # synchronous read: dat_r is mem[adr of last cycle]
        self.specials += mem, wr, rd
        slot_busy = Signal()                 # from the miss until the slot is sent or dropped
        wr_ptr = Signal(max=slot_words)
        rd_ptr = Signal(max=slot_words)
        last_ptr = Signal(max=slot_words)
        last_be = Signal(dw // 8)
        self.comb += [
            rd.adr.eq(rd_ptr),
            wr.adr.eq(wr_ptr),
            wr.dat_w.eq(p.data),
        ]
        resolved = arp_table.resolved
        lookup, response = arp_table.lookup, arp_table.response
        target_mac = Signal(48, reset_less=True)

        self.fsm = fsm = FSM(reset_state="IDLE")
        self.comb += [
            lookup.ip_address.eq(sink.ip_address),
            lookup.resolve.eq(~slot_busy),
        ]
        parked_last = Signal()
        self.comb += parked_last.eq(rd_ptr == last_ptr)
        self._slot_fsm(fsm, _SlotFSM(
            sink=sink, source=source, p=p, wr=wr, rd=rd, slot_busy=slot_busy, wr_ptr=wr_ptr,
            rd_ptr=rd_ptr, last_ptr=last_ptr, last_be=last_be, resolved=resolved, lookup=lookup,
            response=response, target_mac=target_mac, parked_last=parked_last,
            slot_words=slot_words))

    def _slot_fsm(self, fsm, s):
        """The transmit path's states: a cached destination's datagram is sent; a missed
        one parks in the slot until its exchange ends, then goes (or is dropped). (Only
        statements: every signal is the caller's, so that Migen names them as before.)"""
        sink, source, p, wr, rd = s.sink, s.source, s.p, s.wr, s.rd
        slot_busy, wr_ptr, rd_ptr, last_ptr, last_be = (s.slot_busy, s.wr_ptr, s.rd_ptr,
                                                        s.last_ptr, s.last_be)
        resolved, lookup, response = s.resolved, s.lookup, s.response
        target_mac, parked_last, slot_words = s.target_mac, s.parked_last, s.slot_words
        fsm.act("IDLE",
            If(slot_busy & resolved.valid,
                If(resolved.failed,
                    resolved.ready.eq(1),
                    self.target_unreachable.eq(1),
                    NextValue(slot_busy, 0)
                ).Else(
                    NextValue(rd_ptr, 0),
                    NextState("LOAD_PARKED")
                )
            ).Elif(p.valid,
                If(sink.ip_address[0:8] == bcast_ip_mask,
                    NextValue(target_mac, bcast_mac_address),
                    NextState("SEND")
                ).Elif(sink.ip_address[28:] == mcast_ip_mask,
                    NextValue(target_mac, Cat(sink.ip_address[:23], 0, mcast_oui)),
                    NextState("SEND")
                ).Else(
                    NextState("LOOKUP")
                )
            )
        )
        fsm.act("LOOKUP",
            lookup.valid.eq(1),
            If(lookup.ready,
                NextState("LOOKUP_RESPONSE")
            )
        )
        fsm.act("LOOKUP_RESPONSE",
            response.ready.eq(1),
            If(response.valid,
                NextValue(target_mac, response.mac_address),
                If(~response.miss,
                    NextState("SEND")
                ).Elif(response.started,
                    NextValue(slot_busy, 1),
                    NextValue(wr_ptr, 0),
                    NextState("PARK")
                ).Else(
                    self.busy_drop.eq(1),
                    NextState("DROP")
                )
            )
        )
        fsm.act("SEND",
            p.connect(source, omit={"target_mac", "sender_mac", "ethernet_type"}),
            source.target_mac.eq(target_mac),
            If(p.valid & p.last & p.ready,
                NextState("IDLE")
            )
        )
        fsm.act("DROP",
            p.ready.eq(1),
            If(p.valid & p.last,
                NextState("IDLE")
            )
        )
        # A datagram longer than the slot (the front end never sends one: it is sized for
        # the largest frame) keeps its last words in the slot's last one; it cannot overrun.
        fsm.act("PARK",
            p.ready.eq(1),
            wr.we.eq(p.valid),
            If(p.valid,
                If(wr_ptr != slot_words - 1,
                    NextValue(wr_ptr, wr_ptr + 1)
                ),
                If(p.last,
                    NextValue(last_ptr, wr_ptr),
                    NextValue(last_be, p.last_be),
                    NextState("IDLE")
                )
            )
        )
        # One cycle for the memory to present the first word.
        fsm.act("LOAD_PARKED",
            NextState("SEND_PARKED")
        )
        fsm.act("SEND_PARKED",
            source.valid.eq(1),
            source.data.eq(rd.dat_r),
            source.last.eq(parked_last),
            If(parked_last, source.last_be.eq(last_be)),
            source.target_mac.eq(resolved.mac_address),
            If(source.ready,
                rd.adr.eq(rd_ptr + 1),
                NextValue(rd_ptr, rd_ptr + 1),
                If(parked_last,
                    resolved.ready.eq(1),
                    NextValue(slot_busy, 0),
                    NextState("IDLE")
                )
            )
        )


class ParkingIP(LiteXModule):
    """``LiteEthIP`` with :class:`ParkingIPTX` as its transmitter."""

    def __init__(self, mac, mac_address, ip_address, arp_table, slot_words, with_broadcast,
                 dw=8):
        self.tx = tx = ParkingIPTX(mac_address, ip_address, arp_table, slot_words, dw=dw)
        self.rx = rx = LiteEthIPRX(mac_address, ip_address, with_broadcast, dw=dw)
        mac_port = mac.crossbar.get_port(ethernet_type_ip, dw)
        self.crossbar = crossbar = LiteEthIPV4Crossbar(dw)
        self.comb += [
            tx.source.connect(mac_port.sink),
            mac_port.source.connect(rx.sink),
            crossbar.master.source.connect(tx.sink),
            rx.source.connect(crossbar.master.sink),
        ]


def add_ip_checks(ip, ip_address):
    """Drop IPv4 fragments in LiteEth's IP receiver and report each of its drop causes.

    The receiver decides once per datagram (``IDLE`` with header and checksum ready); the
    action appended here runs after LiteEth's own in that state, so its ``NextState`` wins.
    """
    rx = ip.rx
    d = rx.depacketizer.source
    header = rx.depacketizer.header
    flags_offset = Cat(header[7 * 8:8 * 8], header[6 * 8:7 * 8])   # bytes 6-7, big-endian
    fragment = Signal()
    decide = Signal()
    self_ip = convert_ip(ip_address)
    rx.comb += [
        fragment.eq((flags_offset[13]) | (flags_offset[:13] != 0)),   # MF or an offset
        decide.eq(rx.fsm.ongoing("IDLE") & d.valid & rx.checksum.done),
    ]
    rx.fsm.act("IDLE",
        If(d.valid & rx.checksum.done & fragment,
            NextState("DROP")
        )
    )
    bad_header = (d.version != 4) | (d.ihl != 5)
    bad_checksum = rx.checksum.value != 0
    other_ip = d.target_ip != self_ip
    events = {name: Signal(name=f"ev_{name}") for name in
              ("ip_header", "ip_checksum", "ip_address", "ip_fragment", "ip_protocol")}
    rx.comb += [
        events["ip_header"].eq(decide & bad_header),
        events["ip_checksum"].eq(decide & ~bad_header & bad_checksum),
        events["ip_address"].eq(decide & ~bad_header & ~bad_checksum & other_ip),
        events["ip_fragment"].eq(decide & ~bad_header & ~bad_checksum & ~other_ip & fragment),
        events["ip_protocol"].eq(decide & ~bad_header & ~bad_checksum & ~other_ip & ~fragment
                                 & (d.protocol != udp_protocol) & (d.protocol != icmp_protocol)),
    ]
    return events


def _io(dw=DATA_WIDTH):
    stream_rx = [("valid", 1), ("ready", 1), ("last", 1), ("data", dw), ("last_be", dw // 8),
                 ("error", 1), ("ip_address", 32), ("src_port", 16), ("dst_port", 16),
                 ("length", 16)]
    stream_tx = [("valid", 1), ("ready", 1), ("last", 1), ("data", dw), ("last_be", dw // 8),
                 ("ip_address", 32), ("src_port", 16), ("dst_port", 16), ("length", 16)]
    return [
        ("sys_clock", 0, Pins(1)),
        ("sys_reset", 0, Pins(1)),
        ("rgmii_clocks", 0, Subsignal("tx", Pins(1)), Subsignal("rx", Pins(1))),
        ("rgmii", 0, Subsignal("rx_ctl", Pins(1)), Subsignal("rx_data", Pins(4)),
                     Subsignal("tx_ctl", Pins(1)), Subsignal("tx_data", Pins(4))),
        ("udp_rx", 0, *[Subsignal(n, Pins(w)) for n, w in stream_rx]),
        ("udp_tx", 0, *[Subsignal(n, Pins(w)) for n, w in stream_tx]),
        ("arp", 0, Subsignal("clear_enable", Pins(1))),
        ("status", 0, Subsignal("link_up", Pins(1)), Subsignal("link_speed", Pins(2))),
        ("ev", 0, *[Subsignal(name, Pins(1)) for name in EVENTS]),
    ]


class GradwireLiteEthCore(LiteXModule):
    """The whole core: RGMII PHY, filtering MAC, ARP, IPv4, ICMP echo, one raw UDP port."""

    def __init__(self, platform, cfg):
        dw = DATA_WIDTH
        mac_address = int(cfg["mac_address"].replace(":", ""), 16)
        ip_address = convert_ip(cfg["ip_address"])

        # sys: everything after the RGMII receive CDC and before the transmit CDC.
        self.cd_sys = ClockDomain()
        sys_reset = platform.request("sys_reset")
        self.comb += [
            self.cd_sys.clk.eq(platform.request("sys_clock")),
            self.cd_sys.rst.eq(sys_reset),
        ]

        self.ethphy = phy = LiteEthPHYRGMII(
            clock_pads=platform.request("rgmii_clocks"),
            pads=platform.request("rgmii"),
            with_hw_init_reset=False,
            tx_delay=cfg["tx_delay_ns"] * 1e-9,
            rx_delay=cfg["rx_delay_ns"] * 1e-9)
        # LiteEth resets its RGMII domains from a CSR that nothing writes in a standalone
        # core; sys_reset takes its place, so that both sides of every clock-crossing FIFO
        # are reset together (a one-sided reset would replay stale words onto the wire).
        self.comb += phy.crg._reset.storage.eq(sys_reset)
        self.mac = mac = FilteringMAC(phy, mac_address, max_frame=cfg["max_frame"], dw=dw)
        self.arp = arp = ParkingARP(mac, mac_address, ip_address, cfg["sys_clk_hz"],
                                    entries=cfg["arp_entries"],
                                    timeout_s=cfg["arp_timeout_s"], dw=dw)
        fix_arp_cache_response(arp.table.cache)
        # The slot holds the largest IPv4 packet a frame carries (header and payload).
        slot_words = -(-(cfg["max_frame"] - mac_header_length - eth_fcs_length) // (dw // 8))
        self.ip = ip = ParkingIP(mac, mac_address, ip_address, arp.table, slot_words,
                                 with_broadcast=False, dw=dw)
        ip_events = add_ip_checks(ip, ip_address)
        self.icmp = LiteEthICMP(ip, ip_address, dw=dw, fifo_depth=cfg["icmp_fifo_depth"])
        self.udp_tx = udp_tx = LiteEthUDPTX(ip_address, dw)
        self.udp_rx = udp_rx = UDPReceiver(ip_address, dw)
        ip_port = ip.crossbar.get_port(udp_protocol, dw)
        self.comb += [
            udp_tx.source.connect(ip_port.sink),
            ip_port.source.connect(udp_rx.sink),
        ]

        # Pins.
        rx, tx = platform.request("udp_rx"), platform.request("udp_tx")
        s = udp_rx.source
        self.comb += [
            rx.valid.eq(s.valid), s.ready.eq(rx.ready), rx.last.eq(s.last),
            rx.data.eq(s.data), rx.last_be.eq(s.last_be), rx.error.eq(s.error),
            rx.ip_address.eq(s.ip_address), rx.src_port.eq(s.src_port),
            rx.dst_port.eq(s.dst_port), rx.length.eq(s.length),
        ]
        k = udp_tx.sink
        self.comb += [
            k.valid.eq(tx.valid), tx.ready.eq(k.ready), k.last.eq(tx.last),
            k.data.eq(tx.data), k.last_be.eq(tx.last_be),
            k.ip_address.eq(tx.ip_address), k.src_port.eq(tx.src_port),
            k.dst_port.eq(tx.dst_port), k.length.eq(tx.length),
        ]
        arp_pins = platform.request("arp")
        self.comb += arp.table.cache.clear_enable.eq(arp_pins.clear_enable)
        status = platform.request("status")
        inband = phy.rx.inband_status.fields
        self.comb += [status.link_up.eq(inband.link_status),
                      status.link_speed.eq(inband.clock_speed)]

        table = arp.table
        sources = {
            "rx_preamble": mac.ev_preamble, "rx_fcs": mac.ev_fcs, "rx_runt": mac.ev_runt,
            "rx_oversize": mac.ev_oversize, "rx_mac": mac.ev_mac,
            "rx_ethertype": mac.ev_ethertype,
            **ip_events,
            "udp_length": udp_rx.ev_length, "udp_checksum": udp_rx.ev_checksum,
            "arp_miss": table.ev_miss,
            "arp_unreachable": ip.tx.target_unreachable,
            "arp_busy_drop": ip.tx.busy_drop,
        }
        ev = platform.request("ev")
        assert set(sources) == set(EVENTS)
        for name in EVENTS:
            self.comb += getattr(ev, name).eq(sources[name])


def _wire_io(dw=DATA_WIDTH):
    """Pins of the wire core: per port ``p`` its RGMII pins and raw frame streams."""
    frame = [("valid", 1), ("ready", 1), ("last", 1), ("data", dw), ("last_be", dw // 8)]
    io = [("sys_clock", 0, Pins(1)), ("sys_reset", 0, Pins(1))]
    for p in WIRE_PORTS:
        io += [
            (f"rgmii{p}_clocks", 0, Subsignal("tx", Pins(1)), Subsignal("rx", Pins(1))),
            (f"rgmii{p}", 0, Subsignal("rx_ctl", Pins(1)), Subsignal("rx_data", Pins(4)),
                             Subsignal("tx_ctl", Pins(1)), Subsignal("tx_data", Pins(4))),
            (f"rx{p}", 0, *[Subsignal(n, Pins(w)) for n, w in frame + [("error", 1)]]),
            (f"tx{p}", 0, *[Subsignal(n, Pins(w)) for n, w in frame]),
            (f"status{p}", 0, Subsignal("link_up", Pins(1))),
        ]
    return io


class _WirePort(LiteXModule):
    """One port of the wire core: LiteEth's ECP5 RGMII PHY and its MAC core (preamble, FCS
    checked and stripped on receive, added on transmit, short frames padded). The MAC's
    datapath runs at the PHY's 8 bits in the port's own clock domains, converted to and from
    32 bits at the crossing into ``sys``: a third of the logic of a 32-bit datapath in
    ``sys`` (whose CRC takes a last word of 1 to 4 bytes), measured with Yosys for both
    ports together: 1,233 LUTs and carry cells against 3,682, which the board's own service
    needs on the Versa. Its clock domains are ``eth_rx``/``eth_tx``, renamed per port by the
    caller."""

    def __init__(self, clock_pads, pads, cfg, sys_reset, dw=DATA_WIDTH):
        self.phy = phy = LiteEthPHYRGMII(
            clock_pads=clock_pads, pads=pads, with_hw_init_reset=False,
            tx_delay=cfg["tx_delay_ns"] * 1e-9, rx_delay=cfg["rx_delay_ns"] * 1e-9)
        # as in GradwireLiteEthCore: both sides of every clock crossing reset together
        self.comb += phy.crg._reset.storage.eq(sys_reset)
        self.phy_last_be = _ReceivedLastBE(phy)
        self.mac = LiteEthMACCore(phy=self.phy_last_be, dw=dw, with_sys_datapath=False,
                                  tx_cdc_depth=32, tx_cdc_buffered=True,
                                  rx_cdc_depth=32, rx_cdc_buffered=True)
        # The transmit side at 125 MHz, cut twice by register stages in both directions:
        # - after the clock crossing: its read pointer advances on the ready of the stage
        #   behind it, and the next read address feeds its memory's output register in the
        #   same clock. The crossing's memory sits by the engines that write it, the rest of
        #   the datapath by the port's pins, so with the converter's ready behind it that
        #   path crossed the chip (seed 1: 8.26 ns, 6.77 of them routing); now it starts at a
        #   flip-flop beside the memory.
        # - after the width converter: the handshake from the FCS inserter back through
        #   padding, byte enables and the converter is ten levels of logic, which a full
        #   Versa does not route in 8 ns (port 0 met 120 MHz on seed 2 without it).
        tx = self.mac.tx_datapath
        for stage_type, width in ((stream.ClockDomainCrossing, dw), (LiteEthMACTXLastBE, 8)):
            cut = ClockDomainsRenamer("eth_tx")(
                stream.Buffer(eth_phy_description(width), pipe_valid=True, pipe_ready=True))
            tx.submodules += cut
            stage, = (m for m in tx.pipeline if isinstance(m, stage_type))
            tx.pipeline.insert(tx.pipeline.index(stage) + 1, cut)
        self.link_up = phy.rx.inband_status.fields.link_status


class _ReceivedLastBE(LiteXModule):
    """A PHY of 8 bits whose received frames carry ``last_be`` on their last byte.

    LiteEth's MAC core with its datapath at the PHY's width sets ``last_be`` after the FCS
    checker (LiteEth 2024.12), whose CRC engine picks its byte count from ``last_be``: with
    none, a bad FCS goes unflagged. Setting it here, where the bytes leave the PHY, gives
    the checker what it has in a datapath of 32 bits (``tests/hdl/wire/test_wire_top.py``'s
    bad frames fail without it)."""

    def __init__(self, phy):
        assert phy.dw == 8
        self.dw = phy.dw
        self.sink = phy.sink
        self.source = source = stream.Endpoint(eth_phy_description(phy.dw))
        self.comb += [phy.source.connect(source, omit={"last_be"}),
                      source.last_be.eq(phy.source.last)]


class GradwireWireCore(LiteXModule):
    """The NIC in the wire's core: LiteEth's PHY and MAC on each of two RGMII ports, raw
    frames in ``sys`` (``rx<p>``: without the FCS, ``error`` on a bad FCS; ``tx<p>``: the
    MAC adds preamble, padding and FCS). Nothing above the MAC: the wire parses frames
    itself (``hdl.wire``), and LiteEth's own ARP/IP would answer for the board on both
    ports, where section 6 makes it invisible on the network side."""

    def __init__(self, platform, cfg):
        dw = DATA_WIDTH
        self.cd_sys = ClockDomain()
        sys_reset = platform.request("sys_reset")
        self.comb += [self.cd_sys.clk.eq(platform.request("sys_clock")),
                      self.cd_sys.rst.eq(sys_reset)]
        for p in WIRE_PORTS:
            port = ClockDomainsRenamer({"eth_rx": f"eth{p}_rx", "eth_tx": f"eth{p}_tx"})(
                _WirePort(platform.request(f"rgmii{p}_clocks"), platform.request(f"rgmii{p}"),
                          cfg, sys_reset, dw))
            setattr(self, f"port{p}", port)
            rx, tx = platform.request(f"rx{p}"), platform.request(f"tx{p}")
            source, sink = port.mac.source, port.mac.sink
            self.comb += [
                rx.valid.eq(source.valid), source.ready.eq(rx.ready), rx.last.eq(source.last),
                rx.data.eq(source.data), rx.last_be.eq(source.last_be),
                rx.error.eq(source.error != 0),      # one bit per byte in LiteEth
                sink.valid.eq(tx.valid), tx.ready.eq(sink.ready), sink.last.eq(tx.last),
                sink.data.eq(tx.data), sink.last_be.eq(tx.last_be), sink.error.eq(0),
                platform.request(f"status{p}").link_up.eq(port.link_up),
            ]


#: ``kind`` of a configuration -> (its pins, its top)
KINDS = {"network": (_io, GradwireLiteEthCore), "wire": (_wire_io, GradwireWireCore)}
assert set(KINDS) == set(CORE_MODULES)


def generate(cfg: dict) -> str:
    """Verilog text of the core for one configuration (see ``hdl.net.core.liteeth``)."""
    kind = cfg.get("kind", "network")
    io, core = KINDS[kind]
    platform = LatticePlatform(cfg["device"], io=[], toolchain="trellis")
    platform.add_extension(io())
    top = core(platform, cfg)
    LiteXContext.top = None          # no hierarchy banner: keeps the text small and stable
    LiteXContext.platform = platform
    text = str(platform.get_verilog(top, name=CORE_MODULES[kind]))
    # The banner's date would make every generation differ; the cache key says what it is.
    return "".join(line for line in text.splitlines(keepends=True)
                   if not line.startswith("// Date"))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        raise SystemExit("usage: python -m hdl.net.core.liteeth_migen CONFIG.json OUT.v")
    with open(argv[0]) as f:
        cfg = json.load(f)
    cfg = cfg.get("config", cfg)     # hdl.net.core.liteeth writes it beside its cache key
    text = generate(cfg)
    with open(argv[1], "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
