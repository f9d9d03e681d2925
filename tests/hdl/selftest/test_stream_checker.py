# amaranth: UnusedElaboratable=no
"""The stream checker counts differences and stalls."""


from hdl.selftest.stream_checker import StreamChecker
from tests.amaranth_sim import run

# -- the stream checker ----------------------------------------------------------------------------

def test_stream_checker_counts_differences_and_stalls():
    dut = StreamChecker(stall_limit=50)
    # (expected, received) beats: (data, keep, last)
    good = [((5, 0xFFFFFFFF, 0), (5, 0xFFFFFFFF, 0)), ((7, 0xF, 1), (7 | 1 << 40, 0xF, 1))]
    bad = [((1, 0xFFFFFFFF, 0), (3, 0xFFFFFFFF, 0)),      # lane 0 differs
           ((9, 0xF, 1), (9, 0xFF, 1)),                    # keep differs
           ((2, 0xFFFFFFFF, 1), (2, 0xFFFFFFFF, 0)),       # last differs
           ((4, 0xFFFFFFFF, 1), (4, 0xFFFFFFFF, 1))]       # same
    pairs = good + bad

    async def tb(ctx):
        for (exp, rcv) in pairs:
            for stream, beat in ((dut.expected, exp), (dut.received, rcv)):
                ctx.set(stream.valid, 1)
                ctx.set(stream.payload, {"data": beat[0], "keep": beat[1], "last": beat[2]})
            await ctx.tick()
        ctx.set(dut.received.valid, 0)
        await ctx.tick().repeat(5)
        assert ctx.get(dut.beats) == 6
        assert ctx.get(dut.packets) == 4         # by expected last
        assert ctx.get(dut.errors) == 3
        assert ctx.get(dut.bad_packets) == 2     # the packet ending at beat 4 and at beat 5
        await ctx.tick().repeat(60)              # expected waiting, nothing received
        assert ctx.get(dut.errors) == 4 and ctx.get(dut.error)

    run(dut, tb)
