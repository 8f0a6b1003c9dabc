"""Which inference replica each model call goes to: many replicas, routed by weight version.

    fleet topic ──ReplicaStatus(url, serving_version, state)──▶ FleetView (members, versions)
                                                                   │
    rollout r, call k ──▶ Router.route(r) ──▶ RolloutRoute ── pick ─┘
                                                 │  sticky: every call of r goes to the replica of its
                                                 │          first call (its prefix cache holds r's turns)
                                                 │  version-aware: never to a replica serving an older
                                                 │          version than r's earlier calls were sampled on
                                                 │  new rollouts: the newest version served, then the
                                                 │          fewest requests in flight
                                                 └─ failover: a replica that fails before sampling a token
                                                    is left for another eligible one, once per call

A replica joins when it reports on `fleet` with a URL and leaves when it reports `stopped` or
`failed`, or stops reporting for `member_ttl_s` (replicas send a heartbeat every few seconds).
The choice is recorded on the current span (`rollwire.replica`, `rollwire.route`): no system in
the field routes by weight version today, so the traces show why each call went where it did.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace

from rollwire.consumers.vllm_control import VllmControl, VllmError
from rollwire.core import metrics
from rollwire.core.bus import EventLog, Follower
from rollwire.producers.interception import version_number
from rollwire.producers.tool_calls import ToolCallFormat
from rollwire.schemas.topics import Topics
from rollwire.schemas.weights import ReplicaStatus

logger = logging.getLogger(__name__)

MEMBER_TTL_S = 30.0
"""A replica silent for this long leaves the pool (replicas report every `heartbeat_s`, 10 s)."""


class NoReplica(VllmError):
    """No replica can take the call: none serves, or none serves a version the rollout may use
    (an `inference` error on the rollout)."""


@dataclass
class Member:
    """One replica as the fleet topic describes it."""

    replica_id: str
    url: str
    version: int | None
    state: str
    seen_at: float
    control: VllmControl
    in_flight: int = 0


@dataclass
class FleetView:
    """The replicas that serve, from their `ReplicaStatus` events; thread-safe."""

    member_ttl_s: float = MEMBER_TTL_S
    clock: Callable[[], float] = time.monotonic
    make_control: Callable[[str], VllmControl] = VllmControl
    _members: dict[str, Member] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    changed: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self.changed = threading.Condition(self._lock)

    def apply(self, status: ReplicaStatus) -> None:
        """Takes in one status event: joins, updates or removes its replica."""
        with self._lock:
            member = self._members.get(status.replica_id)
            if status.state in ("stopped", "failed") or status.url is None:
                if member is not None:
                    self._members.pop(status.replica_id)
                    member.control.close()
                return
            version = status.serving_version or 0  # a replica that loaded nothing serves the base model, v0
            if member is None or member.url != status.url:
                if member is not None:
                    member.control.close()
                member = Member(status.replica_id, status.url, version, status.state, self.clock(),
                                self.make_control(status.url))
                self._members[status.replica_id] = member
            member.version, member.state, member.seen_at = version, status.state, self.clock()
            self.changed.notify_all()

    def add_static(self, replica_id: str, control: VllmControl) -> None:
        """A replica known without the fleet topic (one URL given on the command line): it never
        expires, and its version is unknown (any rollout may use it)."""
        with self._lock:
            url = getattr(control, "base_url", "")
            self._members[replica_id] = Member(replica_id, url, None, "serving", float("inf"), control)

    def members(self) -> list[Member]:
        """The replicas that serve now (reported recently, not reloading)."""
        now = self.clock()
        with self._lock:
            expired = [m for m in self._members.values() if now - m.seen_at > self.member_ttl_s]
            for member in expired:
                logger.warning("replica %s has not reported for %.0f s: left the pool", member.replica_id,
                               now - member.seen_at)
                self._members.pop(member.replica_id)
            return [m for m in self._members.values() if m.state == "serving"]

    def close(self) -> None:
        with self._lock:
            for member in self._members.values():
                member.control.close()
            self._members.clear()


def choose(members: Sequence[Member], *, sticky: str | None, min_version: int | None,
           avoid: Collection[str] = frozenset(), rng: random.Random | None = None,
           prefer: tuple[int, str] | None = None) -> tuple[Member, str]:
    """The replica for a rollout's next call, and why (`sticky`, `newest`, `failover`, or the lane
    of `prefer`).

    `sticky` is the replica of the rollout's earlier calls; `min_version` the newest version they
    were sampled on. A member serving an unknown version (a static URL) is eligible for any rollout.
    `prefer` (version, lane) asks for replicas serving that version (the serving gateway's canary or
    stable version); while none does, the newest version takes the call (`<lane>-unserved`)."""
    def eligible(m: Member) -> bool:
        return m.replica_id not in avoid and (min_version is None or m.version is None or m.version >= min_version)

    candidates = [m for m in members if eligible(m)]
    if not candidates:
        served = ", ".join(f"{m.replica_id}@v{m.version}" for m in members) or "none"
        raise NoReplica(f"no replica serves version {min_version} or newer for this rollout (serving: {served})"
                        if min_version is not None else f"no replica serves (serving: {served})")
    for m in candidates:
        if m.replica_id == sticky:
            return m, "sticky"
    why = "failover" if sticky is not None else "newest"
    pool = [m for m in candidates if prefer is not None and m.version == prefer[0]]
    if prefer is not None:
        why = prefer[1] if pool else f"{prefer[1]}-unserved"
    if not pool:
        newest = max((m.version for m in candidates if m.version is not None), default=None)
        pool = [m for m in candidates if m.version is None or m.version == newest]
    fewest = min(m.in_flight for m in pool)
    pool = [m for m in pool if m.in_flight == fewest]
    return (rng or random).choice(pool), why


class Router:
    """Routes each rollout's model calls over the fleet (`FleetView`)."""

    def __init__(self, fleet: FleetView, *, wait_s: float = 60.0, rng: random.Random | None = None) -> None:
        self.fleet, self.wait_s, self.rng = fleet, wait_s, rng or random.Random()
        self._lock = threading.Lock()
        self._follower: Follower | None = None
        metrics.observe("rollwire.replica.in_flight", self.in_flight, attribute="rollwire.replica_id",
                        unit="{request}", description="requests open on each replica, from this router")

    @classmethod
    def single(cls, control: VllmControl, *, wait_s: float = 60.0) -> Router:
        """One replica at a known URL: every call goes there (waiting up to `wait_s` while it
        cannot be reached)."""
        fleet = FleetView()
        fleet.add_static(getattr(control, "base_url", "") or "replica", control)
        return cls(fleet, wait_s=wait_s)

    def follow(self, log: EventLog, topics: Topics, poll_s: float = 0.5) -> Router:
        """Keeps the fleet view current from the `fleet` topic, in a background thread."""
        def take(event) -> None:
            if isinstance(event, ReplicaStatus):
                self.fleet.apply(event)
        self._follower = Follower(log, [topics.fleet], take, name="fleet-follower", poll_s=poll_s)
        self._follower.wait()
        return self

    def route(self, prefer: tuple[int, str] | None = None) -> RolloutRoute:
        """A route for one new rollout (or production request, with the version it should go to)."""
        return RolloutRoute(self, prefer)

    def pick(self, *, sticky: str | None, min_version: int | None, avoid: set[str],
             prefer: tuple[int, str] | None = None) -> tuple[Member, str]:
        """A member, waiting up to `wait_s` for one to serve (a replica restarting, the first start)."""
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                with self._lock:
                    member, why = choose(self.fleet.members(), sticky=sticky, min_version=min_version, avoid=avoid,
                                         rng=self.rng, prefer=prefer)
                    member.in_flight += 1
                    return member, why
            except NoReplica:
                if time.monotonic() >= deadline:
                    raise
            with self.fleet.changed:
                self.fleet.changed.wait(timeout=1.0)

    def in_flight(self) -> dict[str, int]:
        """Requests open on each serving replica."""
        with self._lock:
            return {m.replica_id: m.in_flight for m in self.fleet.members()}

    def done(self, member: Member) -> None:
        with self._lock:
            member.in_flight -= 1

    def close(self) -> None:
        if self._follower is not None:
            self._follower.close()
        self.fleet.close()


class RolloutRoute:
    """One rollout's way to the fleet, with the interface of `VllmControl` that interceptors use:
    every call goes to the rollout's replica, chosen at its first call."""

    def __init__(self, router: Router, prefer: tuple[int, str] | None = None) -> None:
        self.router, self.prefer = router, prefer
        self.replica: str | None = None
        self.min_version: int | None = None
        self.base_url = ""

    def _call(self, fn: Callable[[VllmControl], Any], *, sampled: Callable[[Any], list[int]] | None = None) -> Any:
        avoid: set[str] = set()
        gone_since: float | None = None
        while True:
            member, why = self.router.pick(sticky=self.replica, min_version=self.min_version, avoid=avoid,
                                           prefer=self.prefer)
            span = trace.get_current_span()
            span.set_attributes({"rollwire.replica": member.replica_id, "rollwire.route": why,
                                 "rollwire.replica_version": -1 if member.version is None else member.version})
            try:
                result = fn(member.control)
            except VllmError as exc:
                if exc.unreachable and len(self.router.fleet.members()) < 2:
                    # the only replica went away (restarting: its supervisor brings it back): nothing
                    # it did was returned, so the call goes again once it is back, up to `wait_s`
                    if gone_since is None:
                        gone_since = time.monotonic()
                        logger.warning("replica %s cannot be reached (%s); waiting up to %.0f s for it",
                                       member.replica_id, exc, self.router.wait_s)
                    elif time.monotonic() - gone_since > self.router.wait_s:
                        raise
                    time.sleep(1.0)
                    continue
                # nothing was sampled on a failed call: another eligible replica may take it, once
                if avoid or len(self.router.fleet.members()) < 2:
                    raise
                logger.warning("replica %s failed a call (%s); trying another", member.replica_id, exc)
                avoid.add(member.replica_id)
                continue
            finally:
                self.router.done(member)
            self.replica, self.base_url = member.replica_id, member.url
            if sampled is not None:
                versions = sampled(result)
                if versions:
                    self.min_version = max(self.min_version or 0, *versions)
            return result

    def tokenize(self, text: str) -> list[int]:
        return self._call(lambda c: c.tokenize(text))

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return self._call(lambda c: c.detokenize(token_ids))

    def render_chat(self, messages: list[dict], *, model: str = "policy", tools: list[dict] | None = None,
                    add_generation_prompt: bool = True) -> list[int]:
        return self._call(lambda c: c.render_chat(messages, model=model, tools=tools,
                                                  add_generation_prompt=add_generation_prompt))

    def end_of_turn_ids(self, model: str = "policy") -> list[int]:
        return self._call(lambda c: c.end_of_turn_ids(model))

    def tool_call_format(self, model: str = "policy") -> ToolCallFormat | None:
        return self._call(lambda c: c.tool_call_format(model))

    def generate(self, token_ids: Sequence[int], **options: Any) -> dict:
        return self._call(lambda c: c.generate(token_ids, **options), sampled=_versions)

    def generate_stream(self, token_ids: Sequence[int], **options: Any) -> Iterator[dict]:
        """Streams from the rollout's replica (no failover once chunks flow: tokens were sampled)."""
        member, why = self.router.pick(sticky=self.replica, min_version=self.min_version, avoid=set(),
                                       prefer=self.prefer)
        trace.get_current_span().set_attributes({"rollwire.replica": member.replica_id, "rollwire.route": why})
        self.replica, self.base_url = member.replica_id, member.url
        try:
            for chunk in member.control.generate_stream(token_ids, **options):
                versions = _versions(chunk)
                if versions:
                    self.min_version = max(self.min_version or 0, *versions)
                yield chunk
        finally:
            self.router.done(member)


def _versions(answer: dict) -> list[int]:
    """The weight versions that sampled an answer's tokens (a stream's chunk carries them on its last)."""
    choices = answer.get("choices") or [{}]
    return [version_number(str(s["version"])) for s in choices[0].get("weight_versions") or []]
