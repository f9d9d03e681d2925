"""The golden board's authenticated control (``docs/protocol/network.md`` section 7), as
datagrams in and out without sockets: the tag checked first, the write counter, the
read-only registers, tagged replies; a 64-bit key keeps section 4's behaviour."""
import struct

import pytest

from contract.header import HEADER_BYTES, Flags, Header, PacketType
from contract.network import (CTRL_OP_OFFSET, NET_REGISTERS, SERVICE_OFFSETS, CtrlOp, Service,
                              network_address)
from contract.registers import AUTH_REGISTERS
from host.board import GoldenBoard
from host.board.backend import Datagram
from host.board.control import BackendControl
from host.golden.ctrl_auth import counter_of, seal, unsealed, with_counter
from host.golden.siphash import check_tag

KEY = bytes.fromhex("000102030405060708090a0b0c0d0e0f")
HOST = ("10.0.0.9", 40000)
PORT = network_address("net", NET_REGISTERS["worker"].address(0, "port"))
LOW = network_address("net", AUTH_REGISTERS["write_counter_low"].address)
HIGH = network_address("net", AUTH_REGISTERS["write_counter_high"].address)


def request(op, pairs, counter, key=KEY):
    header = bytearray(Header(type=PacketType.CTRL, count=len(pairs)).pack())
    header[CTRL_OP_OFFSET] = op
    words = [w for pair in pairs for w in pair]
    packet = bytes(header) + struct.pack(f"<{len(words)}I", *words)
    return seal(key, with_counter(packet, counter))


def send(board, payload):
    port = board.port_base + SERVICE_OFFSETS[Service.CTRL]
    return board.deliver([Datagram(*HOST, board.ip, port, payload)])


def state(board):
    return (dict(board.worker_table), board.write_counter,
            {k: v for k, v in board.counters.items() if k not in ("ctrl_in",)})


def test_a_tagged_write_is_done_and_its_reply_tagged_with_the_counter_echoed():
    board = GoldenBoard(KEY)
    counter = 0x0123_4567_89AB_CDEF
    [reply] = send(board, request(CtrlOp.WRITE, [(PORT, 1234), (LOW, 0), (HIGH, 0)], counter))
    assert check_tag(KEY, reply.payload) and counter_of(reply.payload) == counter
    assert reply.payload[3] & Flags.RESULT and not reply.payload[3] & Flags.ERROR
    # the read-only counter registers read back the new largest counter, low word first
    assert struct.unpack("<6I", reply.payload[HEADER_BYTES:])[1::2] == \
        (1234, counter & 0xFFFFFFFF, counter >> 32)
    assert board.worker_table == {(0, 0): (0, 1234)} and board.write_counter == counter
    # reads may carry any counter, and raise nothing
    [reply] = send(board, request(CtrlOp.READ, [(PORT, 0)], 5))
    assert check_tag(KEY, reply.payload) and counter_of(reply.payload) == 5
    assert board.write_counter == counter
    assert board.counters["drop_bad_tag"] == board.counters["drop_replay"] == 0


def test_a_write_counter_not_above_the_largest_is_dropped_whole():
    board = GoldenBoard(KEY)
    assert send(board, request(CtrlOp.WRITE, [(PORT, 1)], 100))
    for counter in (100, 99, 0):
        before = state(board)
        assert send(board, request(CtrlOp.WRITE, [(PORT, 2), (LOW, 0)], counter)) == []
        after = state(board)
        assert after[2].pop("drop_replay") == before[2].pop("drop_replay") + 1
        assert after == before
    assert board.worker_table == {(0, 0): (0, 1)} and board.write_counter == 100
    assert send(board, request(CtrlOp.WRITE, [(PORT, 3)], 101))
    assert board.worker_table == {(0, 0): (0, 3)} and board.write_counter == 101


@pytest.mark.parametrize("forge", [
    lambda p: p[:24] + bytes([p[24] ^ 1]) + p[25:],                   # wrong tag
    lambda p: p[:-8],                                                # truncated
    lambda p: p[:24] + bytes(8) + p[32:] + p[24:32],                 # tag moved to the end
    lambda p: p[:16] + p[24:32] + bytes(8) + p[32:],                 # tag moved to 16..23
    lambda p: seal(int.from_bytes(KEY[:8], "little"), p),            # the old 64-bit key
    lambda p: request(CtrlOp.WRITE, [(PORT, 9)], 500, key=bytes(16)),  # another key
], ids=["wrong-tag", "truncated", "tag-at-end", "tag-in-counter", "64-bit-key", "other-key"])
def test_a_wrong_tag_is_dropped_before_anything_else(forge):
    board = GoldenBoard(KEY)
    send(board, request(CtrlOp.WRITE, [(PORT, 1)], 100))
    before = state(board)
    forged = forge(request(CtrlOp.WRITE, [(PORT, 9)], 500))
    assert not unsealed(KEY, forged)
    assert send(board, forged) == []
    after = state(board)
    assert after[2].pop("drop_bad_tag") == before[2].pop("drop_bad_tag") + 1
    assert after == before          # no write, no counter raised, no other counter


def test_a_datagram_shorter_than_a_header_is_a_bad_ctrl_packet():
    board = GoldenBoard(KEY)
    assert send(board, request(CtrlOp.READ, [(PORT, 0)], 1)[:31]) == []
    assert board.counters["drop_bad_ctrl"] == 1 and board.counters["drop_bad_tag"] == 0


def test_a_malformed_request_gets_a_tagged_error_reply_and_raises_no_counter():
    board = GoldenBoard(KEY)
    packet = bytearray(request(CtrlOp.WRITE, [(PORT, 1)], 7))
    packet[CTRL_OP_OFFSET] = 9
    [reply] = send(board, seal(KEY, bytes(packet)))
    assert check_tag(KEY, reply.payload) and reply.payload[3] & Flags.ERROR
    assert board.write_counter == 0 and board.counters["drop_bad_ctrl"] == 1


def test_the_auth_registers_read_zero_on_a_64_bit_board_which_keeps_section_4():
    board = GoldenBoard(0x1122334455667788)
    assert "drop_bad_tag" not in board.counters and not board.authenticated
    control = BackendControl(board)
    assert control.read_many([LOW, HIGH]) == [0, 0]
    control.write(PORT, 77)
    assert board.worker_table == {(0, 0): (0, 77)}
    # a tagged request means nothing to it: a wrong key
    assert send(board, request(CtrlOp.READ, [(PORT, 0)], 1)) == []
    assert board.counters["drop_bad_key"] == 1


def test_backend_control_speaks_section_7_with_a_128_bit_key():
    board = GoldenBoard(KEY)
    control = BackendControl(board)
    control.write(PORT, 4321)
    assert control.read(PORT) == 4321
    low, high = control.read_many([LOW, HIGH])
    assert high << 32 | low == board.write_counter > 0
    assert board.counters["drop_bad_tag"] == board.counters["drop_replay"] == 0


@pytest.mark.parametrize("key", [b"short", 1 << 64, -1, True, "00" * 16])
def test_a_key_of_neither_kind_is_refused(key):
    with pytest.raises(ValueError, match="control key"):
        GoldenBoard(key)
