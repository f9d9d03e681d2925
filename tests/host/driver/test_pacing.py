"""The host never outruns the board (issue 45 item 4): windows within the board's reply
buffers (host/driver/pacing.py), give-ups that follow the measured round trip, and a board
made slow on purpose (host/board/slow.py) to show both.

The slow board keeps every reply in an output buffer of the gateware's size and sends them
one after the other, each after a seeded random 3-15 ms (the golden board answers one
request in about 1 ms here, a full window in 2-6 ms; through the slow board a window's
round trip is about 90 ms), dropping what does not fit as ``drop_reply_full``.
Every run is bounded (a few seconds); nothing asserts a wall-clock time."""
import ast
import inspect
import secrets
import time
from pathlib import Path

import numpy as np
import pytest

from contract.header import BEAT_BYTES, HEADER_BYTES, Header, PacketType
from contract.network import Service
from contract.packet import Packet
from host.board import GoldenBoard
from host.board.backend import Datagram
from host.board.slow import SlowBoard, slow_virtual_board
from host.driver.nic import NicInterface
from host.driver.pacing import (GIVE_UP_RTTS, ReplyBudget, ServiceBuffer, board_buffers,
                                give_up_after, known_boards, reply_beats)
from host.driver.settings import inc_max_bytes, nic_packet_values
from host.driver.udp_worker import UdpSwitchWorker, configure_job
from host.golden import inceptionn
from tests.helpers import bits, in_threads

ROOT = Path(__file__).resolve().parents[3]
SLOW = (0.003, 0.015)            # seconds per reply on the slow board's transmit path
#: values per NIC packet at MTU 1500, and a tensor of 24 packets
VALUES = nic_packet_values(1500)
TENSOR = 24 * VALUES


def _unbounded(board=None):
    """Reply buffers no board has: the transports' windows as they were before the clamp."""
    return {s: ServiceBuffer(1 << 20, 1 << 20) for s in Service}


# -- the capacity: from the gateware's sizes ------------------------------------------------

def test_every_board_builds_the_network_top_with_its_default_buffer_sizes():
    """board_buffers reads the default BufferSizes (contract), NetworkTop's: what every board gets
    only while no builder of the top passes sizes of its own."""
    for path in ("hdl/board/network.py", "sim/harness/network.py", "sim/network_top.py"):
        tree = ast.parse((ROOT / path).read_text())
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
                 and getattr(n.func, "id", getattr(n.func, "attr", None)) == "NetworkTop"]
        assert calls, path
        assert all(k.arg != "sizes" for c in calls for k in c.keywords), path
    from hdl.net.front_end.front_end import BufferSizes
    from hdl.net.top import NetworkTop
    sizes = inspect.signature(NetworkTop).parameters["sizes"].default
    assert isinstance(sizes, BufferSizes)
    for board in known_boards():
        buffers = board_buffers(board)
        assert buffers[Service.NIC_TX] == buffers[Service.NIC_RX] == \
            ServiceBuffer(sizes.nic_out, sizes.queue)
        assert buffers[Service.SWITCH] == ServiceBuffer(sizes.switch_out, sizes.queue)
        assert buffers[Service.CTRL] == ServiceBuffer(sizes.ctrl_out, sizes.queue)
    with pytest.raises(ValueError, match="known"):
        board_buffers("no-such-board")


def test_reply_windows_hold_the_largest_replies():
    buffers = board_buffers()
    largest = {Service.NIC_TX: inc_max_bytes(VALUES), Service.NIC_RX: HEADER_BYTES + 4 * VALUES,
               Service.CTRL: HEADER_BYTES + 8 * 64, Service.SWITCH: HEADER_BYTES + 4 * 64}
    for service, reply in largest.items():
        buffer = buffers[service]
        n = buffer.replies(reply)
        assert n * reply_beats(reply) <= buffer.beats and n <= buffer.packets
        assert (n + 1) * reply_beats(reply) > buffer.beats or n == buffer.packets
        half = buffer.replies(reply, share=2)      # at least one, though
        assert 2 * half * reply_beats(reply) <= buffer.beats or half == 1
    assert reply_beats(0) == 1 and reply_beats(BEAT_BYTES) == 1 \
        and reply_beats(BEAT_BYTES + 1) == 2


def test_reply_budget_frees_every_attempt_up_to_the_one_answered():
    budget = ReplyBudget(ServiceBuffer(beats=10, packets=3))
    assert budget.fits(100)                 # alone, anything goes
    first = budget.charge(4)
    second = budget.charge(4)
    assert not budget.fits(4) and budget.fits(2)
    budget.charge(2)
    assert not budget.fits(1)               # three packets
    budget.answered(second)                 # in order: the first is off the board too
    assert budget.outstanding == 1 and budget.used_beats == 2
    budget.answered(first)                  # a late reply changes nothing
    assert budget.outstanding == 1
    assert (budget.peak_beats, budget.peak_packets) == (10, 3)
    assert ReplyBudget(ServiceBuffer(beats=10, packets=3), share=2).beats == 5


def test_give_up_follows_the_measured_round_trip():
    assert give_up_after(None, 0.5) == 0.5
    assert give_up_after(0.2, 0.5) == pytest.approx(GIVE_UP_RTTS * 0.2)


# -- the slow board itself (a clock of its own: no sockets, no waiting) ----------------------

def test_the_slow_board_holds_what_its_buffer_holds_and_drops_the_rest():
    now = [0.0]
    golden = GoldenBoard(secrets.randbits(64))
    buffers = {s: ServiceBuffer(beats=5, packets=32) for s in Service}
    slow = SlowBoard(golden, delay=(1.0, 1.0), buffers=buffers, clock=lambda: now[0])
    # a RAW_F32 packet without COMPRESS passes the transmit path unchanged: 64 bytes, 2 beats
    request = Packet(Header(type=PacketType.RAW_F32, count=8), bytes(32)).to_bytes()
    port = golden.port_base
    datagrams = [Datagram("127.0.0.1", 5000 + i, golden.ip, port, request) for i in range(3)]
    assert slow.deliver(datagrams) == []                 # held on the slow transmit path
    assert golden.counters["drop_reply_full"] == 1 and golden.counters["nic_tx_out"] == 2
    assert slow.next_due == 1.0
    now[0] = 1.0
    first = slow.poll()
    assert [d.dst_port for d in first] == [5000]
    # the first reply left: room for one more
    assert slow.deliver(datagrams[2:]) == [] and golden.counters["drop_reply_full"] == 1
    now[0] = 3.0
    assert [d.dst_port for d in slow.poll()] == [5001, 5002]
    assert slow.next_due is None and slow.stats["dropped"] == 1


# -- NIC through the slow board -----------------------------------------------------------

def _tensor(seed):
    return np.random.default_rng(seed).standard_normal(TENSOR).astype(np.float32)


def _nic_round_trip(board, x, k=12, **options):
    with board.transport(region="nic", **options) as t:
        nic = NicInterface(t)
        got = nic.receive(nic.transmit(x, k), x.size)
        return got, t.network_stats()


def test_nic_through_a_slow_board_is_exact_and_drops_nothing():
    x = _tensor(1)
    board = slow_virtual_board(delay=SLOW, seed=1)
    with board:
        got, stats = _nic_round_trip(board, x)
    assert np.array_equal(bits(got), bits(inceptionn.quantize(x, 12)))
    buffers = board_buffers()
    for name, service in (("nic_tx", Service.NIC_TX), ("nic_rx", Service.NIC_RX)):
        s = stats[name]
        print(f"{name}: srtt {s['srtt_ms']:.1f} ms, rto {s['rto_ms']:.1f} ms, "
              f"{s['requests']} requests, {s['resends']} resends, {s['deferred']} deferred, "
              f"peak {s['peak_outstanding']} replies / {s['peak_beats']} beats")
        assert s["replies"] == s["requests"] == TENSOR // VALUES
        assert s["peak_beats"] <= buffers[service].beats
        assert s["peak_outstanding"] <= buffers[service].packets
    print("board:", board.backend.stats)
    assert board.backend.counters["drop_reply_full"] == 0
    assert board.backend.stats["dropped"] == 0


def test_without_the_clamp_the_slow_board_drops_replies(monkeypatch):
    """The old windows (16 requests of up to 46 beats each, beyond the 512-beat buffer):
    the board drops replies, the resends recover them."""
    monkeypatch.setattr("host.driver.udp.board_buffers", _unbounded)
    x = _tensor(2)
    board = slow_virtual_board(delay=(0.01, 0.03), seed=2)
    with board:
        got, stats = _nic_round_trip(board, x)
    assert np.array_equal(bits(got), bits(inceptionn.quantize(x, 12)))
    print("unclamped:", {k: (v["requests"], v["resends"], v["peak_beats"])
                         for k, v in stats.items()}, board.backend.stats)
    assert board.backend.counters["drop_reply_full"] > 0
    assert stats["nic_tx"]["resends"] > 0


def _two_ranks(board, share):
    """Two ranks on one board at once (the bring-up rehearsal's run), each with its own
    transport; the tensors and what came back."""
    xs = [_tensor(10 + r) for r in range(2)]
    out = [r[0] for r in in_threads([lambda r=r: _nic_round_trip(board, xs[r], share=share)
                                     for r in range(2)], timeout=60)]
    for x, got in zip(xs, out):
        assert np.array_equal(bits(got), bits(inceptionn.quantize(x, 12)))


def test_two_ranks_sharing_a_slow_board_split_its_buffers():
    board = slow_virtual_board(delay=SLOW, seed=3)
    with board:
        _two_ranks(board, share=2)
    print("share 2:", board.backend.stats)
    assert board.backend.counters["drop_reply_full"] == 0


def test_two_ranks_that_do_not_split_the_buffers_lose_replies():
    """The bring-up rehearsal's failure: each rank's window fits the buffer alone, both
    together do not (the resends recover the replies; the board counts the drops)."""
    board = slow_virtual_board(delay=SLOW, seed=3)
    with board:
        _two_ranks(board, share=1)
    print("share 1:", board.backend.stats)
    assert board.backend.counters["drop_reply_full"] > 0


# -- the switch through the slow board ----------------------------------------------------

def _aggregate_two_workers(board, seed, chunks=40):
    workers = [UdpSwitchWorker(board.host, port_base=board.port_base, worker=w, rto=0.1)
               for w in range(2)]
    try:
        with board.transport(region="switch") as control:
            layout = configure_job(control, 0, [w.address for w in workers])
        for w in workers:
            w.set_layout(layout)
        rng = np.random.default_rng(seed)
        vectors = [rng.integers(0, 2**32, layout.lanes * chunks, dtype=np.uint64)
                   .astype(np.uint32) for _ in workers]
        results = [r[0] for r in in_threads(
            [lambda i=i: workers[i].aggregate(vectors[i], PacketType.AGG_ADD_I32)
             for i in range(2)], timeout=60)]
        expected = ((vectors[0].astype(np.uint64) + vectors[1]) % 2**32).astype(np.uint32)
        for got in results:
            assert np.array_equal(got, expected)
        return [w.stats for w in workers], workers[0].rto_ms, layout
    finally:
        for w in workers:
            w.close()


def _record_resends_and_drops(monkeypatch, board):
    """Event times (``time.monotonic``) of every datagram a switch worker sends again and
    of every reply the slow board drops: the clamp keeps first attempts' replies within
    the buffer, while each resend may add one reply it never counted (a loaded machine
    resends now and then)."""
    resends, drops = [], []
    send, drop = UdpSwitchWorker._send, board.backend._drop
    sent = set()

    def recording_send(worker, data):
        if data in sent:
            resends.append(time.monotonic())   # before it leaves: its reply comes later
        sent.add(data)
        send(worker, data)

    def recording_drop(service, copies):
        drops.append(time.monotonic())
        drop(service, copies)

    monkeypatch.setattr(UdpSwitchWorker, "_send", recording_send)
    monkeypatch.setattr(board.backend, "_drop", recording_drop)
    return resends, drops


def test_switch_through_a_slow_board_is_exact_and_drops_nothing(monkeypatch):
    board = slow_virtual_board(delay=SLOW, seed=4, slots=16)
    resends, drops = _record_resends_and_drops(monkeypatch, board)
    with board:
        stats, rto_ms, layout = _aggregate_two_workers(board, 4)
    print("switch:", stats[0], f"rto {rto_ms:.1f} ms", board.backend.stats,
          f"resends {len(resends)}, drops {len(drops)}")
    assert board.backend.counters["drop_reply_full"] == len(drops)
    # no reply is dropped that first attempts alone would have made: the n-th drop comes
    # after at least n resends (none at all where nothing was resent)
    for n, when in enumerate(drops, 1):
        assert sum(r < when for r in resends) >= n, (n, drops, resends)
    window = board_buffers()[Service.SWITCH].replies(HEADER_BYTES + 4 * layout.lanes)
    assert window < layout.slot_count          # the clamp is what holds it
    assert board.backend.stats["peak_packets"]["switch"] <= window + len(resends)


def test_without_the_clamp_the_switch_drops_results(monkeypatch):
    monkeypatch.setattr(UdpSwitchWorker, "result_window", lambda self, lanes: 1 << 20)
    board = slow_virtual_board(delay=(0.01, 0.03), seed=5, slots=16)
    with board:
        stats, _, _ = _aggregate_two_workers(board, 5)
    print("switch unclamped:", stats[0], board.backend.stats)
    assert board.backend.counters["drop_reply_full"] > 0


# -- giving up ---------------------------------------------------------------------------

def test_a_slow_board_is_slow_not_failed_with_short_timeouts():
    """Timeouts far below the slow board's round trip and one retry: resends go (each
    charged to the reply buffer), but a board that answers is never given up on."""
    x = _tensor(6)
    board = slow_virtual_board(delay=(0.01, 0.02), seed=6)
    with board:
        got, stats = _nic_round_trip(board, x, timeout=0.005, min_timeout=0.005,
                                     max_timeout=0.01, retries=1, give_up=0.1)
    assert np.array_equal(bits(got), bits(inceptionn.quantize(x, 12)))
    print("short timeouts:", {k: (v["requests"], v["resends"], v["discarded"],
                                  v["peak_outstanding"], v["peak_beats"])
                              for k, v in stats.items()}, board.backend.stats)
    assert stats["nic_tx"]["resends"] > 0
    assert board.backend.counters["drop_reply_full"] == 0


def test_a_reply_from_the_board_starts_the_strikes_again():
    from host.driver.rtt import ResendTimer
    from host.driver.udp import UdpTransport
    with UdpTransport("127.0.0.1", port_base=40000, timeout=0.1, min_timeout=0.01,
                      max_timeout=1.0) as t:
        now = time.monotonic()
        entry = ResendTimer(0, now - 1.0, now - 0.5, 0.1)
        t._resend_timer(Service.NIC_TX, entry)            # silent: a strike
        t._resend_timer(Service.NIC_TX, entry)
        assert (entry.attempt, entry.strikes) == (2, 2)
        t._heard[Service.NIC_TX] = entry.last_sent + 1.0  # the board answered something
        t._resend_timer(Service.NIC_TX, entry)
        assert (entry.attempt, entry.strikes) == (3, 0)
        t._heard[Service.NIC_TX] = entry.last_sent - 1.0  # and nothing since
        t._resend_timer(Service.NIC_TX, entry, send=False)   # held back, not sent
        assert (entry.attempt, entry.strikes) == (3, 1)
        assert t.network[Service.NIC_TX].resends == 3
        with pytest.raises(ValueError, match="share"):
            UdpTransport("127.0.0.1", port_base=40000, share=0)
