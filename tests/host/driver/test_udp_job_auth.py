"""Workers of an authenticated job (``docs/protocol/network.md`` section 7, **Jobs**) over UDP
on 127.0.0.1, through the virtual golden board with a 128-bit control key: tagged
datagrams and results, a result changed on the way refused and recovered, no key byte on
the wire, and ``gradwire board configure-job --auth --epoch`` / ``job-key``.

The board's datagrams are seen where the virtual board hands them to its backend. Every
wait is bounded (the workers' timeouts, ``in_threads``)."""
import numpy as np
import pytest

from contract.header import HEADER_BYTES, Flags, PacketType
from host.board import VirtualBoard
from host.cli import main
from host.driver.udp import UdpTransport
from host.driver.udp_worker import (JobLayout, UdpSwitchWorker, authenticates_jobs, configure_job,
                                    job_key_for)
from host.golden.ctrl_auth import key_fragments
from host.golden.siphash import check_tag, job_key
from tests.helpers import Wire, in_threads

LOOP = "127.0.0.1"
KEY = bytes.fromhex("8d3a51c2f0e97b46a1d52c3e9f078b64")
FAST = dict(timeout=0.05, min_timeout=0.01, max_timeout=0.2)


@pytest.fixture
def board(monkeypatch):
    for name in ("GRADWIRE_BOARD", "GRADWIRE_PORT_BASE", "GRADWIRE_KEY", "GRADWIRE_MTU"):
        monkeypatch.delenv(name, raising=False)
    with VirtualBoard("golden", port_base=None, key=KEY, slots=16) as b:
        b.wire = Wire(b.backend)
        yield b


def workers_of(board, epoch, count=2):
    workers = [UdpSwitchWorker(LOOP, port_base=board.port_base, worker=w, rto=0.05,
                               timeout=20) for w in range(count)]
    with UdpTransport(LOOP, port_base=board.port_base, key=KEY, region="switch",
                      **FAST) as control:
        layout = configure_job(control, 0, [w.address for w in workers], epoch=epoch)
    return workers, layout


def keyed_workers(board, epoch):
    """``workers_of`` an authenticated job, each holding the job key: workers, key."""
    workers, layout = workers_of(board, epoch)
    key = job_key_for(KEY, layout)
    for w in workers:
        w.set_layout(layout, job_key=key)
    return workers, key


def aggregate(workers, seed, chunks=20):
    rng = np.random.default_rng(seed)
    lanes = workers[0].layout.lanes
    vectors = [rng.integers(0, 2**32, lanes * chunks, dtype=np.uint64).astype(np.uint32)
               for _ in workers]
    results = in_threads([lambda w=w, v=v: w.aggregate(v, PacketType.AGG_ADD_I32)[0]
                          for w, v in zip(workers, vectors)], timeout=60)
    want = (sum(v.astype(np.uint64) for v in vectors) % 2**32).astype(np.uint32)
    for got in results:
        assert np.array_equal(got, want)


def test_an_authenticated_job_over_udp_is_exact_and_tagged_end_to_end(board):
    workers, key = keyed_workers(board, epoch=3)
    try:
        aggregate(workers, 1)
        aggregate(workers, 2)                  # chunk numbers go on across messages
    finally:
        for w in workers:
            w.close()
    agg = [p for p in board.wire.seen if len(p) >= HEADER_BYTES
           and p[2] == PacketType.AGG_ADD_I32]
    results = [p for p in agg if p[3] & Flags.RESULT]
    assert results and len(agg) > len(results)
    assert all(check_tag(key, p) for p in agg)
    counters = board.backend.counters
    assert counters["drop_bad_tag"] == counters["drop_replay"] == 0
    assert [w.stats.bad_tag for w in workers] == [0, 0]


def test_a_result_changed_on_the_way_is_refused_counted_and_recovered(board):
    """A result whose bytes changed between board and worker fails its tag: the worker
    never takes it (``bad_tag``), resends, and the board's answer ends the message
    bit-exact."""
    workers, layout = workers_of(board, epoch=4)
    key = job_key_for(KEY, layout)
    changed = []

    def flip_one(datagram):
        p = datagram.payload
        if not changed and len(p) > HEADER_BYTES and p[3] & Flags.RESULT:
            changed.append(p)
            return datagram._replace(payload=p[:-1] + bytes([p[-1] ^ 0x80]))
        return datagram

    board.wire.outbound = flip_one
    try:
        for w in workers:
            w.set_layout(layout, job_key=key)
        aggregate(workers, 3)
    finally:
        for w in workers:
            w.close()
    assert len(changed) == 1
    assert sum(w.stats.bad_tag for w in workers) >= 1
    assert sum(w.stats.resends for w in workers) >= 1


def test_without_the_job_key_a_worker_takes_no_result(board):
    """A worker holding another epoch's key: the board drops its datagrams (bad tag), and
    it would refuse the board's results too; it gives up within its timeout."""
    from host.driver.transport import NoReplyError

    workers, layout = workers_of(board, epoch=5, count=1)
    stale = job_key(KEY, 0, 4)
    worker = workers[0]
    worker.timeout = 0.5
    try:
        worker.set_layout(layout, job_key=stale)
        with pytest.raises(NoReplyError):
            worker.aggregate(np.arange(64, dtype=np.uint32), PacketType.AGG_ADD_I32)
    finally:
        worker.close()
    assert board.backend.counters["drop_bad_tag"] >= 1
    assert board.backend.counters["switch_out"] == 0


def test_set_layout_asks_for_the_job_key_exactly_when_the_job_has_authentication(board):
    worker = UdpSwitchWorker(LOOP, port_base=board.port_base)
    try:
        plain = JobLayout(job=0, workers=1, slot_base=0, slot_count=4, lanes=64)
        authenticated = JobLayout(job=0, workers=1, slot_base=0, slot_count=4, lanes=64,
                                  epoch=1)
        with pytest.raises(ValueError, match="job key"):
            worker.set_layout(authenticated)
        with pytest.raises(ValueError, match="16-byte"):
            worker.set_layout(authenticated, job_key=b"short")
        with pytest.raises(ValueError, match="no authentication"):
            worker.set_layout(plain, job_key=bytes(16))
        worker.set_layout(authenticated, job_key=bytes(16))
        with pytest.raises(ValueError, match="no epoch"):
            job_key_for(KEY, plain)
    finally:
        worker.close()


def test_no_key_byte_of_the_control_or_the_job_key_in_any_datagram(board):
    workers, key = keyed_workers(board, epoch=6)
    try:
        aggregate(workers, 4)
    finally:
        for w in workers:
            w.close()
    fragments = key_fragments(KEY) + key_fragments(key)
    assert len(board.wire.seen) > 40
    assert not [p for p in board.wire.seen for f in fragments if f in p]


# -- the command line --------------------------------------------------------------------

def test_configure_job_auth_prints_nothing_secret_and_job_key_prints_the_derived_key(
        board, capsys):
    where = ["--board", f"{LOOP}:{board.port_base}", "--key", KEY.hex(), "--timeout", "2"]
    assert main(["board", "configure-job", "0", "--workers", "2", "--slots", "0:8",
                 "--auth", "--epoch", "9", *where]) == 0
    out, _ = capsys.readouterr()
    assert "authenticated, epoch 9" in out and "job-key 0 --epoch 9" in out
    derived = job_key(KEY, 0, 9)
    assert KEY.hex() not in out and derived.hex() not in out
    assert board.backend.job_auth.active(0).key == derived
    assert main(["board", "job-key", "0", "--epoch", "9", "--key", KEY.hex()]) == 0
    assert capsys.readouterr().out.strip() == derived.hex()
    # configured again without --auth: the job loses its authentication
    assert main(["board", "configure-job", "0", "--workers", "2", "--slots", "0:8",
                 *where]) == 0
    assert board.backend.job_auth.active(0) is None


@pytest.mark.parametrize("args", [["--auth"], ["--epoch", "3"]])
def test_auth_and_epoch_go_together(board, capsys, args):
    where = ["--board", f"{LOOP}:{board.port_base}", "--key", KEY.hex(), "--timeout", "2"]
    assert main(["board", "configure-job", "0", "--workers", "2", *args, *where]) != 0
    assert "go together" in capsys.readouterr().err
    assert board.backend.aggregator.job_config(0) is None


def test_an_epoch_beyond_32_bits_is_refused(board, capsys):
    with pytest.raises(SystemExit):
        main(["board", "configure-job", "0", "--workers", "2", "--auth", "--epoch",
              str(1 << 32), "--board", f"{LOOP}:{board.port_base}", "--key", KEY.hex()])
    assert "an epoch is 0.." in capsys.readouterr().err


def test_job_key_needs_a_128_bit_key(capsys):
    assert main(["board", "job-key", "0", "--epoch", "1", "--key", "0123456789abcdef"]) != 0
    assert "128-bit" in capsys.readouterr().err


def test_a_board_with_a_64_bit_key_refuses_auth_in_one_line(monkeypatch, capsys):
    key = 0x8D3A51C2F0E97B46
    with VirtualBoard("golden", port_base=None, key=key) as b:
        code = main(["board", "configure-job", "0", "--workers", "1", "--auth", "--epoch",
                     "1", "--board", f"{LOOP}:{b.port_base}", "--key", f"{key:016x}",
                     "--timeout", "2"])
        err = capsys.readouterr().err
        assert code != 0 and "does not authenticate job 0" in err
        assert b.backend.aggregator.job_config(0) is None


def test_board_status_shows_each_jobs_authentication_and_the_auth_counters(board, capsys):
    import json

    where = ["--board", f"{LOOP}:{board.port_base}", "--key", KEY.hex(), "--timeout", "2"]
    assert main(["board", "configure-job", "0", "--workers", "1", "--slots", "0:4",
                 "--auth", "--epoch", "12", *where]) == 0
    assert main(["board", "configure-job", "1", "--workers", "1", "--slots", "4:4",
                 *where]) == 0
    capsys.readouterr()
    assert main(["board", "status", "--json", *where]) == 0
    status = json.loads(capsys.readouterr().out)
    jobs = status["switch"]["jobs"]
    assert jobs["0"]["auth_epoch"] == 12 and jobs["1"]["auth_epoch"] is None
    assert status["counters"]["auth"] == {"drop_bad_tag": 0, "drop_replay": 0}
    assert status["write_counter"] == board.backend.write_counter > 0
    assert status["auth_features"] == ["control", "jobs", "upstream keys"]
    assert main(["board", "status", *where]) == 0
    out = capsys.readouterr().out
    assert out.count("authenticated, epoch 12") == 1 and "drop_bad_tag" in out
    assert "section 7   control, jobs, upstream keys\n" in out


def test_the_probe_finds_authenticated_jobs_on_the_golden_board_and_not_on_a_64_bit_one(board):
    with UdpTransport(LOOP, port_base=board.port_base, key=KEY, region="switch",
                      **FAST) as control:
        assert authenticates_jobs(control, 0) and authenticates_jobs(control, 3)
    with VirtualBoard("golden", port_base=None, key=0x0123456789ABCDEF) as plain:
        with UdpTransport(LOOP, port_base=plain.port_base, key=0x0123456789ABCDEF,
                          **FAST) as control:
            assert not authenticates_jobs(control, 0)
