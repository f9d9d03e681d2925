"""cocotb side of the cocotb transport: serves a host process over a local socket.

The host driver (``sim.cocotb_transport.CocotbTransport``) starts the Verilated top
through cocotb with this module as the test. :func:`serve` connects back to the host and
executes its requests one at a time while simulated time stands still in between:

``("exchange", stream, frames, options)``
    send ``frames`` (packet byte images) into ``{stream}`` 's sink port, collect what the
    source port emits until the design has been quiet for ``options["idle"]`` cycles, and
    answer ``{"frames": [...], "cycles": ..., "in_beats": ..., "out_beats": ..., ...}``.
    The options and their seeded input-gap and back-pressure patterns are
    ``sim/harness/patterns.py``'s; the compiled harness (``sim/harness``) gives the same
    cycles for the same requests, and this module defines what they are.
``("write", addr, value)`` / ``("read", addr)``
    one access on the ``ctrl_*`` register port.
``("close",)``
    end the simulation.

Every stream is a pair of flat AXI-Stream port groups (``prefix_in``, ``prefix_out``) given
in the test parameters; the driver never sees a cocotb object, so the same driver code
runs over the reference models, this bridge, the compiled harness and a board over UDP.
"""
import traceback
from multiprocessing.connection import Client

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import RisingEdge
from cocotb.utils import get_sim_steps, get_sim_time
from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamSink, AxiStreamSource

from sim.harness.patterns import IN, OUT, ExchangeOptions
from sim.runner import test_params


class PauseSchedule:
    """The ``pause`` of a cocotbext-axi source or sink, read from a seeded
    :class:`~sim.harness.patterns.PausePattern` by clock edges since the exchange began.

    cocotbext-axi reads ``pause`` from its own coroutines, which run in whatever order the
    scheduler resumes them after a clock edge; its pause generator is one more coroutine.
    Computing the value from the simulation time instead makes it the same for every
    reader in a time step, whatever the order, which is what lets the compiled harness
    reproduce the bridge's cycles exactly. A pattern applies strictly after the time step
    it was installed in and up to the time step it was removed in, so readers in those
    two time steps agree too.
    """

    def __init__(self, period_steps):
        self.period = period_steps
        self.segments = []   # (start, end or None, pattern); at most the last two are kept

    def begin(self, pattern):
        self.segments = self.segments[-1:] + [(get_sim_time("step"), None, pattern)]

    def end(self):
        start, _, pattern = self.segments[-1]
        self.segments[-1] = (start, get_sim_time("step"), pattern)

    def value(self):
        now = get_sim_time("step")
        for start, end, pattern in reversed(self.segments):
            if start < now and (end is None or now <= end):
                return pattern.paused((now - start) // self.period)
        return False


class ScheduledSource(AxiStreamSource):
    """An AXI-Stream source whose gaps come from a :class:`PauseSchedule`."""

    def __init__(self, *args, schedule, **kwargs):
        super().__init__(*args, **kwargs)
        self.schedule = schedule

    @property
    def pause(self):
        return self.schedule.value()

    @pause.setter
    def pause(self, value):   # AxiStreamPause's own generator is not used
        pass


class ScheduledSink(AxiStreamSink):
    """An AXI-Stream sink whose back-pressure comes from a :class:`PauseSchedule`.

    The sink sleeps while nothing changes and relies on being woken when ``pause`` does;
    :meth:`watch` does that once per clock edge (its position among the coroutines does
    not matter: the sink only sleeps when the value did not change at that edge).
    """

    def __init__(self, *args, schedule, **kwargs):
        super().__init__(*args, **kwargs)
        self.schedule = schedule
        cocotb.start_soon(self.watch())

    @property
    def pause(self):
        return self.schedule.value()

    @pause.setter
    def pause(self, value):
        pass

    async def watch(self):
        before = self.pause
        while True:
            await RisingEdge(self.clock)
            now = self.pause
            if now != before:
                self.wake_event.set()
            before = now


class StreamPort:
    """One AXI-Stream path through the design, with handshake counters per clock."""

    def __init__(self, dut, sink_prefix, source_prefix, period_steps):
        self.dut = dut
        self.in_schedule = PauseSchedule(period_steps)
        self.out_schedule = PauseSchedule(period_steps)
        self.source = ScheduledSource(AxiStreamBus.from_prefix(dut, sink_prefix), dut.clk,
                                      dut.rst, schedule=self.in_schedule)
        self.sink = ScheduledSink(AxiStreamBus.from_prefix(dut, source_prefix), dut.clk,
                                  dut.rst, schedule=self.out_schedule)
        self.in_valid = getattr(dut, f"{sink_prefix}_tvalid")
        self.in_ready = getattr(dut, f"{sink_prefix}_tready")
        self.out_valid = getattr(dut, f"{source_prefix}_tvalid")
        self.out_ready = getattr(dut, f"{source_prefix}_tready")

    def begin_pauses(self, options):
        self.in_schedule.begin(options.pattern(IN))
        self.out_schedule.begin(options.pattern(OUT))

    def end_pauses(self):
        self.in_schedule.end()
        self.out_schedule.end()


async def exchange(clock, port, frames, options):
    """One exchange; the cycle accounting that ``sim/harness/harness.cpp`` reproduces."""
    options = ExchangeOptions.from_dict(options)
    if any(len(frame) == 0 for frame in frames):
        raise ValueError("an AXI-Stream frame needs at least one byte")
    port.begin_pauses(options)
    for frame in frames:
        port.source.send_nowait(AxiStreamFrame(frame))
    stats = {"in_beats": 0, "out_beats": 0, "first_in": None, "last_in": None,
             "first_out": None, "last_out": None, "stall_in": 0, "stall_out": 0}
    out_frames = []
    quiet = 0
    start = clock.cycle
    try:
        while True:
            await RisingEdge(port.dut.clk)
            clock.cycle += 1
            cycle = clock.cycle - start
            # Values sampled right after the edge are those of the cycle that just ended.
            # "Quiet" counts cycles with no handshake and no output beat waiting: the design
            # may take many cycles after its last input beat before it emits.
            quiet += 1
            if port.in_valid.value and port.in_ready.value:
                stats["in_beats"] += 1
                stats["first_in"] = cycle if stats["first_in"] is None else stats["first_in"]
                stats["last_in"] = cycle
                quiet = 0
            elif port.in_valid.value:
                stats["stall_in"] += 1
            if port.out_valid.value:
                quiet = 0
                if port.out_ready.value:
                    stats["out_beats"] += 1
                    stats["first_out"] = cycle if stats["first_out"] is None else stats["first_out"]
                    stats["last_out"] = cycle
                else:
                    stats["stall_out"] += 1
            while not port.sink.empty():
                out_frames.append(bytes(port.sink.recv_nowait().tdata))
            if port.source.empty() and port.source.idle() and quiet >= options.idle:
                break
            if cycle >= options.max_cycles:
                raise TimeoutError(
                    f"exchange did not settle within its budget of max_cycles="
                    f"{options.max_cycles} cycles ({stats['in_beats']} beats in, "
                    f"{stats['out_beats']} out, {len(out_frames)} frames out so far)")
    finally:
        port.end_pauses()
    stats["cycles"] = cycle
    stats["frames"] = out_frames
    return stats


class CycleClock:
    cycle = 0


@cocotb.test()
async def serve(dut):
    params = test_params()
    cocotb.start_soon(Clock(dut.clk, params.get("period_ns", 8), unit="ns").start())
    clock = CycleClock()
    period_steps = get_sim_steps(params.get("period_ns", 8), "ns")
    ports = {name: StreamPort(dut, sink, source, period_steps)
             for name, (sink, source) in params["streams"].items()}
    has_ctrl = params.get("ctrl", False)
    dut.rst.value = 1
    if has_ctrl:
        dut.ctrl_addr.value = 0
        for name in ("ctrl_we", "ctrl_re", "ctrl_wdata"):
            if hasattr(dut, name):
                getattr(dut, name).value = 0
    for _ in range(4):
        await RisingEdge(dut.clk)
    dut.rst.value = 0
    # Two edges: after the second every source has gone idle, so the first exchange starts
    # exactly like every later one (the compiled harness does the same).
    for _ in range(2):
        await RisingEdge(dut.clk)

    conn = Client(params["address"], authkey=bytes.fromhex(params["authkey"]))
    try:
        while True:
            request = conn.recv()
            op = request[0]
            try:
                if op == "close":
                    conn.send(("ok", None))
                    break
                elif op == "exchange":
                    _, stream, frames, options = request
                    reply = await exchange(clock, ports[stream], frames, options)
                elif op == "write":
                    _, addr, value = request
                    dut.ctrl_addr.value = addr
                    dut.ctrl_wdata.value = value
                    dut.ctrl_we.value = 1
                    await RisingEdge(dut.clk)
                    dut.ctrl_we.value = 0
                    await RisingEdge(dut.clk)
                    clock.cycle += 2
                    reply = None
                elif op == "read":
                    _, addr = request
                    dut.ctrl_addr.value = addr
                    dut.ctrl_re.value = 1
                    await RisingEdge(dut.clk)
                    dut.ctrl_re.value = 0
                    await RisingEdge(dut.clk)
                    clock.cycle += 2
                    reply = int(dut.ctrl_rdata.value)
                elif op == "idle":
                    for _ in range(int(request[1])):
                        await RisingEdge(dut.clk)
                    clock.cycle += int(request[1])
                    reply = None
                elif op == "cycle":
                    reply = clock.cycle
                else:
                    raise ValueError(f"unknown bridge request {op!r}")
            except Exception as exc:   # report to the host, keep serving
                conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
            else:
                conn.send(("ok", reply))
    finally:
        conn.close()
