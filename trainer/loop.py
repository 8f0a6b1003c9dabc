"""The trainer: scored rollouts in, optimizer steps, checkpoints, weight versions out.

    reads:  <prefix>.scored (through BatchConsumer)
    writes: <prefix>.train, <prefix>.weights, <prefix>.drops, <prefix>.deadletter; the object store

One step, as a commit protocol (under torchrun, rank 0 runs it; Step 2 is every rank's, see
`rollwire.trainer.distributed`):

    # Step 1  take a batch (stale rollouts dropped, bad ones dead-lettered, duplicates ignored)
    # Step 2  train on it (or skip on a non-finite loss)
    # Step 3  version += 1; when due, write the weights to the object store (manifest last)
    # Step 4  build the step's outbox (train step, weights published, drops); flush dead letters
    # Step 5  checkpoint model, optimizer, read positions, version and outbox as one unit
    # Step 6  send the outbox, then mark it sent; prune versions the retention policy lets go

A crash before Step 5 redoes the step from the previous checkpoint on the same rollouts; a crash
after it, before the mark, re-sends the outbox. Either way each rollout is trained once or dropped once.

Rollouts dropped while no batch forms (all of a batch went stale, say) are reported at once by a
drops-only commit (Steps 4-6 with the previous weights), not with the next step: the dispatcher
counts them back into its budget, and until it does, the next batch may never be issued.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from rollwire.core import metrics, telemetry
from rollwire.core.bus import EventLog, EventProducer
from rollwire.core.errors import ConfigError
from rollwire.core.objectstore import ObjectStore
from rollwire.core.trackers import Trackers, step_metrics
from rollwire.core.weight_transfer import WeightSender
from rollwire.core.weight_versions import DeltaBase, Published, publish, version_prefix
from rollwire.schemas.registry import EVENT_TYPES
from rollwire.schemas.rollout import ScoredRollout
from rollwire.schemas.topics import Topics
from rollwire.schemas.training import TrainStepCompleted
from rollwire.schemas.weights import WeightsPublished
from rollwire.trainer import checkpoint
from rollwire.trainer.batches import Batch, BatchConsumer
from rollwire.trainer.distributed import Shard
from rollwire.trainer.model import resolve_device, save_model
from rollwire.trainer.retention import InUse, Retention
from rollwire.trainer.settings import TrainerSettings
from rollwire.trainer.step import Objectives, StepResult, train_step

logger = logging.getLogger(__name__)


def publish_weights(store: ObjectStore, model, settings: TrainerSettings, *, policy: str, version: int,
                    step: int, base: DeltaBase | None = None, into: Path | None = None
                    ) -> tuple[WeightsPublished, Published]:
    """Writes `model`'s weights as `policy` version `version` (`<policy>/v<version>` in the store,
    manifest last), as a delta against `base` when given; returns the event announcing them and what
    was written (with its manifest). `into`: the folder the weights are saved in, kept (the next
    version's delta base); default a temporary one."""
    lora = settings.model.lora is not None
    with contextlib.ExitStack() as stack:
        folder = into or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        save_model(model, folder)
        done = publish(store, folder, version_prefix(policy, version), policy=policy, version=version, step=step,
                       format="lora" if lora else "full", base_model=settings.model.path, base=base)
    return done.event(), done


def means_by_name(rows: list[dict[str, float]]) -> dict[str, float]:
    """Per-name means over the rows that have the name."""
    sums: dict[str, list[float]] = {}
    for row in rows:
        for name, value in row.items():
            sums.setdefault(name, []).append(value)
    return {name: sum(values) / len(values) for name, values in sums.items()}


def batch_fields(batch: Sequence[ScoredRollout]) -> dict:
    """What a `TrainStepCompleted` says of the samples it trained: ids, counts and reward means
    (rewards over environment rollouts: production samples carry ratings, not task rewards)."""
    environment = [s for s in batch if s.production is None] or list(batch)
    samples: collections.Counter[str] = collections.Counter(s.objective for s in batch)
    samples["production"] = len(batch) - len([s for s in batch if s.production is None])
    return {"rollout_ids": [s.rollout.rollout_id for s in batch],
            "reward_mean": sum(s.reward for s in environment) / len(environment) if environment else 0.0,
            "rewards_mean": means_by_name([{**s.rollout.rewards, **s.group_rewards} for s in environment]),
            "metrics_mean": means_by_name([s.rollout.metrics for s in environment]),
            "samples": {k: v for k, v in samples.items() if v}}


class Trainer:
    """Rank 0's trainer (or the only one): the six steps above. Under torchrun (`shard`), each
    batch also goes to the other ranks (`follow`), which train their shares of it with this one."""

    def __init__(self, log: EventLog, topics: Topics, store: ObjectStore, settings: TrainerSettings, *,
                 shard: Shard | None = None, trackers: Trackers | None = None) -> None:
        if not settings.model.path:
            raise ConfigError("trainer.model.path is empty: give the starting weights (a directory or hub name; "
                              "`rollwire train --model DIR`)")
        self.settings, self.topics, self.store = settings, topics, store
        self.device, _ = resolve_device(settings.model)
        previous = checkpoint.latest(settings.checkpoint_dir)
        self.state, self.model, self.optimizer = checkpoint.restore(settings, previous)
        self.objectives = Objectives.from_settings(settings)
        self.producer = EventProducer(log.producer(), topics, name="trainer")
        vocab = self.model.get_input_embeddings().num_embeddings
        self.consumer = BatchConsumer(log, topics, settings.batch, vocab_size=vocab, positions=self.state.positions,
                                      seen=self.state.seen, producer=self.producer, mix=settings.feedback)
        self._ready_since = time.monotonic()
        self._published_dir = settings.checkpoint_dir / "published"
        shutil.rmtree(self._published_dir, ignore_errors=True)  # an earlier process's: its first version is whole
        self._delta_base: DeltaBase | None = None
        """The last version this process published, whose files it keeps: the next one's delta base."""
        self._since_snapshot = 0
        self.sender = (WeightSender(settings.direct.host, settings.direct.port, timeout_s=settings.direct.timeout_s)
                       if settings.direct.enabled else None)
        """Serves each new full version to replicas from memory (`rollwire.core.weight_transfer`)."""
        self.shard = shard
        self.trackers = trackers
        """Where each step's metrics are reported once its commit is sent (`rollwire.core.trackers`)."""
        self.in_use = InUse(log, topics, settings.policy) if settings.retention.keep_last is not None else None
        """Versions replicas serve or serving decisions name: never pruned (`rollwire.trainer.retention`)."""
        self.retention = Retention(self.store, settings.policy, settings.retention)
        self._staleness = metrics.staleness_histogram()
        self._step_duration = metrics.seconds_histogram("rollwire.trainer.step.duration",
                                                        "seconds per trainer step, from batch to commit")
        scored = topics.scored
        metrics.observe_lag(lambda: {("trainer", scored): metrics.lag(
            log.end_offsets(scored), {p: o for (t, p), o in dict(self.consumer.positions).items() if t == scored})})
        if shard is not None:
            shard.barrier()  # every rank has read `previous`: only now may a new commit point replace it
        if previous is not None:
            logger.info("resuming at step %d (version %d) from %s", self.state.step, self.state.version, previous)
            if not checkpoint.outbox_sent(previous):  # the previous run stopped between Steps 5 and 6
                self._send_outbox(previous)

    def run(self, *, max_steps: int | None = None, idle_exit_s: float | None = None) -> None:
        """Trains until `max_steps`, or until no batch formed for `idle_exit_s`, or forever."""
        idle_since = time.monotonic()
        while max_steps is None or self.state.step < max_steps:
            if self.step(timeout_s=1.0):
                idle_since = time.monotonic()
            elif idle_exit_s is not None and time.monotonic() - idle_since > idle_exit_s:
                return

    def step(self, timeout_s: float = 1.0) -> TrainStepCompleted | None:
        # Step 1
        batch = self.consumer.next_batch(self.state.version, timeout_s=timeout_s)
        if batch is None:
            if self.consumer.drops:
                self._commit_drops()
            return None
        started = time.monotonic()
        waited = started - self._ready_since
        with telemetry.tracer().start_as_current_span(
                "trainer step", links=telemetry.links_for(batch.headers),
                attributes={"messaging.batch.message_count": len(batch.rollouts),
                            "rollwire.step": self.state.step + 1}):
            # Step 2
            if self.shard is not None:
                self.shard.send_batch(batch.rollouts)
            result = train_step(self.model, self.optimizer, self.objectives, batch.rollouts,
                                micro_batch=self.settings.micro_batch_rollouts,
                                max_grad_norm=self.settings.max_grad_norm, device=self.device, shard=self.shard)
            # Step 3
            self.state.step += 1
            self.state.version += 1
            weights = None
            if self.state.version % self.settings.publish_every == 0:
                with telemetry.tracer().start_as_current_span("publish weights",
                                                              attributes={"rollwire.weight_version": self.state.version}):
                    weights = self._publish_weights()
            # Step 4
            event = self._step_event(batch, result, waited)
            self.state.outbox = [self._entry(self.topics.train, self.settings.policy, event)]
            if weights is not None:
                self.state.outbox.append(self._entry(self.topics.weights, self.settings.policy, weights))
            self.state.outbox += [self._entry(self.topics.drops, d.rollout_ids[0], d)
                                  for d in self.consumer.drops_event(batch.drops)]
            self.consumer.flush()
            # Step 5
            self.state.positions = dict(self.consumer.positions)
            self.state.seen = self.consumer.accounted()
            saved = checkpoint.save(self.settings.checkpoint_dir, self.model, self.optimizer, self.state,
                                    keep=self.settings.keep_checkpoints,
                                    keep_every=self.settings.keep_checkpoint_every)
            # Step 6
            self._send_outbox(saved)
        if weights is not None and self.in_use is not None:
            self.retention.apply(weights.version, self.in_use.versions())
        self._ready_since = time.monotonic()
        self._step_duration.record(self._ready_since - started)
        for scored in batch.rollouts:
            if scored.production is None:
                self._staleness.record(BatchConsumer.staleness_of(scored.rollout, self.state.version - 1))
        logger.info("step %d: loss %s, reward %.3f, %d rollouts, staleness max %d", event.step, event.loss,
                    event.reward_mean, len(batch.rollouts), batch.staleness.max)
        return event

    def _commit_drops(self) -> None:
        """Steps 4-6 for drops alone: the model is unchanged, the read positions move past them."""
        drops = self.consumer.take_drops()
        self.state.outbox = [self._entry(self.topics.drops, d.rollout_ids[0], d) for d in self.consumer.drops_event(drops)]
        self.consumer.flush()
        self.state.positions = dict(self.consumer.positions)
        self.state.seen = self.consumer.accounted()
        saved = checkpoint.save_drops(self.settings.checkpoint_dir, checkpoint.latest(self.settings.checkpoint_dir),
                                      self.model, self.optimizer, self.state, keep=self.settings.keep_checkpoints,
                                      keep_every=self.settings.keep_checkpoint_every)
        self._send_outbox(saved)
        logger.info("reported %s while no batch formed", ", ".join(f"{len(v)} {k}" for k, v in drops.items()))

    def _publish_weights(self) -> WeightsPublished:
        """Publishes the current weights: a snapshot when due, else a delta against the last version
        this process published (whose files it keeps under `<checkpoint_dir>/published`)."""
        folder = self._published_dir / f"v{self.state.version:08d}"
        shutil.rmtree(folder, ignore_errors=True)
        snapshot_due = self._since_snapshot + 1 >= self.settings.snapshot_every
        event, done = publish_weights(self.store, self.model, self.settings, policy=self.settings.policy,
                                      version=self.state.version, step=self.state.step,
                                      base=None if snapshot_due else self._delta_base, into=folder)
        previous, self._delta_base = self._delta_base, None
        if previous is not None:
            shutil.rmtree(previous.folder, ignore_errors=True)
        if event.format == "full" and self.sender is not None:
            self.sender.offer(event.version, folder, done.manifest_data)
            event = event.model_copy(update={"direct": self.sender.address})
        if event.format == "full":
            self._delta_base = DeltaBase(event.version, done.uri, done.manifest_sha256, folder,
                                         done.manifest.result or done.manifest.files)
            self._since_snapshot = 0 if event.encoding == "snapshot" else self._since_snapshot + 1
        else:
            shutil.rmtree(folder, ignore_errors=True)
        if event.encoding == "delta":
            logger.info("version %d: a delta on %s, %.1f%% of the whole (%.2f%% of elements changed)", event.version,
                        event.base_version, 100 * done.size_bytes / max(done.full_size_bytes, 1),
                        100 * (done.changed_share or 0.0))
        return event

    def _step_event(self, batch: Batch, result: StepResult, waited: float) -> TrainStepCompleted:
        return TrainStepCompleted(
            policy=self.settings.policy, step=self.state.step, policy_version=self.state.version,
            loss=result.loss, num_tokens=result.num_tokens, tokens_per_s=result.num_tokens / max(result.seconds, 1e-9),
            grad_norm=result.grad_norm, staleness=batch.staleness, drops={k: len(v) for k, v in batch.drops.items()},
            loss_metrics=result.metrics, skipped_reason=result.skipped_reason, wait_s=waited,
            **batch_fields(batch.rollouts))

    @staticmethod
    def _entry(topic: str, key: str, event) -> dict:
        return {"topic": topic, "key": key, "event": event.model_dump(mode="json")}

    def _send_outbox(self, saved: Path) -> None:
        for entry in self.state.outbox:
            event = EVENT_TYPES[entry["event"]["type"]].model_validate(entry["event"])
            self.producer.send(entry["topic"], event, key=entry["key"])
            if self.trackers is not None and isinstance(event, TrainStepCompleted):
                self.trackers.report(step_metrics(event, int(time.time() * 1000)))
        self.producer.flush()
        checkpoint.mark_sent(saved)

    def close(self) -> None:
        if self.sender is not None:
            self.sender.close()
        if self.shard is not None:
            self.shard.send_batch(None)  # the other ranks stop
            self.shard = None
        self.consumer.close()
        self.producer.close()
        if self.trackers is not None:
            self.trackers.close()
        if self.in_use is not None:
            self.in_use.close()


def follow(settings: TrainerSettings, shard: Shard) -> int:
    """Ranks 1..N-1 under torchrun: from the same checkpoint as rank 0, train the share of every
    batch rank 0 sends, until it stops; nothing is read from or written to the log or the store.
    Returns the steps taken."""
    device, _ = resolve_device(settings.model)
    _, model, optimizer = checkpoint.restore(settings, checkpoint.latest(settings.checkpoint_dir))
    objectives = Objectives.from_settings(settings)
    shard.barrier()
    steps = 0
    while (batch := shard.receive_batch()) is not None:
        train_step(model, optimizer, objectives, batch, micro_batch=settings.micro_batch_rollouts,
                   max_grad_norm=settings.max_grad_norm, device=device, shard=shard)
        steps += 1
    logger.info("rank %d: %d steps; rank 0 stopped", shard.rank, steps)
    return steps
