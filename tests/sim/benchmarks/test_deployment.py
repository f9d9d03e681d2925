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
