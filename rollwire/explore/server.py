"""`rollwire explore`: the run explorer's web server, a page over a run's log, live or finished.

    GET /                        the page (static/index.html, app.js, style.css, vendor/uPlot)
    GET /api/summary             the run: name, steps, rollouts, environments, what could not be read
    GET /api/curves?since=MS     reward (per environment, per term), staleness, throughput, losses, lag,
                                 reloads, drops since MS
    GET /api/rollouts?...        a page of rollouts, filtered (environment, fate, reason, step, version,
                                 group, min_reward, max_reward, q; offset, limit <= 200), newest first
    GET /api/rollout/ID          one rollout's story: its tokens (mask, version, logprob), its turns and
                                 tool calls, its scores, its group side by side, its trace link
    GET /api/steps?offset&limit  trainer steps, newest first; GET /api/step/N: one, with its reloads
    GET /api/fleet               replicas, the version each serves, weight versions, serving decisions
    GET /api/replays             the run's replays; GET /api/replay/NAME: changed rollouts, sign flips

One thread follows the log into a `RunIndex`; handlers read the index (pages, never whole topics)
and read single records back by position. Beyond loopback every `/api` request needs a bearer token
(`--tokens FILE` or `$ROLLWIRE_EXPLORE_TOKENS`); the page passes the one in its URL (`?token=`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from rollwire.core.bus import EventLog
from rollwire.core.http_service import Refused, refusals, source_of
from rollwire.explore.index import Query, RunIndex, tokens_of
from rollwire.schemas.rollout import RolloutCompleted, ScoredRollout, TraceRecorded
from rollwire.schemas.topics import Topics

logger = logging.getLogger(__name__)

PAGE_LIMIT = 200
"""Most rows one request returns."""


@dataclass
class Explorer:
    """What the handlers share: the run's index, how to decode tokens, where traces are viewed."""

    index: RunIndex
    name: str
    decode: Callable[[list[int]], list[str]] | None = None
    """Each token id's text; None shows ids."""
    trace_url: str | None = None
    """A trace viewer URL with `{trace_id}` (Jaeger's `/trace/{trace_id}`)."""
    replays: Callable[[], dict[str, Topics]] = dict
    """The run's replays by name: their shadow topics."""
    tokens: dict[str, str] = field(default_factory=dict)
    planned_steps: int | None = None
    """The steps the run's recipe asks for: the page says the run finished once the last is on the log."""
    _stop: threading.Event = field(default_factory=threading.Event)
    _replay_cache: dict[str, tuple[Any, dict]] = field(default_factory=dict)

    def start_following(self, every_s: float = 1.0) -> threading.Thread:
        def loop() -> None:
            while not self._stop.is_set():
                try:
                    if self.index.follow(timeout_s=every_s) == 0:
                        self._stop.wait(every_s)
                except Exception:  # the log away for a while: say so, try again
                    logger.exception("reading the run's log failed; trying again")
                    self._stop.wait(5.0)
        thread = threading.Thread(target=loop, name="explore-follow", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()

    # -- views ---------------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        index = self.index
        with index.lock:
            last = index.steps.rows[-1] if index.steps.rows else None
            return {"run": self.name, "prefix": index.topics.prefix, "records": index.records,
                    "caught_up": index.caught_up, "behind": index.behind,
                    "rollouts": len(index.rollouts), "forgotten": index.forgotten, "steps": len(index.steps.rows),
                    "last_step": last["step"] if last else None, "planned_steps": self.planned_steps,
                    "finished": bool(last and self.planned_steps and last["step"] >= self.planned_steps),
                    "version": last["version"] if last else None,
                    "updated_ms": index.updated_ms, "unreadable": index.unreadable.count,
                    "unreadable_last": list(index.unreadable.last), "drops": dict(index.drops),
                    "environments": sorted({r.environment for r in index.rollouts.values()}),
                    "replicas": len(index.replicas), "trace_url": self.trace_url is not None}

    def curves(self, since_ms: int) -> dict[str, Any]:
        index = self.index
        with index.lock:
            return {"steps": [r | {"environments": index.environments_of(r["step"])}
                              for r in index.steps.rows if r["time_ms"] > since_ms],
                    "drops": [r for r in index.drop_points.rows if r["time_ms"] > since_ms],
                    "reloads": [r for r in index.reloads.rows if r["time_ms"] > since_ms],
                    "lag": [r for r in index.lag.rows if r["time_ms"] > since_ms]}

    def rollout(self, rollout_id: str) -> dict[str, Any]:
        row = self.index.row(rollout_id)
        if row is None:
            raise Refused(404, f"no rollout {rollout_id!r} in this run (or an older one than the explorer keeps)")
        rollout = self.index.read_at("rollouts", row.at)
        if not isinstance(rollout, RolloutCompleted):
            raise Refused(410, f"rollout {rollout_id}'s record could not be read back")
        scored = self.index.read_at("scored", row.scored_at) if row.scored_at else None
        trace = self.index.read_at("traces", row.trace_at) if row.trace_at else None
        scored = scored if isinstance(scored, ScoredRollout) else None
        pieces = self.decode(rollout.completion_token_ids) if self.decode else None
        prompt = self.decode(rollout.prompt_token_ids) if self.decode else None
        trace_id = rollout.traceparent.split("-")[1] if rollout.traceparent and rollout.traceparent.count("-") >= 3 else None
        return {
            "row": row.as_json(), "question": rollout.question, "answer": rollout.answer,
            "rewards": rollout.rewards, "metrics": rollout.metrics,
            "error": rollout.error.model_dump() if rollout.error else None,
            "prompt": "".join(prompt) if prompt is not None else " ".join(map(str, rollout.prompt_token_ids)),
            "tokens": tokens_of(rollout, scored, pieces),
            "spans": [s.model_dump() for s in rollout.weight_versions],
            "scored": None if scored is None else {"reward": scored.reward, "advantage": scored.advantage,
                                                   "group_rewards": scored.group_rewards,
                                                   "group_reward_mean": scored.group_reward_mean,
                                                   "algorithm": scored.algorithm},
            "turns": _turns(trace) if isinstance(trace, TraceRecorded) else [],
            "completion": trace.completion if isinstance(trace, TraceRecorded) else None,
            "group": self.index.group(row.group_id),
            "trace_id": trace_id,
            "trace_link": self.trace_url.format(trace_id=trace_id) if self.trace_url and trace_id else None}

    def steps(self, offset: int, limit: int) -> dict[str, Any]:
        with self.index.lock:
            rows = list(reversed(self.index.steps.rows))
            served = {v: dict(r) for v, r in self.index.served_at.items()}
        page = rows[offset:offset + limit]
        return {"total": len(rows), "steps": [r | {"served": served.get(r["version"], {})} for r in page]}

    def step(self, number: int) -> dict[str, Any]:
        with self.index.lock:
            row = self.index.step_rows.get(number)
            served = dict(self.index.served_at.get(row["version"], {})) if row else {}
            environments = self.index.environments_of(number)
        if row is None:
            raise Refused(404, f"no step {number} in this run (or an older one than the explorer keeps)")
        total, trained = self.index.page(Query(step=number, limit=PAGE_LIMIT))
        return {**row, "served": served, "environments": environments, "trained": trained, "trained_total": total}

    def fleet(self) -> dict[str, Any]:
        with self.index.lock:
            return {"replicas": sorted(self.index.replicas.values(), key=lambda r: r["replica"]),
                    "versions": self.index.versions.rows[-50:][::-1],
                    "decisions": list(self.index.decisions)[-50:][::-1]}

    def replay(self, name: str) -> dict[str, Any]:
        from rollwire.streams import replay as replays
        shadow = self.replays().get(name)
        if shadow is None:
            raise Refused(404, f"no replay {name!r}: the run's replays are {sorted(self.replays())}")
        log, live = self.index.log, self.index.topics
        ends = (tuple(sorted(log.end_offsets(live.scored).items())), tuple(sorted(log.end_offsets(shadow.scored).items())))
        cached = self._replay_cache.get(name)
        if cached is not None and cached[0] == ends:
            return cached[1]
        held = self.index.unreadable
        comparison = replays.compare(replays.recorded_summaries(log, live.scored, held),
                                     replays.recorded_summaries(log, shadow.scored, held))
        result = {
            "name": name, "identical": comparison.identical, "changed": comparison.changed,
            "only_recorded": comparison.only_recorded, "only_replayed": comparison.only_replayed,
            "zero_signal_groups": comparison.zero_signal_groups,
            "environments": [{"environment": env, "rollouts": c.rollouts, "sign_flips": c.sign_flips,
                              "reward_before": c.rewards_before.mean, "reward_after": c.rewards_after.mean,
                              "advantage_before": c.advantages_before.mean, "advantage_after": c.advantages_after.mean}
                             for env, c in sorted(comparison.environments.items())],
            "largest": [{"rollout_id": rid, "before": old, "after": new,
                         "sign_flip": (old > 0 > new) or (old < 0 < new)} for rid, old, new in comparison.largest]}
        self._replay_cache[name] = (ends, result)
        return result


def _turns(trace: TraceRecorded) -> list[dict[str, Any]]:
    return [{"node": n.node_id, "parent": n.parent_id, "branch": n.branch, "kind": n.kind, "role": n.role,
             "content": n.content[:4000]} for n in trace.nodes if n.kind != "llm_call"]


def _int(request, name: str, default: int, *, low: int = 0, high: int | None = None) -> int:
    raw = request.query.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise Refused(400, f"{name} must be a whole number, not {raw!r}") from None
    if value < low or (high is not None and value > high):
        raise Refused(400, f"{name} must be between {low} and {high if high is not None else 'any'}, not {value}")
    return value


def _float(request, name: str) -> float | None:
    raw = request.query.get(name)
    if raw in (None, ""):
        return None
    try:
        return float(raw)
    except ValueError:
        raise Refused(400, f"{name} must be a number, not {raw!r}") from None


def query_of(request) -> Query:
    text = request.query.get
    return Query(environment=text("environment") or None, fate=text("fate") or None, reason=text("reason") or None,
                 step=_int(request, "step", -1, low=-1) if text("step") else None,
                 version=_int(request, "version", -1, low=-1) if text("version") else None,
                 group=text("group") or None, min_reward=_float(request, "min_reward"),
                 max_reward=_float(request, "max_reward"), text=text("q") or None,
                 offset=_int(request, "offset", 0), limit=_int(request, "limit", 50, low=1, high=PAGE_LIMIT))


def build_app(explorer: Explorer):
    from aiohttp import web

    static = resources.files("rollwire.explore").joinpath("static")

    def error(exc: Refused):
        return web.json_response({"error": exc.reason}, status=exc.status, headers=exc.headers)

    @web.middleware
    async def guard(request, handler):
        if request.path.startswith("/api/"):
            source_of(request.headers.get("Authorization"), explorer.tokens)
        return await handler(request)

    async def call(fn, *args):  # index reads and record reads off the event loop
        return web.json_response(await asyncio.to_thread(fn, *args))

    async def page(request):
        return web.Response(text=static.joinpath("index.html").read_text(), content_type="text/html")

    async def asset(request):
        name = request.match_info["name"]
        path = static.joinpath(*name.split("/"))
        if ".." in name.split("/") or not path.is_file():
            raise web.HTTPNotFound()
        kind = {"js": "application/javascript", "css": "text/css"}.get(name.rsplit(".", 1)[-1], "application/octet-stream")
        return web.Response(body=path.read_bytes(), content_type=kind)

    async def rollouts(request):
        query = query_of(request)

        def page_of() -> dict[str, Any]:
            total, rows = explorer.index.page(query)
            return {"total": total, "rollouts": rows}
        return await call(page_of)

    app = web.Application(middlewares=[refusals(error), guard])
    app.router.add_get("/", page)
    app.router.add_get("/static/{name:.+}", asset)
    def reads(pick):
        """A handler that calls what `pick(request)` names, `(function, *arguments)`, off the loop."""
        async def handler(request):
            return await call(*pick(request))
        return handler

    app.router.add_get("/api/summary", reads(lambda r: (explorer.summary,)))
    app.router.add_get("/api/curves", reads(lambda r: (explorer.curves, _int(r, "since", 0))))
    app.router.add_get("/api/rollouts", rollouts)
    app.router.add_get("/api/rollout/{id}", reads(lambda r: (explorer.rollout, r.match_info["id"])))
    app.router.add_get("/api/steps", reads(lambda r: (explorer.steps, _int(r, "offset", 0),
                                                      _int(r, "limit", 50, low=1, high=PAGE_LIMIT))))
    app.router.add_get("/api/step/{n}", reads(lambda r: (explorer.step, _int_path(r, "n"))))
    app.router.add_get("/api/fleet", reads(lambda r: (explorer.fleet,)))
    app.router.add_get("/api/replays", reads(lambda r: (lambda: sorted(explorer.replays()),)))
    app.router.add_get("/api/replay/{name}", reads(lambda r: (explorer.replay, r.match_info["name"])))
    return app


def _int_path(request, name: str) -> int:
    raw = request.match_info[name]
    if not raw.isdigit():
        raise Refused(400, f"{name} must be a whole number, not {raw!r}")
    return int(raw)


def run_replays(log: EventLog, run_dir: Path | None, named: list[str]) -> Callable[[], dict[str, Topics]]:
    """The run's replays: those `rollwire replay score` reported into `<run_dir>/replays/`, and `named`."""
    def found() -> dict[str, Topics]:
        names = set(named)
        if run_dir is not None and (run_dir / "replays").is_dir():
            names |= {p.name for p in (run_dir / "replays").iterdir() if (p / "report.md").is_file()}
        return {name: Topics(name) for name in sorted(names)}
    return found
