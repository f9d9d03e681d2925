"""NetworkFrontEnd with stand-in engines in the Amaranth simulator: addressing, dispatch,
the control service end to end, the worker table, fan-out and every front-end counter.

The stand-ins are small and exact (the transmit "engine" echoes, the receive one drops a
packet whose first byte is not the magic, the "switch" answers every packet with itself),
so that this test checks the front end alone; the real engines behind the real core are
``tests/hdl/net/test_network_top.py``.
"""
import random
import struct

from amaranth import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from contract.counters import NET_COUNTERS
from contract.network import CtrlOp, Service, network_address, service_ports
from contract.registers import COMMIT, NET_REGISTERS, SWITCH_REGISTERS
from hdl.net.front_end.front_end import BufferSizes, NetworkFrontEnd
from hdl.stream.axis import axis_signature
from tests.amaranth_sim import datagram_words, run
from tests.hdl.net.front_end.test_ctrl_service import ctrl_request

KEY = 0x0123456789ABCDEF
BASE = 47570
PORTS = service_ports(BASE)
MAC, IP = 0x024757000001, 0xC0A84D02
HOST = 0xC0A84D0A
SWITCH_JOB = SWITCH_REGISTERS["job"]


def as_result(packet):
    """``packet`` as the switch stand-in sends it on: RESULT set."""
    return packet[:3] + bytes([packet[3] | 2]) + packet[4:]


class Echo(wiring.Component):
    """Output = input, through one register; `drop_bad` drops packets not starting 0x47;
    `complete` (the switch) sets RESULT, and turns a header whose exponent byte is 0x80
    into a multicast result (worker 0xFF), as the switch does when a packet completes its
    slot."""
    i: In(axis_signature())
    o: Out(axis_signature())
    dropped: Out(1)
    stall: In(1)

    def __init__(self, drop_bad=False, complete=False):
        self._drop_bad, self._complete = drop_bad, complete
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        first = Signal(init=1)
        dropping = Signal()
        bad = (self.i.p.data[:8] != 0x47) if self._drop_bad else 0
        drop_now = Signal()
        m.d.comb += drop_now.eq(bad if first is None else (bad & first) | (dropping & ~first))
        m.d.comb += self.i.ready.eq((~self.o.valid | self.o.ready) & ~self.stall)
        m.d.sync += self.dropped.eq(0)
        with m.If(self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += first.eq(self.i.p.last)
            with m.If(first):
                m.d.sync += [dropping.eq(bad), self.dropped.eq(bad)]
            with m.If(~drop_now):
                m.d.sync += [self.o.valid.eq(1), self.o.p.eq(self.i.p)]
                if self._complete:
                    # every packet the switch sends its workers is a result (RESULT set;
                    # one without it would go to the job's upstream)
                    with m.If(first):
                        m.d.sync += self.o.p.data[25].eq(1)
                    with m.If(first & (self.i.p.data[56:64] == 0x80)):
                        m.d.sync += self.o.p.data[48:56].eq(0xFF)
        return m


class Bench(wiring.Component):
    def __init__(self, sizes=BufferSizes(nic_in=16, nic_out=16, switch_in=16, switch_out=16,
                                         ctrl_in=32, ctrl_out=32, queue=8), **kwargs):
        self.front = NetworkFrontEnd(mac=MAC, ip=IP, port_base=BASE, key=KEY, jobs=2,
                                     max_workers=4, sizes=sizes, **kwargs)
        self.tx_engine, self.rx_engine = Echo(), Echo(drop_bad=True)
        self.switch = Echo(complete=True)
        super().__init__({"switch_reg": Out(32)})

    def elaborate(self, platform):
        m = Module()
        f = self.front
        m.submodules.front = f
        m.submodules.tx_engine, m.submodules.rx_engine = self.tx_engine, self.rx_engine
        m.submodules.switch = self.switch
        wiring.connect(m, f.nic_tx_in, self.tx_engine.i)
        wiring.connect(m, self.tx_engine.o, f.nic_tx_out)
        wiring.connect(m, f.nic_rx_in, self.rx_engine.i)
        wiring.connect(m, self.rx_engine.o, f.nic_rx_out)
        m.d.comb += f.nic_rx_dropped.eq(self.rx_engine.dropped)
        wiring.connect(m, f.switch_in, self.switch.i)
        wiring.connect(m, self.switch.o, f.switch_out)
        m.d.comb += f.switch_drained.eq(1)      # the stand-in holds no commit back
        # a one-register switch port and a NIC port that reads its address back
        with m.If(f.switch_ctrl.we):
            m.d.sync += self.switch_reg.eq(f.switch_ctrl.wdata)
        with m.If(f.switch_ctrl.re):
            m.d.sync += f.switch_ctrl.rdata.eq(self.switch_reg)
        with m.If(f.nic_ctrl.re):
            m.d.sync += f.nic_ctrl.rdata.eq(f.nic_ctrl.addr + 1000)
        return m


class Host:
    """Sends datagrams into the front end's rx and collects what it sends on tx."""

    def __init__(self, dut, rng):
        self.dut, self.rng = dut, rng
        self.queue = []
        self.sent = []               # (meta, bytes) from the board
        self.tx_ready = 1.0

    def datagram(self, payload, dport, *, sport=40000, ip=HOST, error=False):
        meta = {"ip_address": ip, "src_port": sport, "dst_port": dport,
                "length": len(payload)}
        self.queue += datagram_words(payload, meta, rng=self.rng, error=error)

    async def rx(self, ctx):
        while True:
            if self.queue:
                ctx.set(self.dut.front.rx.valid, 1)
                ctx.set(self.dut.front.rx.p, self.queue[0])
            else:
                ctx.set(self.dut.front.rx.valid, 0)
            _, _, ready, valid = await ctx.tick().sample(self.dut.front.rx.ready,
                                                         self.dut.front.rx.valid)
            if valid:
                assert ready, "the front end stalled the core's receive stream"
                self.queue.pop(0)

    async def tx(self, ctx):
        tx = self.dut.front.tx
        current = b""
        while True:
            ctx.set(tx.ready, self.rng.random() < self.tx_ready)
            _, _, valid, ready, p = await ctx.tick().sample(tx.valid, tx.ready, tx.p)
            if valid and ready:
                current += int(p.data).to_bytes(4, "little")
                if p.last:
                    meta = (int(p.meta.ip_address), int(p.meta.src_port), int(p.meta.dst_port))
                    length = int(p.meta.length)
                    assert int(p.last_be) == (0b1000 if length else 0)
                    self.sent.append((meta, current[:length]))
                    assert len(current) == max(4, -(-length // 4) * 4)
                    current = b""

    async def wait(self, ctx, cycles=400):
        while self.queue:
            await ctx.tick()
        for _ in range(cycles):
            await ctx.tick()

    def ctrl(self, op, pairs, seq=1, **kwargs):
        self.datagram(ctrl_request(op, pairs, seq=seq, key=kwargs.pop("key", KEY)),
                      PORTS[Service.CTRL], **kwargs)


def counters(ctx, dut):
    return {name: ctx.get(dut.front.counters[name]) for name in NET_COUNTERS}


def delta(before, after):
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


def words(payload):
    return payload + bytes(-len(payload) % 4)


def test_requests_replies_and_counters():
    rng = random.Random(1)
    dut = Bench()
    host = Host(dut, rng)
    reply_to = lambda sport, service: ((HOST, PORTS[service], sport))

    async def bench(ctx):
        c0 = counters(ctx, dut)
        # NIC TX: the reply is the engine's output (here the request), to the requester,
        # whole 32-bit words and at least a whole header (a datagram's last partial word,
        # and one shorter than 32 bytes, are completed with zero bytes for the engine)
        payloads = [bytes(rng.getrandbits(8) for _ in range(n))
                    for n in (32, 1, 45, 100, 0, 31, 33)]
        for n, p in enumerate(payloads):
            host.datagram(p, PORTS[Service.NIC_TX], sport=41000 + n)
        await host.wait(ctx)
        assert host.sent == [(reply_to(41000 + n, Service.NIC_TX),
                              words(p) + bytes(max(0, 32 - len(words(p)))))
                             for n, p in enumerate(payloads)]
        c1 = counters(ctx, dut)
        assert delta(c0, c1) == {"nic_tx_in": 7, "nic_tx_out": 7}

        # NIC RX: dropped by the engine -> no reply; good ones answered; flagged ones and
        # closed ports never reach an engine
        host.sent.clear()
        good = b"\x47" + bytes(63)
        host.datagram(b"\x00" * 40, PORTS[Service.NIC_RX], sport=1)
        host.datagram(good, PORTS[Service.NIC_RX], sport=2)
        host.datagram(good, PORTS[Service.NIC_RX], sport=3, error=True)
        host.datagram(good, BASE + 4, sport=4)
        host.datagram(good, BASE - 1, sport=5, error=True)
        await host.wait(ctx)
        assert host.sent == [(reply_to(2, Service.NIC_RX), good)]
        c2 = counters(ctx, dut)
        assert delta(c1, c2) == {"nic_rx_in": 2, "nic_rx_out": 1, "drop_closed_port": 1}

        # CTRL: read the board's registers and the NIC region, write the switch's register
        host.sent.clear()
        net = lambda name: network_address("net", NET_REGISTERS[name].address)
        counter = lambda name: network_address("net", NET_REGISTERS["counter"].address(name))
        pairs = [(net("ip"), 0), (net("mac_high"), 0), (net("services"), 0),
                 (network_address("nic", 5), 0), (counter("nic_tx_in"), 0), (7 << 16, 0)]
        host.ctrl(CtrlOp.READ, pairs, seq=9, sport=42000)
        host.ctrl(CtrlOp.WRITE, [(network_address("switch", 1), 0xCAFE)], seq=10, sport=42001)
        host.ctrl(CtrlOp.WRITE, [(network_address("switch", 1), 0xBAD)], sport=42002,
                  key=KEY ^ 2)
        await host.wait(ctx)
        assert len(host.sent) == 2
        (to, raw), (to2, raw2) = host.sent
        assert to == reply_to(42000, Service.CTRL) and to2 == reply_to(42001, Service.CTRL)
        values = [struct.unpack_from("<II", raw, 32 + 8 * k) for k in range(len(pairs))]
        assert [v for _, v in values] == [IP, MAC >> 32, 0b1111, 1005, 7, 0]
        assert raw[3] & 2 and raw[16] == 9                  # RESULT, seq echoed
        assert struct.unpack_from("<II", raw2, 32) == (network_address("switch", 1), 0xCAFE)
        assert ctx.get(dut.switch_reg) == 0xCAFE            # the wrong key wrote nothing
        c3 = counters(ctx, dut)
        assert delta(c2, c3) == {"ctrl_in": 3, "ctrl_out": 2, "drop_bad_key": 1}

        # a refused request (count says 2, one pair): the header back with ERROR, then the
        # service goes on
        host.sent.clear()
        host.datagram(ctrl_request(CtrlOp.WRITE, [(network_address("switch", 1), 5)],
                                   count=2, key=KEY), PORTS[Service.CTRL], sport=42003)
        host.ctrl(CtrlOp.READ, [(network_address("switch", 1), 0)], sport=42004)
        await host.wait(ctx)
        assert [to for to, _ in host.sent] == [reply_to(42003, Service.CTRL),
                                               reply_to(42004, Service.CTRL)]
        refused, answered = host.sent[0][1], host.sent[1][1]
        assert len(refused) == 32 and refused[3] & 0b110 == 0b110
        assert struct.unpack_from("<II", answered, 32)[1] == 0xCAFE
        c4 = counters(ctx, dut)
        assert delta(c3, c4) == {"ctrl_in": 2, "ctrl_out": 2, "drop_bad_ctrl": 1}

        # longer than the longest request (32 + 64 pairs), one longer than the control
        # buffer too: taken as the header alone, so the key is checked and a request with
        # it refused like any other bad one; nothing written, the next request answered
        host.sent.clear()
        write = lambda n, **kw: ctrl_request(CtrlOp.WRITE, [(network_address("switch", 1),
                                                             0x50 + k) for k in range(n)], **kw)
        host.datagram(write(65, key=KEY), PORTS[Service.CTRL], sport=42005)
        host.datagram(write(64, key=KEY, extra=bytes(8)), PORTS[Service.CTRL], sport=42006)
        host.datagram(write(200, key=KEY ^ 1, count=64), PORTS[Service.CTRL], sport=42007)
        host.ctrl(CtrlOp.READ, [(network_address("switch", 1), 0)], sport=42008)
        await host.wait(ctx, 1500)
        assert [to for to, _ in host.sent] == [reply_to(port, Service.CTRL)
                                               for port in (42005, 42006, 42008)]
        for (_, raw), sport in zip(host.sent[:2], (42005, 42006)):
            want = bytearray(write(65 if sport == 42005 else 64, key=KEY)[:32])
            want[3] |= 0b110                                # RESULT, ERROR
            assert raw == bytes(want)
        assert struct.unpack_from("<II", host.sent[2][1], 32)[1] == 0xCAFE
        assert delta(c4, counters(ctx, dut)) == {"ctrl_in": 4, "ctrl_out": 3,
                                                 "drop_bad_ctrl": 2, "drop_bad_key": 1}

    run(dut, bench, background=(host.rx, host.tx))


def test_worker_table_source_check_and_fan_out():
    """Sources checked against the worker table; a multicast result to the job's workers
    0 .. n - 1 with an entry, n the workers of the job's last commit (a pending value is
    not one; a rejected commit unconfigures the job); a unicast one to its worker."""
    rng = random.Random(2)
    dut = Bench()
    host = Host(dut, rng)
    worker = NET_REGISTERS["worker"]
    workers = {0: (0x0A000010, 50010), 1: (0x0A000011, 50011), 3: (0x0A000013, 50013)}
    src = PORTS[Service.SWITCH]

    def agg(job, w, completes=False):
        header = bytearray(32)
        header[0], header[1], header[2], header[5], header[6] = 0x47, 1, 2, job, w
        header[7] = 0x80 if completes else 0
        return bytes(header) + bytes(rng.getrandbits(8) for _ in range(64))

    def job_regs(job, **fields):
        return [(network_address("switch", SWITCH_JOB.address(job, field)), value)
                for field, value in fields.items()]

    def multicast():
        """A packet from worker 0 that completes its slot: the result, as sent."""
        p = agg(1, 0, completes=True)
        host.datagram(p, src, ip=workers[0][0], sport=workers[0][1])
        return as_result(p[:6] + b"\xff" + p[7:])

    async def bench(ctx):
        pairs = []
        for w, (ip, port) in workers.items():
            pairs += [(network_address("net", worker.address(1 * 32 + w, "ip")), ip),
                      (network_address("net", worker.address(1 * 32 + w, "port")), port)]
        # job 1 with 2 workers: the entry of worker 3 is a stale one
        host.ctrl(CtrlOp.WRITE, pairs + job_regs(1, workers=2, slot_base=0, slot_count=4,
                                                 commit=COMMIT))
        await host.wait(ctx)
        host.sent.clear()
        c0 = counters(ctx, dut)
        # from worker 1's entry: the "switch" answers with the packet itself (worker 1:
        # a unicast answer to worker 1)
        p1 = agg(1, 1)
        host.datagram(p1, src, ip=workers[1][0], sport=workers[1][1])
        # a multicast result goes to workers 0 and 1, in worker order
        p2 = multicast()
        # strangers: wrong port, wrong address, a job or worker without an entry
        bad = [(agg(1, 1), workers[1][0], workers[1][1] + 1),
               (agg(1, 1), workers[1][0] + 1, workers[1][1]),
               (agg(1, 2), workers[1][0], workers[1][1]),
               (agg(1, 0xFF), workers[1][0], workers[1][1]),
               (agg(0, 1), workers[1][0], workers[1][1]),
               (agg(3, 1), workers[1][0], workers[1][1])]
        for raw, ip, port in bad:
            host.datagram(raw, src, ip=ip, sport=port)
        await host.wait(ctx, 1500)
        assert host.sent == [((workers[1][0], src, workers[1][1]), as_result(p1))] + [
            ((workers[w][0], src, workers[w][1]), p2) for w in (0, 1)]
        c1 = counters(ctx, dut)
        assert delta(c0, c1) == {"switch_in": 2 + len(bad), "switch_out": 3,
                                 "drop_bad_source": len(bad)}

        # recommitted with 4 workers: every entry of the job; a pending value alone
        # changes nothing
        for regs, targets in ((job_regs(1, workers=4, commit=COMMIT), (0, 1, 3)),
                              (job_regs(1, workers=1), (0, 1, 3)),
                              (job_regs(1, workers=3, commit=COMMIT), (0, 1))):
            host.ctrl(CtrlOp.WRITE, regs)
            await host.wait(ctx)
            host.sent.clear()
            p = multicast()
            await host.wait(ctx, 600)
            assert host.sent == [((workers[w][0], src, workers[w][1]), p) for w in targets]
        # a commit the switch rejects (an empty range) unconfigures the job: its results
        # go nowhere
        host.ctrl(CtrlOp.WRITE, job_regs(1, workers=4, slot_count=0, commit=COMMIT))
        await host.wait(ctx)
        host.sent.clear()
        c2 = counters(ctx, dut)
        multicast()
        await host.wait(ctx, 600)
        assert host.sent == []
        assert delta(c2, counters(ctx, dut)) == {"switch_in": 1}

    run(dut, bench, background=(host.rx, host.tx))


def test_result_group_one_datagram_per_result():
    """A job with a result group: each multicast result leaves once, to the group, and
    counts in ``switch_group_out``; a unicast answer still goes to the worker's entry; the
    group reads back; a group of port 0, or on an unconfigured job, is no group; a job
    beyond the switch's keeps none."""
    rng = random.Random(3)
    dut = Bench()
    host = Host(dut, rng)
    worker, group = NET_REGISTERS["worker"], NET_REGISTERS["group"]
    workers = {0: (0x0A000010, 50010), 1: (0x0A000011, 50011), 2: (0x0A000012, 50012)}
    group_ip, group_port = 0xEF4D0001, 47600          # 239.77.0.1
    src = PORTS[Service.SWITCH]

    def agg(w, completes=False):
        header = bytearray(32)
        header[0], header[1], header[2], header[5], header[6] = 0x47, 1, 2, 1, w
        header[7] = 0x80 if completes else 0
        return bytes(header) + bytes(rng.getrandbits(8) for _ in range(64))

    def multicast():
        p = agg(0, completes=True)
        host.datagram(p, src, ip=workers[0][0], sport=workers[0][1])
        return as_result(p[:6] + b"\xff" + p[7:])

    def group_regs(job, ip, port):
        return [(network_address("net", group.address(job, "ip")), ip),
                (network_address("net", group.address(job, "port")), port)]

    async def bench(ctx):
        pairs = []
        for w, (ip, port) in workers.items():
            pairs += [(network_address("net", worker.address(1 * 32 + w, "ip")), ip),
                      (network_address("net", worker.address(1 * 32 + w, "port")), port)]
        pairs += group_regs(1, group_ip, group_port)
        pairs += [(network_address("switch", SWITCH_JOB.address(1, field)), value)
                  for field, value in dict(workers=3, slot_base=0, slot_count=4,
                                           commit=COMMIT).items()]
        host.ctrl(CtrlOp.WRITE, pairs)
        await host.wait(ctx)
        # the group reads back; job 3 is beyond the board's 2 jobs: it keeps no group (and
        # writing one changes no other job's)
        host.sent.clear()
        host.ctrl(CtrlOp.WRITE, group_regs(3, group_ip + 5, group_port + 5))
        host.ctrl(CtrlOp.READ, group_regs(1, 0, 0) + group_regs(3, 0, 0), seq=2)
        await host.wait(ctx)
        reply = host.sent[-1][1]
        assert struct.unpack("<8I", reply[32:]) == (
            group_regs(1, 0, 0)[0][0], group_ip, group_regs(1, 0, 0)[1][0], group_port,
            group_regs(3, 0, 0)[0][0], 0, group_regs(3, 0, 0)[1][0], 0)

        host.sent.clear()
        c0 = counters(ctx, dut)
        p1 = multicast()                       # to the group, once
        p2 = agg(2)                            # a unicast answer: to worker 2's entry
        host.datagram(p2, src, ip=workers[2][0], sport=workers[2][1])
        p3 = multicast()
        await host.wait(ctx, 1500)
        assert host.sent == [((group_ip, src, group_port), p1),
                             ((workers[2][0], src, workers[2][1]), as_result(p2)),
                             ((group_ip, src, group_port), p3)]
        assert delta(c0, counters(ctx, dut)) == {"switch_in": 3, "switch_out": 3,
                                                 "switch_group_out": 2}

        # port 0 is no group: one datagram per worker again
        for regs in (group_regs(1, group_ip, 0), group_regs(1, 0, group_port)):
            host.ctrl(CtrlOp.WRITE, regs)
            await host.wait(ctx)
            host.sent.clear()
            c1 = counters(ctx, dut)
            p = multicast()
            await host.wait(ctx, 800)
            assert host.sent == [((workers[w][0], src, workers[w][1]), p) for w in (0, 1, 2)]
            assert delta(c1, counters(ctx, dut)) == {"switch_in": 1, "switch_out": 3}
        # an unconfigured job's results go nowhere, its group set or not
        host.ctrl(CtrlOp.WRITE, group_regs(1, group_ip, group_port) + [
            (network_address("switch", SWITCH_JOB.address(1, field)), value)
            for field, value in dict(slot_count=0, commit=COMMIT).items()])
        await host.wait(ctx)
        host.sent.clear()
        c2 = counters(ctx, dut)
        multicast()
        await host.wait(ctx, 600)
        assert host.sent == []
        assert delta(c2, counters(ctx, dut)) == {"switch_in": 1}

    run(dut, bench, background=(host.rx, host.tx))


def test_full_buffers_drop_whole_and_count():
    """Transmit path held: the output buffer fills and drops whole replies, the engine goes
    on. Engine stalled: its input buffer fills and drops whole requests, the other services
    go on. Released, everything stored leaves exact and the service goes on."""
    rng = random.Random(3)
    dut = Bench()
    host = Host(dut, rng)
    payloads = [bytes(rng.getrandbits(8) for _ in range(200)) for _ in range(12)]

    async def bench(ctx):
        host.tx_ready = 0.0
        for n, p in enumerate(payloads):
            host.datagram(p, PORTS[Service.NIC_TX], sport=43000 + n)
        await host.wait(ctx, 200)
        c = counters(ctx, dut)
        # 16-beat buffers, 7 beats a datagram: two replies stored, the rest dropped whole
        assert (c["nic_tx_in"], c["drop_reply_full"], c["drop_service_full"]) == (12, 10, 0)
        host.tx_ready = 1.0
        await host.wait(ctx, 600)
        c = counters(ctx, dut)
        assert c["nic_tx_out"] == 2
        for (_, _, sport), raw in host.sent:
            assert raw == payloads[sport - 43000]

        # the engine stalls: one request in it, two stored, the rest dropped whole ...
        host.sent.clear()
        ctx.set(dut.tx_engine.stall, 1)
        for n, p in enumerate(payloads):
            host.datagram(p, PORTS[Service.NIC_TX], sport=45000 + n)
        # ... while the other services keep answering
        host.datagram(b"\x47" + bytes(31), PORTS[Service.NIC_RX], sport=46000)
        await host.wait(ctx, 200)
        c2 = counters(ctx, dut)
        assert delta(c, c2) == {"nic_tx_in": 2, "drop_service_full": 10, "nic_rx_in": 1,
                                "nic_rx_out": 1}
        ctx.set(dut.tx_engine.stall, 0)
        await host.wait(ctx, 600)
        assert sorted(sport for (_, _, sport), _ in host.sent) == [45000, 45001, 46000]
        for (_, _, sport), raw in host.sent:
            if sport < 46000:
                assert raw == payloads[sport - 45000]

    run(dut, bench, background=(host.rx, host.tx))
