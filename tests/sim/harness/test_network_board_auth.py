"""The Verilated network top built with section 7's 128-bit control key, against the
golden board: every hostile ``CTRL`` datagram of ``docs/protocol/network.md`` section 7
dropped and counted the same way, every genuine one answered with the same bytes, every
reply tagged, no key byte in anything the gateware sends.

One harness build of the network top with :data:`KEY` (cached by content); the golden twin
and the gateware see the same datagrams one at a time (``replies_of``). Bounded by the
harness's cycle budget.
"""
import numpy as np
import pytest

from contract.network import CTRL_OP_OFFSET, CtrlOp, Service, network_address
from contract.registers import AUTH_REGISTERS, COMMIT
from host.golden.ctrl_auth import key_fragments, seal
from sim.benchmarks.ctrl_auth import KEY     # one build of the top for both
from tests.helpers import control_forgeries, fresh_rng
from tests.sim.harness.test_network_board import (COUNTERS_COMPARED, CTRL_PORT, WORKER_A,
                                                  WORKER_B, agg, commit_address, ctrl,
                                                  job_setup, net, replies_of)

pytestmark = pytest.mark.slow



def auth(name, *args):
    entry = AUTH_REGISTERS[name]
    return network_address("net", entry.address(*args) if args else entry.address)


#: section 7's registers and counters, read through a genuine request
AUTH_READS = [(auth("write_counter_low"), 0), (auth("write_counter_high"), 0),
              (auth("auth_counter", "drop_bad_tag"), 0),
              (auth("auth_counter", "drop_replay"), 0)]

#: what an attacker on the LAN does to a captured or made-up write
FORGERIES = control_forgeries(KEY)


def hostile_traffic(rng):
    """``(source port, service, payload)``: genuine section 7 control, then each attack of
    issue 48's list on control, genuine aggregation beside it, and the counters read."""
    c = lambda op, pairs, counter, **kw: (CTRL_PORT, Service.CTRL,
                                          ctrl(KEY, op, pairs, seq=counter, **kw))
    setup = job_setup(KEY)              # writes under counters 5 and 6, a read under 7
    newer = c(CtrlOp.WRITE, [(net("worker", 2, "port"), 4242)], 100)
    forged_base = ctrl(KEY, CtrlOp.WRITE, [(net("worker", 0, "port"), 6666),
                                           (net("worker", 1, "port"), 7777)], seq=200)
    long_write = lambda pairs, **kw: ctrl(KEY, CtrlOp.WRITE, [(net("worker", 3, "port"), 9)]
                                          * pairs, seq=300, **kw)
    malformed = bytearray(ctrl(KEY, CtrlOp.READ, [(net("ip"), 0)], seq=8))
    malformed[CTRL_OP_OFFSET] = 7
    a, b = WORKER_A, WORKER_B
    return [
        c(CtrlOp.READ, AUTH_READS, 1),                      # all zero after power-up
        *setup,
        c(CtrlOp.READ, AUTH_READS, 2),                      # a read may carry any counter
        setup[1],                                           # a captured write replayed
        newer,
        setup[0],                                           # ... after a newer one
        newer,
        *[(CTRL_PORT, Service.CTRL, forge(forged_base)) for forge in FORGERIES.values()],
        c(CtrlOp.READ, [(net("worker", w, "port"), 0) for w in range(3)], 3),  # unchanged
        c(CtrlOp.READ, [], 101, count=0),                   # refused: a tagged ERROR reply
        (CTRL_PORT, Service.CTRL, seal(KEY, bytes(malformed))),   # bad op: the same
        (CTRL_PORT, Service.CTRL, seal(KEY, ctrl(KEY, CtrlOp.READ, [(net("ip"), 0)],
                                                 seq=9)[:-1])),   # torn, tagged: ERROR
        (CTRL_PORT, Service.CTRL, ctrl(KEY, CtrlOp.READ, [(net("ip"), 0)], seq=9)[:31]),
        (CTRL_PORT, Service.CTRL, b""),
        (CTRL_PORT, Service.CTRL, long_write(65)),          # longer than the longest:
        (CTRL_PORT, Service.CTRL, long_write(64, count=64) + bytes(8)),   # dropped
        (CTRL_PORT, Service.CTRL, seal(KEY, long_write(64, count=64) + bytes(8))),
        (CTRL_PORT, Service.CTRL, long_write(64)),          # the longest: executed
        (a, Service.SWITCH, agg(0, 0, rng.integers(0, 1 << 20, 64), slot=1, seq=10)),
        (b, Service.SWITCH, agg(0, 1, rng.integers(0, 1 << 20, 64), slot=1, seq=11)),
        c(CtrlOp.WRITE, [(net("worker", 2, "port"), 5)], (1 << 64) - 1),   # the largest
        c(CtrlOp.WRITE, [(net("worker", 2, "port"), 6)], (1 << 64) - 1),   # ... once only
        c(CtrlOp.READ, AUTH_READS + [(net("counter", n), 0) for n in COUNTERS_COMPARED], 4),
    ]


def sent_as_the_golden_board(traffic):
    """Every datagram the Verilated top (built with :data:`KEY`) sent for ``traffic``,
    after asserting that it sent what the golden board sends, datagram for datagram."""
    seen = []
    mismatches = replies_of(traffic, key=KEY, seen=seen)
    assert not mismatches, "\n".join(
        f"datagram {n} ({traffic[n][1].value}, {traffic[n][2][:40].hex()}): golden {want}, "
        f"Verilated {got}" for n, want, got in mismatches)
    return seen


def test_hostile_control_is_dropped_and_counted_as_the_golden_board_does():
    traffic = hostile_traffic(fresh_rng())
    seen = sent_as_the_golden_board(traffic)
    # every CTRL reply was tagged right (replies_of checks each); no key byte in anything
    # the gateware sent; the attacks counted where section 7 says
    assert len(seen) > 10        # (which ones: the golden comparison above)
    fragments = key_fragments(KEY)
    assert not [d for d in seen for f in fragments if f in d.payload]
    final = np.frombuffer(seen[-1].payload[32:], "<u4")[1::2]
    low, high, bad_tag, replay = (int(v) for v in final[:4])
    assert high << 32 | low == (1 << 64) - 1
    assert bad_tag == len(FORGERIES)
    assert replay == 4          # two captured writes, the newer one again, the largest twice


def test_the_driver_and_gradwire_board_on_the_authenticated_gateware(capsys):
    from host.board import VirtualBoard
    from host.cli import main
    from host.driver.udp import UdpTransport
    from host.driver.udp_worker import authenticates_jobs, authenticates_trees, configure_job
    from sim.harness.board import VerilatorBoard
    port = net("worker", 0, "port")
    with VirtualBoard(VerilatorBoard(key=KEY), port_base=None) as board:
        options = VerilatorBoard.transport_options
        with UdpTransport("127.0.0.1", port_base=board.port_base, key=KEY, **options) as t:
            assert t.authenticated
            t.write(port, 4321)
            assert t.read(port) == 4321
            low, high, bad_tag, replay = t.read_many([a for a, _ in AUTH_READS])
            assert high << 32 | low > 0 and bad_tag == replay == 0
            # authenticated jobs are in the gateware, upstream keys (trees) are not: the
            # probes say so
        with UdpTransport("127.0.0.1", port_base=board.port_base, key=KEY, region="switch",
                          **options) as t:
            assert authenticates_jobs(t, 0) and not authenticates_trees(t)
            configure_job(t, 0, [("127.0.0.1", 40000)], epoch=7)
            assert t.read_many([auth("job_auth", 0, "epoch")], full=True) == [7]
        where = ["--board", f"127.0.0.1:{board.port_base}", "--timeout", "5"]
        assert main(["board", "status", *where, "--key", KEY.hex()]) == 0
        out, err = capsys.readouterr()
        assert "drop_bad_tag" in out and KEY.hex() not in out + err
        assert "section 7   control, jobs (not: upstream keys)" in out


# -- section 7's jobs ---------------------------------------------------------------------

EPOCH, NEW_EPOCH = 0x1234_5678, 0x1234_5679


def job_traffic(rng):
    """``(source port, service, payload)``: a job configured with authentication, genuine
    tagged rounds of two workers, and each attack of issue 48's list on aggregation: a
    forged tag (a value changed, none at all, another job's key), an earlier round's
    datagram replayed into its (slot, version)'s next use, a datagram from another worker's
    port, and after a new epoch the old key's packets; the counters read last."""
    from host.golden.siphash import job_key, tag_datagram
    c = lambda op, pairs, counter: (CTRL_PORT, Service.CTRL, ctrl(KEY, op, pairs, seq=counter))
    enable = lambda epoch: [(auth("job_auth", 0, "enable"), 1),
                            (auth("job_auth", 0, "epoch"), epoch)]
    old, new = job_key(KEY, 0, EPOCH), job_key(KEY, 0, NEW_EPOCH)
    a, b = WORKER_A, WORKER_B
    values = lambda: rng.integers(0, 1 << 20, 64)

    def chunk(worker, c, key=old, **kw):
        """worker's packet of chunk ``c`` (slot c mod 4, version (c div 4) mod 2), tagged"""
        data = agg(0, worker, values(), slot=c % 4, seq=c, version=(c // 4) % 2, **kw)
        return tag_datagram(key, data) if key is not None else data

    round1 = [chunk(0, 1), chunk(1, 1)]
    changed = bytearray(chunk(0, 2))
    changed[40] ^= 1                                   # a value changed after tagging
    setup = job_setup(KEY, extra=enable(EPOCH))
    reads = AUTH_READS + [(net("counter", n), 0) for n in COUNTERS_COMPARED]
    return [
        *setup,
        c(CtrlOp.READ, [(auth("job_auth", 0, "enable"), 0), (auth("job_auth", 0, "epoch"), 0)],
          8),
        (a, Service.SWITCH, round1[0]), (b, Service.SWITCH, round1[1]),   # tagged results
        (a, Service.SWITCH, bytes(changed)),                              # bad tag
        (a, Service.SWITCH, chunk(0, 2, key=None)),                       # untagged
        (a, Service.SWITCH, chunk(0, 2, key=job_key(KEY, 1, EPOCH))),     # job 1's key
        (b, Service.SWITCH, chunk(0, 2)),       # worker 0's, from worker 1's port: source
        (b, Service.SWITCH, bytes(changed)),    # ... with a wrong tag too: the source first
        (a, Service.SWITCH, chunk(0, 2)), (b, Service.SWITCH, chunk(1, 2)),
        (a, Service.SWITCH, chunk(0, 5)), (b, Service.SWITCH, chunk(1, 5)),   # slot 1 again
        (a, Service.SWITCH, round1[0]),         # chunk 1 replayed into slot 1's next use
        (b, Service.SWITCH, round1[1]),
        (a, Service.SWITCH, chunk(0, 5)),       # a resend of the newest passes the filter
        (a, Service.SWITCH, chunk(0, 1)[:20]),  # shorter than a header: the engine's drop
        # a slot outside the job's range: the filter keeps nothing for it (a lower seq
        # next is not a replay), the engine drops both
        (a, Service.SWITCH, tag_datagram(old, agg(0, 0, values(), slot=9, seq=9))),
        (a, Service.SWITCH, tag_datagram(old, agg(0, 0, values(), slot=9, seq=3))),
        c(CtrlOp.READ, reads, 9),
        # a new epoch: the old key's packets are worthless, the filter starts empty
        c(CtrlOp.WRITE, enable(NEW_EPOCH), 10),
        setup[1][:2] + (ctrl(KEY, CtrlOp.WRITE, [(commit_address(0), COMMIT)], seq=11),),
        (a, Service.SWITCH, chunk(0, 6)),                                 # old key
        (a, Service.SWITCH, chunk(0, 1, key=new)),     # below the old epoch's last: passes
        (b, Service.SWITCH, chunk(1, 1, key=new)),
        (a, Service.SWITCH, chunk(0, 7, key=new)),
        c(CtrlOp.READ, reads, 12),
    ]


def test_hostile_aggregation_is_dropped_and_counted_as_the_golden_board_does():
    """Issue 48's attacks on an authenticated job, through the Verilated network top and
    the golden board datagram for datagram: every result tagged alike (bytes compared), the
    drops counted alike, genuine rounds beside them unharmed."""
    from host.golden.siphash import check_tag, job_key
    traffic = job_traffic(fresh_rng())
    seen = sent_as_the_golden_board(traffic)
    results = [d for d in seen if d.src_port != seen[0].src_port]
    keys = (job_key(KEY, 0, EPOCH), job_key(KEY, 0, NEW_EPOCH))
    assert len(results) >= 6 and all(any(check_tag(k, d.payload) for k in keys)
                                     for d in results)
    assert not [d for d in seen for f in key_fragments(KEY) if f in d.payload]
    assert not [d for d in seen for k in keys for f in key_fragments(k) if f in d.payload]
    final = np.frombuffer(seen[-1].payload[32:], "<u4")[1::2]
    bad_tag, replay = (int(v) for v in final[2:4])
    assert (bad_tag, replay) == (4, 2)
