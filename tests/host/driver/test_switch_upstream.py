"""A job's upstream through the driver (``host/driver/switch.py``, ``udp_worker.py``,
``striped.py``; ``docs/protocol/aggregator-protocol.md`` section 4): the four ``upstream``
registers are written before the job's commit, always (None writes zeros, so a job
configured again without one loses it), they reach the engine with the commit, a switch
without them is a clear :class:`NoUpstreamError` before anything is committed, and
:func:`parse_upstream` refuses bad values in one line."""
import ipaddress

import pytest

from contract.registers import SWITCH_REGISTERS
from host.board import GoldenBoard, VirtualBoard
from host.driver.lockstep import LockstepTransport
from host.driver.models import SwitchModelTransport
from host.driver.striped import StripedSwitchInterface
from host.driver.switch import (NoUpstreamError, SwitchInterface, UPSTREAM_FIELDS,
                                format_upstream, parse_upstream)
from host.driver.udp_worker import configure_job
from host.golden.aggregator import Upstream

_UPSTREAM = SWITCH_REGISTERS["upstream"]
_JOB = SWITCH_REGISTERS["job"]
PARENT = Upstream(int(ipaddress.IPv4Address("192.168.77.3")), 47572, 2, 5)


class Recording(SwitchModelTransport):
    """The switch model, logging every register write as ``(entry name, job, field, value)``."""

    def __init__(self, **params):
        super().__init__(**params)
        self.writes = []

    def write(self, addr, value):
        decoded = SWITCH_REGISTERS.decode(addr)
        self.writes.append((decoded.entry.name, decoded.index, decoded.register.name, value))
        super().write(addr, value)


class WithoutUpstream(SwitchModelTransport):
    """A switch whose gateware predates trees: the upstream registers ignore writes and
    read 0, as every unmapped switch address does."""

    def write(self, addr, value):
        if SWITCH_REGISTERS.decode(addr).entry is not _UPSTREAM:
            super().write(addr, value)

    def read(self, addr):
        decoded = SWITCH_REGISTERS.decode(addr)
        return 0 if decoded is not None and decoded.entry is _UPSTREAM else super().read(addr)


def test_the_upstream_is_written_before_the_commit_and_applied_with_it():
    transport = Recording(slots=16, jobs=4)
    switch = SwitchInterface(transport)
    switch.configure_job(1, 3, 4, 8, upstream=PARENT)
    writes = [w for w in transport.writes if w[1] == 1]
    assert writes[:4] == [("upstream", 1, f, getattr(PARENT, f)) for f in UPSTREAM_FIELDS]
    assert writes[-1][:3] == ("job", 1, "commit")
    assert transport.model.job_config(1).upstream == PARENT
    assert switch.upstream(1) == PARENT and format_upstream(switch.upstream(1)) == \
        "192.168.77.3:47572 job 2 worker 5"
    # configured again without one: zeros, before the commit, and the job has none
    transport.writes.clear()
    switch.configure_job(1, 3, 4, 8)
    assert transport.writes[:4] == [("upstream", 1, f, 0) for f in UPSTREAM_FIELDS]
    assert transport.writes[-1][:3] == ("job", 1, "commit")
    assert transport.model.job_config(1).upstream is None
    assert switch.upstream(1) is None and format_upstream(None) == "none"


def test_a_switch_without_upstream_registers_is_a_clear_error_and_nothing_is_committed():
    transport = WithoutUpstream(slots=16, jobs=4)
    switch = SwitchInterface(transport)
    with pytest.raises(NoUpstreamError, match="predates trees of aggregators"):
        switch.configure_job(0, 2, 0, 8, upstream=PARENT)
    assert transport.model.job_config(0) is None
    # without an upstream it configures as before (zeros read back as zeros anyway)
    switch.configure_job(0, 2, 0, 8)
    assert transport.model.job_config(0).workers == 2 and switch.upstream(0) is None


def test_lockstep_against_a_device_without_the_registers_says_so():
    """The Verilated switch of today under the lockstep check: the model holds the upstream,
    the device reads 0; the mismatch becomes the same clear error."""
    transport = LockstepTransport(WithoutUpstream(slots=16), SwitchModelTransport(slots=16),
                                  SWITCH_REGISTERS)
    with pytest.raises(NoUpstreamError, match="job 3's upstream registers.*device 0"):
        SwitchInterface(transport).configure_job(3, 2, 0, 8, upstream=PARENT)


def test_configure_job_refuses_what_is_not_an_upstream():
    switch = SwitchInterface(SwitchModelTransport(slots=16))
    with pytest.raises(ValueError, match="must be a host.golden.aggregator.Upstream"):
        switch.configure_job(0, 2, 0, 8, upstream=("192.168.77.3", 47572))
    with pytest.raises(ValueError, match=r"job must be in 0\.\.3"):
        switch.configure_job(4, 2, 0, 8, upstream=PARENT)


class BoardWithoutUpstream(GoldenBoard):
    """A golden board whose switch region has no upstream registers."""

    def write(self, address, value):
        if not _is_upstream(address):
            super().write(address, value)

    def read(self, address):
        return 0 if _is_upstream(address) else super().read(address)


def _is_upstream(address):
    from contract.network import decode_network_address
    where = decode_network_address(address)
    if where is None or where[0].name != "switch":
        return False
    decoded = SWITCH_REGISTERS.decode(where[1])
    return decoded is not None and decoded.entry is _UPSTREAM


def test_over_udp_the_registers_reach_the_board_and_a_board_without_them_is_refused():
    with VirtualBoard("golden", port_base=None, slots=16) as board:
        with board.transport(region="switch") as control:
            layout = configure_job(control, 2, [("127.0.0.1", 41000)], slot_base=0,
                                   slot_count=8, upstream=PARENT)
            assert board.backend.aggregator.job_config(2).upstream == PARENT
            assert layout.job == 2 and not hasattr(layout, "upstream")
            configure_job(control, 2, [("127.0.0.1", 41000)], slot_base=0, slot_count=8)
            assert board.backend.aggregator.job_config(2).upstream is None
    old = BoardWithoutUpstream(key=7)
    with VirtualBoard(old, port_base=None) as board:
        with board.transport(region="switch", retries=3) as control:
            with pytest.raises(NoUpstreamError, match="predates trees"):
                configure_job(control, 0, [("127.0.0.1", 41000)], slot_count=8,
                              upstream=PARENT)
        assert old.aggregator.job_config(0) is None


def test_a_striped_job_takes_one_upstream_per_board():
    boards = [SwitchInterface(SwitchModelTransport(slots=16)) for _ in range(2)]
    striped = StripedSwitchInterface(boards)
    other = Upstream(PARENT.ip + 1, 47572, 2, 5)
    striped.configure_job(0, 2, 0, 8, upstream=[PARENT, other])
    assert [b.upstream(0) for b in boards] == [PARENT, other]
    striped.configure_job(0, 2, 0, 8)
    assert [b.upstream(0) for b in boards] == [None, None]
    with pytest.raises(ValueError, match="one upstream .or None. per board"):
        striped.configure_job(0, 2, 0, 8, upstream=PARENT)


@pytest.mark.parametrize("args, message", [
    (("192.168.77.3", 0, 0), "give the upstream as HOST:PORT"),
    (("192.168.77.3:0", 0, 0), r"port must be in 1\.\.65535"),
    (("192.168.77.3:x", 0, 0), "port must be an integer"),
    (("239.1.2.3:47572", 0, 0), "not a board's"),
    (("0.0.0.0:47572", 0, 0), "not a board's"),
    (("no-such-host.invalid:47572", 0, 0), "not an IPv4 address or a name"),
    (("192.168.77.3:47572", None, 0), "needs the parent's job number"),
    (("192.168.77.3:47572", 0, None), "needs this aggregator's worker number"),
    (("192.168.77.3:47572", 64, 0), r"parent's job must be an integer in 0\.\.63"),
    (("192.168.77.3:47572", 0, 32), r"worker number in the parent's job must be an integer "
                                    r"in 0\.\.31"),
    (("0", 1, None), "without an upstream address"),
])
def test_parse_upstream_refuses_bad_values_in_one_line(args, message):
    with pytest.raises(ValueError, match=message) as info:
        parse_upstream(*args)
    assert "\n" not in str(info.value)


def test_parse_upstream_takes_both_forms_and_none():
    assert parse_upstream("192.168.77.3:47572", 2, 5) == PARENT
    assert parse_upstream(("192.168.77.3", "47572"), 2, 5) == PARENT
    assert parse_upstream("localhost:9", 0, 0).ip == int(ipaddress.IPv4Address("127.0.0.1"))
    assert parse_upstream(None) is None and parse_upstream("0") is None and \
        parse_upstream(0) is None
