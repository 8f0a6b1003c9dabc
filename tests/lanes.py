"""The order of the suite, and how `make test`'s two pytest-xdist workers share it.

Tests run tier by tier in `LANES` order (`tests/conftest.py` sorts them). With workers (`--dist
loadfile`: a test file at a time, so that module fixtures run once), `TwoLanes` gives the first
worker the whole runs (`tests/run`, `tests/trainer`) and the others everything else, each in that
order; a worker whose own files are done takes the next file of the other lane. Measured on an idle
2-core machine, the tiers keep about one core busy each (the whole runs 1.1, the inference tier
0.9, the integration tier 0.4: their processes start, wait and recover), so two lanes fill both
cores; two whole runs at once (what plain `loadfile` hands out first) took longer than one after
the other.
"""

from __future__ import annotations

import pytest

LANES = ("demo-run", "run", "trainer", "inference", "integration", "contract", "unit", "docker")
"""Tiers in the order they run: the longest first, the docker tests last, once the images the
session builds in the background from its start are ready (`docker_engine.Prebuild`). Tests that
share a session fixture too costly to run twice (the demo run) are in one file."""

WHOLE_RUNS = ("tests/run/", "tests/trainer/")
"""The first worker's lane: whole `rollwire run`s, each with its own vLLM servers, and the trainer's
processes."""


def lane_of(item: pytest.Item) -> str:
    """The tier an item runs in (`LANES`); a test file outside a tier is `unit`."""
    if item.get_closest_marker("stack") or item.get_closest_marker("container"):
        return "docker"
    if {"demo_run", "demo_started"} & set(getattr(item, "fixturenames", ())):
        return "demo-run"
    path = item.nodeid.split("::")[0]
    tier = path.split("/")[1] if path.count("/") > 1 else "unit"
    return tier if tier in LANES else "unit"


def order(items: list[pytest.Item]) -> None:
    """Sorts `items` in place by lane, keeping the collected order within one (each worker sorts
    its collection alike; the controller hands out files in that order)."""
    lanes = {item.nodeid: lane_of(item) for item in items}
    collected = {nodeid: index for index, nodeid in enumerate(lanes)}
    items.sort(key=lambda item: (LANES.index(lanes[item.nodeid]), collected[item.nodeid]))


def make_scheduler(config: pytest.Config, log):
    """`TwoLanes` for `--dist loadfile` (None: pytest-xdist's own scheduler for any other mode)."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class TwoLanes(LoadFileScheduling):
        """`LoadFileScheduling`, a file at a time, but the first worker (gw0) takes the files of
        `WHOLE_RUNS` first and the others the rest first; each takes the other lane's next file when
        its own has none left."""

        def _assign_work_unit(self, node) -> None:
            runs_worker = node.gateway.id == "gw0"
            own = [scope for scope in self.workqueue if scope.startswith(WHOLE_RUNS) == runs_worker]
            scope = own[0] if own else next(iter(self.workqueue))
            work_unit = self.workqueue.pop(scope)
            self.assigned_work.setdefault(node, {})[scope] = work_unit
            collection = self.registered_collections[node]
            node.send_runtest_some([collection.index(nodeid) for nodeid, done in work_unit.items() if not done])

    return TwoLanes(config, log)

