"""Host interface of the switch aggregator: configure jobs, all-reduce, read counters.

The same :class:`SwitchInterface` runs over any transport with the stream ``agg`` and the
switch register map: the reference model (:class:`~host.driver.models.SwitchModelTransport`),
the Verilated gateware (:func:`open_switch` with ``backend="verilator"``), or, later, a
board. Windowing, resends and result collection are ``host.switch_packets``'s.
"""
from __future__ import annotations

import dataclasses

from ..counters import AGG_COUNTERS
from .registers import AGG_COUNTER_BASE, AGG_PARAMS, JOB_REG_STRIDE, JobReg

__all__ = ["SwitchInterface", "open_switch", "SWITCH_STREAMS"]

#: The switch top's AXI-Stream path: name -> (sink prefix, source prefix).
SWITCH_STREAMS = {"agg": ("s_axis", "m_axis")}


class SwitchInterface:
    """Drive the in-network aggregator.

    Parameters
    ----------
    transport : host.driver.transport.Transport
        Stream ``agg`` and the switch registers.
    """

    def __init__(self, transport):
        self.transport = transport
        params = transport.read(AGG_PARAMS)
        self.slots, self.lanes = params & 0xFFFF, params >> 16
        if not self.slots or not self.lanes or self.lanes % 8:
            raise RuntimeError(f"the switch reports {self.slots} slots of {self.lanes} lanes: "
                               f"is this a gradwire switch?")
        self._next_chunk = {}

    def configure_job(self, job, workers, slot_base, slot_count):
        """Give ``job`` ``workers`` workers and the slots [slot_base, slot_base+slot_count);
        resets the state of those slots."""
        if not 0 <= slot_base < slot_base + slot_count <= self.slots:
            raise ValueError(f"slots {slot_base}..{slot_base + slot_count - 1} are not inside "
                             f"the switch's pool of {self.slots}")
        if not 1 <= workers <= 32:
            raise ValueError(f"workers must be in 1..32, not {workers}")
        base = JOB_REG_STRIDE * job
        self.transport.write(base + JobReg.WORKERS, workers)
        self.transport.write(base + JobReg.SLOT_BASE, slot_base)
        self.transport.write(base + JobReg.SLOT_COUNT, slot_count)
        self.transport.write(base + JobReg.COMMIT, 1)
        self._next_chunk[job] = 0

    def clear_job(self, job):
        """Unconfigure ``job``: its packets are dropped (``drop_unconfigured_job``)."""
        self.transport.write(JOB_REG_STRIDE * job + JobReg.WORKERS, 0)
        self.transport.write(JOB_REG_STRIDE * job + JobReg.COMMIT, 1)
        self._next_chunk.pop(job, None)

    def counters(self):
        return {name: self.transport.read(AGG_COUNTER_BASE + i)
                for i, name in enumerate(AGG_COUNTERS)}

    def send(self, packets, **options):
        """Raw access: feed packets to the aggregator, return what it emits."""
        return self.transport.exchange("agg", packets, **options)

    def allreduce(self, tensors, *, job=0, slot_base=0, slot_count=None, fault=None,
                  configure=True, **options):
        """LHC all-reduce of one float32 tensor per worker through the switch.

        With ``configure`` the job is (re)configured for ``len(tensors)`` workers over
        ``slot_count`` slots (default: the whole pool from ``slot_base``) first.

        Returns
        -------
        result : np.ndarray (float32)
            Bit for bit ``host.golden.lhc.allreduce(tensors)[0]``.
        stats : dict
            LHC statistics (rows, peeled, unpeeled, bytes per phase, ...) and packet
            statistics (packets sent, resends, results).
        """
        from ..switch_packets import allreduce_over_transport
        if slot_count is None:
            slot_count = self.slots - slot_base
        if configure:
            self.configure_job(job, len(tensors), slot_base, slot_count)
        elif job not in self._next_chunk:
            raise RuntimeError(f"job {job} was not configured through this interface")
        result, stats = allreduce_over_transport(
            tensors, lambda packets: self.transport.exchange("agg", packets, idle=32),
            job=job, slot_base=slot_base, slot_count=slot_count, lanes=self.lanes,
            fault=fault, first_chunk=self._next_chunk[job], **options)
        self._next_chunk[job] = stats["packets"].next_chunk
        flat = {}
        for part in ("lhc", "packets"):
            value = stats[part]
            flat.update(dataclasses.asdict(value) if dataclasses.is_dataclass(value)
                        else dict(value))
        return result, flat


def open_switch(backend="golden", *, check=True, waves=None, slots=64, lanes=64,
                max_workers=32, jobs=4):
    """A transport to the switch aggregator (``"golden"`` model, or the gateware through
    the compiled harness, ``"verilator"``, or the cocotb bridge, ``"cocotb"``; by default
    checked packet for packet against the model in lockstep)."""
    from .models import SwitchModelTransport
    params = dict(slots=slots, lanes=lanes, max_workers=max_workers, jobs=jobs)
    if backend == "golden":
        return SwitchModelTransport(**params)
    if backend == "verilator":
        from sim.harness import HarnessTransport as Device
    elif backend == "cocotb":
        from .transport import VerilatorTransport as Device
    else:
        raise ValueError(f"backend must be 'golden', 'verilator' or 'cocotb', not {backend!r}")
    from hdl.switch_top import SwitchTop
    from sim.runner import export_verilog
    device = Device("switch_top", export_verilog(SwitchTop(**params), "switch_top"),
                    SWITCH_STREAMS, ctrl=True, waves=waves)
    if not check:
        return device
    from .lockstep import LockstepTransport
    return LockstepTransport(device, SwitchModelTransport(**params))
