"""The measurement of ``make bench``'s ``codec_memory`` section, and the ``--large`` option."""
import json

import numpy as np

from host import bench
from host.benchmarks import codec_memory


def test_child_peak_is_the_childs_own():
    """A child's peak is its own, not the parent's: the parent holds 256 MiB while the
    children run (``ru_maxrss`` would report at least that for every child)."""
    held = np.ones(256 << 20, np.uint8)
    base, _, _ = codec_memory.peak_of_child("import numpy as np")
    peak, _, out = codec_memory.peak_of_child(
        "import numpy as np; a = np.ones(64 << 20, np.uint8); print(int(a.sum()))")
    assert out.strip() == str(64 << 20)
    assert base < 200 << 20 and 60 << 20 < peak - base < 72 << 20, (base, peak)
    assert held[-1] == 1
    peak, _, out = codec_memory.peak_of_child("-m", ["host.cli", "--help"])
    assert "compress" in out and peak < 200 << 20


def test_large_reaches_only_sections_that_take_it(tmp_path, monkeypatch):
    calls = []

    def run_with_large(quick, large=False):
        calls.append(("codec_memory", quick, large))
        return {}

    def run_plain(quick):
        calls.append(("lhc", quick))
        return {}

    monkeypatch.setattr(codec_memory, "run", run_with_large)
    from host.benchmarks import lhc
    monkeypatch.setattr(lhc, "run", run_plain)
    out = tmp_path / "r.json"
    for large in (False, True):
        assert bench.main(["--only", "codec_memory", "--only", "lhc", "--quick", "--out",
                           str(out)] + (["--large"] if large else [])) == 0
    assert calls == [("codec_memory", True, False), ("lhc", True),
                     ("codec_memory", True, True), ("lhc", True)]
    assert set(json.loads(out.read_text())) >= {"codec_memory", "lhc"}
