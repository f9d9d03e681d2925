"""cocotb side of the Verilator transport: serves a host process over a local socket.

The host driver (``host.driver.transport.VerilatorTransport``) starts the Verilated top
through cocotb with this module as the test. :func:`serve` connects back to the host and
executes its requests one at a time while simulated time stands still in between:

``("exchange", stream, frames, options)``
    send ``frames`` (packet byte images) into ``{stream}`` 's sink port, collect what the
    source port emits until the design has been quiet for ``options["idle"]`` cycles, and
    answer ``{"frames": [...], "cycles": ..., "in_beats": ..., "out_beats": ..., ...}``.
``("write", addr, value)`` / ``("read", addr)``
    one access on the ``ctrl_*`` register port.
``("close",)``
    end the simulation.

Every stream is a pair of flat AXI-Stream port groups (``prefix_in``, ``prefix_out``) given
in the test parameters; the driver never sees a cocotb object, so the same driver code
runs over the reference models or, later, a UDP link to a board.
"""
import random
import traceback
from multiprocessing.connection import Client

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import RisingEdge
from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamSink, AxiStreamSource

from sim.runner import test_params


class StreamPort:
    """One AXI-Stream path through the design, with handshake counters per clock."""

    def __init__(self, dut, sink_prefix, source_prefix):
        self.dut = dut
        self.source = AxiStreamSource(AxiStreamBus.from_prefix(dut, sink_prefix), dut.clk, dut.rst)
        self.sink = AxiStreamSink(AxiStreamBus.from_prefix(dut, source_prefix), dut.clk, dut.rst)
        self.in_valid = getattr(dut, f"{sink_prefix}_tvalid")
        self.in_ready = getattr(dut, f"{sink_prefix}_tready")
        self.out_valid = getattr(dut, f"{source_prefix}_tvalid")
        self.out_ready = getattr(dut, f"{source_prefix}_tready")

    def set_pauses(self, rng, pause_in, pause_out):
        # Random idle cycles on the input and back-pressure on the output.
        if pause_in:
            self.source.set_pause_generator(iter(lambda: rng.random() < pause_in, None))
        else:
            self.source.clear_pause_generator()
            self.source.pause = False   # clearing the generator keeps its last value
        if pause_out:
            self.sink.set_pause_generator(iter(lambda: rng.random() < pause_out, None))
        else:
            self.sink.clear_pause_generator()
            self.sink.pause = False


async def exchange(clock, port, frames, options):
    rng = random.Random(options.get("seed", 0))
    port.set_pauses(rng, options.get("pause_in", 0.0), options.get("pause_out", 0.0))
    idle_limit = int(options.get("idle", 64))
    max_cycles = int(options.get("max_cycles", 10_000_000))
    for frame in frames:
        port.source.send_nowait(AxiStreamFrame(frame))
    stats = {"in_beats": 0, "out_beats": 0, "first_in": None, "last_in": None,
             "first_out": None, "last_out": None, "stall_in": 0}
    out_frames = []
    quiet = 0
    start = clock.cycle
    while True:
        await RisingEdge(port.dut.clk)
        clock.cycle += 1
        cycle = clock.cycle - start
        # Values sampled right after the edge are those of the cycle that just ended.
        # "Quiet" counts cycles with no handshake on either side: the design may take
        # many cycles after its last input beat before it emits (a result, a buffered packet).
        quiet += 1
        if port.in_valid.value and port.in_ready.value:
            stats["in_beats"] += 1
            stats["first_in"] = cycle if stats["first_in"] is None else stats["first_in"]
            stats["last_in"] = cycle
            quiet = 0
        elif port.in_valid.value:
            stats["stall_in"] += 1
        if port.out_valid.value and port.out_ready.value:
            stats["out_beats"] += 1
            stats["first_out"] = cycle if stats["first_out"] is None else stats["first_out"]
            stats["last_out"] = cycle
            quiet = 0
        while not port.sink.empty():
            out_frames.append(bytes(port.sink.recv_nowait().tdata))
        if port.source.empty() and port.source.idle() and quiet >= idle_limit:
            break
        if cycle >= max_cycles:
            raise TimeoutError(f"exchange did not settle within {max_cycles} cycles "
                               f"({len(out_frames)} frames out so far)")
    port.set_pauses(rng, 0, 0)
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
    ports = {name: StreamPort(dut, sink, source) for name, (sink, source) in params["streams"].items()}
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
