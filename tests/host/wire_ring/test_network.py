"""The ring through NICs in the wire (``host/wire_ring/network.py``, ``host.py``): hosts
behind golden wire boards and a learning switch reach the golden ring's result bit for
bit, with and without loss, duplication and reordering on the network links."""
import numpy as np
import pytest

from contract.network import NIC_VALUES_PER_MTU
from host.board.link_faults import WireFaults
from host.wire_ring import RingStalled, golden_ring, ring_over_wire
from host.wire_ring.host import ring_schedule
from host.wire_ring.network import MAX_WORKERS, bits_equal, ring_addresses
from tests.helpers import bits

#: the golden ring adds NaNs and infinities as they come
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in add:RuntimeWarning")

#: NaN payloads (quiet, signalling, negative), infinities, -0.0, a denormal, 1.0
SPECIALS = np.array([0x7FC0_0001, 0xFFA0_1234, 0x7F80_0001, 0x7F80_0000, 0xFF80_0000,
                     0x8000_0000, 0x0000_0001, 0x3F80_0000], dtype=np.uint32).view(np.float32)


def gradients(n, workers=4, seed=0, scale=0.05):
    rng = np.random.default_rng(seed)
    out = [(rng.standard_normal(n) * scale).astype(np.float32) for _ in range(workers)]
    for w, t in enumerate(out):
        t[w * 3:w * 3 + SPECIALS.size] = SPECIALS   # overlapping specials: NaN + x etc.
    return out


def check_exact(tensors, k, **kw):
    results, stats = ring_over_wire(tensors, k, **kw)
    golden = golden_ring(tensors, k)
    for r, (got, want) in enumerate(zip(results, golden)):
        assert bits_equal(got, want), f"host {r} differs from the golden ring"
    return results, stats


@pytest.mark.parametrize("k", [4, 8, 10, 15])
def test_four_hosts_bit_exact_and_compressed_on_the_network(k):
    _, s = check_exact(gradients(3000), k)
    assert s.network_bytes < s.host_bytes
    assert s.boards[0]["compressed"] == s.hosts["tx_datagrams"] > 0
    assert s.boards[1]["decompressed"] >= s.hosts["tx_datagrams"]
    assert s.hosts["tx_resends"] == 0 and s.hosts["rx_duplicates"] == 0
    # without faults every frame crosses one host link and one network link each way
    assert s.host_link["frames"] == s.network_link["frames"]
    # acks and everything that is not a gradient datagram pass the boards unchanged
    assert s.host_link["bytes"]["ack"] == s.network_link["bytes"]["ack"] > 0
    assert s.switch["learned"] == 4


def test_bytes_shrink_with_the_error_bound():
    ratios = [check_exact(gradients(3000), k)[1].gradient_ratio for k in (4, 10, 15)]
    assert ratios[0] > ratios[1] > ratios[2] > 1


@pytest.mark.parametrize("seed", [1, 2])
def test_bit_exact_through_loss_duplication_and_reordering(seed):
    faults = WireFaults(loss=0.1, dup=0.1, reorder=0.2, seed=seed, max_delay=3e-4)
    _, s = check_exact(gradients(5000, seed=seed), 10, faults=faults)
    f = s.faults
    assert f["lost"] > 0 and f["duplicated"] > 0 and f["delayed"] > 0
    assert s.hosts["tx_resends"] > 0 and s.hosts["rx_duplicates"] > 0
    assert s.hosts["rx_dropped"] == 0


def test_faults_are_deterministic():
    runs = [ring_over_wire(gradients(2000), 8, faults=WireFaults(0.1, seed=7, max_delay=2e-4))
            for _ in range(2)]
    assert runs[0][1].as_dict() == runs[1][1].as_dict()
    assert all(bits_equal(a, b) for a, b in zip(runs[0][0], runs[1][0]))


def test_values_that_do_not_compress_pass_raw():
    # every value at least 1 in magnitude: tag 11, 34 bits each; the boards pass them raw
    tensors = [np.full(2000, 1.5 + w, dtype=np.float32) for w in range(4)]
    _, s = check_exact(tensors, 10)
    assert s.boards[0]["incompressible"] == s.hosts["tx_datagrams"] > 0
    assert s.boards[0]["compressed"] == 0 and s.boards[1]["decompressed"] == 0
    assert s.network_link["bytes"] == s.host_link["bytes"]
    assert s.ratio == 1.0


def test_host_quantizes_so_a_raw_datagram_gives_the_golden_bits():
    # mostly raw values with a few 16-bit ones: the datagram is longer compressed, so it
    # passes raw; without quantizing the receiver would add the unquantized values
    tensors = [np.full(400, 3.0 + w, dtype=np.float32) for w in range(3)]
    for t in tensors:
        t[::40] = np.float32(0.3)
    _, s = check_exact(tensors, 10)
    assert s.boards[0]["incompressible"] > 0
    results, _ = ring_over_wire(tensors, 10, quantize=False)
    assert not all(bits_equal(a, b) for a, b in zip(results, golden_ring(tensors, 10)))


@pytest.mark.parametrize("workers, n", [(2, 1000), (3, 1001), (5, 3), (4, 0)])
def test_ring_sizes_including_empty_chunks(workers, n):
    check_exact(gradients(n, workers) if n >= 20 else
                [np.arange(n, dtype=np.float32) * (w + 1) / 9 for w in range(workers)], 9)


def test_datagrams_fit_the_mtu():
    tensors = gradients(NIC_VALUES_PER_MTU * 4 * 3)     # three datagrams per chunk
    _, s = check_exact(tensors, 10)
    assert s.hosts["tx_datagrams"] == 4 * 6 * 3
    _, jumbo = check_exact(tensors, 10, mtu=9000)
    assert jumbo.hosts["tx_datagrams"] == 4 * 6         # one datagram per chunk
    assert NIC_VALUES_PER_MTU == 360


def test_schedule_is_the_golden_rings():
    send, receive = ring_schedule(1, 4)
    assert send == {0: 1, 1: 0, 2: 3, 3: 2, 4: 1, 5: 0}
    assert receive == {seq: chunk for seq, chunk in ring_schedule(0, 4)[0].items()}


def test_addresses_are_distinct_and_boards_keep_their_own():
    hosts, boards = ring_addresses(MAX_WORKERS)
    assert boards[0].mac == "02:47:57:00:00:01" and boards[0].ip == "192.168.77.2"
    assert len({e.ip for e in hosts + boards}) == 2 * MAX_WORKERS


def test_bounded():
    with pytest.raises(RingStalled, match="within 50 events"):
        ring_over_wire(gradients(2000), 10, max_events=50)


@pytest.mark.parametrize("tensors, kw, message", [
    ([np.zeros(8, np.float32)], {}, "2..64 hosts"),
    ([np.zeros(8, np.float32)] * 65, {}, "2..64 hosts"),
    ([np.zeros(8, np.float32)] * 3, dict(k=0), "k"),
    ([np.zeros(8, np.float32)] * 3, dict(k=16), "k"),
    ([np.zeros(8, np.float32), np.zeros(9, np.float32)], {}, "shape"),
    ([np.zeros(8, np.float32), np.zeros(8, np.float64)], {}, "float32"),
    ([np.zeros(8, np.float32)] * 2, dict(mtu=40), "MTU"),
    ([np.zeros(8, np.float32)] * 2, dict(timeout=0), "timeout"),
    ([np.zeros(8, np.float32)] * 2, dict(max_events=0), "max_events"),
])
def test_bad_parameters(tensors, kw, message):
    with pytest.raises(ValueError, match=message):
        ring_over_wire(tensors, **kw)
