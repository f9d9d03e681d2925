"""``LhcHook(backend="udp")`` on a board with a 128-bit control key (``network.md`` section 7,
**Jobs**): group rank 0 configures the job with a fresh epoch, derives its job key and
hands it to the other ranks over the hook's process group; every rank's datagrams and
results are tagged, and the sum is bit for bit the golden all-reduce's."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from contract.header import HEADER_BYTES, PacketType  # noqa: E402
from host import ddp  # noqa: E402
from host.board import VirtualBoard  # noqa: E402
from host.golden.siphash import check_tag  # noqa: E402

KEY = bytes.fromhex("5f0e2a9c41b7d3866e12c0fa9b3d4e71")
WORLD = 2


class _Bucket:
    def __init__(self, tensor, index, last):
        self._tensor, self._index, self._last = tensor, index, last

    def buffer(self):
        return self._tensor

    def index(self):
        return self._index

    def is_last(self):
        return self._last


def _rank_main(rank, world, address, key):
    rng = np.random.default_rng(100 + rank)
    x = rng.standard_normal(3000).astype(np.float32) * np.float32(rank + 1)
    x[rng.random(3000) < 0.9] = 0                        # sparse, as LHC's gradients
    hook = ddp.LhcHook(backend="udp", board=address, key=key)
    try:
        got = hook(None, _Bucket(torch.from_numpy(x.copy()), 0, True)).wait()
        worker = hook._hardware.worker
        layout, stats = worker.layout, worker.stats
        job_key = worker._job_key
    finally:
        hook.close()
    want = torch.from_numpy(ddp.lhc_allreduce(x, None)[0]).div_(world)
    dist.barrier()
    return dict(same=bool(np.array_equal(got.numpy().view(np.uint32),
                                         want.numpy().view(np.uint32))),
                epoch=layout.epoch, job_key=job_key, bad_tag=stats.bad_tag,
                packets=stats.packets)


def test_an_lhc_hook_on_an_authenticated_board_tags_its_job_and_stays_exact():
    with VirtualBoard("golden", port_base=None, key=KEY) as board:
        seen = []
        deliver = board.backend.deliver

        def capture(datagrams):
            out = deliver(datagrams)
            seen.extend(d.payload for d in list(datagrams) + out)
            return out

        board.backend.deliver = capture
        ranks = ddp.run_local_group(_rank_main, WORLD, f"{board.address[0]}:"
                                    f"{board.address[1]}", KEY, timeout=240)
        counters = dict(board.backend.counters)
    assert all(r["same"] for r in ranks)
    epochs = {r["epoch"] for r in ranks}
    keys = {r["job_key"] for r in ranks}
    assert len(epochs) == 1 and None not in epochs and len(keys) == 1
    [job_key] = keys
    assert len(job_key) == 16 and all(r["packets"] > 0 and r["bad_tag"] == 0 for r in ranks)
    agg = [p for p in seen if len(p) >= HEADER_BYTES
           and p[2] in (PacketType.AGG_ADD_I32, PacketType.AGG_OR32)]
    assert agg and all(check_tag(job_key, p) for p in agg)
    assert not [p for p in seen if job_key in p or KEY in p]
    assert counters["drop_bad_tag"] == counters["drop_replay"] == 0
