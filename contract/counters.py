"""Counter names shared by the gateware, the reference models, the driver and the tests.

The order of each tuple is the gateware's counter index (what the control interface reads
at address ``i``) and, for drop causes, the **priority**: a packet that is bad in several
ways is counted once, under the first cause in this order that applies.
"""

__all__ = ["NIC_TX_COUNTERS", "NIC_RX_COUNTERS", "AGG_DROP_CAUSES", "AGG_COUNTERS",
           "NET_CORE_DROPS", "NET_COUNTERS", "AUTH_COUNTERS", "WIRE_DROP_CAUSES",
           "WIRE_COUNTERS"]

#: NIC transmit path (compressor).
NIC_TX_COUNTERS = (
    "packets",            # packets in (all types)
    "compressed",         # RAW_F32 + COMPRESS packets turned into INC_F32
    "bypassed",           # packets passed through untouched
    "bad_k",              # RAW_F32 + COMPRESS with k outside 1..15: passed through untouched
    "length_mismatch",    # compressed packet whose payload word count differs from `count`
    "too_large",          # RAW_F32 + COMPRESS with count above NIC_MAX_COUNT: passed through
)

#: NIC receive path (decompressor). Drop causes in priority order after the first two.
NIC_RX_COUNTERS = (
    "packets",            # packets in (all types)
    "decompressed",       # INC_F32 packets turned into RAW_F32
    "bypassed",           # other packets passed through untouched
    "drop_bad_header",    # bad magic or version: dropped whole
    "drop_bad_k",         # INC_F32 with k outside 1..15
    "drop_too_large",     # INC_F32 with count above the engine's maximum packet size
    "drop_truncated",     # bitstream ends before `count` values
    "drop_overlong",      # bitstream carries 32-bit words beyond the padded end
)

#: Switch aggregator. Drop causes in priority order.
AGG_DROP_CAUSES = (
    "bad_header",         # bad magic or version
    "bad_type",           # not AGG_ADD_I32 or AGG_OR32
    "unconfigured_job",   # job number not configured (or beyond the engine's job count)
    "bad_worker",         # worker >= the job's worker count
    "bad_slot",           # slot outside the job's slot range
    "bad_slot_version",   # slot_version other than 0 or 1
    "bad_count",          # count != P
    "bad_length",         # payload not exactly P words (early or late tlast), or a beat
                          # other than the last whose tkeep is not all ones
    "mixed_op",           # ADD and OR mixed on one (slot, version) within a round
)

AGG_COUNTERS = (
    "packets",            # packets in
    "accepted",           # new contributions folded into a slot
    "results_multicast",  # results emitted on completion
    "results_unicast",    # results re-sent to one worker (retransmission of a complete slot)
    "retransmit_dropped", # retransmission while the slot is still incomplete: dropped
) + tuple(f"drop_{cause}" for cause in AGG_DROP_CAUSES) + (
    # A job with an upstream (aggregator-protocol.md section 4, trees of aggregators):
    "upstream_sent",      # completed slots sent upstream (the slot is then pending)
    "upstream_resent",    # a pending slot's aggregate sent upstream again (a retransmission)
    "results_upstream",   # results from upstream taken (pending -> final, on to the workers)
    "drop_result_duplicate",   # result from upstream for a slot already final
    "drop_result_unexpected",  # result from upstream for a slot neither pending nor final,
                               # or for a job without an upstream
)

#: Network front end (``docs/protocol/network.md``): frames and datagrams the Ethernet/IP/UDP
#: core drops before the front end sees them (each counted by exactly one cause).
NET_CORE_DROPS = (
    "rx_fcs",             # bad frame check sequence
    "rx_runt",            # frame shorter than 64 bytes
    "rx_oversize",        # frame longer than 9018 bytes
    "rx_mac",             # for another MAC address (not broadcast)
    "rx_ethertype",       # neither IPv4 nor ARP
    "ip_address",         # IPv4 packet for another address
    "ip_fragment",        # IPv4 fragment
    "ip_header",          # IPv4 options or a bad header length
    "ip_checksum",        # bad IPv4 header checksum
    "ip_protocol",        # neither UDP nor ICMP
    "udp_checksum",       # wrong non-zero UDP checksum
    "udp_length",         # UDP length disagrees with the IP length
)

#: Every network counter, in register order: datagrams per service, then drop causes.
NET_COUNTERS = (
    "nic_tx_in", "nic_tx_out",        # datagrams to / replies from each service
    "nic_rx_in", "nic_rx_out",
    "switch_in", "switch_out",
    "ctrl_in", "ctrl_out",
    "arp_miss",           # a reply waited for an ARP exchange (its destination not cached)
    "arp_unreachable",    # a reply dropped: its destination never answered ARP
    "arp_busy_drop",      # a reply dropped: not cached while another waited for ARP
) + NET_CORE_DROPS + (
    "drop_closed_port",   # datagram to a port no service listens on
    "drop_bad_source",    # AGG datagram whose source is not the (job, worker) table entry
    "drop_bad_key",       # CTRL packet with a wrong control key (no reply)
    "drop_bad_ctrl",      # CTRL packet malformed (count 0 or above 64, length, op)
    "drop_service_full",  # datagram dropped whole: its service's input buffer was full
    "drop_reply_full",    # reply dropped whole: the output path to the wire was full
    "switch_group_out",   # results sent once to the job's result group (each also a switch_out)
    "drop_result_source", # AGG result (RESULT set) whose source, port and job are no
                          # configured job's upstream (aggregator-protocol.md section 4)
    "switch_upstream_out",  # aggregates sent to a job's upstream (each also a switch_out)
)

#: Authenticated control (``docs/protocol/network.md`` section 7): the network front end's
#: counters of a board with a 128-bit control key. **Host side only for now; the gateware
#: follows**: the golden and virtual boards count them, the network top does not yet, so
#: they are kept out of :data:`NET_COUNTERS` (whose every name the gateware counts) and
#: served at ``contract.registers.AUTH_REGISTERS``, just after ``NET_COUNTERS``' block,
#: where they land when the gateware appends them to it.
AUTH_COUNTERS = (
    "drop_bad_tag",       # datagram that must carry a tag and whose tag is wrong (no reply)
    "drop_replay",        # CTRL write whose counter is not above the largest accepted, or
                          # an authenticated job's data packet S or more chunks old
)

#: The NIC in the wire (``docs/protocol/network.md`` section 6): drop causes of a frame
#: arriving on one port, in priority order.
WIRE_DROP_CAUSES = (
    "full",               # frame store full: the frame arrived while the store held no
                          # room for it; the MAC cannot wait
    "fcs",                # bad frame check sequence
    "runt",               # frame shorter than 64 bytes (FCS included)
    "oversize",           # frame longer than 9018 bytes (FCS included)
    "board_address",      # network side: frame to the board's MAC, or ARP for its IP
    "unanswered",         # host side: frame for the board that it does not answer
    "udp_length",         # gradient port: UDP length not the IPv4 payload's, or the
                          # IPv4 packet longer than the frame
    "udp_checksum",       # gradient port: wrong non-zero UDP checksum
    "malformed",          # network side: gradient datagram the NIC receive path drops
)

#: Counters of each port of the NIC in the wire, in register order. Every frame arriving
#: on a port counts in ``frames_in`` and in exactly one of ``passed`` .. ``answered`` or
#: one ``drop_*`` cause, all on that port; every frame a port sends counts in its
#: ``frames_out``.
WIRE_COUNTERS = (
    "frames_in",          # frames arriving on this port (bad ones included)
    "frames_out",         # frames sent from this port (forwarded and the board's replies)
    "passed",             # forwarded to the other port unchanged (byte for byte)
    "compressed",         # host side: RAW_F32 gradient datagram sent on as INC_F32
    "decompressed",       # network side: INC_F32 gradient datagram sent on as RAW_F32
    "incompressible",     # host side: passed raw, its INC_F32 packet would be longer
    "answered",           # host side: frame for the board, answered on this port
) + tuple(f"drop_{cause}" for cause in WIRE_DROP_CAUSES)
