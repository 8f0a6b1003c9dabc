"""Where a component's memory grows, by allocation site: `tracemalloc` snapshots diffed over time,
behind a setting (`[telemetry.memory_sites] enabled`), for finding what a long run leaks.

    <run_dir>/memory/<role>-<index>.jsonl    one line per `every_s`:
        {"t_s": 1800.0, "traced_mb": 41.2, "threads": 9,
         "sites": [{"site": "streams/embedded_scorer.py:212", "grew_kb": 5120.4, "blocks": 20480}, ...]}

The first snapshot is taken `warmup_s` after the start (imports, caches filling, the first
versions loaded are not growth); every later line lists the `top` sites whose live allocations
grew most since it, with their size and count of blocks. A site that keeps climbing line after
line is a leak or an unbounded map; one that levels off is a cache filling up. `bench/soak.py
--sites` turns it on for every component and prints the sites that grew.

Cost: tracemalloc records every Python allocation (C libraries' own buffers, a tensor's storage
or librdkafka's queues, are not seen); expect the traced process to run noticeably slower, so
measure rates with it off.
"""

from __future__ import annotations

import json
import threading
import time
import tracemalloc
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

_IGNORED = ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>", "<unknown>", tracemalloc.__file__)


class MemorySitesSettings(BaseModel):
    """tracemalloc in every component of a run, its growth by allocation site written to
    `<run_dir>/memory/` (off by default: it slows the traced processes)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    enabled: bool = False
    """Trace allocations in each component process and write what grew."""
    warmup_s: float = Field(default=300.0, ge=0)
    """Seconds after a component starts before the snapshot growth is measured from."""
    every_s: float = Field(default=300.0, gt=0)
    """Seconds between the lines written."""
    top: int = Field(default=15, ge=1)
    """Sites per line, the most grown first."""


class MemorySites:
    """Takes the snapshots on a daemon thread and appends a line to `path` every `every_s`."""

    def __init__(self, path: Path, settings: MemorySitesSettings, *, root: str = "") -> None:
        self.path, self.settings = Path(path), settings
        self.root = root
        """A path prefix left out of site names (the installation's folder), for short names."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="rollwire-memory-sites", daemon=True)

    def start(self) -> MemorySites:
        if not tracemalloc.is_tracing():
            tracemalloc.start(1)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        started = time.monotonic()
        if self._stop.wait(self.settings.warmup_s):
            return
        base = _snapshot()
        while not self._stop.wait(self.settings.every_s):
            self.write(base, time.monotonic() - started)

    def write(self, base: tracemalloc.Snapshot, t_s: float) -> dict:
        """Appends one line: the sites grown most since `base`; returns it."""
        grown = [s for s in _snapshot().compare_to(base, "lineno") if s.size_diff > 0][: self.settings.top]
        line = {"t_s": round(t_s, 1), "traced_mb": round(tracemalloc.get_traced_memory()[0] / 2**20, 2),
                "threads": threading.active_count(),
                "sites": [{"site": self._name(s.traceback[0]), "grew_kb": round(s.size_diff / 1024, 1),
                           "blocks": s.count_diff} for s in grown]}
        with self.path.open("a") as out:
            out.write(json.dumps(line) + "\n")
        return line

    def _name(self, frame: tracemalloc.Frame) -> str:
        name = frame.filename
        if self.root and name.startswith(self.root):
            name = name[len(self.root):].lstrip("/")
        elif "site-packages/" in name:
            name = name.rpartition("site-packages/")[2]
        return f"{name}:{frame.lineno}"

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _snapshot() -> tracemalloc.Snapshot:
    return tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, f) for f in _IGNORED])


def read_sites(folder: Path) -> dict[str, list[dict]]:
    """Every component's lines under `folder` (`<run_dir>/memory`), by component name."""
    return {path.stem: [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            for path in sorted(Path(folder).glob("*.jsonl"))}
