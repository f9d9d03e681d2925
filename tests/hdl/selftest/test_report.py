# amaranth: UnusedElaboratable=no
"""The text report, decoded bit by bit from the UART line."""
import gc

import pytest
from amaranth import Module
from amaranth.lib import wiring

from hdl.selftest.report import Report, parse_template
from hdl.selftest.top import SelfTest
from hdl.selftest.uart_tx import UartTx, uart_divisor
from tests.amaranth_sim import run

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
