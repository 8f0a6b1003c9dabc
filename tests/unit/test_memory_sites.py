"""`tracemalloc` growth by allocation site: a map that grows is named, with its size and blocks."""

from __future__ import annotations

import json
import tracemalloc

from rollwire.core.memory_sites import MemorySites, MemorySitesSettings, read_sites

KEPT: dict[int, bytes] = {}


def grow(count: int) -> None:
    for key in range(len(KEPT), len(KEPT) + count):
        KEPT[key] = bytes(1000) + key.to_bytes(8, "little")  # the site that grows


def test_the_site_that_grows_is_named_with_its_growth(tmp_path):
    path = tmp_path / "memory" / "scorer-0.jsonl"
    sites = MemorySites(path, MemorySitesSettings(enabled=True, warmup_s=3600, top=5), root=str(tmp_path)).start()
    try:
        base = tracemalloc.take_snapshot()
        grow(2000)
        first = sites.write(base, 60.0)
        grow(2000)
        second = sites.write(base, 120.0)
    finally:
        sites.stop()
        tracemalloc.stop()
        KEPT.clear()
    site = next(s for s in second["sites"] if "test_memory_sites.py" in s["site"])
    assert site["site"].endswith(f"test_memory_sites.py:{grow.__code__.co_firstlineno + 2}")
    assert 3900 <= site["grew_kb"] <= 4300 and 3900 <= site["blocks"] <= 4100  # 4000 values of ~1 kB
    assert next(s for s in first["sites"] if s["site"] == site["site"])["grew_kb"] < site["grew_kb"] / 1.8
    assert second["threads"] >= 2 and second["traced_mb"] > 3.9  # this thread and the watcher's
    assert [json.loads(line)["t_s"] for line in path.read_text().splitlines()] == [60.0, 120.0]
    assert read_sites(path.parent) == {"scorer-0": [first, second]}
