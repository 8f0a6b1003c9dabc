"""Which weight versions production serves: promotion, canaries and rollback, as events.

    rollwire promote 14                  # v14 serves every production request
    rollwire promote 15 --canary 0.1     # v15 takes 10% of requests beside the stable v14
    rollwire rollback 14                 # v14 again, canary withdrawn: no restart of anything

Each command appends one `ServingDecision` to `serving` (kept forever: the serving history). Serving
replicas (`follow = "serving"`) load the version their lane gets; the serving gateway sends each
request to the canary with the decided share, else to the stable version (`ServingPlan`). The
training loop is untouched: its replicas follow every version on `weights`.

A rollback may only go to a version that was stable before (a verified version); `force` overrides.
Versions come from the object store's manifests (`stored_version`), since `weights` is compacted to
the newest version per policy.
"""

from __future__ import annotations

import getpass
import logging
import random

from rollwire.core.bus import EventLog, EventProducer, Follower, records_to_end
from rollwire.core.errors import ConfigError
from rollwire.core.objectstore import ObjectStore
from rollwire.core.weight_versions import stored_version
from rollwire.schemas.envelope import Codec
from rollwire.schemas.topics import Topics
from rollwire.schemas.weights import ServingDecision

logger = logging.getLogger(__name__)


def history(log: EventLog, topics: Topics, policy: str) -> list[ServingDecision]:
    """Every decision on `serving` for `policy`, oldest first (records that do not decode are skipped:
    the readers that act on them dead-letter them)."""
    codec = Codec()
    decisions = []
    for record in records_to_end(log, [topics.serving]):
        try:
            event = codec.decode(record.value).event if record.value is not None else None
        except Exception:
            continue
        if isinstance(event, ServingDecision) and event.policy == policy:
            decisions.append(event)
    return decisions


def _send(log: EventLog, topics: Topics, decision: ServingDecision) -> ServingDecision:
    producer = EventProducer(log.producer(), topics, name="rollwire-releases")
    try:
        producer.send(topics.serving, decision, key=decision.policy)
        producer.flush()
    finally:
        producer.close()
    logger.info("serving decision: %s", describe(decision))
    return decision


def promote(log: EventLog, topics: Topics, store: ObjectStore, *, policy: str, version: int,
            canary_share: float | None = None, decided_by: str | None = None, note: str = "") -> ServingDecision:
    """Makes `version` stable, or (with `canary_share` < 1) puts it on trial beside the stable version."""
    weights = stored_version(store, policy, version)
    past = history(log, topics, policy)
    decided_by = decided_by or getpass.getuser()
    if canary_share is None or canary_share >= 1.0:
        return _send(log, topics, ServingDecision(policy=policy, stable=weights, reason="promote",
                                                  decided_by=decided_by, note=note))
    if not 0.0 < canary_share < 1.0:
        raise ConfigError(f"--canary {canary_share}: give the canary's share of requests, above 0 and below 1")
    if not past:
        raise ConfigError(f"no stable version of {policy!r} yet for a canary to run beside: promote one first "
                          f"(`rollwire promote {version}`)")
    stable = past[-1].stable
    if stable.version == version:
        raise ConfigError(f"version {version} is already the stable version")
    return _send(log, topics, ServingDecision(policy=policy, stable=stable, canary=weights, canary_share=canary_share,
                                              reason="canary", decided_by=decided_by, note=note))


def rollback(log: EventLog, topics: Topics, store: ObjectStore, *, policy: str, version: int,
             decided_by: str | None = None, note: str = "", force: bool = False) -> ServingDecision:
    """Serves `version` again, and withdraws any canary. It must have been stable before, unless `force`."""
    verified = sorted({d.stable.version for d in history(log, topics, policy)})
    if version not in verified and not force:
        listed = ", ".join(map(str, verified)) or "none yet"
        raise ConfigError(f"version {version} was never stable (stable so far: {listed}); rolling back to an "
                          "untried version needs --force")
    weights = stored_version(store, policy, version)
    return _send(log, topics, ServingDecision(policy=policy, stable=weights, reason="rollback",
                                              decided_by=decided_by or getpass.getuser(), note=note))


def describe(decision: ServingDecision) -> str:
    if decision.canary is None:
        return f"{decision.reason}: v{decision.stable.version} serves every request of {decision.policy!r}"
    return (f"{decision.reason}: v{decision.canary.version} takes {100 * decision.canary_share:.0f}% of requests, "
            f"v{decision.stable.version} the rest")


class ServingPlan:
    """The latest serving decision, kept current from `serving` in a background thread; the gateway
    asks it which version each request goes to."""

    def __init__(self, policy: str = "policy", decision: ServingDecision | None = None) -> None:
        self.policy, self.decision = policy, decision
        self._follower: Follower | None = None

    def pick(self, rng: random.Random) -> tuple[int, str] | None:
        """(version, `stable` or `canary`) for one request; None before any decision (then the newest
        version served takes it)."""
        decision = self.decision
        if decision is None:
            return None
        if decision.canary is not None and rng.random() < decision.canary_share:
            return decision.canary.version, "canary"
        return decision.stable.version, "stable"

    def follow(self, log: EventLog, topics: Topics, poll_s: float = 0.5) -> ServingPlan:
        """Reads every decision so far, then keeps up with new ones until `close()`."""
        def take(event) -> None:
            if isinstance(event, ServingDecision) and event.policy == self.policy:
                self.decision = event
                logger.info("now serving by the decision %s", describe(event))
        self._follower = Follower(log, [topics.serving], take, name="serving-plan", poll_s=poll_s)
        self._follower.wait()
        return self

    def close(self) -> None:
        if self._follower is not None:
            self._follower.close()
