"""Self-test counters as readable text: one line per period, unsigned decimal numbers.

The line is a Python format string such as ``"t={line}s nic err={nic_errors}\\r\\n"``.
Each replacement field names a 32-bit input port of :class:`Report`, except ``{line}``, the
line's own number (1, 2, ...); the literal text goes out as is. At every period the inputs
are copied at once (so a line is one consistent snapshot), then the line is sent character
by character into a byte stream (a :class:`hdl.selftest.uart_tx.UartTx` in the board top). Numbers
are converted by repeated subtraction of powers of ten: one subtraction per clock, far
faster than any UART.
"""
import string

from amaranth import Array, Const, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["Report", "parse_template"]


def parse_template(template):
    """Split a line template into ``(literal_bytes, field_name_or_None)`` pieces.

    Raises ``ValueError`` on format specs, conversions or non-ASCII text, which the
    hardware does not support.
    """
    pieces = []
    for literal, field, spec, conversion in string.Formatter().parse(template):
        try:
            literal.encode("ascii")
        except UnicodeEncodeError:
            raise ValueError(f"Report text must be ASCII: {literal!r}") from None
        if spec or conversion:
            raise ValueError(f"Report field {field!r}: format specs and conversions are not "
                             f"supported (numbers are always unsigned decimal)")
        if field is not None and not field.isidentifier():
            raise ValueError(f"Report field {field!r} must be a plain identifier")
        pieces.append((literal.encode("ascii"), field))
    return pieces


class Report(wiring.Component):
    """Sends ``template`` with its fields filled in, once every ``period`` clock cycles.

    Parameters
    ----------
    template : str
        The line, with ``{name}`` fields; each distinct name but ``line`` becomes an
        ``In(width)`` port; ``{line}`` is the number of the line (1 for the first).
    period : int
        Clock cycles between the starts of two lines (a line that is still being sent when
        the next period starts makes that period's line be skipped, not queued).
    width : int
        Width of every field, bits (numbers up to ``2**width - 1``).

    Attributes
    ----------
    o : Out(stream.Signature(8))
        The text, one ASCII byte per transfer.
    tick : Out(1)
        High for one cycle at the start of every period.
    lines : Out(32)
        Lines started so far.
    <field name> : In(width)
        One port per field of the template.
    """

    def __init__(self, template, *, period, width=32):
        if not isinstance(period, int) or period < 1:
            raise ValueError(f"Report period must be a positive number of cycles, not {period!r}")
        self.pieces = parse_template(template)
        self.fields = list(dict.fromkeys(f for _, f in self.pieces if f is not None))
        reserved = {"o", "tick", "lines"} & set(self.fields)
        if reserved:
            raise ValueError(f"Report field names {sorted(reserved)} clash with its ports")
        self.period, self.width = period, width
        super().__init__({
            "o": Out(stream.Signature(8)),
            "tick": Out(1),
            "lines": Out(32),
            **{name: In(width) for name in self.fields if name != "line"},
        })

    def _program(self):
        """The line as a list of ops: ``("char", byte)`` or ``("number", field_index)``."""
        ops = []
        for literal, field in self.pieces:
            ops += [("char", byte) for byte in literal]
            if field is not None:
                ops.append(("number", self.fields.index(field)))
        return ops

    def elaborate(self, platform):
        m = Module()
        ops = self._program()
        digits = len(str((1 << self.width) - 1))
        powers = Array(Const(10 ** i, self.width) for i in range(digits))

        timer = Signal(range(self.period), init=self.period - 1)
        tick = self.tick
        m.d.comb += tick.eq(timer == 0)
        m.d.sync += timer.eq(timer - 1)
        with m.If(tick):
            m.d.sync += timer.eq(self.period - 1)

        # The snapshot is a queue in the order the numbers are printed (a field used twice
        # is in it twice): each number takes the head and shifts the rest, so no wide
        # multiplexer picks the value to print.
        printed = [self.fields[arg] for kind, arg in ops if kind == "number"]
        queue = [Signal(self.width, name=f"queue{n}_{name}") for n, name in enumerate(printed)]
        pc = Signal(range(len(ops) + 1))
        # the op at `pc`, decoded from the program into registers (FETCH) before it is used
        # (EXEC): no ROM decoder in front of the output handshake
        decoded_number, decoded_char = Signal(), Signal(8)
        with m.Switch(pc):
            for index, (kind, arg) in enumerate(ops):
                with m.Case(index):
                    if kind == "char":
                        m.d.comb += decoded_char.eq(arg)
                    else:
                        m.d.comb += decoded_number.eq(1)
        op_end, op_number, op_char = Signal(), Signal(), Signal.like(decoded_char)

        work = Signal(self.width)        # what is left of the number being printed
        place = Signal(range(digits))    # the decimal place being worked on
        power = Signal(self.width)       # 10 ** place, registered: keeps the mux off the
                                         # compare/subtract carry chain
        digit = Signal(4)
        started = Signal()               # a non-zero digit was sent: zeros are no longer leading

        with m.FSM():
            with m.State("IDLE"):
                with m.If(tick):
                    for name, entry in zip(printed, queue):
                        value = self.lines + 1 if name == "line" else getattr(self, name)
                        m.d.sync += entry.eq(value)
                    m.d.sync += [pc.eq(0), self.lines.eq(self.lines + 1)]
                    m.next = "FETCH"
            with m.State("FETCH"):
                m.d.sync += [op_end.eq(pc == len(ops)), op_number.eq(decoded_number),
                             op_char.eq(decoded_char)]
                m.next = "EXEC"
            with m.State("EXEC"):
                with m.If(op_end):
                    m.next = "IDLE"
                with m.Elif(op_number):
                    m.d.sync += [work.eq(queue[0]), place.eq(digits - 1),
                                 power.eq(10 ** (digits - 1)), digit.eq(0), started.eq(0)]
                    m.d.sync += [a.eq(b) for a, b in zip(queue, queue[1:])]
                    m.next = "SUBTRACT"
                with m.Else():
                    m.d.comb += [self.o.valid.eq(1), self.o.payload.eq(op_char)]
                    with m.If(self.o.ready):
                        m.d.sync += pc.eq(pc + 1)
                        m.next = "FETCH"
            with m.State("SUBTRACT"):
                # the digit at `place`: subtract 10 ** place while it fits
                with m.If(work >= power):
                    m.d.sync += [work.eq(work - power), digit.eq(digit + 1)]
                with m.Else():
                    m.next = "EMIT"
            with m.State("EMIT"):
                advance = Signal()
                with m.If((digit != 0) | started | (place == 0)):
                    m.d.comb += [self.o.valid.eq(1), self.o.payload.eq(ord("0") + digit),
                                 advance.eq(self.o.ready)]
                    with m.If(self.o.ready):
                        m.d.sync += started.eq(1)
                with m.Else():
                    m.d.comb += advance.eq(1)           # a leading zero: skipped
                with m.If(advance):
                    m.d.sync += [digit.eq(0), place.eq(place - 1), power.eq(powers[place - 1])]
                    with m.If(place == 0):
                        m.d.sync += pc.eq(pc + 1)
                        m.next = "FETCH"
                    with m.Else():
                        m.next = "SUBTRACT"
        return m
