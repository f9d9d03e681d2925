"""The NIC in the wire (``docs/protocol/network.md`` section 6), whole, below the MACs.

:class:`WireEngine` is a two-port board's gateware between its two LiteEth MACs, in one
clock domain: port 0 faces the host, port 1 the network.

- ``port0_rx`` -> :class:`~hdl.wire.path.WirePath` ``tx`` -> ``port1_tx``: frames from the
  host, gradient datagrams through the NIC transmit path (compression);
- ``port1_rx`` -> :class:`~hdl.wire.path.WirePath` ``rx`` -> ``port0_tx``: frames from the
  network, gradient datagrams through the NIC receive path (decompression);
- one :class:`~hdl.nic.engine.NicEngine` shared by the two paths (each uses one of its
  directions), so the board has one set of NIC counters, as a NIC top does;
- the board's own service (:class:`~hdl.wire.service.BoardService`: ARP, ping, ``CTRL``)
  behind the tx path's frames for the board, its replies merged with the rx path's frames
  into ``port0_tx`` a frame at a time;
- the registers of ``contract.registers.WIRE_REGISTERS``: the NIC engine's counters (blocks
  ``tx`` and ``rx``, read from the engine's own port) and each port's ``WIRE_COUNTERS``
  (blocks ``port0`` and ``port1``); other addresses read 0. Counters are 32 bits and wrap
  around. The service reads them for ``CTRL`` requests, and ``ctrl`` (read-only
  :class:`~hdl.ctrl_port.RegisterPort`) for the board (its UART report) in the clocks the
  service leaves free (``ctrl_free``).

A frame's counters belong to the port it arrives on, except ``frames_out``, which counts on
the port that sends it: the tx path's frames leave from port 1, the rx path's from port 0
(``host.board.wire_golden.GoldenWire.receive`` counts the same way).
"""
from amaranth import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from contract.counters import WIRE_COUNTERS
from contract.network import DEFAULT_IP, DEFAULT_MAC, SIMULATION_KEY, WIRE_GRADIENT_PORT
from contract.registers import NIC_REGISTERS, WIRE_REGISTERS
from hdl.ctrl_port import RegisterPort
from hdl.nic.engine import COUNTER_BITS, NicEngine
from hdl.stream.arbiter import PacketArbiter
from hdl.wire.classify import MacBeat
from hdl.wire.path import DEFAULT_FRAMES, DEFAULT_STORE_BYTES, WirePath
from hdl.wire.service import BoardService

__all__ = ["WireEngine"]

#: the wire's register blocks that are the NIC engine's counters, and the engine's own
#: blocks they read (same names: ``tx`` and ``rx``)
_NIC_BLOCKS = ("tx", "rx")
#: the wire's per-port blocks, by port
_PORT_BLOCKS = {0: "port0", 1: "port1"}
#: port 0's counters that the board's service strobes (port 1 has no service: they stay 0)
_SERVICE_COUNTERS = ("answered", "drop_unanswered")


class WireEngine(wiring.Component):
    """Both directions of the NIC in the wire, the NIC engine they share and the counters.

    Each direction is store and forward with a frame store of its own
    (:class:`~hdl.wire.path.WirePath`: what happens to each frame, the rate, frames dropped
    when a store is full); both run at once, and each takes a MAC's frames at line rate.
    Frames for the board itself (ARP, ping, ``CTRL`` from the host side) go to its service
    (:class:`~hdl.wire.service.BoardService`), which answers them on port 0.

    Parameters
    ----------
    key : int
        The 64-bit control key of ``CTRL`` requests (default the public
        ``contract.network.SIMULATION_KEY``: a board's bitstream draws its own).
    max_count : int
        The NIC engine's ``max_count``: the largest ``INC_F32`` packet (values) the receive
        path decompresses, 1..2048.
    store_bytes : int
        Each direction's frame store (:class:`~hdl.wire.path.WirePath`), a power of two of
        at least 4096.
    frames : int
        Frames each store holds at most, at least 2.
    mac : str or int
        The board's MAC address.
    ip : str or int
        The board's IPv4 address.
    gradient_port : int
        UDP destination port of gradient datagrams, 1..65535, not the control port.

    Members
    -------
    port0_rx : In(stream.Signature(MacBeat, always_ready=True))
        Frames from the host-side MAC (port 0); never stalled.
    port1_rx : In(stream.Signature(MacBeat, always_ready=True))
        Frames from the network-side MAC (port 1); never stalled.
    port0_tx : Out(stream.Signature(MacBeat))
        Frames to the host-side MAC: ``last_be`` one-hot on the last beat, ``error`` 0.
    port1_tx : Out(stream.Signature(MacBeat))
        Frames to the network-side MAC, likewise.
    ctrl : In(RegisterPort(writable=False))
        The counters of ``contract.registers.WIRE_REGISTERS``; ``rdata`` the cycle after
        ``re``. A read counts only in a cycle with ``ctrl_free`` high.
    ctrl_free : Out(1)
        The board's service is not reading the registers this cycle.
    """

    port0_rx: In(stream.Signature(MacBeat, always_ready=True))
    port1_rx: In(stream.Signature(MacBeat, always_ready=True))
    port0_tx: Out(stream.Signature(MacBeat))
    port1_tx: Out(stream.Signature(MacBeat))
    ctrl: In(RegisterPort(writable=False))
    ctrl_free: Out(1)

    def __init__(self, *, key=SIMULATION_KEY, max_count=2048, store_bytes=DEFAULT_STORE_BYTES,
                 frames=DEFAULT_FRAMES, mac=DEFAULT_MAC, ip=DEFAULT_IP,
                 gradient_port=WIRE_GRADIENT_PORT):
        # built here so that a bad parameter is an error at construction: the paths check
        # every parameter (max_count too, as the engine does), the tx path first, so that
        # nothing is left built when one is bad (the key is the service's alone)
        BoardService.check_key(key)
        common = dict(store_bytes=store_bytes, frames=frames, max_count=max_count, mac=mac,
                      ip=ip, gradient_port=gradient_port)
        self._tx = WirePath(direction="tx", **common)
        self._rx = WirePath(direction="rx", **common)
        self._nic = NicEngine(max_count=max_count)
        self._service = BoardService(key=key, mac=mac, ip=ip)
        self.max_count, self.store_bytes, self.frames = max_count, store_bytes, frames
        self.mac, self.ip, self.gradient_port = mac, ip, gradient_port
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        m.submodules.tx = tx = self._tx
        m.submodules.rx = rx = self._rx
        m.submodules.nic = nic = self._nic

        m.submodules.service = service = self._service

        wiring.connect(m, wiring.flipped(self.port0_rx), tx.i)
        wiring.connect(m, tx.o, wiring.flipped(self.port1_tx))
        wiring.connect(m, wiring.flipped(self.port1_rx), rx.i)
        # port 0 sends the network's frames and the board's replies, each frame whole
        m.submodules.port0_out = port0_out = PacketArbiter(2, shape=MacBeat)
        wiring.connect(m, rx.o, port0_out.i0)
        wiring.connect(m, service.o, port0_out.i1)
        wiring.connect(m, port0_out.o, wiring.flipped(self.port0_tx))
        wiring.connect(m, tx.board, service.i)
        m.d.comb += tx.board_free.eq(service.free)
        # each path uses one direction of the shared engine; only the receive path drops
        wiring.connect(m, tx.nic_in, nic.tx_in)
        wiring.connect(m, nic.tx_out, tx.nic_out)
        m.d.comb += tx.nic_dropped.eq(0)
        wiring.connect(m, rx.nic_in, nic.rx_in)
        wiring.connect(m, nic.rx_out, rx.nic_out)
        m.d.comb += rx.nic_dropped.eq(nic.rx_dropped)

        # -- the ports' counters ------------------------------------------------------------
        # Every event of a path is its arriving port's (tx: 0, rx: 1) but frames_out: the
        # frame left from the other port. The service's replies leave from port 0 too, and
        # it counts the frames for the board (answered or not) of port 0. A strobe is one
        # frame: +1 each.
        registers = {}
        for port in (0, 1):
            arriving = (tx, rx)[port]
            sending = (rx, tx)[port]
            block = WIRE_REGISTERS[_PORT_BLOCKS[port]]
            for name, address in block.items():
                if name == "frames_out":
                    strobes = [sending.events[name]]
                    if port == 0:
                        strobes.append(service.events[name])
                elif name in _SERVICE_COUNTERS:
                    strobes = [service.events[name]] if port == 0 else []
                else:
                    strobes = [arriving.events[name]]
                counter = Signal(COUNTER_BITS, name=f"{block.name}_{name}")
                if len(strobes) == 1:
                    with m.If(strobes[0]):
                        m.d.sync += counter.eq(counter + 1)   # wraps at 2^32
                elif strobes:
                    m.d.sync += counter.eq(counter + sum(strobes))
                registers[address] = counter

        # -- the register port --------------------------------------------------------------
        # The NIC blocks are the engine's counters: a read there goes to the engine's port,
        # at the engine's address of the same counter. Both ports answer the cycle after
        # re, so the choice of answer is registered with the read.
        # The service's reads come first; ``ctrl``'s in the other clocks.
        ctrl = RegisterPort(writable=False).create(path=("registers",))
        service_reads = service.bus.re
        m.d.comb += [
            ctrl.addr.eq(Mux(service_reads, service.bus.addr, self.ctrl.addr)),
            ctrl.re.eq(service_reads | self.ctrl.re),
            self.ctrl_free.eq(~service_reads),
            self.ctrl.rdata.eq(ctrl.rdata),
            service.bus.rdata.eq(ctrl.rdata),
        ]
        to_nic = Signal()
        from_nic = Signal()
        m.d.comb += nic.ctrl.re.eq(ctrl.re & to_nic)
        with m.Switch(ctrl.addr):
            for block in _NIC_BLOCKS:
                for name, address in WIRE_REGISTERS[block].items():
                    with m.Case(address):
                        m.d.comb += [to_nic.eq(1),
                                     nic.ctrl.addr.eq(NIC_REGISTERS[block].address(name))]
        own = Signal(COUNTER_BITS)
        with m.If(ctrl.re):
            m.d.sync += [from_nic.eq(to_nic), own.eq(0)]    # (0 where nothing is mapped)
            with m.Switch(ctrl.addr):
                for address, counter in registers.items():
                    with m.Case(address):
                        m.d.sync += own.eq(counter)
        m.d.comb += ctrl.rdata.eq(Mux(from_nic, nic.ctrl.rdata, own))
        return m
