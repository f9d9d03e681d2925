"""Section 7's counters and registers (``docs/protocol/network.md``): host side only for now.

They are declared apart from what the gateware serves (``NET_COUNTERS``, ``NET_REGISTERS``),
so that the gateware and the contract keep agreeing until the gateware follows; these
tests hold the two apart and make sure the addresses are free for them to land on.
"""
from contract import counters, network, registers
from contract.counters import AUTH_COUNTERS, NET_COUNTERS
from contract.registers import AUTH_REGISTERS, NET_REGISTERS, REGISTER_MAPS


def test_auth_counters_are_not_the_gateware_counters():
    assert AUTH_COUNTERS == ("drop_bad_tag", "drop_replay")
    assert not set(AUTH_COUNTERS) & set(NET_COUNTERS)
    assert "AUTH_COUNTERS" in counters.__all__


def test_auth_registers_take_addresses_the_net_map_leaves_free():
    net = {address for entry in NET_REGISTERS for address, _, _ in entry.addresses()}
    auth = {address for entry in AUTH_REGISTERS for address, _, _ in entry.addresses()}
    assert auth and not auth & net
    # where the gateware puts them when it follows: the counters after NET_COUNTERS'
    block = AUTH_REGISTERS["auth_counter"]
    assert block.base == NET_REGISTERS["counter"].end
    assert dict(block.items()) == {name: block.base + i for i, name in enumerate(AUTH_COUNTERS)}
    low, high = AUTH_REGISTERS["write_counter_low"], AUTH_REGISTERS["write_counter_high"]
    assert high.address == low.address + 1          # low word first
    assert low.access is high.access is registers.Access.R
    # not in the maps the gateware serves and docs/registers.md prints
    assert AUTH_REGISTERS not in REGISTER_MAPS.values()


def test_auth_ctrl_layout():
    assert network.CTRL_AUTH_KEY_BYTES == 16
    assert (network.CTRL_COUNTER_OFFSET, network.CTRL_COUNTER_BYTES) == (16, 8)
    assert (network.CTRL_TAG_OFFSET, network.CTRL_TAG_BYTES) == \
        (network.CTRL_KEY_OFFSET, network.CTRL_KEY_BYTES)
