"""UdpTransport and the virtual golden board on 127.0.0.1 with a 128-bit control key:
``docs/protocol/network.md`` section 7's authenticated control, hostile cases included.

The board's datagrams are captured where the virtual board hands them to its backend (every
datagram in, every one out); forged and replayed requests go from a socket of the test's
own, followed by a genuine read whose reply marks that the board has handled everything
before it, so that "no reply" is known without waiting for a timeout. Every wait is bounded
(socket timeouts, the transport's retry limit)."""
import socket
import struct
import threading
import time

import pytest

from contract.header import HEADER_BYTES, Header, PacketType
from contract.network import (CTRL_OP_OFFSET, NET_REGISTERS, CtrlOp, Service,
                              network_address)
from contract.registers import AUTH_REGISTERS
from host.board import VirtualBoard
from host.cli import main
from host.driver.ctrl_counter import next_counter
from host.driver.settings import board_settings, format_key, parse_key
from host.driver.transport import BadTagError, NoReplyError
from host.driver.udp import UdpTransport
from host.golden.ctrl_auth import counter_of, key_fragments, seal, unsealed, with_counter
from host.golden.siphash import check_tag
from tests.helpers import control_forgeries

LOOP = "127.0.0.1"
KEY = bytes.fromhex("8d3a51c2f0e97b46a1d52c3e9f078b64")
FAST = dict(timeout=0.05, min_timeout=0.01, max_timeout=0.2)
PORT0 = network_address("net", NET_REGISTERS["worker"].address(0, "port"))
PORT1 = network_address("net", NET_REGISTERS["worker"].address(1, "port"))
LOW = network_address("net", AUTH_REGISTERS["write_counter_low"].address)
HIGH = network_address("net", AUTH_REGISTERS["write_counter_high"].address)
BAD_TAG = network_address("net", AUTH_REGISTERS["auth_counter"].address("drop_bad_tag"))


class Tap:
    """Wraps a backend's ``deliver``: records every datagram in and out, and may lose or
    change some (``inbound``/``outbound``: datagram -> datagram or None)."""

    def __init__(self, backend):
        self.deliver_ = backend.deliver
        self.lock = threading.Lock()
        self.seen_in, self.seen_out = [], []
        self.inbound = self.outbound = None
        backend.deliver = self.deliver

    def deliver(self, datagrams):
        with self.lock:
            self.seen_in.extend(d.payload for d in datagrams)
            if self.inbound:
                datagrams = [d for d in map(self.inbound, datagrams) if d is not None]
        out = self.deliver_(datagrams)
        with self.lock:
            if self.outbound:
                out = [d for d in map(self.outbound, out) if d is not None]
            self.seen_out.extend(d.payload for d in out)
        return out

    def writes(self):
        with self.lock:
            return [p for p in self.seen_in
                    if len(p) >= HEADER_BYTES and p[2] == PacketType.CTRL
                    and p[CTRL_OP_OFFSET] == CtrlOp.WRITE]


@pytest.fixture
def board(monkeypatch):
    for name in ("GRADWIRE_BOARD", "GRADWIRE_PORT_BASE", "GRADWIRE_KEY", "GRADWIRE_MTU"):
        monkeypatch.delenv(name, raising=False)
    with VirtualBoard("golden", port_base=None, key=KEY, slots=16) as b:
        b.tap = Tap(b.backend)
        yield b


def transport(board, **options):
    return UdpTransport(LOOP, port_base=board.port_base, key=KEY, **{**FAST, **options})


def request(op, pairs, counter, key=KEY):
    header = bytearray(Header(type=PacketType.CTRL, count=len(pairs)).pack())
    header[CTRL_OP_OFFSET] = op
    words = [w for pair in pairs for w in pair]
    return seal(key, with_counter(bytes(header) + struct.pack(f"<{len(words)}I", *words),
                                  counter))


def raw_exchange(board, payloads):
    """Send ``payloads`` to the control port from a socket of our own, then a genuine
    read; return every reply that came before the read's (the board handles its control
    datagrams in order, and loopback keeps them)."""
    address = (LOOP, board.ports[Service.CTRL])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((LOOP, 0))
        sock.settimeout(5.0)
        for payload in payloads:
            sock.sendto(payload, address)
        marker = next_counter()
        sock.sendto(request(CtrlOp.READ, [(BAD_TAG, 0)], marker), address)
        replies = []
        while True:
            data, _ = sock.recvfrom(65536)       # a timeout fails the test: bounded
            if check_tag(KEY, data) and counter_of(data) == marker:
                return replies
            replies.append(data)


def snapshot(board):
    b = board.backend
    return dict(b.worker_table), b.write_counter, dict(b.counters)


def changed(before, after):
    """Counters that moved between two snapshots, asserting nothing else did."""
    assert after[:2] == before[:2]
    return {k: after[2][k] - before[2][k] for k in after[2] if after[2][k] != before[2][k]}


# -- genuine traffic ---------------------------------------------------------------------

def test_reads_and_writes_work_tagged_with_the_clock_as_counter(board):
    start = time.time_ns() // 1000
    with transport(board, region="net") as t:
        assert t.authenticated
        t.write_many([(NET_REGISTERS["worker"].address(w, "port"), 1000 + w) for w in range(70)])
        assert t.read_many([NET_REGISTERS["worker"].address(w, "port") for w in range(70)]) == \
            [1000 + w for w in range(70)]
        low, high = t.read_many([AUTH_REGISTERS["write_counter_low"].address,
                                 AUTH_REGISTERS["write_counter_high"].address])
    counters = [counter_of(p) for p in board.tap.writes()]
    assert len(counters) == 2 and counters == sorted(set(counters))   # 70 pairs: 2 packets
    assert high << 32 | low == counters[-1] == board.backend.write_counter
    assert start <= counters[0] <= time.time_ns() // 1000 + 1     # the clock in microseconds
    assert all(check_tag(KEY, p) for p in board.tap.seen_in + board.tap.seen_out)
    c = board.backend.counters
    assert c["drop_bad_tag"] == c["drop_replay"] == c["drop_bad_key"] == 0


def test_the_counter_is_strictly_increasing_even_where_the_clock_stands_or_steps_back():
    first = next_counter(lambda: 5_000_000_000_000_000)
    assert next_counter(lambda: 5_000_000_000_000_000) == first + 1
    assert next_counter(lambda: 1_000) == first + 2
    assert next_counter() > first + 2 or first + 3 > time.time_ns() // 1000


# -- replays -------------------------------------------------------------------------------

def test_a_captured_write_replayed_is_dropped_before_and_after_a_newer_write(board):
    with transport(board) as t:
        t.write(PORT0, 1111)
        [captured] = board.tap.writes()
        # replayed at once: its counter is the largest accepted, not above it
        before = snapshot(board)
        assert raw_exchange(board, [captured]) == []
        assert changed(before, snapshot(board)) == {"ctrl_in": 2, "ctrl_out": 1,
                                                    "drop_replay": 1}
        # a newer write, then the old one again: still dropped, the newer value stays
        t.write(PORT0, 2222)
        before = snapshot(board)
        assert raw_exchange(board, [captured, captured]) == []
        assert changed(before, snapshot(board)) == {"ctrl_in": 3, "ctrl_out": 1,
                                                    "drop_replay": 2}
        assert t.read(PORT0) == 2222
        low, high = t.read_many([LOW, HIGH])
        newer = [w for w in board.tap.writes() if w != captured]
        assert len(newer) == 1
        assert high << 32 | low == counter_of(newer[0]) == board.backend.write_counter


# -- forged requests -----------------------------------------------------------------------

FORGERIES = control_forgeries(KEY)


@pytest.mark.parametrize("forge", FORGERIES.values(), ids=FORGERIES.keys())
def test_a_forged_request_is_dropped_counted_unanswered_and_changes_nothing(board, forge):
    with transport(board) as t:
        t.write(PORT0, 1111)
    # a write with a fresh counter: only its tag is wrong
    forged = forge(request(CtrlOp.WRITE, [(PORT0, 6666), (PORT1, 7777)], next_counter()))
    assert not unsealed(KEY, forged)
    before = snapshot(board)
    assert raw_exchange(board, [forged]) == []
    assert changed(before, snapshot(board)) == {"ctrl_in": 2, "ctrl_out": 1,
                                                "drop_bad_tag": 1}
    assert board.backend.worker_table == {(0, 0): (0, 1111)}


def test_a_request_under_the_old_64_bit_key_times_out_quickly_with_a_hint(board):
    with UdpTransport(LOOP, port_base=board.port_base, key=int.from_bytes(KEY[:8], "little"),
                      retries=2, **FAST) as t:
        with pytest.raises(NoReplyError, match="tag"):
            t.write(PORT0, 5)
    assert board.backend.counters["drop_bad_tag"] == 3
    assert board.backend.worker_table == {}


# -- replies -------------------------------------------------------------------------------

@pytest.mark.parametrize("where", [24, 31, 16, 36])
def test_a_reply_with_a_bad_tag_is_refused_in_one_line(board, where):
    def corrupt(d):
        payload = bytearray(d.payload)
        payload[where] ^= 1
        return d._replace(payload=bytes(payload))
    board.tap.outbound = corrupt
    with transport(board) as t:
        with pytest.raises(BadTagError) as error:
            t.read(PORT0)
    message = str(error.value)
    assert "\n" not in message and "wrong SipHash tag" in message
    assert error.value.service is Service.CTRL
    board.tap.outbound = None
    with transport(board) as t:
        assert t.read(PORT0) == 0


@pytest.mark.parametrize("lose", ["request", "reply"])
def test_a_resent_write_takes_a_new_counter(board, lose):
    lost = []

    def first_write_lost(d):
        is_write = d.payload[2] == PacketType.CTRL and d.payload[CTRL_OP_OFFSET] == CtrlOp.WRITE
        if is_write and not lost:
            lost.append(d)
            return None
        return d
    if lose == "request":
        board.tap.inbound = first_write_lost
    else:   # the board took the write; its reply is lost, so the resend must be newer
        board.tap.outbound = first_write_lost
    with transport(board, retries=3) as t:
        t.write(PORT0, 4242)
        assert t.network[Service.CTRL].resends >= 1
    counters = [counter_of(p) for p in board.tap.writes()]
    assert len(counters) >= 2 and counters == sorted(set(counters))
    assert board.backend.worker_table[(0, 0)][1] == 4242
    assert board.backend.counters["drop_replay"] == 0
    assert board.backend.write_counter == counters[-1]


# -- keys never travel ---------------------------------------------------------------------

def exercise(board, key):
    with UdpTransport(LOOP, port_base=board.port_base, key=key, **FAST) as t:
        t.write_many([(PORT0, 1), (PORT1, 2)])
        t.read_many([PORT0, PORT1, LOW, HIGH, BAD_TAG])


def test_no_key_byte_in_any_datagram_the_host_or_the_board_sends(board):
    exercise(board, KEY)
    malformed = bytearray(request(CtrlOp.WRITE, [(PORT0, 3)], next_counter()))
    malformed[CTRL_OP_OFFSET] = 7                       # a tagged ERROR reply comes back
    raw_exchange(board, [seal(KEY, bytes(malformed)),
                         request(CtrlOp.READ, [(PORT0, 0)], 1)])
    datagrams = board.tap.seen_in + board.tap.seen_out
    assert len(board.tap.seen_out) >= 5 and any(p[3] & 0x04 for p in board.tap.seen_out)
    fragments = key_fragments(KEY)
    assert len(fragments) == 6
    assert not [p for p in datagrams for f in fragments if f in p]


def test_the_key_search_finds_a_64_bit_key_sent_in_clear():
    key = 0x8D3A51C2F0E97B46
    with VirtualBoard("golden", port_base=None, key=key) as b:
        b.tap = Tap(b.backend)
        exercise(b, key)
    found = [p for p in b.tap.seen_in + b.tap.seen_out for f in key_fragments(key) if f in p]
    assert len(found) == len(b.tap.seen_in) + len(b.tap.seen_out) > 0


# -- the key's text --------------------------------------------------------------------------

def test_32_hex_digits_are_a_128_bit_key_and_16_a_64_bit_one(monkeypatch):
    assert parse_key(KEY.hex()) == KEY and format_key(KEY) == KEY.hex()
    assert parse_key("00" * 16) == bytes(16)              # leading zeros keep the kind
    assert parse_key("0x" + ":".join(f"{b:02X}" for b in KEY)) == KEY
    assert parse_key("ff" * 8) == (1 << 64) - 1
    for bad in ("1" * 17, "1" * 31, "1" * 33, "g" * 32):
        with pytest.raises(ValueError, match="32"):
            parse_key(bad)
    monkeypatch.setenv("GRADWIRE_KEY", KEY.hex())
    assert board_settings()["key"] == KEY


def test_gradwire_board_takes_a_32_digit_key(board, capsys):
    where = ["--board", f"{LOOP}:{board.port_base}", "--timeout", "2"]
    assert main(["board", "status", *where, "--key", KEY.hex()]) == 0
    out, err = capsys.readouterr()
    assert board.backend.counters["ctrl_in"] > 0 and board.backend.counters["drop_bad_tag"] == 0
    assert KEY.hex() not in out + err
