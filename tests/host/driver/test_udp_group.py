"""Result groups on the host side (``docs/protocol/network.md`` section 3): ``configure_job``
writes and checks a job's group, ``JobLayout`` carries it, and real multicast over UDP.

The multicast tests run ``group_namespace.py`` once under ``unshare -n``: a network
namespace of its own, where loopback gets multicast and a route for 224.0.0.0/4 (never the
machine's own namespace, whose interfaces and routes are left alone), with the virtual
board (golden backend), its workers (:class:`UdpSwitchWorker`, and :class:`UdpTransport`
carrying a whole job) and their group sockets. They are skipped, saying why, where the
machine allows no network namespace. Everything here without a namespace writes registers
only: nothing joins a group or sends multicast in the machine's namespace."""
from pathlib import Path

import pytest

from contract.network import NET_REGISTERS, ip_to_int, network_address
from host.board import VirtualBoard
from host.driver.sockets import parse_group
from host.driver.transport import TransportError
from host.driver.udp_worker import JobLayout, configure_job, read_group, write_group
from tests.helpers import namespace_command, run_in_namespace

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
DRIVER = HERE / "group_namespace.py"
#: the whole namespace run (about 15 s: the scenarios take under a second each, the three
#: torch processes of ``ranks`` the rest; a worker that hears nothing gives up after 20 s)
DRIVER_TIMEOUT = 240
GROUP = ("239.77.0.1", 47580)
WORKERS = 4
GROUP_TABLE = NET_REGISTERS["group"]


# ---- configure_job and the layout (registers only) -----------------------------------

@pytest.fixture
def board():
    with VirtualBoard("golden", port_base=None, slots=8, lanes=64) as b:
        yield b


def _group_registers(control, job):
    return control.read_many([network_address("net", GROUP_TABLE.address(job, f))
                              for f in ("ip", "port")], full=True)


def test_configure_job_writes_the_group_before_the_commit_and_clears_it_without_one(board):
    addresses = [("127.0.0.1", 40000 + w) for w in range(3)]
    with board.transport(region="switch") as control:
        layout = configure_job(control, 1, addresses, group="239.77.0.1:47580")
        assert layout == JobLayout(job=1, workers=3, slot_base=0, slot_count=8, lanes=64,
                                   group=GROUP)
        assert _group_registers(control, 1) == [ip_to_int(GROUP[0]), GROUP[1]]
        assert board.backend.groups[1] == (ip_to_int(GROUP[0]), GROUP[1])
        assert read_group(control, 1) == GROUP and read_group(control, 0) is None
        # configured again without a group (None or 0): the old group is gone
        for none in (None, 0):
            configure_job(control, 1, addresses, group=GROUP)
            layout = configure_job(control, 1, addresses, group=none)
            assert layout.group is None and _group_registers(control, 1) == [0, 0]
        assert write_group(control, 2, ("239.0.0.9", 9)) == ("239.0.0.9", 9)
        assert read_group(control, 2) == ("239.0.0.9", 9)


def test_the_layout_carries_the_group_to_every_rank_as_data():
    import pickle
    layout = JobLayout(job=0, workers=2, slot_base=0, slot_count=4, lanes=64, group=GROUP)
    assert pickle.loads(pickle.dumps(layout)) == layout        # broadcast_object_list
    assert layout.as_dict()["group"] == GROUP
    assert JobLayout(job=0, workers=2, slot_base=0, slot_count=4, lanes=64).group is None


@pytest.mark.parametrize("group, message", [
    ("10.0.0.1:5000", r"10\.0\.0\.1 is not IPv4 multicast \(224\.0\.0\.0/4; use 239"),
    (("192.168.77.255", 5000), "is not IPv4 multicast"),
    ("239.1.1.1:0", r"port must be in 1\.\.65535, not 0"),
    ("239.1.1.1:65536", r"port must be in 1\.\.65535, not 65536"),
    ("239.1.1.1", r"give a result group as ADDR:PORT"),
    ("bogus:5", r"'bogus' is not an IPv4 address"),
    (("239.1.1.1", "x"), r"port must be an integer"),
    (("239.1.1.1", True), r"port must be an integer"),
])
def test_a_group_that_is_not_multicast_or_has_no_port_is_a_clear_error_before_any_write(
        board, group, message):
    with pytest.raises(ValueError, match=message):
        parse_group(group)
    with board.transport(region="switch") as control:
        requests = control.network_stats().get("ctrl", {}).get("requests", 0)
        with pytest.raises(ValueError, match=message):
            configure_job(control, 0, [("127.0.0.1", 40000)], group=group)
        assert control.network_stats().get("ctrl", {}).get("requests", 0) == requests
    assert board.backend.aggregator.job_config(0) is None and not board.backend.worker_table


def test_no_group_spellings_and_group_spellings():
    for none in (None, 0, "0", " 0 "):
        assert parse_group(none) is None
    assert parse_group("239.1.2.3:80") == ("239.1.2.3", 80)
    assert parse_group(("224.0.0.251", "5353")) == ("224.0.0.251", 5353)


def test_a_board_without_group_registers_is_a_clear_error(board):
    board.backend.params["jobs"] = 1          # job 1's group entry now ignores writes
    with board.transport(region="switch") as control:
        with pytest.raises(TransportError, match="does not hold a result group for job 1"):
            write_group(control, 1, GROUP)
        assert write_group(control, 1, None) is None           # 0/0 reads back as written


# ---- real multicast, in a network namespace of its own -------------------------------

@pytest.fixture(scope="module")
def multicast(tmp_path_factory):
    command, why = namespace_command("ip link set lo up && ip link set lo multicast on && "
                                     "ip route add 224.0.0.0/4 dev lo", "a multicast route")
    if command is None:
        pytest.skip(why)
    return run_in_namespace(command, DRIVER, tmp_path_factory.mktemp("group") / "group.json",
                            DRIVER_TIMEOUT)


def _ran(r, *scenarios):
    for name in scenarios:
        assert name not in r["errors"], f"{name}: {r['errors'][name]}"


def test_group_results_are_bit_identical_to_unicast_ones(multicast):
    _ran(multicast, "unicast", "group")
    u, g = multicast["unicast"], multicast["group"]
    assert u["exact"] and g["exact"]
    assert len(set(u["digests"] + g["digests"])) == 1       # every worker, both runs
    assert g["layout_group"] == list(GROUP)


def test_the_boards_port_carries_each_result_once_with_a_group_and_n_times_without(multicast):
    _ran(multicast, "unicast", "group")
    u, g = multicast["unicast"], multicast["group"]
    results = u["results"]
    assert results == g["results"] > 100
    # read over CTRL from the board: N datagrams per result without a group, one with. A
    # worker whose timer runs out on a loaded machine resends, and each resend of a
    # completed round gets a unicast answer of its own: those are counted apart.
    resent = {name: sum(s["resends"] for s in run["stats"])
              for name, run in (("unicast", u), ("group", g))}
    assert u["counters"]["switch_in"] == WORKERS * results + resent["unicast"]
    assert u["counters"]["switch_group_out"] == 0
    assert 0 <= u["counters"]["switch_out"] - WORKERS * results <= resent["unicast"]
    assert g["counters"]["switch_in"] == WORKERS * results + resent["group"]
    assert g["counters"]["switch_group_out"] == results
    answers = g["counters"]["switch_out"] - results          # unicast answers to resends
    assert sum(s["unicast"] for s in g["stats"]) <= answers <= resent["group"]
    assert g["board"]["multicast"] == results and u["board"]["multicast"] == 0
    assert g["board"]["send_errors"] == 0


def test_every_worker_joined_the_group_and_took_every_result_from_it(multicast):
    _ran(multicast, "group")
    g = multicast["group"]
    assert GROUP[0] in g["memberships"]           # the kernel's IGMP membership on lo
    assert GROUP[0] not in multicast["unicast"]["memberships"]
    for s in g["stats"]:
        # every result from the group, but for the answers to a loaded machine's resends
        assert s["group"] == s["multicast"]
        assert s["group"] + s["unicast"] == s["results"] == s["packets"]
        assert s["unicast"] <= s["resends"] and s["foreign"] == 0
        assert s["group"] >= s["results"] - s["resends"] > 0


def test_a_lost_group_result_comes_back_as_unicast_answers_to_every_workers_resend(
        multicast):
    _ran(multicast, "resend")
    r = multicast["resend"]
    assert r["lost"] == 1 and r["exact"]
    results = r["results"]
    for s in r["stats"]:
        assert s["resends"] >= 1 and s["unicast"] >= 1
        assert s["group"] == s["multicast"] == results - s["unicast"]
    unicast = sum(s["unicast"] for s in r["stats"])
    # the group datagrams (one lost on the wire) and one unicast answer per resend
    assert r["counters"]["switch_group_out"] == results
    assert r["counters"]["switch_out"] == results + unicast
    assert r["board"]["multicast"] == results - 1


def test_a_job_sharing_the_group_address_and_port_is_ignored_as_foreign(multicast):
    _ran(multicast, "shared")
    s = multicast["shared"]
    assert s["exact"] == [True, True, True]
    job0, job1 = s["stats"]["0"], s["stats"]["1"]
    # job 0 ran once, job 1 twice: each saw the other's results on the group, took none
    assert all(w["foreign"] == job1[0]["results"] // 2 for w in job0)
    assert all(w["foreign"] == job0[0]["results"] for w in job1)
    assert all(w["group"] == w["results"] for w in job0 + job1)


def test_udp_transport_receives_a_jobs_group_for_every_local_worker(multicast):
    _ran(multicast, "transport")
    u, g = multicast["transport_unicast"], multicast["transport"]
    assert u["digest"] == g["digest"]
    assert g["joined"] == [list(GROUP)] and u["joined"] == []
    results = g["switch"]["replies"]
    assert results == u["switch"]["replies"] > 0
    # (each resend of a completed round, on a loaded machine, gets a unicast answer)
    assert 0 <= u["counters"]["switch_out"] - WORKERS * results <= u["switch"]["resends"]
    assert g["counters"]["switch_group_out"] == results
    assert 0 <= g["counters"]["switch_out"] - results <= g["switch"]["resends"]
    assert g["switch"]["foreign"] == g["switch"]["rebuilt"] == 0


def test_the_hooks_switch_backend_writes_the_group_and_its_rank_joins_it(multicast):
    _ran(multicast, "hook")
    h = multicast["hook"]
    assert h["exact"] and h["board_group"] == [ip_to_int(GROUP[0]), GROUP[1]]
    s = h["stats"]
    assert s["layout"]["group"] == list(GROUP)
    assert s["group"] == s["results"] == s["packets"] > 0
    assert h["cleared"]                    # closing released the job


def test_the_hooks_switch_backend_checks_its_group_when_made():
    from host.ddp.hardware import UdpSwitch
    settings = {"host": "127.0.0.1", "port_base": 1, "key": 1, "mtu": 1500}
    assert UdpSwitch("t", settings, group="239.1.2.3:4").group == ("239.1.2.3", 4)
    assert UdpSwitch("t", settings).group is None
    with pytest.raises(ValueError, match="not IPv4 multicast"):
        UdpSwitch("t", settings, group=("10.0.0.1", 4))


def test_a_result_sent_to_the_group_from_elsewhere_is_foreign(multicast):
    _ran(multicast, "forged")
    f = multicast["forged"]
    assert f["exact"]
    for s in f["stats"]:
        assert s["foreign"] == 1 and s["group"] == s["results"] == 1


def test_a_job_over_two_boards_has_a_group_per_board(multicast):
    _ran(multicast, "boards")
    r = multicast["boards"]
    if "skipped" in r:
        pytest.skip(r["skipped"])
    assert r["totals"] == [r["want"]] * 2
    for b, counters in enumerate(r["counters"]):
        # each board: one datagram per result, to its own group port; every rank took
        # every result of that board from the group
        results = r["per_board"][0][b]["results"]
        assert results > 0
        # (a loaded machine's resends counted apart, as above)
        resent = sum(rank[b]["resends"] for rank in r["per_board"])
        assert counters["switch_in"] == 2 * results + resent
        assert counters["switch_group_out"] == results
        assert 0 <= counters["switch_out"] - results <= resent
        for rank in r["per_board"]:
            assert rank[b]["results"] == results and rank[b]["foreign"] == 0
            assert rank[b]["group"] + rank[b]["unicast"] == results
            assert rank[b]["unicast"] <= rank[b]["resends"]


def test_ranks_in_processes_of_their_own_each_join_the_group(multicast):
    _ran(multicast, "ranks")
    r = multicast["ranks"]
    if "skipped" in r:
        pytest.skip(r["skipped"])
    assert r["totals"] == [r["want"]] * 3
    results = r["stats"][0]["results"]
    # a rank whose timer runs out on a loaded machine resends: each resend is one more
    # datagram in, and of a completed round one unicast answer out (counted apart)
    resent = sum(s["resends"] for s in r["stats"])
    counters = r["counters"]
    assert counters["switch_in"] == 3 * results + resent
    assert counters["switch_group_out"] == results
    answers = counters["switch_out"] - results
    assert sum(s["unicast"] for s in r["stats"]) <= answers <= resent
    for s in r["stats"]:
        assert s["results"] == results and s["foreign"] == 0
        assert s["group"] + s["unicast"] == results and s["unicast"] <= s["resends"]
