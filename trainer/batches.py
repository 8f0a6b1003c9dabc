"""The trainer's only door to the log: scored rollouts in, checked, deduped, packed into batches.

    reads:  <prefix>.scored   (a reader positioned at the offsets of the last checkpoint)
    writes: <prefix>.deadletter (rollouts the trainer cannot use, with the reason)

The consumer does not commit to a consumer group: the trainer's checkpoint holds its offsets
(`positions`), so model, optimizer and read position move together and a restart neither loses
nor repeats a rollout. Each rollout ends up in exactly one of:

    a batch        trained at the next step
    drops[key]     `stale` (oldest sampling version more than `max_off_policy` behind),
                   `stale_production` (a production sample served more than
                   `ProductionMix.max_age_s` ago), `overflow_production` (the oldest production
                   samples past `ProductionMix.max_pending` waiting) — reported with the next step
    dead letter    token ids outside the vocabulary, no trainable token
    duplicates     the same rollout id again (the scorer delivers at least once): ignored
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

from rollwire.core.bounds import RecentKeys, digest
from rollwire.core.bus import AtOffsets, DeadLetters, Delivery, EventConsumer, EventLog, EventProducer
from rollwire.schemas.base import now_ms
from rollwire.schemas.rollout import RolloutCompleted, ScoredRollout, TokenSequence
from rollwire.schemas.topics import Topics
from rollwire.schemas.training import DropReason, RolloutsDropped, Staleness
from rollwire.trainer.settings import BatchSettings, ProductionMix

DROP_DETAIL = {
    "stale": "more than {max_off_policy} versions behind the trainer",
    "stale_production": "served more than {max_age_s:g} s ago",
    "overflow_production": "more than {max_pending} production samples waited for room in a batch",
}
"""Why samples were dropped, by key of `drops`: environment rollouts and production samples
apart, so that the dispatcher counts back only its own."""


@dataclass
class Batch:
    """Scored rollouts for one optimizer step."""

    rollouts: list[ScoredRollout]
    staleness: Staleness
    drops: dict[str, list[str]] = field(default_factory=dict)
    """Rollout ids dropped while this batch was collected, by reason."""
    headers: list[tuple[tuple[str, bytes], ...]] = field(default_factory=list)
    """Each rollout's record headers (trace context for the step's span links)."""

    @property
    def num_tokens(self) -> int:
        return sum(_tokens(s) for s in self.rollouts)


def _tokens(scored: ScoredRollout) -> int:
    """Prompt and completion tokens of a sample (both responses of a preference; a rollout's other lines)."""
    rows: list[RolloutCompleted | TokenSequence] = [scored.rollout, *scored.rollout.branches]
    if scored.rejected is not None:
        rows.append(scored.rejected)
    return sum(len(r.prompt_token_ids) + len(r.completion_token_ids) for r in rows)


class BatchConsumer:
    """Pulls scored rollouts from `positions` onwards and packs batches."""

    def __init__(self, log: EventLog, topics: Topics, settings: BatchSettings, *, vocab_size: int,
                 positions: dict[tuple[str, int], int] | None = None, seen: Sequence[int] = (),
                 producer: EventProducer | None = None, name: str = "trainer",
                 mix: ProductionMix | None = None) -> None:
        self.settings, self.vocab_size, self.topics = settings, vocab_size, topics
        self.mix = mix or ProductionMix()
        self.producer = producer or EventProducer(log.producer(), topics, name=name)
        ends = {(topics.scored, p): 0 for p in range(log.partitions(topics.scored))}
        self.positions = {**ends, **(positions or {})}
        reader = log.reader([topics.scored], AtOffsets(dict(self.positions)))
        self.consumer = EventConsumer(reader, DeadLetters(self.producer, name))
        self.seen = RecentKeys(settings.dedupe_window, "trainer.seen", digests=seen,
                               what=": a rollout redelivered after that many others would be trained twice")
        """The rollout ids read lately (as digests, restored from the checkpoint), to drop redeliveries."""
        self.drops: dict[str, list[str]] = collections.defaultdict(list)
        self.counts: collections.Counter[str] = collections.Counter()
        self._pending: collections.deque = collections.deque()
        self._production_pending = 0
        """How many of `_pending` are production samples (recounted whenever `_pending` is rebuilt)."""
        self._read: dict[tuple[str, int], int] = {}
        self._stale_lengths: list[int] = []
        """Completion lengths of the rollouts dropped as stale since the last batch."""

    def next_batch(self, policy_version: int, timeout_s: float = 1.0) -> Batch | None:
        """A full batch, or None if not enough usable rollouts arrived within `timeout_s`
        (what did arrive stays pending for the next call)."""
        deadline = time.monotonic() + timeout_s
        self._drop_stale_pending(policy_version)  # accepted at an older version: the lag has grown since
        while not self._ready() and (remaining := deadline - time.monotonic()) > 0:
            for d in self.consumer.poll_batch(1000, remaining):
                self._accept(d, policy_version)
        chosen, full = self._choose()
        if not chosen or not full:
            return None
        taken = {id(d) for d in chosen}
        self._pending = collections.deque(d for d in self._pending if id(d) not in taken)
        self._recount_production()
        environment = [d for d in chosen if d.event.production is None] or chosen
        batch = Batch(rollouts=[d.event for d in chosen], headers=[d.record.headers for d in chosen],
                      staleness=self._staleness([d.event.rollout for d in environment], policy_version),
                      drops={k: list(v) for k, v in self.drops.items()})
        self.drops.clear()
        self._stale_lengths.clear()
        self._advance_positions()
        return batch

    def _staleness(self, rollouts: Sequence[RolloutCompleted], policy_version: int) -> Staleness:
        lags = [self.staleness_of(r, policy_version) for r in rollouts]
        token_lags = [(max(0, policy_version - span.version), span.end - span.start)
                      for r in rollouts for span in r.weight_versions]
        tokens = sum(n for _lag, n in token_lags)
        stale = self._stale_lengths
        return Staleness(
            min=min(lags), mean=sum(lags) / len(lags), max=max(lags),
            token_mean=sum(lag * n for lag, n in token_lags) / tokens if tokens else None,
            split_share=sum(len({s.version for s in r.weight_versions}) > 1 for r in rollouts) / len(rollouts),
            completion_tokens_mean=sum(len(r.completion_token_ids) for r in rollouts) / len(rollouts),
            stale_completion_tokens_mean=sum(stale) / len(stale) if stale else None)

    def _drop_stale(self, scored: ScoredRollout) -> None:
        self.drops["stale_production" if scored.production else "stale"].append(scored.rollout.rollout_id)
        self.counts["stale"] += 1
        if scored.production is None:
            self._stale_lengths.append(len(scored.rollout.completion_token_ids))

    def _choose(self) -> tuple[list[Delivery], bool]:
        """The pending samples the next batch takes, oldest first (production ones up to the mix's
        cap, the rest held), and whether they fill a batch."""
        chosen: list[Delivery] = []
        tokens, production, cap = 0, 0, self.mix.cap(self.settings.batch_rollouts)
        for delivery in self._pending:
            if self.settings.batch_rollouts is not None and len(chosen) == self.settings.batch_rollouts:
                return chosen, True
            if delivery.event.production is not None:
                if cap is not None and production == cap:
                    continue
                production += 1
            size = _tokens(delivery.event)
            if self.settings.batch_tokens is not None and chosen and tokens + size > self.settings.batch_tokens:
                return chosen, True
            chosen.append(delivery)
            tokens += size
        return chosen, self.settings.batch_rollouts is not None and len(chosen) == self.settings.batch_rollouts

    def take_drops(self) -> dict[str, list[str]]:
        """The rollout ids dropped since the last batch, by reason, and positions moved past them
        (for a commit that reports them while no batch forms)."""
        drops = {k: list(v) for k, v in self.drops.items() if v}
        self.drops.clear()
        self._advance_positions()
        return drops

    def _ready(self) -> bool:
        """Whether the pending rollouts fill a batch."""
        return self._choose()[1]

    def _advance_positions(self) -> None:
        """Positions move past every accounted record, but not past a pending one, so a checkpoint
        taken now re-reads exactly the records no step has accounted for yet."""
        for tp, read in self._read.items():
            waiting = [d.record.offset for d in self._pending if (d.record.topic, d.record.partition) == tp]
            self.positions[tp] = min(waiting) if waiting else read

    def _accept(self, delivery, policy_version: int) -> None:
        self._read[(delivery.record.topic, delivery.record.partition)] = delivery.record.offset + 1
        scored: ScoredRollout = delivery.event
        rollout = scored.rollout
        if not self.seen.add(rollout.rollout_id):
            self.counts["duplicate"] += 1
            return
        reason = self._unusable(scored)
        if reason:
            self.consumer.dead_letter(delivery, reason)
            self.counts["dead_lettered"] += 1
            return
        if self._stale(scored, policy_version, now_ms()):
            self._drop_stale(scored)
            return
        self._pending.append(delivery)
        if scored.production is not None:
            self._production_pending += 1
            if self._production_pending > self.mix.max_pending:
                self._drop_oldest_production()

    def _drop_oldest_production(self) -> None:
        oldest = next(d for d in self._pending if d.event.production is not None)
        self._pending.remove(oldest)
        self._production_pending -= 1
        self.drops["overflow_production"].append(oldest.event.rollout.rollout_id)
        self.counts["overflow"] += 1

    def _drop_stale_pending(self, policy_version: int) -> None:
        keep: collections.deque[Delivery] = collections.deque()
        now = now_ms()
        for delivery in self._pending:
            if self._stale(delivery.event, policy_version, now):
                self._drop_stale(delivery.event)
            else:
                keep.append(delivery)
        self._pending = keep
        self._recount_production()

    def _recount_production(self) -> None:
        self._production_pending = sum(1 for d in self._pending if d.event.production is not None)

    def _stale(self, scored: ScoredRollout, policy_version: int, now: int) -> bool:
        if scored.production is not None:
            return now - scored.production.served_at_ms > self.mix.max_age_s * 1000
        return self.staleness_of(scored.rollout, policy_version) > self.settings.max_off_policy

    @staticmethod
    def staleness_of(rollout, policy_version: int) -> int:
        """Versions between the rollout's oldest sampled token and the trainer. A version newer than
        the trainer's (a trainer restored from an older checkpoint than the fleet saw) counts as 0."""
        oldest = rollout.min_version if rollout.min_version is not None else policy_version
        return max(0, policy_version - oldest)

    def _unusable(self, scored: ScoredRollout) -> str | None:
        for rollout, where in ((scored.rollout, ""), (scored.rejected, "the rejected response: ")):
            if rollout is None:
                continue
            lines: list[tuple[RolloutCompleted | TokenSequence, str]] = [
                (rollout, ""), *((b, f"branch {i + 1}: ") for i, b in enumerate(rollout.branches))]
            for line, which in lines:
                bad = [t for t in (*line.prompt_token_ids, *line.completion_token_ids) if not 0 <= t < self.vocab_size]
                if bad:
                    return f"{where}{which}token ids {bad[:5]} lie outside the model's vocabulary of {self.vocab_size}"
                if not all(math.isfinite(x) for x in line.completion_logprobs):
                    return f"{where}{which}the sampler logprobs contain NaN or infinity"
            if not any(rollout.loss_mask):
                return f"{where}the rollout has no trainable token (loss_mask is all 0)"
            if rollout.error is not None:
                return f"{where}an errored rollout was scored: {rollout.error.kind}"
        return None

    def drops_event(self, drops: dict[str, list[str]]) -> list[RolloutsDropped]:
        values = {"max_off_policy": self.settings.max_off_policy, "max_age_s": self.mix.max_age_s,
                  "max_pending": self.mix.max_pending}
        return [RolloutsDropped(rollout_ids=ids, reason=cast(DropReason, key.removesuffix("_production")), stage="trainer",
                                detail=DROP_DETAIL[key].format(**values), production=key.endswith("_production"))
                for key, ids in drops.items() if ids]

    def accounted(self) -> list[int]:
        """The digests of recent rollout ids that a step has accounted for (pending ones excluded:
        after a restart they are read again and must not look like duplicates)."""
        pending = {digest(d.event.rollout.rollout_id) for d in self._pending}
        return [d for d in self.seen.digests() if d not in pending]

    def flush(self) -> None:
        """Makes dead letters durable (before a checkpoint moves past their records)."""
        self.producer.flush()

    def close(self) -> None:
        self.consumer.close()
