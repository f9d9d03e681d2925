"""An 8N1 UART transmitter fed by a byte stream."""
from amaranth import C, Cat, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["UartTx", "uart_divisor"]


def uart_divisor(clk_hz, baud):
    """Clock cycles per UART bit, rounded; raises if the rate error would exceed 2 %."""
    if baud <= 0 or clk_hz < 2 * baud:
        raise ValueError(f"Cannot send {baud!r} baud from a {clk_hz!r} Hz clock")
    divisor = round(clk_hz / baud)
    error = abs(clk_hz / divisor - baud) / baud
    if error > 0.02:
        raise ValueError(f"{baud} baud from {clk_hz} Hz is {100 * error:.1f} % off "
                         f"(divisor {divisor}); a UART tolerates about 2 %")
    return divisor


class UartTx(wiring.Component):
    """Sends each byte of ``data`` as start bit, 8 data bits LSB first, stop bit.

    Parameters
    ----------
    divisor : int
        Clock cycles per bit (see :func:`uart_divisor`), at least 2.

    Attributes
    ----------
    data : In(stream.Signature(8))
        Bytes to send; a byte is taken only when the line is idle.
    tx : Out(1)
        The serial line, idle high.
    """

    def __init__(self, *, divisor):
        if not isinstance(divisor, int) or divisor < 2:
            raise ValueError(f"UART divisor must be an integer >= 2, not {divisor!r}")
        self.divisor = divisor
        super().__init__({
            "data": In(stream.Signature(8)),
            "tx": Out(1, init=1),
        })

    def elaborate(self, platform):
        m = Module()
        # the frame (start bit 0, data LSB first, stop bit 1), shifted out LSB first with
        # ones shifted in, so the line rests high once the frame is out
        shreg = Signal(10, init=0x3FF)
        bits_left = Signal(range(11))
        timer = Signal(range(self.divisor))

        m.d.comb += self.data.ready.eq(bits_left == 0)
        with m.If(self.data.valid & self.data.ready):
            m.d.sync += [
                shreg.eq(Cat(C(0, 1), self.data.payload, C(1, 1))),
                bits_left.eq(10),
                timer.eq(self.divisor - 1),
            ]
        with m.Elif(bits_left != 0):
            with m.If(timer == 0):
                m.d.sync += [
                    timer.eq(self.divisor - 1),
                    bits_left.eq(bits_left - 1),
                    shreg.eq(Cat(shreg[1:], C(1, 1))),
                ]
            with m.Else():
                m.d.sync += timer.eq(timer - 1)
        # registered so the pin is driven glitch-free straight from a flip-flop
        m.d.sync += self.tx.eq(shreg[0])
        return m

