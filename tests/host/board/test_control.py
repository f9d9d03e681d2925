"""``BackendControl`` (``host/board/control.py``): control requests to a board backend in
this process, read and written as ``UdpTransport`` does over the network."""
import pytest

from contract.network import NET_REGISTERS, ip_to_int, network_address
from contract.registers import SWITCH_REGISTERS, JobStatus
from host.board.control import BackendControl
from host.board.golden import GoldenBoard
from host.driver.switch import SwitchInterface
from host.driver.transport import TransportError
from host.driver.udp_worker import configure_job

KEY = 0x1122334455667788


def board():
    return GoldenBoard(KEY, ip="10.0.0.7", port_base=40100, slots=16)


def test_the_drivers_configuration_runs_over_it():
    b = board()
    control = BackendControl(b, region="switch")
    layout = configure_job(control, 1, [("10.0.9.1", 40000), ("10.0.9.2", 40000)],
                           slot_base=2, slot_count=4)
    assert (layout.workers, layout.slot_base, layout.slot_count) == (2, 2, 4)
    assert b.aggregator.job_config(1).workers == 2
    assert b.worker_table[(1, 1)] == (ip_to_int("10.0.9.2"), 40000)
    assert SwitchInterface(control).job_status(1) == JobStatus(0)
    # more than 64 registers: requests of at most 64 pairs
    before = control.requests
    counters = control.read_many([a for _, a in SWITCH_REGISTERS["counter"].items()] * 4)
    assert len(counters) == 4 * len(list(SWITCH_REGISTERS["counter"].items())) and \
        control.requests - before == -(-len(counters) // 64)


def test_full_addresses_and_the_read_back_check():
    b = board()
    control = BackendControl(b)
    address = network_address("net", NET_REGISTERS["worker"].address(0, "port"))
    assert control.write_many([(address, 5)]) == [5]
    with pytest.raises(TransportError, match=r"net.ip .* reads back 0xa000007 after a write of 0x5"):
        control.write(network_address("net", NET_REGISTERS["ip"].address), 5)


def test_a_wrong_key_gets_no_reply():
    with pytest.raises(TransportError, match="none: a wrong key"):
        BackendControl(board(), key=KEY ^ 1, region="switch").read(
            SWITCH_REGISTERS["params"].address)
