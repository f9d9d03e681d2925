"""RegisterRouter and NetRegisters: the CTRL address space, decoded from the contract."""
import random

from amaranth import Module
from amaranth.lib import wiring

from contract.counters import NET_COUNTERS
from contract.network import network_address
from contract.registers import NET_REGISTERS
from hdl.net.front_end.ctrl_service import REGISTER_ADDRESS_SETUP, REGISTER_READ_LATENCY
from hdl.net.front_end.registers import NetRegisters, RegisterRouter
from tests.amaranth_sim import run

MAC, IP, BASE = 0x024757000001, 0xC0A84D02, 47570


def build(nic=True, switch=True):
    router = RegisterRouter(nic=nic, switch=switch)
    net = NetRegisters(mac=MAC, ip=IP, port_base=BASE, services=0b1101, jobs=4, max_workers=8)
    top = Module()
    top.submodules.router, top.submodules.net = router, net
    wiring.connect(top, router.net, net.ctrl)
    return top, router, net


async def access(ctx, bus, addr, value=None):
    """A write (when ``value`` is given) and a read of ``addr``, as the control service
    does them: address and value first, the strobes ``REGISTER_ADDRESS_SETUP`` clocks
    later."""
    ctx.set(bus.addr, addr)
    if value is not None:
        ctx.set(bus.wdata, value)
    for _ in range(REGISTER_ADDRESS_SETUP):
        await ctx.tick()
    if value is not None:
        ctx.set(bus.we, 1)
        await ctx.tick()
        ctx.set(bus.we, 0)
    ctx.set(bus.re, 1)
    await ctx.tick()
    ctx.set(bus.re, 0)
    for _ in range(REGISTER_READ_LATENCY - 1):
        await ctx.tick()
    return ctx.get(bus.rdata)


def test_regions_constants_counters_and_table():
    rng = random.Random(1)
    top, router, net = build()
    counts = {name: rng.randint(0, 5) for name in NET_COUNTERS}
    counts["drop_reply_full"] = 0

    async def bench(ctx):
        bus = router.bus
        # the engines' regions: address and strobes reach the port, data comes back
        ctx.set(router.switch.rdata, 0x5A5A)
        ctx.set(router.nic.rdata, 0xA5A5)
        addr = network_address("switch", NET_REGISTERS["ip"].address)  # any local address
        assert await access(ctx, bus, addr) == 0x5A5A
        assert await access(ctx, bus, network_address("nic", 3)) == 0xA5A5
        assert await access(ctx, bus, 3 << 16) == 0         # no such region
        # events -> counters (several per clock for reply_full)
        for name, n in counts.items():
            for _ in range(n):
                ctx.set(net.events[name], 1)
                await ctx.tick()
                ctx.set(net.events[name], 0)
        ctx.set(net.events.drop_reply_full, 3)
        await ctx.tick()
        ctx.set(net.events.drop_reply_full, 0)
        counts["drop_reply_full"] = 3
        for name, address in NET_REGISTERS["counter"].items():
            assert await access(ctx, bus, network_address("net", address)) == counts[name], name
            assert ctx.get(net.counters[name]) == counts[name]
        reg = lambda name: network_address("net", NET_REGISTERS[name].address)
        assert await access(ctx, bus, reg("mac_high")) == MAC >> 32
        assert await access(ctx, bus, reg("mac_low")) == MAC & 0xFFFFFFFF
        assert await access(ctx, bus, reg("ip")) == IP
        assert await access(ctx, bus, reg("port_base")) == BASE
        assert await access(ctx, bus, reg("services")) == 0b1101
        assert await access(ctx, bus, reg("link")) == 0
        ctx.set(net.link, 1)
        assert await access(ctx, bus, reg("link")) == 1
        # read-only registers ignore writes
        assert await access(ctx, bus, reg("ip"), 0) == IP
        # the worker table through its registers and a lookup port
        worker = NET_REGISTERS["worker"]
        ip_addr = network_address("net", worker.address(3 * 32 + 5, "ip"))
        port_addr = network_address("net", worker.address(3 * 32 + 5, "port"))
        assert await access(ctx, bus, ip_addr, 0x0A000005) == 0x0A000005
        assert await access(ctx, bus, port_addr, 0x1234ABCD) == 0xABCD      # 16 bits
        outside = network_address("net", worker.address(3 * 32 + 8, "port"))  # worker 8
        assert await access(ctx, bus, outside, 77) == 0
        ctx.set(net.check.job, 3)
        ctx.set(net.check.worker, 5)
        ctx.set(net.check.en, 1)
        await ctx.tick()
        ctx.set(net.check.en, 0)
        assert ctx.get(net.check.valid)
        assert (ctx.get(net.check.entry.ip_address), ctx.get(net.check.entry.port)) == \
            (0x0A000005, 0xABCD)

    run(top, bench)


def test_absent_engine_region_reads_zero_and_is_never_strobed():
    top, router, net = build(nic=False)

    async def bench(ctx):
        ctx.set(router.nic.rdata, 0xFFFF)
        strobes = []
        ctx.set(router.bus.addr, network_address("nic", 0))
        for _ in range(REGISTER_ADDRESS_SETUP):
            await ctx.tick()
        ctx.set(router.bus.re, 1)
        await ctx.tick()
        strobes.append(ctx.get(router.nic.re))
        ctx.set(router.bus.re, 0)
        for _ in range(REGISTER_READ_LATENCY - 1):
            await ctx.tick()
            strobes.append(ctx.get(router.nic.re))
        assert ctx.get(router.bus.rdata) == 0
        assert strobes == [0] * REGISTER_READ_LATENCY

    run(top, bench)
