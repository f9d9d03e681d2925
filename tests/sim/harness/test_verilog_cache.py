"""The Verilog cache of the exported tops (sim/harness/verilog_cache.py)."""
from __future__ import annotations

import pytest

import sim.runner
from hdl import export
from sim.harness import verilog_cache

SMALL_SWITCH = dict(slots=4, lanes=8, max_workers=2, jobs=1)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(sim.runner, "BUILD", tmp_path)
    return tmp_path / "sim" / "verilog"


def test_a_miss_exports_and_stores_the_same_text_a_hit_reads_it(cache_dir, monkeypatch):
    expected = export.export_verilog(export.make_top("switch_top", **SMALL_SWITCH),
                                     "switch_top")
    assert verilog_cache.cached_verilog("switch_top", **SMALL_SWITCH) == expected
    stored = list(cache_dir.glob("switch_top-*.v"))
    assert len(stored) == 1 and stored[0].read_text() == expected
    assert not list(cache_dir.glob(".*"))            # no temporary file left behind

    def no_elaboration(*args, **kwargs):
        raise AssertionError("a cache hit elaborated the design again")

    monkeypatch.setattr(verilog_cache, "make_top", no_elaboration)
    assert verilog_cache.cached_verilog("switch_top", **SMALL_SWITCH) == expected
    # Other parameters are another design: a miss.
    with pytest.raises(AssertionError, match="elaborated"):
        verilog_cache.cached_verilog("switch_top", **{**SMALL_SWITCH, "slots": 8})


def test_the_key_follows_every_source_file_and_the_parameters(tmp_path, monkeypatch):
    for package in verilog_cache.SOURCE_PACKAGES:
        (tmp_path / package / "sub").mkdir(parents=True)
        (tmp_path / package / "sub" / "stage.py").write_text("WIDTH = 8\n")
    monkeypatch.setattr(verilog_cache, "_REPO", tmp_path)
    verilog_cache._sources_digest.cache_clear()
    try:
        before = verilog_cache.design_digest("nic_top", {"max_count": 2048})
        assert verilog_cache.design_digest("nic_top", {"max_count": 1024}) != before
        assert verilog_cache.design_digest("switch_top", {"max_count": 2048}) != before
        for package in verilog_cache.SOURCE_PACKAGES:
            path = tmp_path / package / "sub" / "stage.py"
            path.write_text("WIDTH = 9\n")
            verilog_cache._sources_digest.cache_clear()
            changed = verilog_cache.design_digest("nic_top", {"max_count": 2048})
            assert changed != before, f"a change in {package}/ kept the key"
            path.write_text("WIDTH = 8\n")
            verilog_cache._sources_digest.cache_clear()
            assert verilog_cache.design_digest("nic_top", {"max_count": 2048}) == before
    finally:
        verilog_cache._sources_digest.cache_clear()
