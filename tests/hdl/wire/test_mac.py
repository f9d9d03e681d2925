"""The wire's MAC (``hdl/wire/mac.py``: LiteEth's PHY and MAC on both ports): configuration,
generation, wrapper."""
import pytest
from amaranth.hdl import Fragment

from hdl.net.core.eth_core import rgmii_ports
from hdl.net.core.liteeth import (CORE_MODULES, RGMII_PINS, generate, load_network_config,
                                  parse_ports)
from hdl.wire.mac import LiteEthWireCore
from tests.hdl.net.core.test_eth_core import BOARDS, platform_of

TWO_PORT_BOARDS = ("versa",)


@pytest.mark.parametrize("board", BOARDS)
def test_second_port_only_where_the_board_has_one(board):
    config = load_network_config(board)
    assert config.two_ports == (board in TWO_PORT_BOARDS)
    if not config.two_ports:
        with pytest.raises(ValueError, match="one RGMII port"):
            generate(config, kind="wire")
        return
    # port 1 names pins that exist on its resource, in the direction the core drives them
    name, number = config.port1_resource
    assert (name, number) != tuple(config.resource)
    subsignals = {sub.name: sub for sub in platform_of(board).lookup(name, number).ios}
    for pin in RGMII_PINS:
        sub = subsignals[config.port1_pins[pin]]
        assert sub.ios[0].dir == ("o" if pin.startswith("tx") else "i"), (pin, sub)


def test_second_port_checked():
    config = load_network_config("versa")
    with pytest.raises(ValueError, match="go together"):
        config.replace(port1_pins=None)
    with pytest.raises(ValueError, match="port1_pins must name exactly"):
        config.replace(port1_pins={"tx_clk": "tx_clk"})
    with pytest.raises(ValueError, match="port 0's resource"):
        config.replace(port1_resource=config.resource)
    with pytest.raises(ValueError, match="kind must be one of"):
        generate(config, kind="bridge")


def test_wire_core_generated_with_both_ports(tmp_path):
    config = load_network_config("versa")
    core = generate(config, tmp_path, kind="wire")
    assert core.module == CORE_MODULES["wire"] and core.verilog_path.name == "liteeth_wire.v"
    text = core.verilog()
    # each port's PHY in clock domains of its own (LiteEth names both eth_rx/eth_tx)
    for p in (0, 1):
        assert f"eth{p}_rx_clk" in text and f"eth{p}_tx_clk" in text
    # nothing of LiteEth's IP stack: the wire parses frames itself
    assert "arp" not in text.lower() and "icmp" not in text.lower()
    assert parse_ports(text, "liteeth_wire") == core.ports
    # the network core of the same board is another module in another file
    network = generate(config, tmp_path)
    assert network.module == "liteeth_core" and network.verilog_path != core.verilog_path
    again = generate(config, tmp_path, kind="wire")
    assert again.verilog_path == core.verilog_path


def test_wrapper_elaborates_on_board_pins():
    config = load_network_config("versa")
    core = generate(config, kind="wire")
    platform = platform_of("versa")
    rgmii = tuple(rgmii_ports(platform.request(*resource, dir="-"), pins)
                  for resource, pins in ((config.resource, config.pins),
                                         (config.port1_resource, config.port1_pins)))
    wrapper = LiteEthWireCore(core, rgmii=rgmii)
    Fragment.get(wrapper, platform)
    assert "liteeth_wire.v" in platform.extra_files


def test_wrapper_checks_arguments():
    config = load_network_config("versa")
    with pytest.raises(TypeError, match="the wire core"):
        LiteEthWireCore(generate(config))          # the network core
    core = generate(config, kind="wire")
    with pytest.raises(TypeError, match="clock domain"):
        LiteEthWireCore(core, domain="")
    with pytest.raises(ValueError, match="one dict per port"):
        LiteEthWireCore(core, rgmii=({},))
    wrapper = LiteEthWireCore(core)
    assert [port.name for port in wrapper.rgmii[1].values()][0].startswith("rgmii1_")
