"""Retraining a recorded run: the trainer's own step over recorded or re-scored rollouts, with no
inference and no environments.

    <run>.train          which rollouts each step trained, in order ─┐
    <scored>.scored      those rollouts as scored: the run's own, or ─┤    checkpoint N: model, optimizer
                         a `replay score` shadow's                    │    and RNG as the run left them
                                                                      ▼    after step N (or its start)
                          train_step, steps N+1..M, the same batches ──▶ <into>.train, <into>.weights,
                                                                         store <into>/v<version>
                          each version against the one the run published ──▶ report

Each replayed step trains exactly the rollouts the recorded step trained, in the same order and
micro-batches, with the run's trainer settings. Over the run's own `scored` events the CPU path
then reproduces the weights the run published, byte for byte (compared by the sha256 of every
safetensors file in the two manifests). Over a shadow's events it shows what the same rollouts,
scored differently, would have trained: a rollout the shadow dropped is left out of its step and
counted. Nothing is written under the run's own prefix or policy name.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from rollwire.core.bus import DeadLetters, EventLog, EventProducer, TopicError, catalog_topics, read_to_end
from rollwire.core.errors import ConfigError
from rollwire.core.objectstore import ObjectNotFoundError, ObjectStore
from rollwire.core.weight_versions import fetch
from rollwire.schemas.manifest import MANIFEST_NAME, Manifest
from rollwire.schemas.rollout import ScoredRollout
from rollwire.schemas.topics import Topics
from rollwire.schemas.training import TrainStepCompleted
from rollwire.schemas.weights import WeightsPublished
from rollwire.trainer import checkpoint
from rollwire.trainer.loop import batch_fields, publish_weights
from rollwire.trainer.model import resolve_device
from rollwire.trainer.settings import TrainerSettings
from rollwire.trainer.step import Objectives, train_step

logger = logging.getLogger(__name__)

E = TypeVar("E", TrainStepCompleted, WeightsPublished)


@dataclass
class ReplayedStep:
    """One retrained step, next to the step the run recorded."""

    step: int
    version: int
    trained: int
    """Rollouts trained: the recorded step's, less `missing`."""
    missing: list[str]
    """Rollouts the recorded step trained that the scored events read do not hold (the shadow
    scorer dropped them, or they lie outside the events read)."""
    recorded_loss: float | None
    loss: float | None
    published: WeightsPublished | None = None
    """The replay's weights of this version, when `publish_every` made it publish them."""
    recorded: WeightsPublished | None = None
    """The run's weights of this version, when it published them."""
    pruned: bool = False
    """The run published this version, and its retention ([trainer.retention]) has since removed it
    from the store: there is nothing to compare with."""
    identical: bool | None = None
    """Every safetensors file has the same sha256 in both manifests; None when either is missing."""
    max_abs_diff: float | None = None
    """Largest absolute difference over every tensor, when the files differ."""


@dataclass
class TrainReplay:
    run: str
    into: str
    scored_from: str
    from_step: int
    steps: list[ReplayedStep] = field(default_factory=list)
    device: str = "cpu"

    @property
    def compared(self) -> list[ReplayedStep]:
        return [s for s in self.steps if s.identical is not None]

    @property
    def reproduced(self) -> bool:
        """Every version both published is byte for byte the run's, and at least one was compared."""
        return bool(self.compared) and all(s.identical for s in self.compared)


def recorded_steps(log: EventLog, live: Topics, policy: str) -> dict[int, TrainStepCompleted]:
    """The run's trainer steps by number (a step re-sent after a restart counts once)."""
    return _first_by_number(log, live.train, TrainStepCompleted, policy, lambda e: e.step)


def recorded_weights(log: EventLog, live: Topics, policy: str) -> dict[int, WeightsPublished]:
    """The run's published weight versions by number."""
    return _first_by_number(log, live.weights, WeightsPublished, policy, lambda e: e.version)


def _first_by_number(log: EventLog, topic: str, kind: type[E], policy: str, number: Callable[[E], int]) -> dict[int, E]:
    """The first event of `kind` and `policy` on `topic` for each `number`."""
    out: dict[int, E] = {}
    for delivery in read_to_end(log, [topic], _ignored()):
        event = delivery.event
        if isinstance(event, kind) and getattr(event, "policy", None) == policy:
            out.setdefault(number(event), event)
    return out


def scored_by_id(log: EventLog, scored: Topics, wanted: set[str],
                 progress: Callable[[int], None] | None = None) -> dict[str, ScoredRollout]:
    """The scored events of the rollouts in `wanted` (the first of each: redeliveries repeat it);
    nothing else is kept, so memory follows the replayed steps, not the log."""
    found: dict[str, ScoredRollout] = {}
    for read, delivery in enumerate(read_to_end(log, [scored.scored], _ignored()), 1):
        event = delivery.event
        if isinstance(event, ScoredRollout) and event.rollout.rollout_id in wanted:
            found.setdefault(event.rollout.rollout_id, event)
        if progress is not None and read % 1000 == 0:
            progress(read)
    return found


def _ignored() -> DeadLetters:
    """Replay reads and never writes to the run's dead-letter topic: what does not decode there
    was dead-lettered when the run read it."""
    from rollwire.core.bus import HeldDeadLetters
    return HeldDeadLetters("replay")


def check_target(log: EventLog, live: Topics, into: Topics, settings: TrainerSettings) -> None:
    """Refuses a target that would write into the run, or over an earlier replay."""
    if into.prefix == live.prefix:
        raise ConfigError(f"--into must differ from the run's prefix ({live.prefix!r}): a replay never writes "
                          "into the run it replays")
    if into.prefix == settings.policy:
        raise ConfigError(f"--into {into.prefix!r} is the run's policy name: its weights would overwrite the "
                          "run's own in the object store; pick another name")
    try:
        if sum(log.end_offsets(into.train).values()):
            raise ConfigError(f"{into.train} already holds trainer steps from an earlier replay: pick another --into")
    except TopicError:
        pass


def train_into(log: EventLog, live: Topics, scored: Topics, into: Topics, store: ObjectStore,
               settings: TrainerSettings, *, from_step: int = 0, to_step: int | None = None,
               progress: Callable[[str, int, int], None] | None = None) -> TrainReplay:
    """Retrains steps `from_step + 1 .. to_step` of the run under `live` from its checkpoint of
    `from_step` (0: the run's starting weights), over the scored events under `scored`, and
    publishes the result as policy `into.prefix` on `into`'s topics and in `store`.
    `progress(stage, done, total)` is called as it goes."""
    check_target(log, live, into, settings)
    recorded = recorded_steps(log, live, settings.policy)
    if not recorded:
        raise ConfigError(f"no trainer steps of policy {settings.policy!r} are recorded under the prefix "
                          f"{live.prefix!r}: check the run directory or --prefix")
    last = max(recorded)
    to_step = last if to_step is None else to_step
    if not 0 <= from_step < to_step <= last:
        raise ConfigError(f"cannot replay steps {from_step + 1}..{to_step}: the run recorded steps "
                          f"{min(recorded)}..{last}; --from-step must be below --to-step")
    gaps = [s for s in range(from_step + 1, to_step + 1) if s not in recorded]
    if gaps:
        raise ConfigError(f"the run's train topic lacks steps {gaps[:10]}: they cannot be replayed")
    start = None
    if from_step > 0:
        try:
            start = checkpoint.at_step(settings.checkpoint_dir, from_step)
        except FileNotFoundError as exc:
            raise ConfigError(f"{exc}; or replay from --from-step 0, the run's starting weights") from None
    wanted = {rid for s in range(from_step + 1, to_step + 1) for rid in recorded[s].rollout_ids}
    rollouts = scored_by_id(log, scored, wanted, progress=lambda n: progress("reading", n, 0) if progress else None)
    if not rollouts:
        raise ConfigError(f"{scored.scored} holds none of the rollouts steps {from_step + 1}..{to_step} trained: "
                          "check --scored")
    published = recorded_weights(log, live, settings.policy)

    log.create_topics(catalog_topics(into))
    state, model, optimizer = checkpoint.restore(settings, start)
    device, _ = resolve_device(settings.model)
    objectives = Objectives.from_settings(settings)
    producer = EventProducer(log.producer(), into, name="replay-trainer")
    replay = TrainReplay(run=live.prefix, into=into.prefix, scored_from=scored.prefix, from_step=from_step,
                         device=device.type)
    try:
        for number in range(from_step + 1, to_step + 1):
            step = recorded[number]
            batch = [rollouts[rid] for rid in step.rollout_ids if rid in rollouts]
            missing = [rid for rid in step.rollout_ids if rid not in rollouts]
            result = train_step(model, optimizer, objectives, batch, micro_batch=settings.micro_batch_rollouts,
                                max_grad_norm=settings.max_grad_norm, device=device)
            done = ReplayedStep(step=number, version=step.policy_version, trained=len(batch), missing=missing,
                                recorded_loss=step.loss, loss=result.loss)
            producer.send(into.train, _step_event(step, into.prefix, batch, result), key=into.prefix)
            if step.policy_version % settings.publish_every == 0:
                done.published, _ = publish_weights(store, model, settings, policy=into.prefix,
                                                    version=step.policy_version, step=number)
                producer.send(into.weights, done.published, key=into.prefix)
                done.recorded = published.get(step.policy_version)
                _compare(store, done)
            producer.flush()
            replay.steps.append(done)
            if progress is not None:
                progress("training", number - from_step, to_step - from_step)
    finally:
        producer.close()
    return replay


def _step_event(recorded: TrainStepCompleted, policy: str, batch: list[ScoredRollout], result) -> TrainStepCompleted:
    """The replayed step's event: the recorded one's step, version and staleness, with what this
    step trained and measured."""
    return TrainStepCompleted(
        policy=policy, step=recorded.step, policy_version=recorded.policy_version, loss=result.loss,
        num_tokens=result.num_tokens, tokens_per_s=result.num_tokens / max(result.seconds, 1e-9),
        grad_norm=result.grad_norm, staleness=recorded.staleness, loss_metrics=result.metrics,
        skipped_reason=result.skipped_reason, **batch_fields(batch))


def _safetensors_digests(store: ObjectStore, weights: WeightsPublished) -> dict[str, str]:
    manifest = Manifest.model_validate_json(store.get_bytes(store.key(weights.uri).rstrip("/") + "/" + MANIFEST_NAME))
    return {f.name: f.sha256 for f in manifest.files if f.name.endswith(".safetensors")}


def _compare(store: ObjectStore, step: ReplayedStep) -> None:
    """Fills `identical`, and `max_abs_diff` where the files differ."""
    if step.published is None or step.recorded is None:
        return
    try:
        recorded = _safetensors_digests(store, step.recorded)
    except ObjectNotFoundError:
        step.pruned = True
        return
    step.identical = _safetensors_digests(store, step.published) == recorded
    if step.identical:
        step.max_abs_diff = 0.0
        return
    from safetensors.torch import load_file
    with tempfile.TemporaryDirectory() as folder:
        tensors = []
        for name, weights in (("replayed", step.published), ("recorded", step.recorded)):
            fetch(store, weights.uri, weights.manifest_sha256, Path(folder) / name)
            tensors.append({k: v for f in sorted((Path(folder) / name).glob("*.safetensors"))
                            for k, v in load_file(f).items()})
    ours, theirs = tensors
    diffs = [(ours[k].float() - theirs[k].float()).abs().max().item() for k in ours.keys() & theirs.keys()]
    step.max_abs_diff = max(diffs, default=float("nan"))


def report_markdown(replay: TrainReplay) -> str:
    """The replay's steps next to the recorded ones, and whether the weights came out the same."""
    start = "the run's starting weights" if replay.from_step == 0 else f"the checkpoint of step {replay.from_step}"
    lines = [f"# Replay train: `{replay.run}` steps {replay.from_step + 1}..{replay.steps[-1].step} "
             f"as `{replay.into}`", "",
             f"Started from {start}; rollouts as scored under `{replay.scored_from}`; device {replay.device}.", ""]
    lines += _verdict(replay)
    lines += ["", "| step | version | rollouts | missing | recorded loss | replayed loss | weights |",
              "|---:|---:|---:|---:|---:|---:|---|"]
    for s in replay.steps:
        lines.append(f"| {s.step} | {s.version} | {s.trained} | {len(s.missing)} | {_num(s.recorded_loss)} | "
                     f"{_num(s.loss)} | {_weights_cell(s)} |")
    missing = [rid for s in replay.steps for rid in s.missing]
    if missing:
        lines += ["", f"{len(missing)} recorded rollouts were not among the scored events read (first: "
                  f"{', '.join(missing[:5])}); their steps trained without them."]
    return "\n".join(lines) + "\n"


def _verdict(replay: TrainReplay) -> list[str]:
    """The report's opening lines: how many versions still in the store came out the same."""
    pruned = sum(1 for s in replay.steps if s.pruned)
    kept = (f" ({pruned} more the run published were pruned by its retention, [trainer.retention], "
            "and could not be compared)") if pruned else ""
    if not replay.compared:
        return [f"No version was published by both the run and the replay and is still stored: nothing to compare{kept}."]
    same = sum(1 for s in replay.compared if s.identical)
    lines = [f"**{same} of {len(replay.compared)} published versions still stored are byte for byte the run's**{kept}."]
    worst = max((s.max_abs_diff for s in replay.compared if s.max_abs_diff is not None), default=None)
    if same < len(replay.compared):
        if worst is not None:
            lines.append(f"Largest absolute weight difference: {worst:.3g}.")
        if replay.device != "cpu":
            lines.append("On a GPU, kernels are not deterministic: byte equality is not expected there.")
    return lines


def _weights_cell(step: ReplayedStep) -> str:
    """What the step's weights column says: compared, or why not."""
    if step.published is None:
        return "—"
    if step.recorded is None:
        return "not published by the run"
    if step.pruned:
        return "pruned by the run's retention: not compared"
    if step.identical:
        return "identical"
    return "differ" if step.max_abs_diff is None else f"differ (max {step.max_abs_diff:.3g})"


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.6g}"

