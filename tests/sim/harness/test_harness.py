"""The compiled harness (``sim/harness``): same cycles as the cocotb bridge, seeded pause
patterns identical in Python and C++, and failures that end as clear errors.

The harness builds of nic_top and of the 16-slot switch_top are shared (cached by content)
with ``test_driver_verilator.py``, ``test_switch_cocotb.py`` and ``test_e2e.py``; the
bridge's cocotb builds with the cocotb testbenches of the same tops.
"""
import functools
import os
import random
import signal
import threading
import time

import numpy as np
import pytest

from contract.header import Header, PacketType
from contract.packet import Packet
from contract.registers import COMMIT, NIC_REGISTERS, SWITCH_REGISTERS
from hdl.export import export_verilog
from host.driver.nic import NIC_STREAMS
from host.driver.switch import SWITCH_STREAMS, SwitchInterface
from host.driver.transport import TransportError
from host.golden import inceptionn
from sim.harness.build import HarnessBuildError, ports_header
from sim.harness.patterns import IN, OUT, ExchangeOptions, PausePattern, splitmix64
from sim.switch_traffic import EngineParams, bad_packet, protocol_traffic

TX_PACKETS = NIC_REGISTERS["tx"].address("packets")
RX = NIC_REGISTERS["rx"]

SWITCH_ENGINE = EngineParams(slots=16, lanes=64, max_workers=32, jobs=4)


@functools.lru_cache(maxsize=None)
def nic_verilog():
    from hdl.export import make_top
    return export_verilog(make_top("nic_top"), "nic_top")


@functools.lru_cache(maxsize=None)
def switch_verilog():
    from hdl.export import make_top
    return export_verilog(make_top("switch_top", **SWITCH_ENGINE.as_dict()), "switch_top")


def open_harness(top="nic_top", **kwargs):
    from sim.harness import HarnessTransport
    if top == "nic_top":
        return HarnessTransport("nic_top", nic_verilog(), NIC_STREAMS, **kwargs)
    return HarnessTransport("switch_top", switch_verilog(), SWITCH_STREAMS, **kwargs)


class Frame:
    """A raw frame (malformed ones included) where the transports expect a Packet."""

    def __init__(self, data):
        self.data = bytes(data)

    def to_bytes(self):
        return self.data


# ---- no simulator --------------------------------------------------------------------------

def test_splitmix64_reference_values():
    # The published SplitMix64 outputs for the state sequence seeded with 0.
    state, out = 0, []
    for _ in range(3):
        out.append(splitmix64(state))
        state = (state + 0x9E3779B97F4A7C15) & (1 << 64) - 1
    assert out == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]


def test_pause_pattern_statistics_and_bursts():
    pattern = PausePattern(seed=5, side=IN, probability=0.3)
    bits = np.frombuffer(pattern.sequence(20000), np.uint8)
    assert 0.28 < bits.mean() < 0.32
    assert PausePattern(5, OUT, 0.3).sequence(64) != pattern.sequence(64)   # sides differ
    assert not any(PausePattern(5, IN, 0.0).sequence(100))
    assert all(PausePattern(5, IN, 1.0).sequence(100))
    bursty = np.frombuffer(PausePattern(5, IN, 0.5, burst=8).sequence(800), np.uint8)
    assert (bursty.reshape(-1, 8) == bursty[::8, None]).all()   # one decision per 8 cycles
    assert not pattern.paused(0)


@pytest.mark.parametrize("options, message", [
    ({"pause": 0.1}, "unknown exchange option"),
    ({"pause_in": 1.5}, "pause_in"),
    ({"pause_out": -0.1}, "pause_out"),
    ({"burst_in": 0}, "burst_in"),
    ({"idle": 0}, "idle"),
    ({"max_cycles": 0}, "max_cycles"),
    ({"seed": 1.5}, "seed"),
])
def test_exchange_options_rejected(options, message):
    with pytest.raises(ValueError, match=message):
        ExchangeOptions.from_dict(options)


def test_stream_table_checked_against_the_ports():
    verilog = nic_verilog()
    header = ports_header("nic_top", verilog, NIC_STREAMS, ctrl=True)
    assert "top->tx_s_axis_tdata" in header and "ctrl_we" not in header   # read-only port
    with pytest.raises(HarnessBuildError, match="no port tx_x_axis_tdata"):
        ports_header("nic_top", verilog, {"tx": ("tx_x_axis", "tx_m_axis")}, ctrl=True)
    with pytest.raises(HarnessBuildError, match="is an output"):
        ports_header("nic_top", verilog, {"tx": ("tx_m_axis", "tx_s_axis")}, ctrl=True)
    with pytest.raises(HarnessBuildError, match="no module"):
        ports_header("nic", verilog, NIC_STREAMS, ctrl=True)


def test_backend_names():
    from host.driver.nic import open_nic
    from host.driver.switch import open_switch
    for opener in (open_nic, open_switch):
        with pytest.raises(ValueError, match="'golden', 'verilator', 'cocotb'"):
            opener("iverilog")


# ---- the harness alone ---------------------------------------------------------------------

pytestmark_sim = pytest.mark.cocotb


@pytestmark_sim
def test_cpp_patterns_match_python():
    patterns = [PausePattern(0, IN, 0.3), PausePattern(0, OUT, 0.3),
                PausePattern(-7, IN, 0.77, burst=5), PausePattern(2**70 + 3, OUT, 0.01),
                PausePattern(9, IN, 1.0), PausePattern(9, OUT, 0.0),
                PausePattern(123456789, OUT, 0.5, burst=1000)]
    with open_harness() as harness:
        for pattern in patterns:
            assert harness.pause_sequence(pattern, 3000) == pattern.sequence(3000), pattern


@pytestmark_sim
def test_cycle_budget_and_bad_requests():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(4096) * 1e-3).astype(np.float32)
    packets = inceptionn.tensor_to_packets(x, 10, packet_values=2048)
    with open_harness() as harness:
        with pytest.raises(ValueError, match="streams 'tx', 'rx'"):
            harness.exchange("agg", packets)
        with pytest.raises(ValueError, match="unknown exchange option"):
            harness.exchange("tx", packets, pause=0.5)
        with pytest.raises(ValueError, match="ctrl_addr"):
            harness.read(1 << 16)
        with pytest.raises(TransportError, match="no writable register port"):
            harness.write(TX_PACKETS, 1)
        # An engine whose output is never taken stops taking input: the budget ends it.
        started = time.perf_counter()
        with pytest.raises(TransportError, match="max_cycles=5000"):
            harness.exchange("tx", packets, pause_out=1.0, max_cycles=5000)
        assert time.perf_counter() - started < 10
        with pytest.raises(TransportError, match="stuck"):
            harness.exchange("tx", packets)
        harness._stuck = None   # past the host's guard, the harness refuses it too
        with pytest.raises(TransportError, match="still sending the frames"):
            harness.exchange("tx", packets)
        assert harness.read(TX_PACKETS) == 1   # counters still readable: one packet went in
        assert harness.cycle > 5000


@pytestmark_sim
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSEGV])
def test_a_dying_harness_raises_with_its_log(how):
    """Killed while it simulates an exchange that would run for minutes: the caller gets a
    TransportError at once, naming the signal and quoting the harness log."""
    rng = np.random.default_rng(4)
    x = (rng.standard_normal(8192) * 1e-3).astype(np.float32)
    packets = inceptionn.tensor_to_packets(x, 10, packet_values=2048)
    harness = open_harness()
    pid = harness._proc.pid
    outcome = {}

    def call():
        try:
            harness.exchange("tx", packets, pause_out=1.0, max_cycles=10**12)
        except Exception as exc:   # noqa: BLE001 - the test inspects it
            outcome["error"] = exc

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    time.sleep(0.5)
    os.kill(pid, how)
    thread.join(timeout=30)
    assert not thread.is_alive(), "the caller hung on a dead harness"
    error = outcome["error"]
    assert isinstance(error, TransportError)
    assert signal.Signals(how).name in str(error) and "log" in str(error)
    with pytest.raises(TransportError):
        harness.read(TX_PACKETS)
    harness.close()


@pytestmark_sim
def test_a_harness_that_stops_answering_times_out():
    harness = open_harness(timeout=1.0)
    try:
        os.kill(harness._proc.pid, signal.SIGSTOP)
        started = time.perf_counter()
        with pytest.raises(TransportError, match="no answer for 1.0 s"):
            harness.read(TX_PACKETS)
        assert time.perf_counter() - started < 10
    finally:
        harness.close()


@pytestmark_sim
@pytest.mark.slow
def test_waves():
    """WAVES=1 (here waves=True): the harness is built with tracing and records the session."""
    rng = random.Random(2)
    traffic = protocol_traffic(rng, SWITCH_ENGINE, jobs={0: (2, range(0, 2))}, packets=4)
    with open_harness("switch_top", waves=True) as harness:
        assert harness.build.waves in ("fst", "vcd")
        harness.exchange("agg", [Frame(image) for _, image in traffic])
        path = harness.waves_path
    assert path.exists() and path.stat().st_size > 1000
    if path.suffix == ".vcd":
        text = path.read_text(errors="replace")
        assert "s_axis_tvalid" in text and "\n#8000\n" in text   # one clock period in


# ---- the harness against the bridge --------------------------------------------------------

def run_plan(transport, plan):
    """Every request of ``plan`` on ``transport``; the raw replies (errors by type)."""
    out = []
    for op, *args in plan:
        if op == "exchange":
            stream, frames, options = args
            # A budget, so that a transport that stops making progress fails the test
            # instead of hanging it.
            options = {"max_cycles": 50_000, **options}
            try:
                out.append(transport._exchange(stream, frames, options))
            except TransportError as exc:
                out.append(("error", "max_cycles" in str(exc)))
        elif op == "read":
            out.append(("read", args[0], transport.read(args[0])))
        elif op == "write":
            transport.write(*args)
        elif op == "idle":
            transport.idle(args[0])
            out.append(("cycle", transport.cycle))
    out.append(("cycle", transport.cycle))
    return out


def both_transports(top, verilog, streams, plan):
    from sim.cocotb_transport import CocotbTransport
    from sim.harness import HarnessTransport
    with HarnessTransport(top, verilog, streams, waves=False) as harness:
        compiled = run_plan(harness, plan)
    with CocotbTransport(top, verilog, streams, waves=False) as bridge:
        cocotb = run_plan(bridge, plan)
    return compiled, cocotb


def assert_same(compiled, cocotb):
    assert len(compiled) == len(cocotb)
    for i, (c, b) in enumerate(zip(compiled, cocotb)):
        brief = lambda r: r if not isinstance(r, dict) else {k: v for k, v in r.items()
                                                             if k != "frames"}
        assert type(c) is type(b), f"request {i}: compiled {brief(c)}, cocotb {brief(b)}"
        if isinstance(c, dict):
            assert c["frames"] == b["frames"], f"request {i}: output bytes differ"
            counts = lambda r: {k: v for k, v in r.items() if k != "frames"}
            assert counts(c) == counts(b), f"request {i}"
        else:
            assert c == b, f"request {i}"


@pytestmark_sim
@pytest.mark.slow
def test_nic_same_cycles_as_the_bridge():
    rng = np.random.default_rng(21)
    x = (rng.standard_normal(2000) * 0.02).astype(np.float32)
    x[::89] = np.float32(np.nan)
    x[5::61] = np.float32(-0.0)
    raw = inceptionn.tensor_to_packets(x, 9, packet_values=256)
    wire = inceptionn.tensor_to_packets(x, 9, compress=True, packet_values=256)
    bypass = Packet(Header(type=PacketType.AGG_ADD_I32, count=3), bytes(12))
    truncated = Frame(wire[1].to_bytes()[:-4])
    odd = Frame(wire[2].to_bytes() + bytes(3))      # not whole 32-bit words
    plan = [
        ("exchange", "tx", raw, {}),
        ("exchange", "rx", wire, {"pause_in": 0.3, "pause_out": 0.5, "seed": 3}),
        ("read", TX_PACKETS), ("idle", 7),
        ("exchange", "tx", [raw[0], bypass, *raw[1:4]],
         {"pause_in": 0.5, "burst_in": 7, "pause_out": 0.2, "burst_out": 3, "seed": 9,
          "idle": 5}),
        ("exchange", "rx", [wire[0], truncated, odd, *wire[3:5]],
         {"pause_out": 0.9, "seed": 1, "idle": 3}),
        ("exchange", "rx", wire[5:7], {"pause_in": 0.95, "idle": 2, "seed": 2}),
        ("exchange", "tx", [], {"idle": 4}),
        ("read", RX.address("decompressed")), ("read", RX.address("drop_bad_k")),
        ("exchange", "tx", raw[:1], {"pause_out": 1.0, "idle": 1, "seed": 2,
                                     "max_cycles": 300}),
    ]
    compiled, cocotb = both_transports("nic_top", nic_verilog(), NIC_STREAMS, plan)
    assert_same(compiled, cocotb)
    assert compiled[1]["stall_in"] > 0 and compiled[1]["stall_out"] > 0
    assert compiled[-2] == ("error", True)


@pytestmark_sim
@pytest.mark.slow
def test_switch_same_cycles_as_the_bridge():
    rng = random.Random(8)
    params = SWITCH_ENGINE
    jobs = {0: (3, range(0, 4)), 1: (1, range(4, 6)), 2: (5, range(6, 10))}
    traffic = protocol_traffic(rng, params, jobs=jobs, packets=90, duplicate=0.1, bad=0.1,
                               mixed=0.05)
    frames = [Frame(image) for _, image in traffic]
    broken = Frame(bad_packet(rng, params, "partial_beat", job=0, workers=3,
                              slot_range=range(0, 4), unconfigured_job=3, version=0))
    plan = []
    for job, (workers, slots) in jobs.items():
        regs = SWITCH_REGISTERS["job"]
        plan += [("write", regs.address(job, "workers"), workers),
                 ("write", regs.address(job, "slot_base"), slots.start),
                 ("write", regs.address(job, "slot_count"), len(slots)),
                 ("write", regs.address(job, "commit"), COMMIT)]
    plan += [("idle", 40),
             ("exchange", "agg", frames[:30], {"idle": 40}),
             ("exchange", "agg", frames[30:60] + [broken],
              {"pause_in": 0.4, "pause_out": 0.6, "burst_out": 4, "seed": 5, "idle": 40}),
             ("exchange", "agg", frames[60:], {"pause_in": 0.1, "pause_out": 0.8, "seed": 6,
                                               "idle": 64})]
    plan += [("read", address) for _, address in SWITCH_REGISTERS["counter"].items()]
    compiled, cocotb = both_transports("switch_top", switch_verilog(), SWITCH_STREAMS, plan)
    assert_same(compiled, cocotb)
    assert any(isinstance(r, dict) and r["frames"] for r in compiled)


@pytestmark_sim
def test_switch_interface_over_the_harness():
    """The driver's own calls (the parameter register, configure, counters) work on it."""
    with open_harness("switch_top") as harness:
        switch = SwitchInterface(harness)
        assert (switch.slots, switch.lanes) == (SWITCH_ENGINE.slots, SWITCH_ENGINE.lanes)
        switch.configure_job(1, 2, 0, 4)
        assert switch.counters()["packets"] == 0


@pytestmark_sim
@pytest.mark.slow
def test_sim_speed_bench_smoke():
    """``make bench``'s sim_speed section, small: every figure is there (its replays check
    each answer against the reference model); no speed is asserted (a shared machine)."""
    from sim.benchmarks import sim_speed
    results = sim_speed.run(quick=True)
    for top in ("nic_top", "switch_top"):
        r = results[top]
        for key in ("bare_cycles_per_s", "compiled_cycles_per_s", "cocotb_cycles_per_s"):
            assert r[key] > 0, (top, key)
        assert r["cycles"]["compiled"] > 0 and r["exchanges"]["cocotb"] > 0
