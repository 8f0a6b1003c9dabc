"""Small builders of valid events, one per type, for tests. Keyword arguments override fields."""

from __future__ import annotations

import json
import random
import struct
from contextlib import contextmanager
from pathlib import Path

from rollwire.schemas import (
    DeadLetter,
    Event,
    FeedbackJoinState,
    FeedbackReceived,
    InferenceCall,
    PartnerRecord,
    ProductionOrigin,
    ReplicaStatus,
    ResponseServed,
    RolloutCompleted,
    RolloutsDropped,
    RolloutTimings,
    SamplingStarted,
    ScoredRollout,
    ScorerGroupRollout,
    ScorerGroupState,
    ScorerTick,
    ServingDecision,
    SourceBaseline,
    Staleness,
    TaskAssigned,
    TokenSequence,
    Topics,
    TraceNode,
    TraceRecorded,
    TrainStepCompleted,
    WeightsPublished,
    WeightVersionSpan,
)
from rollwire.schemas.base import now_ms

DIGEST = "ab" * 32


def task(**kw) -> TaskAssigned:
    return TaskAssigned(**{"task_id": "rev-00017", "group_id": "group-1", "environment": "reverse-digits",
                           "algorithm": "grpo", "group_size": 4, "task": {"digits": "40713"},
                           "policy_version": 3, "issued_at_ms": 1_790_000_000_000, **kw})


def rollout(**kw) -> RolloutCompleted:
    return RolloutCompleted(**{
        "rollout_id": "rollout-1", "group_id": "group-1", "task_id": "rev-00017",
        "environment": "reverse-digits", "algorithm": "grpo", "group_size": 4, "sample_index": 0,
        "prompt_token_ids": [1, 30, 12, 16, 11, 17, 13, 31], "completion_token_ids": [13, 17, 11, 16, 12, 2],
        "completion_logprobs": [-0.1, -0.2, -0.05, -1.5, -0.3, -0.01], "loss_mask": [1, 1, 1, 1, 1, 1],
        "weight_versions": [WeightVersionSpan(version=3, start=0, end=4), WeightVersionSpan(version=4, start=4, end=6)],
        "rewards": {"exact_match": 1.0}, "reward": 1.0, "metrics": {"length": 6.0},
        "timings": RolloutTimings(queued_s=0.01, inference_s=0.2, environment_s=0.0, scoring_s=0.001), **kw})


def trace(**kw) -> TraceRecorded:
    call = InferenceCall(prompt_token_ids=[1, 30, 12], completion_token_ids=[13, 2],
                         completion_logprobs=[-0.1, -0.2], weight_versions=[WeightVersionSpan(version=3, start=0, end=2)],
                         finish_reason="stop", latency_s=0.05)
    return TraceRecorded(**{"rollout_id": "rollout-1", "group_id": "group-1", "nodes": [
        TraceNode(node_id=0, kind="message", role="user", content="R:40713>"),
        TraceNode(node_id=1, parent_id=0, kind="llm_call", call=call),
        TraceNode(node_id=2, parent_id=1, kind="message", role="assistant", content="31704"),
    ], **kw})


def scored(**kw) -> ScoredRollout:
    return ScoredRollout(**{"rollout": rollout(), "algorithm": "grpo", "group_rewards": {"shortest_correct": 0.2},
                            "reward": 1.2, "advantage": 0.6, "group_reward_mean": 0.6, **kw})


def weights(**kw) -> WeightsPublished:
    return WeightsPublished(**{"version": 4, "step": 4, "uri": "s3://rollwire/run/v000004/",
                               "manifest_sha256": DIGEST, "base_model": "tiny-llama", "size_bytes": 1_700_000,
                               "published_at_ms": 1_790_000_000_500, "direct": "gloo://10.0.0.7:29400", **kw})


def replica(**kw) -> ReplicaStatus:
    return ReplicaStatus(**{"replica_id": "127.0.0.1:8000", "state": "serving", "serving_version": 4,
                            "url": "http://127.0.0.1:8000",
                            "requested_version": 4, "bytes_downloaded": 1_700_000, "download_s": 0.1,
                            "swap_s": 0.05, "transfer": "direct", **kw})


def serving_decision(**kw) -> ServingDecision:
    return ServingDecision(**{"stable": weights(version=3, step=3, uri="s3://rollwire/run/v000003/"),
                              "canary": weights(), "canary_share": 0.1, "reason": "canary", "decided_by": "ops",
                              "note": "v4 on trial", **kw})


def train_step(**kw) -> TrainStepCompleted:
    return TrainStepCompleted(**{"step": 4, "policy_version": 4, "rollout_ids": ["rollout-1", "rollout-2"],
                                 "loss": 0.12, "reward_mean": 0.6, "num_tokens": 12, "tokens_per_s": 800.0,
                                 "grad_norm": 1.3, "staleness": Staleness(min=0, mean=0.5, max=1),
                                 "drops": {"stale": 2}, "completed_at_ms": 1_790_000_000_400, **kw})


def dropped(**kw) -> RolloutsDropped:
    return RolloutsDropped(**{"rollout_ids": ["rollout-9"], "group_id": "group-3", "reason": "stale",
                              "stage": "trainer", "detail": "lag 5 > max_off_policy 4", **kw})


def feedback(**kw) -> FeedbackReceived:
    return FeedbackReceived(**{"feedback_id": "fb-1", "conversation_id": "conv-1", "source": "chat-app",
                               "kind": "rating", "rating": -0.5, "messages": [{"role": "user", "content": "hi"}],
                               "served_version": 4, "received_at_ms": 1_790_000_000_600, **kw})


def dead_letter(**kw) -> DeadLetter:
    return DeadLetter(**{"source_topic": "rollwire.rollouts", "partition": 2, "offset": 17, "key": b"group-1",
                         "raw": b"\xc1\x00garbage", "raw_size": 9, "stage": "decode",
                         "error_type": "CorruptEventError", "error": "not a msgpack envelope",
                         "component": "scorer", **kw})


def group_state(**kw) -> ScorerGroupState:
    return ScorerGroupState(**{"group_id": "group-1", "environment": "reverse-digits", "algorithm": "grpo",
                               "group_size": 4, "first_seen_ms": 1_790_000_000_000, "rollouts": [rollout()],
                               "rollout_ids": ["rollout-1"], **kw})


def group_rollout(**kw) -> ScorerGroupRollout:
    return ScorerGroupRollout(**{"rollout": rollout(), **kw})


def served(**kw) -> ResponseServed:
    call = InferenceCall(prompt_token_ids=[1, 40, 41], completion_token_ids=[50, 51, 2], completion_logprobs=[-0.5, -0.25, -0.1],
                         weight_versions=[WeightVersionSpan(version=4, start=0, end=3)], finish_reason="stop")
    return ResponseServed(**{"response_id": "resp-1", "conversation_id": "conv-1", "source": "chat-app",
                             "endpoint": "chat", "model": "policy", "messages": [{"role": "user", "content": "hi"}],
                             "call": call, "completion": "ab", "served_at_ms": 1_790_000_000_800, **kw})


def join_state(**kw) -> FeedbackJoinState:
    return FeedbackJoinState(**{"response_id": "resp-1", "served": served(), "joined": ["fb-1"], "partners": ["resp-0"],
                                "partner_served": [served(response_id="resp-3")],
                                "first_seen_ms": 1_790_000_000_900, **kw})


def partner_record(**kw) -> PartnerRecord:
    return PartnerRecord(**{"to": "resp-1", "sender": "resp-2", "served": served(response_id="resp-2"), **kw})


def source_baseline(**kw) -> SourceBaseline:
    return SourceBaseline(**{"source": "chat-app", "count": 3, "mean": 0.25, **kw})


def tick(**kw) -> ScorerTick:
    return ScorerTick(**{"at_ms": 1_790_000_000_700, **kw})


def preference_pair(**kw) -> ScoredRollout:
    """A preference made from production feedback: `rollout()` chosen over a shorter response."""
    rejected = rollout(rollout_id="rollout-2", completion_token_ids=[3, 1], completion_logprobs=[-0.5, -1.5],
                       loss_mask=[1, 1], weight_versions=[WeightVersionSpan(version=3, start=0, end=2)])
    origin = ProductionOrigin(source="chat-app", feedback_id="feedback-1", response_ids=["resp-1", "resp-2"],
                              served_at_ms=1_790_000_000_050)
    return ScoredRollout(**{"rollout": rollout(), "rejected": rejected, "objective": "preference",
                            "production": origin, "algorithm": "feedback", "reward": 0.0, **kw})


ALL: dict[str, Event] = {e.type: e for e in (task(), rollout(branches=[TokenSequence(
    prompt_token_ids=[1, 2, 9], completion_token_ids=[5, 6], completion_logprobs=[-0.3, 0.0], loss_mask=[1, 0],
    weight_versions=[WeightVersionSpan(version=3, start=0, end=1)])]), trace(), preference_pair(),
    weights(encoding="delta", base_version=3, base_manifest_sha256=DIGEST, size_bytes=61_000, full_size_bytes=1_700_000),
    replica(drain_s=0.004, apply_s=0.03, stage_s=0.02),
                                            train_step(), dropped(), feedback(), served(), dead_letter(),
                                            group_state(), group_rollout(), tick(), join_state(), source_baseline(),
                                            partner_record(), serving_decision(),
                                            SamplingStarted(group_id="group-1", sample_index=2, worker="env-worker-0"))}
"""One valid example of every event type, by type tag."""


def group_of(group_id: str, rewards: list[float], *, lengths: list[int] | None = None, algorithm: str = "grpo",
             environment: str = "reverse-digits", errored: tuple[int, ...] = ()) -> list[RolloutCompleted]:
    """A full group: rollout i has reward `rewards[i]` (as `exact_match`) and `lengths[i]` tokens."""
    lengths = lengths or [4] * len(rewards)
    out = []
    for i, (r, n) in enumerate(zip(rewards, lengths)):
        error = {"kind": "timeout", "message": "harness exceeded 30 s"} if i in errored else None
        out.append(RolloutCompleted(
            rollout_id=f"{group_id}-r{i}", group_id=group_id, task_id=f"task-{group_id}", environment=environment,
            algorithm=algorithm, group_size=len(rewards), sample_index=i, prompt_token_ids=[1, 2, 3],
            completion_token_ids=list(range(10, 10 + n)), completion_logprobs=[-0.5] * n, loss_mask=[1] * n,
            weight_versions=[WeightVersionSpan(version=0, start=0, end=n)] if error is None else [],
            rewards={} if error else {"exact_match": r}, reward=0.0 if error else r, error=error))
    return out


def trainable(i: int, *, version: int = 0, advantage: float = 1.0, prompt=None, completion=None,
           logprobs=None, mask=None) -> ScoredRollout:
    """Scored rollout `r<i>` with token ids inside the tiny character vocabulary."""
    rng = random.Random(i)
    prompt = prompt or [1] + [rng.randrange(5, 80) for _ in range(6)]
    completion = completion or [rng.randrange(5, 80) for _ in range(rng.randrange(3, 8))]
    rollout = RolloutCompleted(
        rollout_id=f"r{i}", group_id=f"g{i // 4}", task_id="t", environment="env", algorithm="grpo", group_size=4,
        sample_index=i % 4, prompt_token_ids=prompt, completion_token_ids=completion,
        completion_logprobs=logprobs or [-2.0] * len(completion), loss_mask=mask or [1] * len(completion),
        weight_versions=[WeightVersionSpan(version=version, start=0, end=len(completion))],
        rewards={"r": 1.0}, reward=1.0)
    return ScoredRollout(rollout=rollout, algorithm="grpo", reward=1.0, advantage=advantage)


def production(i: int, *, objective: str = "policy_gradient", served_at_ms: int | None = None,
               advantage: float = 1.0) -> ScoredRollout:
    """Sample `f<i>` made from production feedback: a rating (`policy_gradient`), a correction
    (`sft`: not sampled, logprobs 0) or a `preference` (chosen `trainable(i)`, rejected `trainable(i + 1000)`)."""
    base = trainable(i, version=0).rollout.model_copy(update={"rollout_id": f"f{i}"})
    origin = ProductionOrigin(source="app", feedback_id=f"f{i}", response_ids=[f"resp{i}"],
                              served_at_ms=now_ms() if served_at_ms is None else served_at_ms)
    if objective == "sft":
        n = len(base.completion_token_ids)
        base = base.model_copy(update={"completion_logprobs": [0.0] * n, "weight_versions": []})
        return ScoredRollout(rollout=base, algorithm="feedback", reward=0.0, objective="sft", production=origin)
    if objective == "preference":
        rejected = trainable(i + 1000, version=0).rollout
        return ScoredRollout(rollout=base, rejected=rejected, algorithm="feedback", reward=0.0, objective="preference",
                             production=origin)
    return ScoredRollout(rollout=base, algorithm="feedback", reward=advantage, advantage=advantage, production=origin)


def big_trace(rollout_id: str = "g-0", tokens: int = 4000) -> TraceRecorded:
    """A trace with one model call of `tokens` prompt and completion tokens (~30 KB at 4000)."""
    call = InferenceCall(prompt_token_ids=list(range(tokens)), completion_token_ids=list(range(tokens)),
                         completion_logprobs=[-0.25] * tokens)
    nodes = [TraceNode(node_id=0, kind="message", role="user", content="reverse 12"),
             TraceNode(node_id=1, parent_id=0, kind="llm_call", call=call)]
    return TraceRecorded(rollout_id=rollout_id, group_id="g", nodes=nodes)


def record_scored_run(log, topics: Topics, groups: int = 10) -> int:
    """A small recorded run on `log`: `groups` groups of 4 (group 3 with an errored rollout),
    members interleaved and out of order as env workers finish them, with their tasks and traces,
    scored by the live embedded scorer. Returns the rollouts scored."""
    from rollwire.core.bus import EventProducer, catalog_topics
    from rollwire.streams.embedded_scorer import EmbeddedScorer
    from rollwire.streams.scoring import GroupScorer, ScorerSettings
    log.create_topics(catalog_topics(topics))
    producer = EventProducer(log.producer(), topics, name="env-worker")
    made = [group_of(f"g{i}", [float((i + j) % 3 == 0) for j in range(4)], lengths=[5 + i, 9, 7 + i % 2, 6],
                     errored=(2,) if i == 3 else ()) for i in range(groups)]
    for group in made:
        producer.send(topics.tasks, TaskAssigned(task_id=group[0].task_id, group_id=group[0].group_id,
                                                 environment="reverse-digits", algorithm="grpo", group_size=4,
                                                 policy_version=0, task={"prompt": "R:12>", "answer": "21"}),
                      key=group[0].group_id)
    for index in (2, 0, 3, 1):  # group members interleave, out of order, as env workers finish them
        for group in made:
            rollout = group[index]
            producer.send(topics.rollouts, rollout, key=rollout.group_id)
            answer = "21" if rollout.reward else "12"
            producer.send(topics.traces, TraceRecorded(rollout_id=rollout.rollout_id, group_id=rollout.group_id,
                                                       completion=answer, finish_reason="stop"), key=rollout.group_id)
    producer.close()
    live = EmbeddedScorer(log, topics, GroupScorer(ScorerSettings()), group_id=f"{topics.prefix}-scorer", tick_s=3600)
    try:
        for _ in range(200):
            if live.stats["rollout.scored"] >= 4 * groups - 1:
                break
            live.step(timeout_s=0.2)
    finally:
        live.close()
    return 4 * groups - 1


@contextmanager
def listening(command: list[str], env: dict[str, str] | None = None):
    """A server process started with `command` (e.g. `rollwire serve ... --port 0`); yields its base
    URL, read from the first line it prints; terminates it after. Its stderr goes to a file, not a
    pipe nobody reads (a full pipe would block the server)."""
    import re
    import subprocess
    import tempfile
    with tempfile.TemporaryFile(mode="w+") as errors:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, text=True, env=env)
        try:
            line = process.stdout.readline()
            match = re.search(r"http://[\d.]+:(\d+)", line)
            if not match:
                process.wait(timeout=30)
                errors.seek(0)
                raise AssertionError(f"the server did not start: {line!r} {errors.read()[-3000:]}")
            yield f"http://127.0.0.1:{match.group(1)}"
        finally:
            process.terminate()
            process.wait(timeout=30)


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    """A valid safetensors file with zeroed data (the standard library is enough)."""
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        size = 4
        for dim in shape:
            size *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))
