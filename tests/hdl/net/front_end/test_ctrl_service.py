"""CtrlService: CTRL requests executed on a register bus, replies bit-exact."""
import random
import struct

import pytest

from contract.header import HEADER_BYTES, Flags, Header
from contract.network import CTRL_KEY_OFFSET, CTRL_OP_OFFSET, CTRL_TYPE, CtrlOp
from host.golden.ctrl_auth import counter_of, is_authenticated, seal, unsealed
from hdl.net.front_end.ctrl_service import (REGISTER_ADDRESS_SETUP, REGISTER_READ_LATENCY,
                                            CtrlService)
from tests.amaranth_sim import run, send_items

KEY = 0x0123456789ABCDEF


def ctrl_request(op, pairs, *, seq=7, key=KEY, count=None, extra=b"", magic=0x47,
                 version=1, type_=CTRL_TYPE):
    """A CTRL packet's bytes (network.md section 4)."""
    header = bytearray(Header(count=len(pairs) if count is None else count, seq=seq).pack())
    header[0], header[1], header[2] = magic, version, type_
    header[CTRL_OP_OFFSET] = op
    header[CTRL_KEY_OFFSET:CTRL_KEY_OFFSET + 8] = key.to_bytes(8, "little")
    return bytes(header) + b"".join(struct.pack("<II", a, v) for a, v in pairs) + extra


def request_beats(raw, tag=0):
    n = max(1, -(-len(raw) // 32))
    padded = raw + bytes(32 * n - len(raw))
    words = -(-len(raw) // 4)
    meta = {"ip_address": tag, "src_port": 1, "dst_port": 47573, "length": len(raw)}
    return [{"data": int.from_bytes(padded[32 * b:32 * b + 32], "little"),
             "keep": (1 << (4 * (words - 8 * b))) - 1 if b == n - 1 else (1 << 32) - 1,
             "last": int(b == n - 1), "first": int(b == 0), "meta": meta} for b in range(n)]


def expected_reply(raw, registers, writable, key=KEY, state=None):
    """The reference (docs/network-contract.md, the golden board's order): what the
    service must answer, and the registers after. A 16-byte ``key`` is section 7's: tags
    instead of the key, and ``state["write_counter"]``."""
    if len(raw) < 32:
        return None, "bad_ctrl"
    header = bytearray(raw[:HEADER_BYTES])
    count = int.from_bytes(raw[8:12], "little")
    op = raw[CTRL_OP_OFFSET]
    if not unsealed(key, raw):
        return None, "bad_tag" if is_authenticated(key) else "bad_key"
    if not (raw[0] == 0x47 and raw[1] == 1 and raw[2] == CTRL_TYPE and 1 <= count <= 64
            and op in (0, 1) and len(raw) == 32 + 8 * count):
        header[3] |= Flags.RESULT | Flags.ERROR
        return seal(key, bytes(header)) if is_authenticated(key) else bytes(header), "bad_ctrl"
    if is_authenticated(key) and op == CtrlOp.WRITE:
        if counter_of(raw) <= state["write_counter"]:
            return None, "replay"
        state["write_counter"] = counter_of(raw)
    header[3] |= Flags.RESULT
    out = bytes(header)
    for p in range(count):
        addr, value = struct.unpack_from("<II", raw, 32 + 8 * p)
        if op == CtrlOp.WRITE and writable(addr):
            registers[addr] = value
        out += struct.pack("<II", addr, registers.get(addr, 0))
    return (seal(key, out) if is_authenticated(key) else out), "executed"


def bench(requests, rng, *, p_stall=0.3, p_block=0.3, key=KEY):
    """Runs ``requests`` through a CtrlService with ``key`` against :func:`expected_reply`;
    returns the register accesses in order (and, section 7, the write counter after)."""
    dut = CtrlService(key=key)
    registers = {a: rng.getrandbits(32) for a in range(0x20000, 0x20040)}
    writable = lambda a: a < 0x20030                 # the rest are read-only
    model = dict(registers)
    state = {"write_counter": 0}
    expected = [expected_reply(raw, model, writable, key, state) for raw in requests]
    replies, events, accesses, answers, held, counter = [], [], [], [], [], []

    async def producer(ctx):
        await send_items(ctx, dut.i, [b for n, raw in enumerate(requests)
                                      for b in request_beats(raw, n)], rng, p_stall)

    async def register_bus(ctx):
        async for _, _, re, we, addr, wdata, ev in ctx.tick().sample(
                dut.bus.re, dut.bus.we, dut.bus.addr, dut.bus.wdata, dut.events):
            assert not (re and we)
            # address and value held REGISTER_ADDRESS_SETUP clocks before a strobe
            held.append((int(addr), int(wdata)))
            if re or we:
                assert len(set(held[-1 - REGISTER_ADDRESS_SETUP:])) == 1, held[-3:]
            if we:
                accesses.append(("w", int(addr)))
                if writable(int(addr)):
                    registers[int(addr)] = int(wdata)
            # a read's value is on rdata REGISTER_READ_LATENCY clocks after its re (and
            # garbage on every other clock)
            if re:
                accesses.append(("r", int(addr)))
            answers.append(registers.get(int(addr), 0) if re else None)
            answer = answers[-REGISTER_READ_LATENCY] if len(answers) >= \
                REGISTER_READ_LATENCY else None
            ctx.set(dut.bus.rdata, rng.getrandbits(32) if answer is None else answer)
            for name in ("executed", "bad_key", "bad_ctrl", "bad_tag", "replay"):
                if getattr(ev, name):
                    events.append(name)

    async def consumer(ctx):
        want = sum(1 for r, _ in expected if r is not None)
        current = b""
        for _ in range(200000):
            if len(replies) == want:
                break
            ctx.set(dut.o.ready, rng.random() >= p_block)
            _, _, valid, ready, p = await ctx.tick().sample(dut.o.valid, dut.o.ready, dut.o.p)
            if valid and ready:
                raw = int(p.data).to_bytes(32, "little")
                current += bytes(raw[i] for i in range(32) if int(p.keep) >> i & 1)
                if p.last:
                    replies.append(current)
                    current = b""
        for _ in range(100):
            await ctx.tick()
        if dut.authenticated:
            counter.append(ctx.get(dut.write_counter))

    run(dut, producer, consumer, background=(register_bus,))
    assert events == [cause for _, cause in expected]
    assert replies == [r for r, _ in expected if r is not None]
    assert events == [cause for _, cause in expected]
    assert registers == model
    if dut.authenticated:
        assert counter == [state["write_counter"]]
    return accesses


@pytest.mark.parametrize("seed", [1, 2])
def test_reads_and_writes_in_order_with_read_back(seed):
    rng = random.Random(seed)
    requests = []
    for n in range(12):
        count = rng.choice([1, 2, 3, 4, 5, 8, 9, rng.randint(1, 64), 64])
        pairs = [(0x20000 + rng.randrange(0x40), rng.getrandbits(32)) for _ in range(count)]
        requests.append(ctrl_request(rng.choice([CtrlOp.READ, CtrlOp.WRITE]), pairs, seq=n))
    bench(requests, rng)


def test_refused_and_dropped_requests():
    rng = random.Random(3)
    good = ctrl_request(CtrlOp.WRITE, [(0x20001, 5), (0x20002, 6)])
    requests = [
        ctrl_request(CtrlOp.WRITE, [(0x20003, 1)], key=KEY ^ 1),           # bad key
        ctrl_request(CtrlOp.WRITE, [(0x20003, 1)], key=KEY ^ (1 << 63)),
        ctrl_request(CtrlOp.READ, [], count=0),                             # count 0
        ctrl_request(CtrlOp.READ, [(0x20000, 0)] * 65),                     # count 65
        ctrl_request(2, [(0x20004, 1)]),                                    # op 2
        ctrl_request(CtrlOp.WRITE, [(0x20005, 1)], count=2),                # short
        ctrl_request(CtrlOp.WRITE, [(0x20005, 1)], extra=b"\0\0\0\0"),      # long
        ctrl_request(CtrlOp.WRITE, [(0x20005, 1)], extra=b"\0"),            # not whole words
        ctrl_request(CtrlOp.WRITE, [(0x20005, 1)])[:-2],                    # torn value
        ctrl_request(CtrlOp.WRITE, [(0x20006, 1)], magic=0x48),             # not CTRL
        ctrl_request(CtrlOp.WRITE, [(0x20006, 1)], version=2),
        ctrl_request(CtrlOp.WRITE, [(0x20006, 1)], type_=2),
        ctrl_request(CtrlOp.WRITE, [(0x20006, 1)], type_=2, key=0),        # ... no key
        ctrl_request(CtrlOp.WRITE, [(0x20006, 1)])[:31],                    # under a header
        b"",
        good,
    ]
    accesses = bench(requests, rng)
    # nothing but the good request touched a register
    assert accesses == [("w", 0x20001), ("r", 0x20001), ("w", 0x20002), ("r", 0x20002)]


def test_key_is_not_in_the_repr():
    service = CtrlService(key=KEY)
    assert f"{KEY:x}" not in repr(service) and str(KEY) not in repr(service)
    with pytest.raises(ValueError):
        CtrlService(key=1 << 64)


# -- section 7: tags and the write counter (CtrlAuth in front of the service) ---------------

AUTH_KEY = bytes.fromhex("8f3a0c6b1e2d4f5a69788796a5b4c3d2")


def auth_request(op, pairs, *, counter, key=AUTH_KEY, **kwargs):
    """A section 7 request: ``counter`` in header bytes 16..23, tagged under ``key``."""
    raw = bytearray(ctrl_request(op, pairs, key=0, **kwargs))
    raw[16:24] = counter.to_bytes(8, "little")
    return seal(key, bytes(raw))


@pytest.mark.parametrize("seed", [4, 5])
def test_authenticated_requests_bit_exact_replies_tagged(seed):
    rng = random.Random(seed)
    requests = []
    counter = 1000
    for n in range(10):
        count = rng.choice([1, 2, 3, 4, 5, 8, 9, rng.randint(1, 64), 64])
        pairs = [(0x20000 + rng.randrange(0x40), rng.getrandbits(32)) for _ in range(count)]
        counter += rng.randint(1, 1 << 40)
        requests.append(auth_request(rng.choice([CtrlOp.READ, CtrlOp.WRITE]), pairs,
                                     counter=counter))
    bench(requests, rng, key=AUTH_KEY)


def test_authenticated_forgeries_and_replays_change_nothing():
    rng = random.Random(6)
    write = auth_request(CtrlOp.WRITE, [(0x20001, 5), (0x20002, 6)], counter=50)
    moved = bytearray(write)
    moved[24:32], moved[16:24] = write[16:24], write[24:32]        # the tag moved
    flipped = bytearray(write)
    flipped[40] ^= 1                                               # a value changed
    old_key = bytearray(ctrl_request(CtrlOp.WRITE, [(0x20003, 9)]))  # section 4's key
    requests = [
        write,
        write,                                                     # replayed: same counter
        auth_request(CtrlOp.WRITE, [(0x20003, 7)], counter=49),    # older counter
        auth_request(CtrlOp.WRITE, [(0x20003, 7)], counter=51, key=bytes(16)),  # wrong key
        bytes(moved), bytes(flipped), bytes(old_key),
        write[:-4],                                                # truncated: tag wrong
        write[:31],                                                # under a header
        auth_request(CtrlOp.READ, [(0x20001, 0)], counter=3),      # a read: any counter
        auth_request(CtrlOp.READ, [(0x20000, 0)], counter=5, count=0),   # refused, tagged
        auth_request(CtrlOp.WRITE, [(0x20004, 8)], counter=51),
        write,                                                     # replayed after a newer
    ]
    accesses = bench(requests, rng, key=AUTH_KEY)
    assert accesses == [("w", 0x20001), ("r", 0x20001), ("w", 0x20002), ("r", 0x20002),
                        ("r", 0x20001), ("w", 0x20004), ("r", 0x20004)]


def test_authenticated_key_is_checked_and_not_in_the_repr():
    service = CtrlService(key=AUTH_KEY)
    assert AUTH_KEY.hex() not in repr(service)
    with pytest.raises(ValueError):
        CtrlService(key=bytes(15))
