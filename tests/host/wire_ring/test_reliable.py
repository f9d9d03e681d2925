"""The hosts' reliability layer (``host/wire_ring/reliable.py``): datagrams named by
``(seq, offset)``, acks of what the receiver holds, resends on a timeout, duplicates
discarded; driven by hand, without a network."""
import numpy as np
import pytest

from contract.packet import Packet
from host.golden import inceptionn
from host.wire_ring.reliable import (ACK_PORT, MAX_ACK_RANGES, AckError, DeliveryError,
                                     MessageReceiver, MessageSender, _add_range, pack_ack,
                                     parse_ack)
from contract.network import WIRE_GRADIENT_PORT
from tests.helpers import bits

SEQ, START, VALUES, PER = 3, 1000, 50, 16       # message 3: values 1000..1049, 16 a datagram


def message(seq=SEQ, start=START, n=VALUES, per=PER):
    values = np.arange(n, dtype=np.float32) / 7
    packets = [Packet(p.header.replace(seq=seq), p.payload) for p in
               inceptionn.tensor_to_packets(values, 10, packet_values=per, offset=start)]
    return values, packets


def pair(timeout=1.0, ack_every=1, **kw):
    return (MessageSender(timeout=timeout, **kw),
            MessageReceiver({SEQ: (START, START + VALUES)}, ack_every=ack_every))


def deliver(receiver, sender, packets, now, lose_acks=()):
    """Packets to the receiver, its acks back to the sender (those not lost)."""
    for i, p in enumerate(packets):
        ack = receiver.accept(p)
        if ack is not None and i not in lose_acks:
            sender.on_ack(*parse_ack(ack), now)


def test_ack_format_round_trip_and_errors():
    data = pack_ack(7, [(0, 360), (720, 1000)])
    assert len(data) == 12 + 16 and data[:4] == b"GWAK"
    assert parse_ack(data) == (7, [(0, 360), (720, 1000)])
    assert ACK_PORT != WIRE_GRADIENT_PORT
    many = [(2 * i, 2 * i + 1) for i in range(MAX_ACK_RANGES + 5)]
    assert len(parse_ack(pack_ack(1, many))[1]) == MAX_ACK_RANGES      # fits one MTU
    assert len(pack_ack(1, many)) <= 1500 - 28
    for bad, why in [(b"GWA", "at least"), (b"XXXX" + bytes(8), "magic"),
                     (data[:-1], "ranges is"), (pack_ack(1, [(5, 5)]), "reversed"),
                     (pack_ack(1, [(8, 9), (0, 4)]), "ascending"),
                     (pack_ack(1, [(0, 4), (4, 9)]), "apart")]:
        with pytest.raises(AckError, match=why):
            parse_ack(bad)


def test_ranges_coalesce():
    ranges = []
    for a, b in [(32, 48), (0, 16), (64, 80), (16, 32)]:
        ranges = _add_range(ranges, a, b)
    assert ranges == [(0, 48), (64, 80)]
    assert _add_range(ranges, 48, 64) == [(0, 80)]


def test_all_delivered_in_any_order():
    values, packets = message()
    sender, receiver = pair()
    assert sender.send(SEQ, packets, 0.0) == packets and sender.outstanding
    deliver(receiver, sender, packets[::-1], 0.1)
    assert receiver.complete(SEQ) and not sender.outstanding
    assert np.array_equal(bits(receiver.take(SEQ)), bits(values))
    assert sender.next_deadline() is None and sender.on_timer(10.0) == []


def test_a_lost_datagram_is_resent_on_the_timeout_alone():
    values, packets = message()
    sender, receiver = pair(timeout=1.0)
    sender.send(SEQ, packets, 0.0)
    deliver(receiver, sender, packets[:1] + packets[2:], 0.1)      # datagram 1 lost
    assert not receiver.complete(SEQ)
    assert sender.next_deadline() == pytest.approx(1.1)     # progress restarted the timer
    assert sender.on_timer(1.0) == []                       # not yet
    assert sender.on_timer(1.1) == [packets[1]]             # only what is not acked
    deliver(receiver, sender, [packets[1]], 1.2)
    assert receiver.complete(SEQ) and not sender.outstanding
    assert np.array_equal(bits(receiver.take(SEQ)), bits(values))
    assert sender.stats["resends"] == 1 and sender.stats["timeouts"] == 1


def test_a_duplicate_is_discarded_and_answered():
    values, packets = message()
    _, receiver = pair(ack_every=100)
    assert receiver.accept(packets[0]) is None              # ack_every: nothing to say yet
    ack = receiver.accept(packets[0])                       # a copy: discarded, acked
    assert parse_ack(ack) == (SEQ, [(START, START + PER)])
    assert receiver.stats["duplicates"] == 1 and receiver.stats["datagrams"] == 1
    for p in packets[1:]:
        receiver.accept(p)
    received = receiver.take(SEQ)
    assert np.array_equal(bits(received), bits(values))     # counted once
    # a late copy after the message was assembled: still discarded, acked as complete
    assert parse_ack(receiver.accept(packets[2])) == (SEQ, [(START, START + VALUES)])
    with pytest.raises(ValueError, match="taken already"):
        receiver.take(SEQ)


def test_a_lost_ack_is_recovered_by_the_resend_it_causes():
    values, packets = message()
    sender, receiver = pair(timeout=1.0)
    sender.send(SEQ, packets, 0.0)
    deliver(receiver, sender, packets, 0.1, lose_acks={len(packets) - 1})
    assert receiver.complete(SEQ) and sender.outstanding     # the last ack was lost
    resent = sender.on_timer(1.1)
    assert resent == [packets[-1]]
    deliver(receiver, sender, resent, 1.2)                   # a duplicate: acked again
    assert not sender.outstanding and receiver.stats["duplicates"] == 1


def test_timeouts_back_off_and_give_up():
    _, packets = message()
    sender = MessageSender(timeout=1.0, max_timeout=4.0, max_tries=3)
    sender.send(SEQ, packets, 0.0)
    deadlines = []
    for _ in range(3):
        deadline = sender.next_deadline()
        deadlines.append(deadline)
        assert len(sender.on_timer(deadline)) == len(packets)
    assert deadlines == [1.0, 3.0, 7.0]                      # 1, then 2, then 4 (capped)
    assert sender.next_deadline() == 11.0
    with pytest.raises(DeliveryError, match="after 3 timeouts"):
        sender.on_timer(11.0)


def test_stale_acks_and_what_the_receiver_drops():
    _, packets = message()
    sender, receiver = pair()
    sender.send(SEQ, packets, 0.0)
    sender.on_ack(99, [(0, 10)], 0.0)                        # no such message
    sender.on_ack(SEQ, [(0, 10)], 0.0)                       # covers nothing it sent
    assert sender.stats["stale_acks"] == 2 and sender.outstanding
    h = packets[0].header
    wrong = [Packet(h.replace(seq=99), packets[0].payload),               # unknown message
             Packet(h.replace(offset=START - 1), packets[0].payload),     # outside it
             Packet(h.replace(offset=START + VALUES - 1), packets[0].payload),
             Packet(h, packets[0].payload[:-4]),                          # short payload
             Packet(h.replace(type=1), packets[0].payload)]               # not RAW_F32
    assert all(receiver.accept(p) is None for p in wrong)
    receiver.accept(packets[0])
    overlapping = Packet(h.replace(offset=START + 8), packets[0].payload)
    assert receiver.accept(overlapping) is None
    assert receiver.stats["dropped"] == len(wrong) + 1 and receiver.stats["datagrams"] == 1


def test_an_empty_message_is_complete_at_once():
    sender = MessageSender(timeout=1.0)
    receiver = MessageReceiver({0: (5, 5)})
    assert sender.send(0, [], 0.0) == [] and not sender.outstanding
    assert receiver.complete(0) and receiver.take(0).size == 0


def test_bad_parameters():
    with pytest.raises(ValueError, match="timeout must be a positive"):
        MessageSender(timeout=0)
    with pytest.raises(ValueError, match="below timeout"):
        MessageSender(timeout=1.0, max_timeout=0.5)
    with pytest.raises(ValueError, match="max_tries"):
        MessageSender(timeout=1.0, max_tries=0)
    with pytest.raises(ValueError, match="ack_every"):
        MessageReceiver({}, ack_every=0)
    with pytest.raises(ValueError, match="bad element range"):
        MessageReceiver({0: (5, 4)})
    sender = MessageSender(timeout=1.0)
    _, packets = message()
    sender.send(SEQ, packets, 0.0)
    with pytest.raises(ValueError, match="sent already"):
        sender.send(SEQ, packets, 0.0)
    with pytest.raises(ValueError, match="distinct offsets"):
        sender.send(SEQ + 1, packets, 0.0)                   # their seq is SEQ
    with pytest.raises(ValueError, match="holds 0 of"):
        MessageReceiver({0: (0, 4)}).take(0)
