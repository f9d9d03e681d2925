"""The driver over the Verilated gateware gives exactly what it gives over the models."""
import numpy as np
import pytest

from contract.header import Header, PacketType
from contract.packet import Packet
from contract.registers import (
    COMMIT,
    SWITCH_REGISTERS,
    JobStatus,
    decode_switch_limits,
    decode_switch_params,
)
from host.driver.models import NicModelTransport, SwitchModelTransport
from host.driver.nic import NicInterface, open_nic
from host.driver.switch import SwitchInterface, open_switch
from host.golden import inceptionn, lhc
from host.switchml.network import TickFaults
from tests.helpers import bits

pytestmark = pytest.mark.cocotb


def nic_traffic(rng):
    """Good, bypass and malformed packets, mixed."""
    x = (rng.standard_normal(3000) * 0.02).astype(np.float32)
    x[::97] = np.float32(np.nan)
    raw = inceptionn.tensor_to_packets(x, 7, packet_values=512)
    wire = inceptionn.tensor_to_packets(x, 7, compress=True, packet_values=512)
    bypass = Packet(Header(type=PacketType.AGG_ADD_I32, count=3), bytes(12))
    bad_k = Packet(raw[0].header.replace(k=0), raw[0].payload)
    truncated = Packet(wire[1].header, wire[1].payload[:-4])
    overlong = Packet(wire[2].header, wire[2].payload + bytes(4))
    bad_magic = Packet(wire[3].header.replace(magic=0x11), wire[3].payload)
    tx_in = [raw[0], bypass, bad_k, *raw[1:]]
    rx_in = [wire[0], truncated, bypass, overlong, *wire[1:3], bad_magic, *wire[3:]]
    return tx_in, rx_in


def test_nic_driver_same_packets_and_counters_on_both_transports():
    rng = np.random.default_rng(11)
    tx_in, rx_in = nic_traffic(rng)
    model = NicModelTransport()
    with open_nic("verilator", check=False) as device:
        for stream, packets in (("tx", tx_in), ("rx", rx_in)):
            got = device.exchange(stream, packets, pause_in=0.2, pause_out=0.3, seed=4)
            want = model.exchange(stream, packets)
            assert [p.to_bytes() for p in got] == [p.to_bytes() for p in want], stream
        assert NicInterface(device).counters() == NicInterface(model).counters()
        stats = device.stats["rx"]
        assert stats.packets_in == len(rx_in) and stats.packets_out == len(rx_in) - 3   # three malformed


def test_switch_driver_resends_after_injected_loss():
    rng = np.random.default_rng(12)
    tensors = []
    for _ in range(4):
        t = np.zeros(3000, np.float32)
        hot = rng.random(t.size) < 0.05
        t[hot] = rng.standard_normal(hot.sum()).astype(np.float32)
        tensors.append(t)
    with open_switch("verilator") as transport:      # checked against the model in lockstep
        switch = SwitchInterface(transport)
        fault = TickFaults(3, loss=0.15, dup=0.1, reorder=0.2)
        result, stats = switch.allreduce(tensors, job=2, slot_base=8, slot_count=6, fault=fault)
        assert np.array_equal(bits(result), bits(lhc.allreduce(tensors)[0]))
        assert stats["resends"] > 0 and stats["lost"] > 0 and stats["duplicated"] > 0
        counters = switch.counters()
        assert counters["results_unicast"] > 0 or counters["retransmit_dropped"] > 0
        assert transport.compared["packets"] > 0


def commit_effects(transport, values=range(8), job=1):
    """What writing each of ``values`` to a job's ``commit`` register does, seen through the
    register map and the data path: ``(value, status, configured)`` per value, where
    ``configured`` says whether a packet for the job was then accepted."""
    regs = SWITCH_REGISTERS["job"]
    counter = SWITCH_REGISTERS["counter"]
    lanes = decode_switch_params(transport.read(SWITCH_REGISTERS["params"].address))["lanes"]
    effects = []
    for value in values:
        # Unconfigure the job, then stage a configuration and write `value` to commit.
        for field, staged in (("workers", 0), ("commit", COMMIT)):
            transport.write(regs.address(job, field), staged)
        for field, staged in (("workers", 2), ("slot_base", 0), ("slot_count", 4)):
            transport.write(regs.address(job, field), staged)
        transport.write(regs.address(job, "commit"), value)
        if hasattr(transport, "idle"):
            transport.idle(32)                  # let a commit clear its slots
        status = transport.read(regs.address(job, "commit"))
        accepted = transport.read(counter.address("accepted"))
        packet = Packet(Header(type=PacketType.AGG_ADD_I32, job=job, worker=0, count=lanes,
                               slot=0), bytes(4 * lanes))
        transport.exchange("agg", [packet], idle=32)
        effects.append((value, status,
                        transport.read(counter.address("accepted")) == accepted + 1))
    return effects


def test_commit_register_takes_only_COMMIT_on_every_transport():
    """Every transport serves the one register contract: the model transport once committed
    on any odd value (``value & 1``), the gateware and the reference model only on 1."""
    want = [(value, 0, value == COMMIT) for value in range(8)]
    assert commit_effects(SwitchModelTransport()) == want
    with open_switch("verilator", check=False) as device:
        assert commit_effects(device) == want
    with open_switch("verilator") as lockstep:          # device and model compared
        assert commit_effects(lockstep) == want


@pytest.mark.parametrize("count", [1666, 2048])
def test_nic_receive_waits_for_a_packet_that_decodes_long_after_its_last_input_beat(count):
    """A well-compressed packet is taken in long before it is decoded (one block of 8 values
    per clock, store and forward): over 64 quiet clocks can pass between its last input beat
    and its first output beat, and the receive must not end before it (it used to: the
    packet came out in the next exchange)."""
    x = np.zeros(count, np.float32)
    x[::10] = np.float32(2.0 ** -10)
    x[5::10] = np.float32(-(2.0 ** -9))
    wire = inceptionn.tensor_to_packets(x, 10, compress=True)
    with open_nic("verilator") as nic_transport:        # in lockstep with the model
        nic = NicInterface(nic_transport)
        for _ in range(2):
            np.testing.assert_array_equal(bits(nic.receive(wire, count)),
                                          bits(inceptionn.quantize(x, 10)))
        stats = nic_transport.device.stats["rx"]
        assert stats.packets_out == 2 and min(stats.latencies) > 64 + stats.in_beats // 2


def isolation_effects(transport):
    """Status and lookup effect of a sequence of commits: overlaps, empty ranges, jobs
    beyond the engine, unconfiguring (``(job, status, accepted)`` per commit)."""
    regs = SWITCH_REGISTERS["job"]
    lanes = decode_switch_params(transport.read(SWITCH_REGISTERS["params"].address))["lanes"]
    jobs = decode_switch_limits(transport.read(SWITCH_REGISTERS["limits"].address))["jobs"]
    counter = SWITCH_REGISTERS["counter"].address("accepted")
    effects = []
    for job, workers, base, count in ((0, 2, 8, 8), (1, 2, 12, 8), (1, 2, 0, 9), (1, 2, 0, 8),
                                      (2, 1, 16, 0), (2, 1, 60, 8), (0, 0, 123, 456),
                                      (2, 1, 8, 4), (jobs, 1, 30, 2), (regs.count - 1, 1, 40, 1)):
        for field, value in (("workers", workers), ("slot_base", base),
                             ("slot_count", count), ("commit", COMMIT)):
            transport.write(regs.address(job, field), value)
        if hasattr(transport, "idle"):
            transport.idle(80)
        status = transport.read(regs.address(job, "commit"))
        before = transport.read(counter)
        packet = Packet(Header(type=PacketType.AGG_ADD_I32, job=job % 256, worker=0,
                               count=lanes, slot=base % 0x10000), bytes(4 * lanes))
        transport.exchange("agg", [packet], idle=32)
        effects.append((job, status, transport.read(counter) - before))
    return effects


def test_job_isolation_is_the_same_on_every_transport():
    """The control interface refuses overlapping ranges, empty ranges and jobs beyond the
    engine, identically in the gateware and in the model behind its registers."""
    want = isolation_effects(SwitchModelTransport())
    rejected = [job for job, status, _ in want if status & JobStatus.REJECTED]
    assert rejected == [1, 1, 2, 2, 4, 63], want      # (2, 1, 60, 8) is beyond the 64 slots
    with open_switch("verilator", check=False) as device:
        assert isolation_effects(device) == want
