"""The switch aggregator: a SwitchML-style streaming engine for LHC's ADD and OR merges.

Behaviour: ``docs/protocol/aggregator-protocol.md`` section 2 and ``docs/switch-contract.md``
(the reference model is ``host/golden/aggregator.py``; the cocotb suite checks the two agree on
every output byte and every counter).

Structure (one 256-bit beat per clock, the pipeline after the input never stalls)::

    s_axis -> A: input register ----------------------------------------------+
               | header beat: HeaderCheck (+ job lookup), slot metadata read   |
               | payload beat i: slot row i read (ForwardedMemory, 2 cycles)   |
               v                                                               |
              H1, H2: header fields wait for the metadata  -> decisions (h+2)  |
              B, C: payload waits for the row -> LaneALU -> staging[i] (a+2)   |
               v                                                               v
              E1 (tlast+1): drop cause incl. length;  E2 (tlast+2): verdict, counters,
              metadata write, result header -> FIFO; then B cycles of commit: staging[i]
              -> slot row i (if accepted) and -> FIFO (if a result is due) -> m_axis

Why it never stalls on a read-modify-write hazard: a packet's commit writes its metadata at
``tlast + 2`` and its row ``i`` at ``tlast + 3 + i``; the next packet reads the metadata at
its header (``>= tlast + 1``) and row ``i`` at its payload beat ``i`` (``>= tlast + 2 + i``).
Every write therefore lands at most one cycle after a dependent read, which
:class:`~hdl.switch.slot_memory.ForwardedMemory` forwards. The commit reads staging row ``i`` at
``tlast + 3 + i``, before the next packet overwrites it (``>= tlast + 4 + i``). Nothing
touches slot state before ``tlast`` is checked, so a packet with a bad length (or any other
drop cause) leaves every slot as it was.

Why results are never lost: an input beat is only taken while the result FIFO has room
for a whole result packet (``P/8 + 1`` beats) on top of the results already queued or
promised to packet ends in flight (each last beat taken reserves one result until its
verdict, counted from a clock after it is taken); the check is a register, one clock old,
so it keeps room for two more. So back-pressure on ``m_axis`` stalls ``s_axis``
(conservatively, at any beat), and a result once decided is always written: nothing after
the input register ever stalls.

Memory: per slot, ``2 * P/8`` rows of 256 bits (two versions) and one metadata row with,
per version, the worker bitmap, the count, the op and the exponent
(:attr:`Aggregator.ram_bits_per_slot`).
"""
import dataclasses

from amaranth import Cat, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from contract.counters import AGG_COUNTERS, AGG_DROP_CAUSES
from contract.header import BEAT_BYTES, WORKER_MULTICAST, Flags, PacketType
from contract.registers import SWITCH_REGISTERS
from hdl.ctrl_port import RegisterPort
from hdl.header import HeaderLayout
from hdl.stream.axis import DATA_BITS, axis_signature
from hdl.switch.control import AggControl
from hdl.switch.header_check import CAUSE, CAUSE_NONE, HeaderCheck, cause_bits
from hdl.switch.lane_alu import LaneALU
from hdl.switch.slot_memory import ForwardedMemory

__all__ = ["Aggregator", "slot_state_layout", "check_parameters"]


# -- the parts the stages of Aggregator.elaborate hand each other ------------------------------
# (plain records of the signals a stage makes: the signals, their names and the order they
# are made in are the stages' own, so the netlist is the same however they are grouped)

@dataclasses.dataclass(frozen=True)
class _Blocks:
    """The module, its sizes and its blocks (memories, FIFO, checker, ALU, control)."""
    m: Module
    B: int              # payload beats of a packet
    D: int              # result FIFO depth
    S: int              # slots
    W: int              # workers of a job, at most
    slot_bits: int
    alu: object
    check: object
    ctl: object
    fifo: object
    meta: object
    rows: object
    stage_rd: object
    stage_wr: object


@dataclasses.dataclass(frozen=True)
class _Input:
    """The input's ready and what it has promised the result FIFO."""
    accept: Signal
    in_packet: Signal
    reserved: Signal


@dataclasses.dataclass(frozen=True)
class _StageA:
    """The registered input beat (stage A): header or payload, its lanes, its index."""
    data: Signal
    header: Signal
    is_header: Signal
    is_payload: Signal
    keep: Signal
    last: Signal
    valid: Signal
    hdr: object         # the header beat's fields (HeaderLayout)
    pay_index: Signal


@dataclasses.dataclass(frozen=True)
class _Packet:
    """What the header decided for the packet its payload beats belong to."""
    cause: Signal
    hdr: object
    keep_ok: Signal
    row_base: Signal


@dataclasses.dataclass(frozen=True)
class _Decision:
    """The header stages' reading of the slot: first, retransmission, mixed, completion, and
    for a result from upstream whether the slot is pending or final."""
    complete_new: Signal
    complete_stored: Signal
    exponent_new: Signal
    exponent_stored: Signal
    final_stored: Signal
    first: Signal
    from_upstream: Signal
    has_upstream: Signal
    mixed: Signal
    op_or: Signal
    retransmit: Signal
    state: object
    up_job: Signal
    up_worker: Signal


@dataclasses.dataclass(frozen=True)
class _End:
    """A packet's end (stage E2): good or its drop cause, its header and rows."""
    cause: Signal
    good: Signal
    hdr: object
    row_base: Signal
    valid: Signal


@dataclasses.dataclass(frozen=True)
class _Verdict:
    """Accepted or not, and the result (and its header) a completed slot sends."""
    accepted: Signal
    result: Signal
    result_hdr: object

FULL_KEEP = (1 << BEAT_BYTES) - 1
MAX_SLOTS = 0xFFFF     # the parameter register holds the pool size in 16 bits
MAX_LANES = 2048       # 8 KiB payloads: beyond any jumbo frame
MAX_JOBS = SWITCH_REGISTERS["job"].count   # the register map holds this many jobs


def slot_state_layout(max_workers):
    """Metadata row of one slot: per version (index 0 and 1) bitmap, count, op, exponent, and
    whether a complete round is final (a job with an upstream completes pending)."""
    version = data.StructLayout({
        "seen": unsigned(max_workers),
        "count": range(max_workers + 1),
        "op_or": unsigned(1),
        "exponent": signed(8),
        "final": unsigned(1),
    })
    return data.ArrayLayout(version, 2)


def check_parameters(slots, lanes, max_workers, jobs):
    """Raise a ``TypeError``/``ValueError`` naming the first bad aggregator parameter."""
    for name, value in (("slots", slots), ("lanes", lanes), ("max_workers", max_workers),
                        ("jobs", jobs)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"Aggregator parameter {name} must be an integer, not {value!r}")
    if not 1 <= slots <= MAX_SLOTS:
        raise ValueError(f"Aggregator slots must be 1..{MAX_SLOTS}, not {slots}")
    if not 8 <= lanes <= MAX_LANES or lanes % 8:
        raise ValueError(f"Aggregator lanes (P) must be a multiple of 8 in 8..{MAX_LANES} "
                         f"(whole 256-bit beats), not {lanes}")
    if not 1 <= max_workers <= 32:
        raise ValueError(f"Aggregator max_workers must be 1..32, not {max_workers}")
    if not 1 <= jobs <= MAX_JOBS:
        raise ValueError(f"Aggregator jobs must be 1..{MAX_JOBS}, not {jobs}")


class Aggregator(wiring.Component):
    """Streaming switch aggregator (see the module docstring).

    Parameters
    ----------
    slots : int
        Pool size (slot indices ``0 .. slots-1``), 1..65535.
    lanes : int
        ``P``, 32-bit lanes per packet, a multiple of 8 (one payload beat holds 8).
    max_workers : int
        Largest worker count of a job, 1..32 (width of the worker bitmaps).
    jobs : int
        Number of job configurations, 1..64.

    Attributes
    ----------
    i : In(axis_signature())
        Data packets (header beat first).
    o : Out(axis_signature())
        Result packets.
    ctrl : In(RegisterPort())
        Control registers (:mod:`hdl.switch.control`).
    drained : Out(1)
        The engine holds no packet (nothing in flight, between packets at the input): the
        condition on which its control block applies a commit. The network front end keeps
        its copy of the jobs' configuration in step with it (:mod:`hdl.net.job_workers`).
    """

    def __init__(self, *, slots=64, lanes=64, max_workers=32, jobs=4):
        check_parameters(slots, lanes, max_workers, jobs)
        self.slots, self.lanes, self.max_workers, self.jobs = slots, lanes, max_workers, jobs
        self.beats = lanes // 8
        super().__init__({
            "i": In(axis_signature()),
            "o": Out(axis_signature()),
            "ctrl": In(RegisterPort()),
            "drained": Out(1),
        })

    @property
    def result_fifo_depth(self):
        """Result FIFO beats: room for a queued result, one being written, one promised, and
        two more promised while the reservation and the registered room flag catch up."""
        return 6 * (self.beats + 1)

    @property
    def ram_bits_per_slot(self):
        """Block RAM bits per slot: two versions of ``P`` lanes plus the metadata row."""
        return 2 * self.beats * DATA_BITS + slot_state_layout(self.max_workers).size

    @property
    def ram_bits_fixed(self):
        """Memory bits independent of the pool size: staging rows and the result FIFO."""
        return self.beats * DATA_BITS + self.result_fifo_depth * (DATA_BITS + 1)

    def elaborate(self, platform):
        m = Module()
        S, P, W, B = self.slots, self.lanes, self.max_workers, self.beats
        D = self.result_fifo_depth
        slot_bits = ceil_log2(S)

        m.submodules.control = ctl = AggControl(slots=S, lanes=P, max_workers=W,
                                                jobs=self.jobs)
        wiring.connect(m, wiring.flipped(self.ctrl), ctl.ctrl)
        m.d.comb += self.drained.eq(ctl.drained)
        m.submodules.check = check = HeaderCheck(lanes=P, max_workers=W)
        m.submodules.meta = meta = ForwardedMemory(shape=slot_state_layout(W), depth=S)
        m.submodules.rows = rows = ForwardedMemory(shape=unsigned(DATA_BITS), depth=S * 2 * B)
        m.submodules.staging = staging = Memory(shape=unsigned(DATA_BITS), depth=B, init=[])
        stage_wr = staging.write_port()
        # Transparent: with P = 8 the commit reads the staging row in the cycle it is written.
        stage_rd = staging.read_port(transparent_for=(stage_wr,))
        m.submodules.alu = alu = LaneALU(lanes=DATA_BITS // 32)
        m.submodules.results = fifo = SyncFIFOBuffered(width=DATA_BITS + 1, depth=D)

        # The stages below take the parts they use and return the part they make.
        blocks = _Blocks(m=m, B=B, D=D, S=S, W=W, slot_bits=slot_bits, alu=alu, check=check,
                         ctl=ctl, fifo=fifo, meta=meta, rows=rows, stage_rd=stage_rd,
                         stage_wr=stage_wr)
        inp = self._input(blocks)
        a, pkt = self._stage_a(blocks, inp)
        dec = self._header_stages(blocks, a)
        self._payload_stages(blocks, a, dec)
        end = self._drop_cause(blocks, a, pkt)
        verdict = self._verdict(blocks, dec, end)
        self._commit(blocks, inp, end, verdict)
        self._output(blocks)
        return m

    def _input(self, blocks):
        """The input's ready: a beat is taken only while a whole result still fits the result
        FIFO.
        """
        B, D, ctl, fifo, m = blocks.B, blocks.D, blocks.ctl, blocks.fifo, blocks.m
        # -- input: take a beat when a whole result still fits -----------------------------
        accept = Signal()
        in_packet = Signal()            # the next input beat is a payload beat
        reserved = Signal(range(D + 1))  # FIFO beats promised to packet ends in flight
        quiet_cycles = B + 6            # last beat -> end of its commit, with margin
        quiet = Signal(range(quiet_cycles + 1))
        # Registered, so the FIFO level and the reservations stay out of the input's ready.
        # It is computed from `reserved` a clock old, which itself counts a packet end a
        # clock after it is taken (see below): the ends taken in the two clocks before and
        # the one taken now (B + 1 beats each) are not in it yet, hence 3 (B + 1) of margin.
        space_ok = Signal()
        m.d.sync += space_ok.eq(fifo.level + reserved + 3 * (B + 1) <= D)
        m.d.comb += [
            self.i.ready.eq(space_ok & ~(ctl.busy & ~in_packet)),
            accept.eq(self.i.valid & self.i.ready),
            ctl.drained.eq((quiet == 0) & ~in_packet),
        ]
        with m.If(accept):
            m.d.sync += [in_packet.eq(~self.i.payload.last), quiet.eq(quiet_cycles)]
        with m.Elif(quiet != 0):
            m.d.sync += quiet.eq(quiet - 1)
        return _Input(accept=accept, in_packet=in_packet, reserved=reserved)

    def _stage_a(self, blocks, inp):
        """Stage A, the input register: a header beat starts the header check and the metadata
        read, a payload beat reads its slot row.
        """
        B, S, check, ctl, m = blocks.B, blocks.S, blocks.check, blocks.ctl, blocks.m
        meta, rows, slot_bits = blocks.meta, blocks.rows, blocks.slot_bits
        accept, in_packet = inp.accept, inp.in_packet
        # -- stage A: the input register --------------------------------------------------
        a_valid = Signal()
        a_header = Signal()     # this beat is a header beat
        a_data = Signal(DATA_BITS)
        a_keep = Signal(BEAT_BYTES)
        a_last = Signal()
        m.d.sync += a_valid.eq(accept)
        with m.If(accept):
            m.d.sync += [
                a_header.eq(~in_packet),
                a_data.eq(self.i.payload.data),
                a_keep.eq(self.i.payload.keep),
                a_last.eq(self.i.payload.last),
            ]
        a_is_header = a_valid & a_header
        a_is_payload = a_valid & ~a_header
        hdr = data.View(HeaderLayout, a_data)
        slot_index = hdr.slot[:slot_bits]
        row_base = slot_index * (2 * B) + hdr.slot_version[0] * B
        m.d.comb += [
            ctl.lookup_job.eq(hdr.job),
            check.header.eq(a_data),
            check.job_configured.eq(ctl.lookup_configured),
            check.workers.eq(ctl.lookup_workers),
            check.slot_base.eq(ctl.lookup_base),
            check.slot_end.eq(ctl.lookup_end),
            meta.read_addr.eq(slot_index),   # used only for header beats
        ]

        # Packet registers, loaded by the header beat, valid until the next header beat.
        pkt_hdr = Signal(HeaderLayout)
        pkt_cause = Signal(cause_bits())
        pkt_row_base = Signal(range(S * 2 * B))
        pay_index = Signal(range(B + 1))   # payload beat number; B = beyond the payload
        row_addr = Signal(range(S * 2 * B))
        # Every beat but the last must be whole (aggregator-protocol.md section 2), the
        # header beat too; the last beat's tkeep is checked with the length at E1.
        pkt_keep_ok = Signal()
        with m.If(a_is_header):
            m.d.sync += [
                pkt_hdr.eq(a_data),
                pkt_cause.eq(check.cause),
                pkt_row_base.eq(row_base),
                row_addr.eq(row_base),
                pay_index.eq(0),
                pkt_keep_ok.eq(a_last | (a_keep == FULL_KEEP)),
            ]
        with m.If(a_is_payload):
            m.d.sync += row_addr.eq(row_addr + 1)
            with m.If(pay_index != B):
                m.d.sync += pay_index.eq(pay_index + 1)
            with m.If(~a_last & (a_keep != FULL_KEEP)):
                m.d.sync += pkt_keep_ok.eq(0)
        m.d.comb += rows.read_addr.eq(row_addr)
        return (_StageA(data=a_data, header=a_header, is_header=a_is_header,
                        is_payload=a_is_payload, keep=a_keep, last=a_last, valid=a_valid,
                        hdr=hdr, pay_index=pay_index),
                _Packet(cause=pkt_cause, hdr=pkt_hdr, keep_ok=pkt_keep_ok,
                        row_base=pkt_row_base))

    def _header_stages(self, blocks, a):
        """H1, H2: the header's fields meet the slot metadata two cycles later; the decisions
        of the contribution.
        """
        W, ctl, m, meta = blocks.W, blocks.ctl, blocks.m, blocks.meta
        a_is_header, hdr = a.is_header, a.hdr
        # -- H1, H2: header fields meet the slot metadata two cycles later ----------------
        fields = data.StructLayout({
            "worker": unsigned(8), "version": unsigned(1), "exponent": signed(8),
            "op_or": unsigned(1), "workers": range(W + 1),
            "from_upstream": unsigned(1), "has_upstream": unsigned(1),
            "up_job": unsigned(8), "up_worker": unsigned(8),
        })
        h1_valid, h2_valid = Signal(), Signal()
        h1, h2 = Signal(fields), Signal(fields)
        m.d.sync += [h1_valid.eq(a_is_header), h2_valid.eq(h1_valid), h2.eq(h1)]
        with m.If(a_is_header):
            m.d.sync += [
                h1.worker.eq(hdr.worker),
                h1.version.eq(hdr.slot_version[0]),
                h1.exponent.eq(hdr.exponent),
                h1.op_or.eq(hdr.type == PacketType.AGG_OR32),
                h1.workers.eq(ctl.lookup_workers),
                # Only results from upstream carry RESULT here: the network front end passes
                # no other (aggregator-protocol.md section 4).
                h1.from_upstream.eq((hdr.flags & Flags.RESULT).any()),
                h1.has_upstream.eq(ctl.lookup_upstream),
                h1.up_job.eq(ctl.lookup_up_job),
                h1.up_worker.eq(ctl.lookup_up_worker),
            ]

        # Decisions (cycle h+2), registered: valid from h+3 until the next packet's h+2,
        # which covers this packet's payload ALU stages and its verdict at tlast + 2.
        state = meta.read_data
        # One-hot; all zero for a worker >= W (dropped anyway) and for a result from upstream,
        # which changes no worker's bit.
        worker_bit = Signal(W)
        with m.If(~h2.from_upstream):
            m.d.comb += worker_bit.bit_select(h2.worker, 1).eq(1)
        cur_seen = Mux(h2.version, state[1].seen, state[0].seen)
        cur_count = Mux(h2.version, state[1].count, state[0].count)
        cur_op_or = Mux(h2.version, state[1].op_or, state[0].op_or)
        cur_final = Mux(h2.version, state[1].final, state[0].final)
        cur_exponent = Signal(signed(8))
        m.d.comb += cur_exponent.eq(Mux(h2.version, state[1].exponent, state[0].exponent))
        seen = (cur_seen & worker_bit) != 0
        first = (cur_count == 0) | (cur_count == h2.workers)
        # A result from upstream keeps the count and takes the value and exponent whole.
        new_count = Mux(h2.from_upstream, cur_count, Mux(first, 1, cur_count + 1))
        new_exponent = Signal(signed(8))
        m.d.comb += new_exponent.eq(Mux(first | h2.from_upstream | (h2.exponent > cur_exponent),
                                        h2.exponent, cur_exponent))
        new_state = Signal(slot_state_layout(W))
        for version in (0, 1):
            mine = h2.version == version
            m.d.comb += [
                new_state[version].seen.eq(Mux(mine, state[version].seen | worker_bit,
                                               state[version].seen & ~worker_bit)),
                new_state[version].count.eq(Mux(mine, new_count, state[version].count)),
                new_state[version].op_or.eq(Mux(mine & ~h2.from_upstream, h2.op_or,
                                                state[version].op_or)),
                new_state[version].exponent.eq(Mux(mine, new_exponent,
                                                   state[version].exponent)),
                # A contribution to a job with an upstream leaves its round pending; the
                # upstream's result makes it final.
                new_state[version].final.eq(Mux(mine, h2.from_upstream | ~h2.has_upstream,
                                                state[version].final)),
            ]
        dec_first, dec_op_or, dec_retransmit, dec_mixed = Signal(), Signal(), Signal(), Signal()
        dec_complete_stored, dec_complete_new = Signal(), Signal()
        dec_exponent_stored, dec_exponent_new = Signal(signed(8)), Signal(signed(8))
        dec_final_stored, dec_from_upstream, dec_has_upstream = Signal(), Signal(), Signal()
        dec_up_job, dec_up_worker = Signal(8), Signal(8)
        dec_state = Signal(slot_state_layout(W))
        with m.If(h2_valid):
            m.d.sync += [
                # The lane ALU takes a result from upstream as it takes a round's first value.
                dec_first.eq(first | h2.from_upstream),
                dec_op_or.eq(h2.op_or),
                dec_retransmit.eq(seen),
                dec_mixed.eq(~seen & ~first & ~h2.from_upstream & (cur_op_or != h2.op_or)),
                dec_final_stored.eq(cur_final),
                dec_from_upstream.eq(h2.from_upstream),
                dec_has_upstream.eq(h2.has_upstream),
                dec_up_job.eq(h2.up_job),
                dec_up_worker.eq(h2.up_worker),
                dec_complete_stored.eq(cur_count == h2.workers),
                dec_complete_new.eq(new_count == h2.workers),
                dec_exponent_stored.eq(cur_exponent),
                dec_exponent_new.eq(new_exponent),
                dec_state.eq(new_state),
            ]
        return _Decision(complete_new=dec_complete_new, complete_stored=dec_complete_stored,
                         exponent_new=dec_exponent_new, exponent_stored=dec_exponent_stored,
                         final_stored=dec_final_stored, first=dec_first,
                         from_upstream=dec_from_upstream, has_upstream=dec_has_upstream,
                         mixed=dec_mixed, op_or=dec_op_or, retransmit=dec_retransmit,
                         state=dec_state, up_job=dec_up_job, up_worker=dec_up_worker)

    def _payload_stages(self, blocks, a, dec):
        """B, C: a payload beat meets its slot row; the lane ALU's result goes to staging."""
        B, alu, m, rows, stage_wr = blocks.B, blocks.alu, blocks.m, blocks.rows, blocks.stage_wr
        a_data, a_is_payload, pay_index = a.data, a.is_payload, a.pay_index
        dec_first, dec_op_or, dec_retransmit = dec.first, dec.op_or, dec.retransmit
        # -- B, C: payload beat meets its slot row; the ALU result goes to staging ---------
        b_valid, c_valid = Signal(), Signal()
        b_row, c_row = Signal(range(B)), Signal(range(B))
        b_payload, c_payload = Signal(DATA_BITS), Signal(DATA_BITS)
        m.d.sync += [
            b_valid.eq(a_is_payload & (pay_index != B)),
            b_row.eq(pay_index),
            b_payload.eq(a_data),
            c_valid.eq(b_valid),
            c_row.eq(b_row),
            c_payload.eq(b_payload),
        ]
        m.d.comb += [
            alu.old.eq(rows.read_data),
            alu.payload.eq(c_payload),
            alu.first.eq(dec_first),
            alu.op_or.eq(dec_op_or),
            alu.keep_old.eq(dec_retransmit),   # a unicast answer re-sends the stored value
            stage_wr.en.eq(c_valid),
            stage_wr.addr.eq(c_row),
            stage_wr.data.eq(alu.result),
        ]

    def _drop_cause(self, blocks, a, pkt):
        """E1 (tlast + 1): the packet's drop cause, its length included."""
        B, S, m = blocks.B, blocks.S, blocks.m
        a_header, a_keep, a_last, a_valid = a.header, a.keep, a.last, a.valid
        pay_index = a.pay_index
        pkt_cause, pkt_hdr, pkt_keep_ok, pkt_row_base = pkt.cause, pkt.hdr, pkt.keep_ok, \
            pkt.row_base
        e1_valid, e1_length_ok, e1_short = Signal(), Signal(), Signal()
        m.d.sync += [
            e1_valid.eq(a_valid & a_last),
            e1_length_ok.eq(~a_header & (pay_index == B - 1) & (a_keep == FULL_KEEP)
                            & pkt_keep_ok),
            # Fewer than 32 bytes: no header at all, a length error whatever the bytes say.
            e1_short.eq(a_header & (a_keep != FULL_KEEP)),
        ]
        e1_cause = Signal(cause_bits())
        m.d.comb += e1_cause.eq(Mux((pkt_cause != CAUSE_NONE) & ~e1_short, pkt_cause,
                                    Mux(e1_length_ok, CAUSE_NONE, CAUSE["bad_length"])))
        e2_valid = Signal()
        # No drop cause, decoded a clock early: the verdict's result (the FIFO write and its
        # data, the commit, the reservations) then starts from registers.
        e2_good = Signal()
        e2_cause = Signal(cause_bits())
        e2_hdr = Signal(HeaderLayout)
        e2_row_base = Signal(range(S * 2 * B))
        m.d.sync += [e2_valid.eq(e1_valid), e2_good.eq(e1_valid & (e1_cause == CAUSE_NONE))]
        with m.If(e1_valid):
            m.d.sync += [
                e2_cause.eq(e1_cause),
                e2_hdr.eq(pkt_hdr),
                e2_row_base.eq(pkt_row_base),
            ]
        return _End(cause=e2_cause, good=e2_good, hdr=e2_hdr, row_base=e2_row_base,
                    valid=e2_valid)

    def _verdict(self, blocks, dec, end):
        """E2 (tlast + 2): the verdict, the counters, the metadata write and the result header.
        """
        ctl, m, meta, slot_bits = blocks.ctl, blocks.m, blocks.meta, blocks.slot_bits
        dec_complete_new, dec_complete_stored = dec.complete_new, dec.complete_stored
        dec_exponent_new, dec_exponent_stored = dec.exponent_new, dec.exponent_stored
        dec_mixed, dec_retransmit, dec_state = dec.mixed, dec.retransmit, dec.state
        e2_cause, e2_good, e2_hdr, e2_valid = end.cause, end.good, end.hdr, end.valid
        # -- E2 (tlast + 2): verdict --------------------------------------------------------
        good = e2_good            # e2_valid & (e2_cause == CAUSE_NONE)
        # A result from upstream (section 4) for a round of a job with an upstream: pending
        # (complete, not final) takes it, final drops it as a duplicate.
        from_up = good & dec.from_upstream
        up_complete = dec.has_upstream & dec_complete_stored
        up_taken = from_up & up_complete & ~dec.final_stored
        up_duplicate = from_up & up_complete & dec.final_stored
        contribution = good & ~dec.from_upstream
        retransmit = contribution & dec_retransmit
        mixed = contribution & ~dec_retransmit & dec_mixed
        accepted = contribution & ~dec_retransmit & ~dec_mixed
        unicast = retransmit & dec_complete_stored & dec.final_stored
        resend = retransmit & dec_complete_stored & ~dec.final_stored
        completed = accepted & dec_complete_new
        sent_up = completed & dec.has_upstream
        upward = sent_up | resend
        multicast = (completed & ~dec.has_upstream) | up_taken
        result = unicast | multicast | upward
        written = accepted | up_taken
        events = {
            "packets": e2_valid,
            "accepted": accepted,
            "results_multicast": completed & ~dec.has_upstream,
            "results_unicast": unicast,
            "retransmit_dropped": retransmit & ~dec_complete_stored,
            "drop_mixed_op": mixed,
            "upstream_sent": sent_up,
            "upstream_resent": resend,
            "results_upstream": up_taken,
            "drop_result_duplicate": up_duplicate,
            "drop_result_unexpected": from_up & ~up_complete,
        }
        for cause in AGG_DROP_CAUSES:
            if cause != "mixed_op":
                events[f"drop_{cause}"] = e2_valid & (e2_cause == CAUSE[cause])
        assert set(events) == set(AGG_COUNTERS)
        m.d.comb += ctl.count_inc.eq(Cat(events[name] for name in AGG_COUNTERS))

        # Metadata: the verdict's write, or a slot being cleared by a job commit (the
        # control only clears while the engine is drained, so the two never meet).
        with m.If(ctl.clear_en):
            m.d.comb += [
                meta.write_en.eq(1),
                meta.write_addr.eq(ctl.clear_slot),
                meta.write_data.eq(0),
            ]
        with m.Else():
            m.d.comb += [
                meta.write_en.eq(written),
                meta.write_addr.eq(e2_hdr.slot[:slot_bits]),
                meta.write_data.eq(dec_state),
            ]

        # A result, or (upward) the round's aggregate as a contribution to the upstream's job.
        result_hdr = Signal(HeaderLayout)
        m.d.comb += [
            result_hdr.eq(e2_hdr),
            result_hdr.flags.eq(Mux(upward, e2_hdr.flags & (0xFF ^ Flags.RESULT),
                                    e2_hdr.flags | Flags.RESULT)),
            result_hdr.job.eq(Mux(upward, dec.up_job, e2_hdr.job)),
            result_hdr.worker.eq(Mux(unicast, e2_hdr.worker,
                                     Mux(upward, dec.up_worker, WORKER_MULTICAST))),
            result_hdr.exponent.eq(Mux(unicast | resend, dec_exponent_stored,
                                       dec_exponent_new)),
            result_hdr.reserved0.eq(0),
            result_hdr.reserved1.eq(0),
        ]
        return _Verdict(accepted=written, result=result, result_hdr=result_hdr)

    def _commit(self, blocks, inp, end, verdict):
        """Commit, B cycles: staging row i goes to slot row i (if accepted) and to the result
        FIFO (if a result is due).
        """
        B, D, S, fifo, m = blocks.B, blocks.D, blocks.S, blocks.fifo, blocks.m
        rows, stage_rd = blocks.rows, blocks.stage_rd
        accept, reserved = inp.accept, inp.reserved
        e2_row_base, e2_valid = end.row_base, end.valid
        accepted, result, result_hdr = verdict.accepted, verdict.result, verdict.result_hdr
        # -- commit: B cycles, staging row i -> slot row i and/or the result FIFO ---------
        cm_active, cm_write, cm_push = Signal(), Signal(), Signal()
        cm_row = Signal(range(B))
        cm_addr = Signal(range(S * 2 * B))
        m.d.comb += stage_rd.addr.eq(Mux(cm_active, cm_row + 1, 0))
        with m.If(cm_active):
            m.d.comb += [
                rows.write_en.eq(cm_write),
                rows.write_addr.eq(cm_addr),
                rows.write_data.eq(stage_rd.data),
            ]
            m.d.sync += [cm_row.eq(cm_row + 1), cm_addr.eq(cm_addr + 1)]
            with m.If(cm_row == B - 1):
                m.d.sync += cm_active.eq(0)
        # A packet's verdict comes B + 1 cycles after the previous one's at the earliest,
        # when that commit is over: starting here never cuts one short.
        with m.If(accepted | result):
            m.d.sync += [
                cm_active.eq(1),
                cm_row.eq(0),
                cm_addr.eq(e2_row_base),
                cm_write.eq(accepted),
                cm_push.eq(result),
            ]
        with m.If(result):
            m.d.comb += [fifo.w_en.eq(1), fifo.w_data.eq(Cat(result_hdr.as_value(), 0))]
        with m.Elif(cm_active & cm_push):
            m.d.comb += [fifo.w_en.eq(1),
                         fifo.w_data.eq(Cat(stage_rd.data, cm_row == B - 1))]

        # Reservations: B + 1 beats per packet end taken at the input, returned by a verdict
        # without a result, or consumed beat by beat as the result is written.
        # The reservation of an end taken is added a clock later, so that the input's
        # accept (a function of the control's busy flag) does not run into this adder; the
        # verdict that may return it comes three clocks after the end at the earliest.
        # Whether a verdict gives a result is known late (a decode that also drives the
        # FIFO's data), so it only picks between two sums of registers, after the adders:
        # every verdict gives back one beat (its result's header, written now, or the first
        # of the B + 1 it returns), and one without a result B more. Commit beats are
        # counted apart: one can be written in a verdict's clock only if that verdict drops
        # a short packet (a whole packet's comes after the commit before it is over).
        end_taken = Signal()
        m.d.sync += end_taken.eq(accept & self.i.payload.last)
        taken = Mux(end_taken, B + 1, 0)
        commit_beat = cm_active & cm_push
        base = Signal(range(D + B + 2))   # the next `reserved`, unless a verdict returns B
        m.d.comb += base.eq(reserved + taken - e2_valid - commit_beat)
        returned = e2_valid & ~result
        m.d.sync += reserved.eq(Mux(returned, base - B, base))

    def _output(self, blocks):
        """The output: the result FIFO's beats onto ``o``."""
        fifo, m = blocks.fifo, blocks.m
        # -- output -------------------------------------------------------------------------
        m.d.comb += [
            self.o.valid.eq(fifo.r_rdy),
            self.o.payload.data.eq(fifo.r_data[:DATA_BITS]),
            self.o.payload.last.eq(fifo.r_data[DATA_BITS]),
            self.o.payload.keep.eq(FULL_KEEP),
            fifo.r_en.eq(self.o.ready),
        ]
