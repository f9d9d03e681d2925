"""Register maps of the gateware tops' ``ctrl_*`` ports (also served by the model transports)."""
import enum

#: NIC: TX counter i at address i, RX counter i at this base + i (contract.counters order).
NIC_TX_COUNTER_BASE = 0x000
NIC_RX_COUNTER_BASE = 0x100

#: Switch: per-job configuration registers at JOB_REG_STRIDE * job + JobReg.
JOB_REG_STRIDE = 4


class JobReg(enum.IntEnum):
    WORKERS = 0      # 0 = unconfigured (clears the job on commit)
    SLOT_BASE = 1
    SLOT_COUNT = 2
    COMMIT = 3       # write 1: apply the three registers above, resetting the job's slots


AGG_COUNTER_BASE = 0x100
#: read-only: slots | lanes << 16
AGG_PARAMS = 0x1FF
