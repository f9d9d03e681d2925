"""The network core without Verilator: configuration, generation, wrapper, echo (fast)."""
import random
import re

import pytest
from amaranth.hdl import Fragment
from amaranth.sim import Simulator

from hdl.net.core.echo import UdpEcho
from hdl.net.core.eth_core import LiteEthCore, rgmii_ports
from hdl.net.core.liteeth import (EVENTS, NETWORK_FILE, RGMII_PINS, generate, load_network_config,
                             parse_ports)

BOARDS = ("ecpix5", "versa", "colorlight")
#: amaranth-boards platform of each board (as constraints/boards.toml names them).
PLATFORMS = {
    "ecpix5": ("amaranth_boards.ecpix5", "ECPIX585Platform"),
    "versa": ("amaranth_boards.versa_ecp5", "VersaECP5Platform"),
    "colorlight": ("amaranth_boards.colorlight_5a75b_r7_0", "Colorlight_5A75B_R70Platform"),
}


def platform_of(board):
    import importlib
    module, cls = PLATFORMS[board]
    return getattr(importlib.import_module(module), cls)()


@pytest.mark.parametrize("board", BOARDS)
def test_config_matches_spec_and_board(board):
    import inspect
    from hdl.switch.aggregator import Aggregator
    config = load_network_config(board)
    assert config.mac_address == "02:47:57:00:00:01" and config.ip_address == "192.168.77.2"
    assert dict(config.udp_ports) == {"nic_tx": 47570, "nic_rx": 47571, "switch": 47572,
                                      "control": 47573}
    defaults = inspect.signature(Aggregator).parameters
    assert config.arp_entries >= (defaults["jobs"].default * defaults["max_workers"].default
                                  + 1), "every worker of every job plus a controller"
    assert config.max_frame == 9018
    assert config.arp_timeout_s == 0.1, "LiteEth's ARP request period, on a board"
    # The pins named exist on the board's resource, in the direction the core drives them.
    name, number = config.resource
    resource = platform_of(board).lookup(name, number)
    subsignals = {sub.name: sub for sub in resource.ios}
    for pin in RGMII_PINS:
        sub = subsignals[config.pins[pin]]
        assert sub.ios[0].dir == ("o" if pin.startswith("tx") else "i"), (pin, sub)


@pytest.mark.parametrize("key,value,message", [
    ("mac_address", "03:47:57:00:00:01", "multicast"),
    ("mac_address", "02:47:57:00:00", "MAC address must look like"),
    ("ip_address", "192.168.77.255", "cannot be a board address"),
    ("ip_address", "192.168.77", "dotted decimal"),
    ("tx_delay_ns", 3.2, "tx_delay_ns must be"),
    ("arp_entries", 1, "arp_entries must be"),
    ("arp_timeout_s", 0, "arp_timeout_s must be"),
    ("arp_timeout_s", True, "arp_timeout_s must be"),
    ("sys_clk_hz", 25_000_000, "sys_clk_hz must be"),
    ("icmp_fifo_depth", 100, "power of two"),
    ("udp_ports", {"a": 1, "b": 1}, "distinct"),
])
def test_config_errors(key, value, message):
    with pytest.raises(ValueError, match=message):
        load_network_config("ecpix5", **{key: value})


def test_config_unknown_board_and_keys(tmp_path):
    with pytest.raises(ValueError, match="known: colorlight, ecpix5, versa"):
        load_network_config("arty")
    with pytest.raises(ValueError, match="unknown keys mtu"):
        load_network_config("ecpix5", mtu=1500)
    broken = tmp_path / "network.toml"
    broken.write_text(NETWORK_FILE.read_text().replace("arp_entries = 129\n", ""))
    with pytest.raises(ValueError, match="missing keys arp_entries"):
        load_network_config("versa", path=broken)


def test_generation_cached_and_complete(tmp_path):
    config = load_network_config("ecpix5")
    core = generate(config, build_root=tmp_path)
    mtime = core.verilog_path.stat().st_mtime_ns
    assert generate(config, build_root=tmp_path).verilog_path.stat().st_mtime_ns == mtime
    # Another address is another core (the address is compared in gateware).
    other = generate(config.replace(ip_address="10.0.0.2"), build_root=tmp_path)
    assert other.verilog_path != core.verilog_path
    text = core.verilog()
    assert "32'd3232255234" in text or "c0a84d02" in text.lower()    # 192.168.77.2
    assert {p.name for p in core.ports} >= {f"ev_{name}" for name in EVENTS}
    assert parse_ports(text) == core.ports
    Fragment.get(LiteEthCore(core), None)               # the wrapper accepts its ports
    # Only the ECP5 cells the simulation models exist for, no bidirectional pins (MDIO).
    import re
    cells = set(re.findall(r"^([A-Z][A-Z0-9_]+)\s*(?:#\(|\w+\s*\()", text, re.M))
    assert cells == {"IDDRX1F", "ODDRX1F", "DELAYG", "FD1S3BX"}, cells
    assert "inout" not in text.split(");", 1)[0]


@pytest.mark.parametrize("board", BOARDS)
def test_delays_reach_the_pins(board):
    config = load_network_config(board)
    text = generate(config).verilog()
    taps = [int(v) for v in re.findall(r"\.DEL_VALUE \(\d+'d(\d+)\)", text)]
    # 1 tx clock + 5 tx (ctl, data) at 0 taps, 5 rx (ctl, data) at the rx delay.
    assert sorted(taps) == sorted([round(config.tx_delay_ns / 0.025)] + [0] * 5
                                  + [round(config.rx_delay_ns / 0.025)] * 5)


@pytest.mark.parametrize("board", BOARDS)
def test_wrapper_elaborates_on_board_pins(board):
    config = load_network_config(board)
    core = generate(config)
    platform = platform_of(board)
    name, number = config.resource
    pins = rgmii_ports(platform.request(name, number, dir="-"), config.pins)
    Fragment.get(LiteEthCore(core, rgmii=pins), platform)
    assert "liteeth_core.v" in platform.extra_files


# A component that refuses its arguments is never elaborated: its warning says so.
@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_wrapper_checks_arguments():
    with pytest.raises(TypeError, match="GeneratedCore"):
        LiteEthCore("liteeth_core.v")
    core = generate(load_network_config("ecpix5"))
    with pytest.raises(ValueError, match="rgmii must map exactly"):
        LiteEthCore(core, rgmii={"tx_clk": None})
    import gc
    gc.collect()          # the refused components' warnings now, under this test's filter


def test_echo_store_and_forward(seed=5, datagrams=60):
    """UdpEcho: good datagrams back exact with ports swapped; errored/oversize ones dropped."""
    rng = random.Random(seed)
    depth = 64
    dut = UdpEcho(depth=depth, queue=4)
    sent = []
    for n in range(datagrams):
        length = rng.choice([0, 1, 3, 4, 5, rng.randint(1, 4 * depth + 8)])
        payload = bytes(rng.getrandbits(8) for _ in range(length))
        sent.append(dict(payload=payload, error=rng.random() < 0.2,
                         ip=rng.getrandbits(32), sport=rng.getrandbits(16),
                         dport=rng.getrandbits(16)))
    got = []
    totals = {}

    async def producer(ctx):
        for d in sent:
            words = [int.from_bytes(d["payload"][i:i + 4], "little")
                     for i in range(0, max(len(d["payload"]), 1), 4)]
            for i, word in enumerate(words):
                last = i == len(words) - 1
                ctx.set(dut.rx.valid, 1)
                ctx.set(dut.rx.p, {"data": word, "last": last, "error": d["error"] and last,
                                   "last_be": 0,
                                   "meta": {"ip_address": d["ip"], "src_port": d["sport"],
                                            "dst_port": d["dport"],
                                            "length": len(d["payload"])}})
                await ctx.tick()
                assert ctx.get(dut.rx.ready)
            ctx.set(dut.rx.valid, 0)
            for _ in range(rng.choice([0, 0, 1, 40])):
                await ctx.tick()
        for _ in range(20 * depth):        # drain: the echo answers what it queued
            await ctx.tick()
        totals.update(echoed=ctx.get(dut.echoed), dropped=ctx.get(dut.dropped))

    async def consumer(ctx):
        beats = []
        while True:
            ctx.set(dut.tx.ready, rng.random() < 0.7)
            _, _, valid, ready, p = await ctx.tick().sample(dut.tx.valid, dut.tx.ready, dut.tx.p)
            if valid and ready:
                beats.append(int(p.data))
                if p.last:
                    length = int(p.meta.length)
                    tail = length % 4
                    assert int(p.last_be) == 1 << ((tail - 1) % 4)
                    data = b"".join(b.to_bytes(4, "little") for b in beats)[:length]
                    got.append(dict(payload=data, ip=int(p.meta.ip_address),
                                    sport=int(p.meta.dst_port), dport=int(p.meta.src_port)))
                    beats = []

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(producer)
    sim.add_testbench(consumer, background=True)
    sim.run()
    # With a 64-word buffer and a slow consumer, some good datagrams may not fit: the echo
    # answers a subsequence of the good ones, in order, and counts the rest as dropped.
    good = [dict(payload=d["payload"], ip=d["ip"], sport=d["sport"], dport=d["dport"])
            for d in sent if not d["error"] and 0 < len(d["payload"]) <= 4 * depth]
    it = iter(good)
    assert all(any(g == x for x in it) for g in got), "echo reordered or corrupted a datagram"
    assert len(got) > len(good) // 2
    assert totals == {"echoed": len(got), "dropped": len(sent) - len(got)}
