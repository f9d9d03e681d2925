"""The self-test's building blocks and the whole self-test, in the Amaranth simulator.

Each block is checked against an independent reference: the LFSR against the bit-serial
reference, the lane quantiser against the spec's arithmetic (and the golden codec), the
gradient generator against its Python model, the aggregator traffic against the reference
aggregator model, the report by decoding the UART line bit by bit. The whole self-test
runs with the real engines (small parameters) and must see zero errors, then, with the
fault injected, must count errors.
"""
import collections
import gc
import fractions
import random
import struct

import pytest
from amaranth import Module
from amaranth.lib import wiring
from amaranth.sim import Simulator

from contract.header import Flags, Header, PacketType
from hdl.selftest.agg_traffic import AggTrafficModel
from hdl.selftest.gradient_gen import GradientGenerator, GradientModel, lane_value_model
from hdl.selftest.lane_quantizer import QuantizeStream, nic_applies_k, quantize_model
from hdl.selftest.lfsr import LFSR, lfsr_advance, lfsr_step
from hdl.selftest.report import Report, parse_template
from hdl.selftest.top import SelfTest
from hdl.selftest.stream_checker import StreamChecker
from hdl.selftest.uart_tx import UartTx, uart_divisor


def run(dut, *testbenches, period=1e-8):
    sim = Simulator(dut)
    sim.add_clock(period)
    for tb in testbenches:
        sim.add_testbench(tb)
    sim.run()


def collect(ctx, stream, n, rng, ready_rate=0.7):
    """Async helper: take ``n`` beats from ``stream`` with random back-pressure."""
    async def consume():
        got = []
        while len(got) < n:
            ctx.set(stream.ready, rng.random() < ready_rate)
            _, _, payload, valid, ready = await ctx.tick().sample(stream.payload, stream.valid,
                                                                  stream.ready)
            if valid and ready:
                got.append((int(payload.data), int(payload.keep), int(payload.last)))
        return got
    return consume()


# -- LFSR ------------------------------------------------------------------------------------

def test_lfsr_16_bit_is_maximal_length():
    state, seen = 1, set()
    while state not in seen:
        seen.add(state)
        state = lfsr_step(state, 16)
    assert len(seen) == (1 << 16) - 1 and state == 1


@pytest.mark.parametrize("width, steps", [(16, 5), (64, 64), (31, 31)])
def test_lfsr_hardware_matches_bit_serial_reference(width, steps):
    dut = LFSR(width=width, seed=0x1234 & ((1 << width) - 1) or 1, steps=steps)
    rng = random.Random(width)
    pattern = [rng.random() < 0.6 for _ in range(300)]

    async def tb(ctx):
        state = dut.seed
        for advance in pattern:
            assert ctx.get(dut.value) == state
            ctx.set(dut.advance, advance)
            await ctx.tick()
            if advance:
                state = lfsr_advance(state, width, steps)
        assert ctx.get(dut.value) == state

    run(dut, tb)


def test_lfsr_rejects_bad_parameters():
    with pytest.raises(ValueError, match="seed"):
        LFSR(width=32, seed=0)
    with pytest.raises(ValueError, match="width 33"):
        LFSR(width=33)
    with pytest.raises(ValueError, match="steps"):
        LFSR(width=32, steps=0)


# -- the independent lane quantiser ------------------------------------------------------------

def _nasty_words():
    words = [0, 0x80000000, 1, 0x807FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001,
             0xFFFFFFFF, 0x7F7FFFFF, 0x3F800000, 0xBF800000, 0x3F7FFFFF]
    for k in range(1, 16):
        for e in {127 - k, min(134 - k, 127), 127}:
            for s in (0, 1):
                words += [s << 31 | e << 23, s << 31 | (e - 1) << 23 | 0x7FFFFF,
                          s << 31 | e << 23 | 1]
    return words


def _spec_arithmetic(u, k):
    """Section 2 from the value side: floor(|x| * 2^k) * 2^-k or floor(|x| * 2^15) * 2^-15,
    computed with exact rationals and converted back to a word."""
    s, e, m = u >> 31, u >> 23 & 0xFF, u & 0x7FFFFF
    if e >= 127:
        return u
    magnitude = fractions.Fraction(m if e == 0 else (1 << 23) | m, 1 << 23) \
        * fractions.Fraction(2) ** ((1 if e == 0 else e) - 127)
    if magnitude < fractions.Fraction(1, 1 << k):
        return 0
    scale = k if magnitude < fractions.Fraction(2) ** (7 - k) else 15
    q = fractions.Fraction((magnitude * (1 << scale)).__floor__(), 1 << scale)
    word = struct.unpack("<I", struct.pack("<f", float(q)))[0]   # exact: q has <= 15 bits
    return word | s << 31


def test_quantize_model_matches_spec_arithmetic():
    rng = random.Random(5)
    words = _nasty_words() + [rng.getrandbits(32) for _ in range(3000)]
    # plus plenty of values in (2^-16, 1), where all the work is
    words += [rng.getrandbits(1) << 31 | rng.randrange(110, 127) << 23 | rng.getrandbits(23)
              for _ in range(3000)]
    for k in range(1, 16):
        bad = [(hex(u), hex(quantize_model(u, k)), hex(_spec_arithmetic(u, k)))
               for u in words if quantize_model(u, k) != _spec_arithmetic(u, k)]
        assert not bad, f"k={k}: {bad[:5]}"


def test_quantize_model_matches_golden_codec():
    np = pytest.importorskip("numpy")
    golden = pytest.importorskip("host.golden.inceptionn")
    rng = random.Random(6)
    words = _nasty_words() + [rng.getrandbits(32) for _ in range(5000)]
    array = np.array(words, dtype=np.uint32)
    for k in range(1, 16):
        want = golden.quantize(array.view(np.float32), k).view(np.uint32)
        assert [quantize_model(u, k) for u in words] == [int(w) for w in want], f"k={k}"


def _quantised_beats(model, n):
    """The first ``n`` beats of a GradientModel after the NIC's round trip."""
    out = []
    for fields, k, beats in model.packets():
        for i, (data, keep, last) in enumerate(beats):
            if i and k is not None:
                data = sum(quantize_model(data >> 32 * j & 0xFFFFFFFF, k) << 32 * j
                           for j in range(8))
            out.append((data, keep, last))
        if len(out) >= n:
            return out[:n]


def test_quantize_stream_matches_model_under_back_pressure():
    m = Module()
    m.submodules.gen = gen = GradientGenerator(seed=11, max_count=32)
    m.submodules.quantise = quantise = QuantizeStream()
    wiring.connect(m, gen.o, quantise.i)
    n, got = 800, []

    async def tb(ctx):
        got.extend(await collect(ctx, quantise.o, n, random.Random(3)))

    run(m, tb)
    want = _quantised_beats(GradientModel(seed=11, max_count=32), n)
    bad = [i for i in range(n) if got[i] != want[i]]
    assert not bad, f"{len(bad)} beats differ, first at {bad[0]}"


# -- the gradient generator --------------------------------------------------------------------

def test_generator_matches_model_under_back_pressure():
    dut = GradientGenerator(seed=9, max_count=64)
    n, got = 700, []

    async def tb(ctx):
        got.extend(await collect(ctx, dut.o, n, random.Random(4), ready_rate=0.5))

    run(dut, tb)
    model = GradientModel(seed=9, max_count=64).beats()
    want = [next(model) for _ in range(n)]
    bad = [i for i in range(n) if got[i] != want[i]]
    assert not bad, f"{len(bad)} beats differ, first at {bad[0]}"


def test_generator_packets_are_well_formed_and_varied():
    kinds = collections.Counter()
    counts = set()
    for fields, k, beats in _take(GradientModel(seed=1, max_count=128).packets(), 400):
        header = Header.from_int(beats[0][0])
        assert header == Header(**fields)
        assert nic_applies_k(fields) == k
        words = sum(bin(keep).count("1") // 4 for _, keep, _ in beats[1:])
        assert words == header.count == fields["count"]
        assert [last for _, _, last in beats] == [False] * (len(beats) - 1) + [True]
        counts.add(header.count)
        if header.type != PacketType.RAW_F32:
            kinds["other type"] += 1
        elif not header.flags & Flags.COMPRESS:
            kinds["no compress"] += 1
        elif k is None:
            kinds["bad k"] += 1
        else:
            kinds[f"k={k}"] += 1
    assert {0, 128} <= counts and len(counts) > 50
    assert kinds["other type"] and kinds["no compress"] and kinds["bad k"]
    assert all(kinds[f"k={k}"] for k in range(1, 16)), kinds


def _take(iterator, n):
    return [next(iterator) for _ in range(n)]


def _tag(u, k):
    e = u >> 23 & 0xFF
    return 0 if e < 127 - k else 1 if e < min(134 - k, 127) else 2 if e < 127 else 3


def test_generator_values_cover_every_class_and_the_nasty_cases():
    rng = random.Random(8)
    for k in range(1, 16):
        words = [lane_value_model(rng.getrandbits(64), k) for _ in range(4000)]
        tags = collections.Counter(_tag(u, k) for u in words)
        assert tags[0] == max(tags.values()), f"k={k}: small values must dominate: {tags}"
        assert tags[1] > 200 and tags[3] > 200, f"k={k}: {tags}"
        assert (tags[2] > 200) == (k > 7), f"k={k}: tag 10 exists only for k > 7: {tags}"
        edge = 127 - k
        for name, word in {"+0": 0, "-0": 1 << 31, "+Inf": 0x7F800000, "-Inf": 0xFF800000,
                           "largest finite": 0x7F7FFFFF, "1.0": 0x3F800000,
                           "1 ulp below 1": 0x3F7FFFFF, "2^-k": edge << 23,
                           "1 ulp below 2^-k": (edge - 1) << 23 | 0x7FFFFF,
                           "smallest denormal": 1}.items():
            assert word in words or word | 1 << 31 in words, f"k={k}: no {name}"
        assert any(u & 0x7F800000 == 0x7F800000 and u & 0x7FFFFF for u in words), "no NaN"
        assert any(u & 0x7F800000 == 0 and u & 0x7FFFFF for u in words), "no denormal"


# -- aggregator traffic --------------------------------------------------------------------------

def test_agg_traffic_model_agrees_with_reference_aggregator():
    from host.aggregator import AggregatorModel
    from contract.packet import Packet
    traffic = AggTrafficModel(workers=4, lanes=16, window=3, slot_base=2, job=1, seed=7)
    agg = AggregatorModel(slots=8, lanes=16, max_workers=8, jobs=2)
    agg.configure_job(1, 4, 2, 3)
    workers = [traffic.worker_packets(w) for w in range(4)]
    expected = traffic.expected_results()
    kinds = set()
    for r in range(24):
        results = []
        for w in random.Random(r).sample(range(4), 4):
            header, words = next(workers[w])
            results += agg.process(Packet(header, struct.pack(f"<{len(words)}I", *words)))
        assert len(results) == 1
        want_header, want_words = next(expected)
        assert results[0].header == want_header
        assert results[0].payload == struct.pack(f"<{len(want_words)}I", *want_words)
        kinds.add(want_header.type)
    assert kinds == {PacketType.AGG_ADD_I32, PacketType.AGG_OR32}
    assert agg.counters["accepted"] == 96 and agg.counters["results_multicast"] == 24


# -- the stream checker ----------------------------------------------------------------------------

def test_stream_checker_counts_differences_and_stalls():
    dut = StreamChecker(stall_limit=50)
    # (expected, received) beats: (data, keep, last)
    good = [((5, 0xFFFFFFFF, 0), (5, 0xFFFFFFFF, 0)), ((7, 0xF, 1), (7 | 1 << 40, 0xF, 1))]
    bad = [((1, 0xFFFFFFFF, 0), (3, 0xFFFFFFFF, 0)),      # lane 0 differs
           ((9, 0xF, 1), (9, 0xFF, 1)),                    # keep differs
           ((2, 0xFFFFFFFF, 1), (2, 0xFFFFFFFF, 0)),       # last differs
           ((4, 0xFFFFFFFF, 1), (4, 0xFFFFFFFF, 1))]       # same
    pairs = good + bad

    async def tb(ctx):
        for (exp, rcv) in pairs:
            for stream, beat in ((dut.expected, exp), (dut.received, rcv)):
                ctx.set(stream.valid, 1)
                ctx.set(stream.payload, {"data": beat[0], "keep": beat[1], "last": beat[2]})
            await ctx.tick()
        ctx.set(dut.received.valid, 0)
        await ctx.tick().repeat(5)
        assert ctx.get(dut.beats) == 6
        assert ctx.get(dut.packets) == 4         # by expected last
        assert ctx.get(dut.errors) == 3
        assert ctx.get(dut.bad_packets) == 2     # the packet ending at beat 4 and at beat 5
        await ctx.tick().repeat(60)              # expected waiting, nothing received
        assert ctx.get(dut.errors) == 4 and ctx.get(dut.error)

    run(dut, tb)


# -- the report over the UART -------------------------------------------------------------------

async def uart_text(ctx, line, divisor, stop_after):
    """Decode 8N1 frames from ``line`` until ``stop_after`` is in the text."""
    text = bytearray()
    while stop_after.encode() not in text:
        while ctx.get(line):                      # idle: wait for a start bit
            await ctx.tick()
        await ctx.tick().repeat(divisor // 2)     # middle of the start bit
        assert ctx.get(line) == 0, "glitch instead of a start bit"
        byte = 0
        for bit in range(8):
            await ctx.tick().repeat(divisor)
            byte |= ctx.get(line) << bit
        await ctx.tick().repeat(divisor)
        assert ctx.get(line) == 1, "missing stop bit"
        text.append(byte)
    return text.decode("ascii")


def test_report_line_over_uart():
    template = "t={line}s a={alpha} b={beta} zero={gamma} big={delta} a={alpha}\r\n"
    values = {"alpha": 1234567, "beta": 10, "gamma": 0, "delta": 0xFFFFFFFF}
    m = Module()
    m.submodules.report = report = Report(template, period=20)
    m.submodules.uart = uart = UartTx(divisor=4)
    wiring.connect(m, report.o, uart.data)
    lines = []

    async def inputs(ctx):
        for name, value in values.items():
            ctx.set(getattr(report, name), value)
        await ctx.tick().repeat(100)      # the first line is being sent: its copy is taken
        ctx.set(report.alpha, 42)

    async def receiver(ctx):
        for _ in range(2):
            lines.append(await uart_text(ctx, uart.tx, 4, "\r\n"))

    run(m, inputs, receiver)
    assert lines[0] == "t=1s a=1234567 b=10 zero=0 big=4294967295 a=1234567\r\n"
    # periods that start while a line is going out are skipped, so this is line 2
    assert lines[1] == "t=2s a=42 b=10 zero=0 big=4294967295 a=42\r\n"


@pytest.mark.filterwarnings("ignore:.*created but never used")
def test_report_template_errors():
    with pytest.raises(ValueError, match="format specs"):
        parse_template("{x:08}")
    with pytest.raises(ValueError, match="ASCII"):
        parse_template("µ={x}")
    with pytest.raises(ValueError, match="clash"):
        Report("{o}", period=10)
    gc.collect()     # its "never elaborated" warning, here where it is filtered
    with pytest.raises(ValueError, match="2 %"):
        uart_divisor(1000, 300)


def test_selftest_bringup_report_over_uart():
    dut = SelfTest(engines=(), clk_hz=1_000_000, baud=250_000, report_period=2000)
    text = []

    async def tb(ctx):
        text.append(await uart_text(ctx, dut.uart_tx, dut.divisor, "\r\n"))

    run(dut, tb, period=1e-6)
    assert text == ["gradwire t=1s | fault=0\r\n"]


# -- the whole self-test with the real engines --------------------------------------------------

SMALL = dict(clk_hz=1_000_000, baud=250_000, report_period=1 << 20, stall_limit=1500,
             nic={"max_count": 64}, nic_values=64,
             switch=dict(slots=8, lanes=16, max_workers=4, jobs=1),
             agg_traffic=dict(workers=3, window=4, clear_cycles=16))


def _selftest_run(engine, clean_cycles, fault_cycles):
    dut = SelfTest(engines=(engine,), **SMALL)
    seen = {}

    async def tb(ctx):
        await ctx.tick().repeat(clean_cycles)
        seen["clean"] = {n: ctx.get(c) for n, c in dut.counters.items()}
        seen["clean_status"] = ctx.get(dut.status)
        ctx.set(dut.inject_fault, 1)
        await ctx.tick().repeat(fault_cycles)
        seen["fault"] = {n: ctx.get(c) for n, c in dut.counters.items()}
        seen["fault_status"] = ctx.get(dut.status)

    run(dut, tb, period=1e-6)
    return seen


@pytest.mark.slow
def test_selftest_nic_engines_clean_then_fault_injected():
    seen = _selftest_run("nic", 2500, 500)
    clean, fault = seen["clean"], seen["fault"]
    assert clean["nic_errors"] == 0 and clean["nic_bad_packets"] == 0, clean
    assert clean["nic_drops"] == 0 and clean["faults"] == 0, clean
    assert clean["nic_packets"] > 300 and clean["nic_compressed"] > 200, clean
    # the NIC compresses: fewer beats on the wire than in
    assert clean["nic_wire_beats"] < clean["nic_in_beats"], clean
    assert seen["clean_status"].nic_ok and not seen["clean_status"].nic_error
    # injected: the checker catches it (every corrupted beat that reached it)
    assert fault["faults"] > 50, fault
    assert fault["nic_errors"] >= fault["faults"] - 10, fault
    assert fault["nic_bad_packets"] > 10, fault
    assert seen["fault_status"].nic_error and not seen["fault_status"].nic_ok


@pytest.mark.slow
def test_selftest_switch_engine_clean_then_fault_injected():
    seen = _selftest_run("switch", 2500, 500)
    clean, fault = seen["clean"], seen["fault"]
    assert clean["agg_errors"] == 0 and clean["agg_bad_packets"] == 0, clean
    assert clean["agg_drops"] == 0 and clean["faults"] == 0, clean
    # 3 workers, one packet each per result; about one beat per clock into the engine
    assert clean["agg_results"] > 150, clean
    assert clean["agg_accepted"] >= 3 * (clean["agg_results"] - 8), clean
    assert seen["clean_status"].agg_ok and not seen["clean_status"].agg_error
    assert fault["faults"] > 50 and fault["agg_errors"] > 10, fault
    assert seen["fault_status"].agg_error


def test_agg_traffic_against_reference_aggregator_in_the_loop():
    """AggTraffic's hardware (workers, arbiter, control writes, expected results, checker)
    with the reference aggregator model in place of the engine: the model is configured
    from the control writes the hardware makes, every worker packet must be the Python
    model's, and the checker must accept every result."""
    from hdl.selftest.agg_traffic import AggTraffic
    from host.aggregator import AggregatorModel
    from contract.packet import Packet
    dut = AggTraffic(workers=3, lanes=16, window=2, slot_base=1, job=1, clear_cycles=4,
                     seed=5, stall_limit=400)
    model = AggregatorModel(slots=4, lanes=16, max_workers=4, jobs=2)
    expected_workers = [dut.model().worker_packets(w) for w in range(3)]
    results = []           # result beats waiting to be driven back
    seen = {"packets": 0, "writes": {}}
    rng = random.Random(12)

    async def engine_input(ctx):
        beats = []
        while seen["packets"] < 60:
            ctx.set(dut.o.ready, rng.random() < 0.8)
            _, _, payload, valid, ready, we, addr, wdata = await ctx.tick().sample(
                dut.o.payload, dut.o.valid, dut.o.ready, dut.ctrl_we, dut.ctrl_addr,
                dut.ctrl_wdata)
            if we:
                seen["writes"][int(addr)] = int(wdata)
                if int(addr) == 4 * 1 + 3:
                    w = seen["writes"]
                    model.configure_job(1, w[4], w[5], w[6])
            if not (valid and ready):
                continue
            beats.append(int(payload.data))
            if payload.last:
                data = b"".join(b.to_bytes(32, "little") for b in beats)
                beats = []
                header = Header.parse(data)
                want_header, want_words = next(expected_workers[header.worker])
                assert header == want_header
                assert data[32:] == struct.pack(f"<{len(want_words)}I", *want_words)
                for out in model.process(Packet.from_bytes(data)):
                    raw = out.to_bytes()
                    results.extend(int.from_bytes(raw[i:i + 32], "little")
                                   for i in range(0, len(raw), 32))
                seen["packets"] += 1

    async def engine_output(ctx):
        sent = 0
        while seen["packets"] < 60 or results:
            if results and rng.random() < 0.7:
                ctx.set(dut.results.valid, 1)
                ctx.set(dut.results.payload, {"data": results[0], "keep": 0xFFFFFFFF,
                                              "last": (sent % 3) == 2})
                await ctx.tick().until(dut.results.ready)
                results.pop(0)
                sent += 1
                ctx.set(dut.results.valid, 0)
            else:
                await ctx.tick()
        await ctx.tick().repeat(10)
        seen["checked"] = ctx.get(dut.packets)
        seen["errors"] = ctx.get(dut.errors)

    run(dut, engine_input, engine_output)
    assert seen["writes"] == {4: 3, 5: 1, 6: 2, 7: 1}
    assert seen["errors"] == 0
    assert seen["checked"] == model.counters["results_multicast"] >= 18
