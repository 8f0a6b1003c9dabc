"""The run explorer's front door: `rollwire explore` and the compose stack's `explore` service start
the page through `serve_explorer`, so a page started by hand reads the run as the service does."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from rollwire.core.bus import EventLog
from rollwire.core.http_service import run_app
from rollwire.explore.index import RunIndex
from rollwire.explore.server import Explorer, build_app, run_replays
from rollwire.schemas.topics import Topics


def serve_explorer(log: EventLog, topics: Topics, *, name: str, host: str, port: int,
                   decode: Callable[[list[int]], list[str]] | None = None, trace_url: str | None = None,
                   run_dir: Path | None = None, replays: Sequence[str] = (), tokens: dict[str, str] | None = None,
                   max_rollouts: int = 200_000, planned_steps: int | None = None,
                   ready: Callable[[int], None] | None = None) -> None:
    """Follows `topics` on `log` into an index and serves the page on `host:port` until interrupted.
    `planned_steps`: the recipe's, to say when the run finished. `replays`: shadow prefixes to
    compare, beside those reported into `<run_dir>/replays/`."""
    explorer = Explorer(RunIndex(log, topics, max_rollouts=max_rollouts), name=name, decode=decode,
                        trace_url=trace_url, replays=run_replays(log, run_dir, list(replays)), tokens=tokens or {},
                        planned_steps=planned_steps)
    explorer.start_following()
    try:
        run_app(build_app(explorer), host, port, ready=ready,
                describe=lambda chosen: f"the run explorer of {topics.prefix}: http://{host}:{chosen}/")
    finally:
        explorer.stop()
