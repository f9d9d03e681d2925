"""Reads an engine's counters through its register port, over and over, for the report.

Both engines expose 32-bit counters on a synchronous register port
(:class:`hdl.ctrl_port.RegisterPort`: ``addr``, ``re`` -> ``rdata`` the cycle after). :class:`CounterPoller` walks a fixed list of
addresses, one read per clock, and publishes named totals: each output is the sum of the
counters at its addresses (e.g. all drop causes), refreshed once per sweep.
"""
from amaranth import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hdl.ctrl_port import RegisterPort

__all__ = ["CounterPoller"]


class CounterPoller(wiring.Component):
    """Publishes ``{name: sum of the counters at addresses}``, one register read per clock.

    Parameters
    ----------
    totals : dict of str -> list of int
        Output name -> register addresses whose values it sums (modulo 2**32).

    Attributes
    ----------
    enable : In(1)
        Reads only while high (the port may be busy with something else before).
    ctrl : Out(RegisterPort(writable=False))
        To the engine's register port.
    <name> : Out(32)
        One per total; updated at the end of every sweep.
    """

    def __init__(self, totals):
        self.totals = {name: list(addresses) for name, addresses in totals.items()}
        if not self.totals or any(not a for a in self.totals.values()):
            raise ValueError("CounterPoller needs at least one total with at least one address")
        clash = {"enable", "ctrl"} & set(self.totals)
        if clash:
            raise ValueError(f"CounterPoller total names {sorted(clash)} clash with its ports")
        super().__init__({
            "enable": In(1),
            "ctrl": Out(RegisterPort(writable=False)),
            **{name: Out(32) for name in self.totals},
        })

    def elaborate(self, platform):
        m = Module()
        reads = [(index, address) for index, addresses in enumerate(self.totals.values())
                 for address in addresses]
        outputs = [getattr(self, name) for name in self.totals]
        sums = [Signal(32, name=f"sum_{name}") for name in self.totals]

        step = Signal(range(len(reads)))
        with m.Switch(step):
            for n, (_, address) in enumerate(reads):
                with m.Case(n):
                    m.d.comb += self.ctrl.addr.eq(address)
        m.d.comb += self.ctrl.re.eq(self.enable)
        with m.If(self.enable):
            m.d.sync += step.eq(Mux(step == len(reads) - 1, 0, step + 1))

        # the value of read n arrives one cycle later; a total's reads are consecutive
        pending = Signal()
        pending_step = Signal.like(step)
        m.d.sync += [pending.eq(self.enable), pending_step.eq(step)]
        with m.If(pending):
            with m.Switch(pending_step):
                for n, (index, _) in enumerate(reads):
                    with m.Case(n):
                        first = n == 0 or reads[n - 1][0] != index
                        last = n == len(reads) - 1 or reads[n + 1][0] != index
                        total = self.ctrl.rdata if first else (sums[index] + self.ctrl.rdata)[0:32]
                        m.d.sync += sums[index].eq(total)
                        if last:
                            m.d.sync += outputs[index].eq(total)
        return m

