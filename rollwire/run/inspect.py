"""The story of one rollout, or one trainer step, told from a run's events (`rollwire inspect`).

    rollout ID:  tasks ─ rollouts ─ traces ─ scored ─ drops ─ train  ──▶ RolloutStory ──▶ text
    step N:      train ─ scored ─ fleet                              ──▶ StepStory    ──▶ text

Each topic is read once, to the end it had when asked, keeping only what concerns the rollout
or step; records that do not decode are counted and shown, never written anywhere.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from rollwire.core.bus import EventLog, HeldDeadLetters, read_to_end
from rollwire.core.errors import ConfigError
from rollwire.schemas.rollout import RolloutCompleted, ScoredRollout, TaskAssigned, TraceRecorded
from rollwire.schemas.topics import Topics
from rollwire.schemas.training import RolloutsDropped, TrainStepCompleted
from rollwire.schemas.weights import ReplicaStatus


@dataclass
class RolloutStory:
    rollout: RolloutCompleted
    task: TaskAssigned | None = None
    trace: TraceRecorded | None = None
    scored: ScoredRollout | None = None
    group: dict[str, RolloutCompleted] = field(default_factory=dict)
    """Every member of its group, by rollout id (itself included)."""
    trained_in: TrainStepCompleted | None = None
    dropped: list[RolloutsDropped] = field(default_factory=list)
    serving: dict[int, list[str]] = field(default_factory=dict)
    """Per weight version the rollout sampled from: the replicas whose last report before the
    rollout was recorded said they served it (the fleet topic's view; one replica in a plain run)."""
    unreadable: int = 0


def rollout_story(log: EventLog, topics: Topics, rollout_id: str) -> RolloutStory:
    """Everything the run's events say about `rollout_id`; `ConfigError` when no rollout has that id."""
    unread = HeldDeadLetters("inspect")
    delivery = next((d for d in read_to_end(log, [topics.rollouts], unread) if d.event.rollout_id == rollout_id), None)
    found = delivery.event if delivery is not None else None
    if delivery is None or found is None:
        raise ConfigError(f"no rollout {rollout_id!r} on {topics.rollouts}: check the id (`rollwire tail rollouts`) "
                          "and the run's log and prefix")
    story = RolloutStory(rollout=found)
    group_id = found.group_id
    story.group = {d.event.rollout_id: d.event for d in read_to_end(log, [topics.rollouts], unread)
                   if d.event.group_id == group_id}
    for d in read_to_end(log, [topics.tasks, topics.traces, topics.scored, topics.drops, topics.train], unread):
        event = d.event
        if isinstance(event, TaskAssigned) and event.group_id == group_id:
            story.task = event
        elif isinstance(event, TraceRecorded) and event.rollout_id == rollout_id:
            story.trace = event
        elif isinstance(event, ScoredRollout) and event.rollout.rollout_id == rollout_id:
            story.scored = event
        elif isinstance(event, RolloutsDropped) and rollout_id in event.rollout_ids:
            story.dropped.append(event)
        elif isinstance(event, TrainStepCompleted) and rollout_id in event.rollout_ids and story.trained_in is None:
            story.trained_in = event
    last_report: dict[str, int | None] = {}  # replica -> the version it last said it served
    for d in read_to_end(log, [topics.fleet], unread):
        if isinstance(d.event, ReplicaStatus) and d.envelope.produced_at_ms <= delivery.envelope.produced_at_ms:
            last_report[d.event.replica_id] = d.event.serving_version if d.event.state == "serving" else None
    for span in found.weight_versions:
        story.serving[span.version] = sorted(r for r, v in last_report.items() if v == span.version)
    story.unreadable = unread.count
    return story


def _decode(tokenizer: Any, ids: list[int]) -> str:
    return tokenizer.decode(ids) if tokenizer is not None else " ".join(map(str, ids))


def _completion_text(rollout: RolloutCompleted, tokenizer: Any) -> str:
    """The completion, with the tokens the model did not sample (environment or tool text, loss
    mask 0) inside ⟦ ⟧."""
    parts, start = [], 0
    ids, mask = rollout.completion_token_ids, rollout.loss_mask
    for i in range(1, len(ids) + 1):
        if i == len(ids) or mask[i] != mask[start]:
            text = _decode(tokenizer, ids[start:i])
            parts.append(text if mask[start] else f"⟦{text}⟧")
            start = i
    return "".join(parts)


def render_rollout(story: RolloutStory, tokenizer: Any = None, trace_url: str | None = None) -> str:
    r = story.rollout
    lines = [f"rollout {r.rollout_id}: sample {r.sample_index} of group {r.group_id} ({r.group_size} rollouts), "
             f"environment {r.environment}, algorithm {r.algorithm}"]
    if story.task is not None:
        lines.append(f"task {story.task.task_id} (issued at policy version {story.task.policy_version}): {story.task.task}")
    lines += ["", "prompt:", _decode(tokenizer, r.prompt_token_ids), "", "completion (⟦ ⟧: not sampled by the model):",
              _completion_text(r, tokenizer) if r.completion_token_ids else "(none)", ""]
    if story.trace is not None and story.trace.completion:
        lines.append(f"answer judged: {story.trace.completion!r} (finish: {story.trace.finish_reason})")
    spans = ", ".join(f"version {s.version} tokens {s.start}-{s.end}"
                      + (f" (served by {', '.join(story.serving[s.version])})" if story.serving.get(s.version) else "")
                      for s in r.weight_versions)
    lines.append(f"sampled by: {spans or '(no tokens sampled)'}")
    if r.error is not None:
        lines.append(f"error: {r.error.kind}: {r.error.message}")
    terms = ", ".join(f"{k}={v:g}" for k, v in r.rewards.items())
    lines.append(f"reward: {r.reward:g}" + (f" ({terms})" if terms else ""))
    if story.scored is not None:
        s = story.scored
        bonus = ", ".join(f"{k}={v:+g}" for k, v in s.group_rewards.items())
        advantage = (f"{s.advantage:+.4f}" if s.advantage is not None
                     else f"per token, mean {sum(s.token_advantages or [0]) / max(1, len(s.token_advantages or [])):+.4f}")
        lines.append(f"scored: final reward {s.reward:g}" + (f" (group rewards {bonus})" if bonus else "")
                     + f", group mean {s.group_reward_mean:g}, advantage {advantage}")
    members = ", ".join(f"{m.rollout_id}{' (this)' if m.rollout_id == r.rollout_id else ''} "
                        f"{'errored' if m.error else f'{m.reward:g}'}"
                        for m in sorted(story.group.values(), key=lambda m: m.sample_index))
    lines.append(f"group: {members}")
    if story.trained_in is not None:
        t = story.trained_in
        lines.append(f"trained: step {t.step}, which produced policy version {t.policy_version}")
    for drop in story.dropped:
        lines.append(f"dropped: {drop.reason} at the {drop.stage}" + (f": {drop.detail}" if drop.detail else ""))
    if story.trained_in is None and not story.dropped:
        lines.append("not trained yet, and not dropped (still in flight, or the run stopped first)")
    if r.traceparent:
        trace_id = r.traceparent.split("-")[1]
        lines.append(f"trace: {trace_id}" + (f" {trace_url.format(trace_id=trace_id)}" if trace_url else ""))
    if story.unreadable:
        lines.append(f"({story.unreadable} records on these topics could not be decoded; see `rollwire tail`)")
    return "\n".join(lines) + "\n"


@dataclass
class StepStory:
    step: TrainStepCompleted
    environments: Counter[str] = field(default_factory=Counter)
    loaded: list[tuple[str, int]] = field(default_factory=list)
    """(replica id, epoch ms) of each replica that reported serving the step's version."""


def step_story(log: EventLog, topics: Topics, step: int) -> StepStory:
    unread = HeldDeadLetters("inspect")
    found = [d.event for d in read_to_end(log, [topics.train], unread) if d.event.step == step]
    if not found:
        raise ConfigError(f"no trainer step {step} on {topics.train}: the run has not reached it, or check the "
                          "run's log and prefix")
    story = StepStory(step=found[-1])
    ids = set(story.step.rollout_ids)
    for d in read_to_end(log, [topics.scored], unread):
        if d.event.rollout.rollout_id in ids:
            story.environments[d.event.rollout.environment] += 1
            ids.discard(d.event.rollout.rollout_id)
    seen: set[str] = set()
    for d in read_to_end(log, [topics.fleet], unread):
        status = d.event
        if (isinstance(status, ReplicaStatus) and status.state == "serving"
                and status.serving_version == story.step.policy_version and status.replica_id not in seen):
            seen.add(status.replica_id)
            story.loaded.append((status.replica_id, d.envelope.produced_at_ms))
    return story


def render_step(story: StepStory) -> str:
    t = story.step
    lines = [f"trainer step {t.step} of policy {t.policy!r}: {len(t.rollout_ids)} rollouts, {t.num_tokens} tokens, "
             f"produced version {t.policy_version}"]
    if t.skipped_reason:
        lines.append(f"skipped: {t.skipped_reason}")
    lines.append("per environment: " + (", ".join(f"{env} {n}" for env, n in sorted(story.environments.items()))
                                        or "(no scored events found for its rollouts)"))
    if t.staleness is not None:
        s = t.staleness
        lines.append(f"staleness (policy versions behind): min {s.min}, mean {s.mean:.2f}, max {s.max}")
    if t.loss is not None:
        lines.append(f"loss {t.loss:.4f}" + (f", grad norm {t.grad_norm:.3f}" if t.grad_norm is not None else "")
                     + "".join(f", {k} {v:.4g}" for k, v in sorted(t.loss_metrics.items())))
    lines.append(f"reward mean {t.reward_mean:.4f}" + "".join(f", {k} {v:.3g}" for k, v in sorted(t.rewards_mean.items())))
    if t.drops:
        lines.append("dropped before the step: " + ", ".join(f"{k} {v}" for k, v in sorted(t.drops.items())))
    for replica, at_ms in story.loaded:
        lines.append(f"replica {replica} serving version {t.policy_version} from {at_ms - t.completed_at_ms:+d} ms "
                     "after the step completed")
    if not story.loaded:
        lines.append(f"no replica has reported serving version {t.policy_version}")
    return "\n".join(lines) + "\n"
