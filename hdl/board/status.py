"""Status helpers the board tops share: LED pulse stretching, a heartbeat, the PHY reset.

An event strobe lasts one clock, far too short to see on an LED: :func:`stretch` holds it for
a while; :func:`heartbeat` toggles once a second, so a lit board shows its clock runs;
:func:`hold_phy_in_reset` keeps an Ethernet PHY chip in reset after its clocks come up, as
LiteX's ``LiteEthPHYRGMII`` hardware reset does; :func:`uart_report` sends a line of
counters over the board's UART once a second.
"""
from amaranth import Signal
from amaranth.lib import io

from hdl.selftest.report import Report
from hdl.selftest.uart_tx import UartTx, uart_divisor

__all__ = ["PHY_RESET_S", "BLINK_S", "BAUD", "stretch", "heartbeat", "hold_phy_in_reset",
           "uart_report"]

#: PHY reset after the clocks are up, as LiteX's LiteEthPHYRGMII hardware reset.
PHY_RESET_S = 10e-3
#: How long an activity LED stays lit after an event.
BLINK_S = 50e-3
#: The report's UART: 115200 8N1.
BAUD = 115200


def stretch(m, event, cycles, name, domain="sync"):
    """A signal high for ``cycles`` clocks of ``domain`` after each ``event`` strobe."""
    timer = Signal(range(cycles + 1), name=f"{name}_timer")
    lit = Signal(name=f"{name}_lit")
    with m.If(event):
        m.d[domain] += timer.eq(cycles)
    with m.Elif(timer != 0):
        m.d[domain] += timer.eq(timer - 1)
    m.d.comb += lit.eq(timer != 0)
    return lit


def heartbeat(m, clk_hz, name="heartbeat", domain="sync"):
    """A signal that toggles once every ``clk_hz`` clocks of ``domain`` (once a second)."""
    beat = Signal(name=name)
    timer = Signal(range(clk_hz), name=f"{name}_timer")
    with m.If(timer == clk_hz - 1):
        m.d[domain] += [timer.eq(0), beat.eq(~beat)]
    with m.Else():
        m.d[domain] += timer.eq(timer + 1)
    return beat


def hold_phy_in_reset(m, resource, clk_hz, domain, name="phy_reset"):
    """Hold the PHY chip of an RGMII ``resource`` in reset for :data:`PHY_RESET_S` after
    ``domain`` leaves reset (nothing on a board whose resource has no ``rst`` pin)."""
    if not hasattr(resource, "rst"):
        return
    cycles = round(PHY_RESET_S * clk_hz)
    timer = Signal(range(cycles + 1), init=cycles, name=f"{name}_timer")
    with m.If(timer != 0):
        m.d[domain] += timer.eq(timer - 1)
    m.submodules[name] = buffer = io.Buffer("o", resource.rst)
    m.d.comb += buffer.o.eq(timer != 0)       # the pin's polarity is the board's


def uart_report(m, template, values, clk_hz):
    """Send ``template`` (:class:`hdl.selftest.report.Report`) once every ``clk_hz`` clocks
    of ``sync``, its fields from ``values`` (field name -> value); returns the UART's
    transmit signal, for the board's pin."""
    m.submodules.report = report = Report(template, period=clk_hz)
    for name, value in values.items():
        m.d.comb += getattr(report, name).eq(value)
    m.submodules.uart = uart = UartTx(divisor=uart_divisor(clk_hz, BAUD))
    m.d.comb += [uart.data.valid.eq(report.o.valid), uart.data.payload.eq(report.o.payload),
                 report.o.ready.eq(uart.data.ready)]
    return uart.tx
