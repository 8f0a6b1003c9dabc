"""Which weight versions stay in the object store: the storage a run leaves stays bounded.

    [trainer.retention]
    keep_last = 5        # the newest five versions
    keep_every = 50      # and every 50th, for good (evaluations, `rollwire promote` later)

Applied by the trainer each time it publishes a version. Never pruned, whatever the policy says:
the version each replica reports serving on `fleet`, and every version a serving decision names
(stable or canary, on `serving`: a rollback may go back to any of them). Nor the versions a kept
delta is rebuilt from (its bases back to the snapshot before it): pruning goes by whole chains.
Version 0 is the base model, which is not in the store.

Pruning deletes a version's manifest first, then its files, so a version is complete or absent:
a replica (or `rollwire promote`) that asks for a pruned version is refused with
`CheckpointMissingError` before anything is loaded. The trainer's own checkpoints hold their
weights themselves and need no version in the store.
"""

from __future__ import annotations

import logging
import threading

from rollwire.core.bus import EventLog, Follower
from rollwire.core.objectstore import ObjectStore
from rollwire.core.weight_versions import delta_chain, prune_version, stored_versions
from rollwire.schemas.topics import Topics
from rollwire.schemas.weights import ReplicaStatus, ServingDecision
from rollwire.trainer.settings import RetentionSettings

logger = logging.getLogger(__name__)


class InUse:
    """The versions something still needs, followed from `fleet` and `serving` in a background thread."""

    def __init__(self, log: EventLog, topics: Topics, policy: str, poll_s: float = 0.5) -> None:
        self.policy = policy
        self._serving: dict[str, int] = {}
        self._decided: set[int] = set()
        self._lock = threading.Lock()
        self._follower = Follower(log, [topics.fleet, topics.serving], self._take, name="versions-in-use",
                                  poll_s=poll_s)

    def _take(self, event) -> None:
        with self._lock:
            if isinstance(event, ReplicaStatus):
                if event.state == "stopped" or event.serving_version is None:
                    self._serving.pop(event.replica_id, None)
                else:
                    self._serving[event.replica_id] = event.serving_version
            elif isinstance(event, ServingDecision) and event.policy == self.policy:
                self._decided |= {v.version for v in (event.stable, event.canary) if v is not None}

    def versions(self, wait_s: float = 10.0) -> set[int]:
        """Every version in use now (after the first catch-up, waited for up to `wait_s`)."""
        self._follower.wait(wait_s)
        with self._lock:
            return set(self._serving.values()) | self._decided

    def close(self) -> None:
        self._follower.close()


class Retention:
    """The trainer's pruning of the versions it published. It lists the store once (and again every
    `relist_every` publishes, to see versions written by anyone else) and remembers each kept
    version's delta base, so a publish reads only the newest version's manifest: a run that keeps
    a version for good every few steps does not pay, each step, for every version it kept. What it
    holds is one entry per version in the store (two ints), bounded by the retention policy."""

    def __init__(self, store: ObjectStore, policy: str, settings: RetentionSettings, relist_every: int = 100) -> None:
        self.store, self.policy, self.settings = store, policy, settings
        self.relist_every = relist_every
        self._stored: set[int] | None = None
        self._bases: dict[int, int | None] = {}
        self._since_listed = 0

    def apply(self, newest: int, in_use: set[int]) -> list[int]:
        """Prunes the versions of the policy neither the settings nor `in_use` keep, `newest` just
        published; returns them, ascending."""
        if self.settings.keep_last is None:
            return []
        if self._stored is None or self._since_listed >= self.relist_every:
            self._stored = set(stored_versions(self.store, self.policy))
            self._bases = {v: base for v, base in self._bases.items() if v in self._stored}
            self._since_listed = 0
        self._since_listed += 1
        self._stored.add(newest)
        kept = {v for v in self._stored if v >= newest or self.settings.keeps(v, newest) or v in in_use}
        # what each kept version's delta is rebuilt from
        needed = {base for v in kept for base in delta_chain(self.store, self.policy, v, self._bases)}
        pruned = sorted(self._stored - needed)
        for version in pruned:
            prune_version(self.store, self.policy, version)
            self._stored.discard(version)
            self._bases.pop(version, None)
        if pruned:
            logger.info("retention: pruned versions %s of %s (newest %d; in use %s)", pruned, self.policy, newest,
                        sorted(in_use) or "none")
        return pruned
