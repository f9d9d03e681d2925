"""The packet-level deployment model (sim/benchmarks/deployment.py): small cases by hand."""
import pytest

from host import bench
from sim.benchmarks import deployment as dep
from sim.benchmarks import links

T = dep.AGG_FRAME * 8 / 1e9          # one aggregator datagram at 1 GbE: 354 B = 2.832 us
L = dep.FORWARD_LATENCY_S
E = 9 / 75e6                          # an engine time per packet (9 cycles at 75 MHz)


def test_frame_and_link():
    assert dep.AGG_FRAME == 32 + 256 + 66 == 354
    link = dep.Link(1.0)
    assert link.send(0.0, 1250) == pytest.approx(10e-6)
    assert link.send(0.0, 1250) == pytest.approx(20e-6)          # waits behind the first
    assert link.peak_queue == pytest.approx(1250)
    assert link.send(30e-6, 125) == pytest.approx(31e-6)         # idle link: starts at once
    assert (link.bytes, link.frames) == (2625, 3)


def test_one_worker_one_chunk_is_store_and_forward():
    # worker -> switch, forward, switch -> board, engine, board -> switch, forward, -> worker
    r = dep.aggregation_stream(1, 1, 1, group=True, engine_s=E)
    assert r["seconds"] == pytest.approx(4 * T + 2 * L + E)


def test_ring_step_one_hop_is_store_and_forward():
    frame = 8290
    t = frame * 8 / 1e9
    assert dep.ring_step(2, 1, frame) == pytest.approx(2 * t + L)
    # packets pipeline: the last one leaves the sender after P frames, then one more hop
    assert dep.ring_step(2, 5, frame) == pytest.approx(6 * t + L)
    # behind NICs in the wire: raw to the board, compressed through the switch, raw again
    small, e = 1000, 1e-6
    s = small * 8 / 1e9
    assert dep.ring_step(2, 1, frame, wire=(small, e)) == pytest.approx(2 * t + 2 * s + 2 * e + L)


@pytest.mark.parametrize("workers", [2, 4, 8])
def test_n_workers_share_the_board_ingress(workers):
    # the board's one port receives every worker's packet of every chunk: per chunk N frames
    fit = dep.StreamFit(workers, 1, True, E, k1=128)
    assert fit.b == pytest.approx(workers * T, rel=1e-9)
    assert fit.deviation < 1e-9
    r = fit.simulate(128)
    assert r["board_in_bytes"] == workers * 128 * dep.AGG_FRAME
    assert r["board_in_bytes_per_chunk"] == workers * dep.AGG_FRAME


@pytest.mark.parametrize("workers", [2, 5, 8])
def test_group_sends_one_datagram_per_result_without_n(workers):
    g = dep.aggregation_stream(workers, 1, 20, group=True, engine_s=E)
    u = dep.aggregation_stream(workers, 1, 20, group=False, engine_s=E)
    assert g["board_out_datagrams_per_result"] == 1
    assert g["board_out_bytes_per_result"] == dep.AGG_FRAME
    assert u["board_out_datagrams_per_result"] == workers
    assert u["board_out_bytes_per_result"] == workers * dep.AGG_FRAME
    # every worker gets every result either way
    assert g["worker_in_bytes"] == u["worker_in_bytes"] == 20 * dep.AGG_FRAME


@pytest.mark.parametrize("boards", [1, 2, 4])
def test_boards_divide_the_board_link_load(boards):
    workers = 8
    fit = dep.StreamFit(workers, boards, True, E, k1=256)
    assert fit.b == pytest.approx(workers / boards * T, rel=1e-9)
    r = fit.simulate(256)
    assert r["board_in_bytes"] == workers * 256 * dep.AGG_FRAME     # all boards together
    assert r["board_in_bytes_per_chunk"] == workers * dep.AGG_FRAME


def test_as_many_boards_as_workers_loads_every_link_with_one_frame_per_chunk():
    # each board receives N packets every B = N chunks, each worker sends and receives one
    # packet per chunk: no link is the bottleneck alone, one frame time per chunk
    fit = dep.StreamFit(4, 4, True, E, k1=512)
    assert fit.b == pytest.approx(T, rel=1e-9)


def test_window_bounds_the_packets_in_flight():
    # one slot, one worker: every chunk waits for the previous chunk's result
    r = dep.aggregation_stream(1, 1, 3, group=True, engine_s=E, slots=1)
    assert r["seconds"] == pytest.approx(3 * (4 * T + 2 * L + E))
    # two slots: the second chunk goes at once behind the first
    r = dep.aggregation_stream(1, 1, 2, group=True, engine_s=E, slots=2)
    assert r["seconds"] == pytest.approx(5 * T + 2 * L + E)


def test_stream_fit_is_exact_for_short_rounds_and_linear_beyond():
    fit = dep.StreamFit(4, 1, False, E, k1=64)
    assert fit.seconds(0) == 0
    assert fit.seconds(10) == dep.aggregation_stream(4, 1, 10, group=False,
                                                     engine_s=E)["seconds"]
    assert fit.seconds(10_000) == pytest.approx(fit.a + fit.b * 10_000)
    assert fit.seconds(10_000) == pytest.approx(
        dep.aggregation_stream(4, 1, 10_000, group=False, engine_s=E)["seconds"], rel=1e-9)


def test_ring_seconds_scale_to_every_packet():
    values = 2 * 2048 * 100         # 2 workers: 100 full packets per step
    got = dep._ring_seconds(2, values, dep._raw_frame)
    t = dep._raw_frame(2048) * 8 / 1e9
    assert got == pytest.approx(2 * (101 * t + L))
    assert dep._ring_seconds(2, 0, dep._raw_frame) == 0


def test_boards_for():
    assert dep.boards_for(2) == [1, 2]
    assert dep.boards_for(8) == [1, 2, 4]
    assert dep.boards_for(32) == [1, 2, 4, 8, 16]


def test_registered_section():
    assert bench.SECTIONS["deployment"] == "sim.benchmarks.deployment"
    assert links.FRAMING_BYTES == 66


def test_a_board_with_two_ports_carries_as_much_as_two_boards_through_one_engine():
    one = dep.StreamFit(8, 1, True, E, k1=256, ports=2)
    two = dep.StreamFit(8, 2, True, E, k1=256)
    assert one.b == pytest.approx(two.b, rel=1e-9) == pytest.approx(4 * T, rel=1e-9)
    # an engine slower than the ports: two ports share it, two boards do not
    slow = 4 * T
    assert dep.StreamFit(1, 1, True, slow, k1=256, ports=2).b == pytest.approx(slow, rel=1e-9)
    assert dep.StreamFit(1, 2, True, slow, k1=256).b == pytest.approx(slow / 2, rel=1e-9)


def test_phase_words_are_the_golden_plans():
    import numpy as np
    from host.golden import lhc
    from sim.benchmarks.aggregation import phase_words

    values = 1 << 16
    p = phase_words(values, 0.05, np.random.default_rng(3))
    assert p["words"]["index"] == values // 32
    assert p["words"]["sketch"] == p["rows"] * lhc.B
    assert p["words"]["fallback"] == p["unpeeled"]
    assert p["words"]["dense"] == values
    assert p["chosen"] == "sketch"
    # a full union is not planned: the golden choice for it is dense, as the shortcut says
    full = phase_words(values, 1.0, None)
    union = lhc._index_of_mask(np.ones(values, dtype=bool))
    assert lhc.make_plan(union, 0, 8, values, path="auto").path == full["chosen"] == "dense"
    assert full["words"]["index"] == union.size


@pytest.mark.cocotb
def test_quick_section_reports_every_figure(tmp_path):
    r = dep.run(quick=True, out_dir=tmp_path)
    assert (tmp_path / "deployment.png").is_file()
    assert r["engine"]["cycles_per_packet"] == pytest.approx(9.0, abs=0.05)  # 1 + 64/8 beats
    bits = 32 * r["values"]
    for n, by_b in r["aggregator"].items():
        assert set(by_b) == {str(b) for b in dep.boards_for(int(n))}
        for b, by_group in by_b.items():
            g, u = by_group["group"], by_group["no_group"]
            assert g["board_out_datagrams_per_result"] == 1
            assert u["board_out_datagrams_per_result"] == int(n)
            assert u["board_out_bytes_per_result"] == int(n) * g["board_out_bytes_per_result"]
            for d, methods in g["densities"].items():
                for m in methods.values():
                    assert m["gbps"] == pytest.approx(bits / m["seconds"] / 1e9)
                    # the boards' ports bind: N / B frames per chunk (one when B = N), plus
                    # each round's fill, a few frames (under 1 % here)
                    per_chunk = max(int(n) / int(b), 1) * T
                    assert m["seconds"] == pytest.approx(
                        per_chunk * sum(m["chunks"].values()), rel=0.01)
        rings = r["rings"][n]
        # the wire board's host side carries raw fp32: no faster than the fp32 ring
        assert rings["ring_inc_wire"]["seconds"] >= rings["ring_fp32"]["seconds"]
        assert rings["ring_inc_nic"]["seconds"] < rings["ring_fp32"]["seconds"]
    assert [t["what"] for t in r["targets"]] and r["max_fit_deviation"] < 1e-6


# ---- two levels: a tree of aggregators on a two-tier fabric, small cases by hand
#
# 2 leaves of 2 workers, one leaf board each, one root board, every leaf group on its own
# leaf switch, one uplink of Tu per frame to the spine; T, L, E as above.

def _tu(uplink_gbps):
    return dep.AGG_FRAME * 8 / (uplink_gbps * 1e9)


@pytest.mark.parametrize("uplink_gbps", [1.0, 10.0])
def test_tree_one_chunk_by_hand(uplink_gbps):
    tu = _tu(uplink_gbps)
    # worker -> leaf switch T + L; both workers' packets onto the leaf board's port, the
    # second done at 3T + L, its engine + E; the aggregate out of the board T + L, the uplink
    # Tu + L, both leaves' aggregates onto the root's port 2T, the engine E; the result out
    # of the root T + L, the downlink Tu + L, into the leaf board T, its engine E, out T + L,
    # to the workers T: 10 T + 6 L + 3 E + 2 Tu
    r = dep.tree_stream(2, 2, 1, 1, engine_s=E, uplink_gbps=uplink_gbps)
    assert r["seconds"] == pytest.approx(10 * T + 6 * L + 3 * E + 2 * tu, rel=1e-12)
    # one aggregate up and one result down per leaf; the root: one from each leaf in, one out
    assert r["leaf_in_bytes_per_chunk"] == 3 * dep.AGG_FRAME
    assert r["leaf_out_bytes_per_chunk"] == 2 * dep.AGG_FRAME
    assert r["root_in_bytes_per_chunk"] == 2 * dep.AGG_FRAME
    assert r["root_out_bytes_per_chunk"] == dep.AGG_FRAME
    assert r["uplink_up_bytes_per_chunk"] == r["uplink_down_bytes_per_chunk"] == dep.AGG_FRAME


@pytest.mark.parametrize("uplink_gbps", [1.0, 10.0])
def test_tree_two_chunks_by_hand(uplink_gbps):
    tu = _tu(uplink_gbps)
    # chunk 1's packets queue behind chunk 0's at the leaf board (done at 5T + L) and at the
    # root (the second aggregate done at 8T + 3L + E + Tu); its result then goes the way of
    # chunk 0's, 2T later: 12 T + 6 L + 3 E + 2 Tu
    r = dep.tree_stream(2, 2, 1, 2, engine_s=E, uplink_gbps=uplink_gbps)
    assert r["seconds"] == pytest.approx(12 * T + 6 * L + 3 * E + 2 * tu, rel=1e-12)


def test_tree_stripes_over_leaf_boards_and_roots_by_hand():
    tu = _tu(10.0)
    one = 10 * T + 6 * L + 3 * E + 2 * tu
    # two leaf boards and two roots: chunk 1 takes chunk 0's way on boards of its own, one
    # frame later (the workers' ports are the only links the two share besides the uplinks)
    r = dep.tree_stream(2, 2, 2, 2, engine_s=E, roots=2, uplink_gbps=10.0)
    assert r["seconds"] == pytest.approx(one + T, rel=1e-12)
    # one root for both stripes: chunk 1's aggregates wait at the root's port for chunk 0's
    # (done at 8T + 3L + E + Tu, not 7T), and its result behind chunk 0's: one frame more
    r = dep.tree_stream(2, 2, 2, 2, engine_s=E, roots=1, uplink_gbps=10.0)
    assert r["seconds"] == pytest.approx(one + 2 * T, rel=1e-12)


def test_tree_window_waits_for_the_root():
    tu = _tu(10.0)
    # one slot: chunk 1 leaves the workers only once chunk 0's result is back from the root
    r = dep.tree_stream(2, 2, 1, 2, engine_s=E, slots=1)
    assert r["seconds"] == pytest.approx(2 * (10 * T + 6 * L + 3 * E + 2 * tu), rel=1e-12)
    # one root for 4 stripes shares its 64 slots: 16 each, a window of 64 chunks
    assert dep.tree_stream(2, 2, 4, 8, engine_s=E, roots=1)["window"] == 64
    assert dep.tree_stream(2, 2, 4, 8, engine_s=E)["window"] == 256


@pytest.mark.parametrize("leaves,leaf_size,boards,roots,frames", [
    (2, 4, 1, 1, 5),        # a leaf board's port: 4 packets and the root's result per chunk
    (2, 4, 2, 2, 2.5),      # two leaf boards per leaf: half as many each
    (8, 2, 1, 1, 8),        # 8 leaves: the root's port binds (8 aggregates per chunk)
    (8, 2, 2, 2, 4),        # two roots: 4 each
    (8, 2, 2, 1, 8),        # one root for two stripes: 8 again
])
def test_tree_steady_state_is_the_busiest_port(leaves, leaf_size, boards, roots, frames):
    layout = {"leaves": leaves, "leaves_per_switch": 1}
    fit = dep.TreeFit(layout, leaf_size, boards, roots, E, uplink_gbps=10.0, uplinks=1,
                      k1=2048)
    assert fit.deviation < 1e-9
    assert fit.b == pytest.approx(frames * T, rel=1e-6)


@pytest.mark.parametrize("roots,uplinks,uplink_gbps", [(2, 1, 10.0), (1, 2, 1.0), (2, 2, 1.0)])
def test_tree_one_leaf_switch_stands_for_all(roots, uplinks, uplink_gbps):
    # every leaf switch is alike: simulating one and counting its packets at the spine for
    # all gives the times of the whole fabric, to the last bit
    kw = dict(engine_s=E, roots=roots, leaves_per_switch=2, uplink_gbps=uplink_gbps,
              uplinks=uplinks)
    whole = dep.tree_stream(8, 3, 2, 300, **kw)
    one = dep.tree_stream(8, 3, 2, 300, simulated_switches=1, **kw)
    two = dep.tree_stream(8, 3, 2, 300, simulated_switches=2, **kw)
    assert one["seconds"] == pytest.approx(whole["seconds"], rel=1e-12)
    assert two["seconds"] == pytest.approx(whole["seconds"], rel=1e-12)
    for k in ("root_in_bytes_per_chunk", "leaf_in_bytes_per_chunk", "root_in_peak_queue_bytes"):
        assert one[k] == pytest.approx(whole[k], rel=1e-12)
    with pytest.raises(ValueError):
        dep.tree_stream(8, 3, 2, 10, simulated_switches=3, **kw)


def test_tree_layout():
    big = dep.tree_layout(1024, 32, 4, 4)
    assert (big["leaves"], big["leaves_per_switch"], big["switches"]) == (32, 1, 32)
    assert (big["leaf_switch_ports"], big["spine_ports"], big["boards"]) == (37, 36, 132)
    # two 16-worker leaves share a 48-port leaf switch (2 x (16 + 4) + 1 uplink)
    mid = dep.tree_layout(256, 16, 4, 1)
    assert (mid["leaves_per_switch"], mid["switches"], mid["leaf_switch_ports"]) == (2, 8, 41)
    assert mid["boards"] == 16 * 4 + 1
    assert "third level" in dep.tree_layout(1024, 16, 1, 1)["impossible"]
    assert "one leaf" in dep.tree_layout(32, 32, 1, 1)["impossible"]
    assert "impossible" in dep.tree_layout(64, 64, 1, 1)
    assert "impossible" in dep.tree_layout(64, 32, 4, 3)          # 3 roots, 4 stripes
    assert "impossible" in dep.tree_layout(1024, 32, 1, 1, uplinks=2)   # 65 spine ports


def test_fabric_ring_step_on_one_switch_is_ring_step():
    frame = 8290
    for wire in (None, (1000, 1e-6)):
        for packets in (1, 5):
            assert dep.fabric_ring_step(4, 4, packets, frame, uplink_gbps=10.0, wire=wire) \
                == pytest.approx(dep.ring_step(4, packets, frame, wire=wire), rel=1e-12)


@pytest.mark.parametrize("uplink_gbps", [1.0, 10.0])
def test_fabric_ring_step_across_switches_by_hand(uplink_gbps):
    frame = 8290
    t, tu = frame * 8 / 1e9, frame * 8 / (uplink_gbps * 1e9)
    # the crossing flow: the worker's port, the uplink and the downlink, the receiver's port,
    # three store-and-forward switches; P packets pipeline behind the slowest link (1 GbE)
    for packets in (1, 5):
        got = dep.fabric_ring_step(4, 2, packets, frame, uplink_gbps=uplink_gbps)
        assert got == pytest.approx((packets + 1) * t + 2 * tu + 3 * L, rel=1e-12)
    # the bench's 2 x 2 ring stands for any ring of 2 switches or more
    for wire in (None, (1000, 1e-6)):
        assert dep.fabric_ring_step(64, 32, 3, frame, uplink_gbps=uplink_gbps, wire=wire) \
            == pytest.approx(dep.fabric_ring_step(4, 2, 3, frame, uplink_gbps=uplink_gbps,
                                                  wire=wire), rel=1e-12)
    assert dep._ring_seconds(64, 64 * 2048 * 3, dep._raw_frame,
                             step=dep._fabric_step(uplink_gbps)) \
        == pytest.approx(2 * 63 * dep.fabric_ring_step(64, 32, 3, dep._raw_frame(2048),
                                                       uplink_gbps=uplink_gbps), rel=1e-12)


@pytest.mark.cocotb
def test_quick_section_reports_the_two_level_rows(tmp_path):
    r = dep.run(quick=True, out_dir=tmp_path)
    tl = r["two_levels"]
    assert tl["max_fit_deviation"] < dep.LINEARITY_TOLERANCE
    assert set(tl["trees"]) == set(dep.QUICK_TREE["uplinks"])
    for name, by_n in tl["trees"].items():
        for n, by_m in by_n.items():
            assert "impossible" in tl["flat"][n]             # N > 32: no one level
            assert set(tl["rings"][name][n]) == {"ring_fp32", "ring_inc_wire", "ring_inc_nic",
                                                 "lhc_ring"}
            for m, entry in by_m.items():
                leaves = int(n) // int(m)
                for b, by_r in entry["boards"].items():
                    assert set(by_r) == ({"R=B"} if b == "1" else {"R=B", "R=1"})
                    for cfg in by_r.values():
                        # per chunk of its stripe a leaf board takes m packets and the
                        # root's result and sends one aggregate and one result (groups);
                        # the roots take one aggregate per leaf
                        assert cfg["leaf_in_bytes_per_chunk"] == (int(m) + 1) * dep.AGG_FRAME
                        assert cfg["leaf_out_bytes_per_chunk"] == 2 * dep.AGG_FRAME
                        assert cfg["root_in_bytes_per_chunk"] == leaves * dep.AGG_FRAME
                        assert cfg["root_out_bytes_per_chunk"] == dep.AGG_FRAME
                        # the busiest port sets the pace: a leaf board's or a root board's
                        frames = max((int(m) + 1) / int(b), leaves / cfg["roots"])
                        assert cfg["fit"]["frames_per_chunk"] == pytest.approx(frames, rel=0.01)
                        for methods in cfg["densities"].values():
                            for x in methods.values():
                                assert x["gbps"] == pytest.approx(
                                    32 * r["values"] / x["seconds"] / 1e9)
                                if sum(x["chunks"].values()) > 100:
                                    assert x["seconds"] == pytest.approx(
                                        frames * T * sum(x["chunks"].values()), rel=0.01)
    # one level of as many boards as a tree is only defined up to 32 workers
    assert all(int(n) <= dep.MAX_JOB_WORKERS for n in tl["flat_same_boards"])
    assert (tmp_path / "deployment.png").is_file()
