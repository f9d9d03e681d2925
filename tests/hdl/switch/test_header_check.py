# amaranth: UnusedElaboratable=no
"""The header check's drop causes and their priority against a reference."""
import random

from contract.counters import AGG_DROP_CAUSES
from contract.header import Flags, MAGIC, VERSION, Header, PacketType
from hdl.switch.header_check import CAUSE, CAUSE_NONE, HeaderCheck
from tests.amaranth_sim import run

# -- HeaderCheck ---------------------------------------------------------------------------

def reference_header_cause(h: Header, *, lanes, configured, workers, base, end):
    """The contract's header-time checks, in priority order (None = passes)."""
    if h.magic != MAGIC or h.version != VERSION:
        return "bad_header"
    if h.type not in (PacketType.AGG_ADD_I32, PacketType.AGG_OR32):
        return "bad_type"
    if not configured:
        return "unconfigured_job"
    if not h.flags & Flags.RESULT and h.worker >= workers:   # a result from upstream: any
        return "bad_worker"
    if not base <= h.slot < end:
        return "bad_slot"
    if h.slot_version not in (0, 1):
        return "bad_slot_version"
    if h.count != lanes:
        return "bad_count"
    return None


def test_header_check_priority():
    rng = random.Random(4)
    lanes, max_workers = 64, 32
    dut = HeaderCheck(lanes=lanes, max_workers=max_workers)

    def field(good, bad, p=0.15):
        return bad() if rng.random() < p else good

    causes = set()

    async def bench(ctx):
        for _ in range(3000):
            workers = rng.randrange(1, max_workers + 1)
            base = rng.randrange(0, 100)
            end = base + rng.randrange(0, 20)
            configured = rng.random() > 0.1
            h = Header(
                magic=field(MAGIC, lambda: rng.randrange(256)),
                version=field(VERSION, lambda: rng.randrange(256)),
                type=field(rng.choice([2, 3]), lambda: rng.randrange(256)),
                worker=field(rng.randrange(workers), lambda: rng.randrange(workers, 256)),
                slot=field(rng.randrange(base, end) if end > base else base,
                           lambda: rng.choice([rng.randrange(0, base + 1),
                                               rng.randrange(end, 0x10000)])),
                count=field(lanes, lambda: rng.choice([0, lanes - 1, lanes + 1,
                                                       rng.getrandbits(32)])),
                slot_version=field(rng.randrange(2), lambda: rng.randrange(2, 256)),
                job=rng.randrange(256), flags=rng.randrange(256), k=rng.randrange(256),
                exponent=rng.randrange(-128, 128), seq=rng.getrandbits(32),
                offset=rng.getrandbits(32))
            ctx.set(dut.header.as_value(), h.to_int())
            ctx.set(dut.job_configured, configured)
            ctx.set(dut.workers, workers)
            ctx.set(dut.slot_base, base)
            ctx.set(dut.slot_end, end)
            want = reference_header_cause(h, lanes=lanes, configured=configured,
                                          workers=workers, base=base, end=end)
            causes.add(want)
            got = ctx.get(dut.cause)
            assert got == (CAUSE_NONE if want is None else CAUSE[want]), (str(h), want, got)

    run(dut, bench, clocked=False)
    # Every header-time cause and the good case were exercised.
    assert causes == {None, *AGG_DROP_CAUSES[:AGG_DROP_CAUSES.index("bad_count") + 1]}
