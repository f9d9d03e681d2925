"""The register maps of the engine tops, as the driver has always named them.

The maps themselves are declared once, in :mod:`contract.registers`; this module only gives
the driver's historical names for them (kept importable for code outside the project).
"""
import enum

from contract.registers import (COMMIT, NIC_REGISTERS, SWITCH_REGISTERS, JobStatus,
                                decode_switch_params, switch_params_word)

__all__ = ["NIC_TX_COUNTER_BASE", "NIC_RX_COUNTER_BASE", "JOB_REG_STRIDE", "JobReg",
           "AGG_COUNTER_BASE", "AGG_PARAMS", "COMMIT", "JobStatus", "NIC_REGISTERS",
           "SWITCH_REGISTERS", "switch_params_word", "decode_switch_params"]

#: NIC: TX counter i at this base + i, RX counter i at the RX base + i (contract.counters).
NIC_TX_COUNTER_BASE = NIC_REGISTERS["tx"].base
NIC_RX_COUNTER_BASE = NIC_REGISTERS["rx"].base

#: Switch: per-job configuration registers at JOB_REG_STRIDE * job + JobReg.
JOB_REG_STRIDE = SWITCH_REGISTERS["job"].stride

#: Field offsets of a job's registers (``WORKERS`` 0 = unconfigured, clears the job on
#: commit; ``COMMIT``: write :data:`COMMIT` to apply the three others).
JobReg = enum.IntEnum("JobReg", {field.name.upper(): field.address
                                 for field in SWITCH_REGISTERS["job"].fields})

AGG_COUNTER_BASE = SWITCH_REGISTERS["counter"].base
#: read-only: slots | lanes << 16
AGG_PARAMS = SWITCH_REGISTERS["params"].address
