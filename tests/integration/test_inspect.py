"""`rollwire inspect`: a rollout's and a step's story from a run's events, on both backends."""

from __future__ import annotations

import subprocess
import sys

import pytest
from builders import record_scored_run

from rollwire.core.bus import EventProducer
from rollwire.core.errors import ConfigError
from rollwire.run.inspect import render_rollout, render_step, rollout_story, step_story
from rollwire.schemas import ReplicaStatus, RolloutsDropped, TrainStepCompleted
from rollwire.schemas.training import Staleness


def recorded_with_a_step(log, topics) -> None:
    from rollwire.core.bus import catalog_topics
    log.create_topics(catalog_topics(topics))
    fleet = EventProducer(log.producer(), topics, name="replica")
    for replica, version in (("replica-0", 0), ("replica-1", 0), ("replica-2", None)):
        fleet.send(topics.fleet, ReplicaStatus(replica_id=replica, state="serving" if version is not None else "failed",
                                               serving_version=version), key=replica)
    fleet.close()
    record_scored_run(log, topics, groups=4)
    producer = EventProducer(log.producer(), topics, name="trainer")
    producer.send(topics.train, TrainStepCompleted(step=1, policy_version=1, rollout_ids=["g0-r0", "g0-r1", "g1-r0"],
                                                   loss=0.25, loss_metrics={"clip_fraction": 0.1}, num_tokens=40,
                                                   staleness=Staleness(min=0, mean=0.5, max=1)), key="policy")
    producer.send(topics.drops, RolloutsDropped(rollout_ids=["g2-r1"], group_id="g2", reason="stale", stage="trainer",
                                                detail="3 versions behind, max_off_policy 1"), key="g2")
    producer.send(topics.fleet, ReplicaStatus(replica_id="replica-0", state="serving", serving_version=1), key="r0")
    producer.close()


def test_a_rollout_s_story_names_its_task_group_score_and_fate(log, topics):
    recorded_with_a_step(log, topics)

    trained = rollout_story(log, topics, "g0-r1")
    assert trained.task.group_id == "g0" and trained.trace.completion in ("21", "12")
    assert sorted(trained.group) == ["g0-r0", "g0-r1", "g0-r2", "g0-r3"]
    assert trained.scored.rollout.rollout_id == "g0-r1" and trained.trained_in.step == 1
    text = render_rollout(trained)
    assert "trained: step 1, which produced policy version 1" in text and "g0-r1 (this)" in text
    assert "advantage" in text and "sampled by: version 0 tokens 0-9 (served by replica-0, replica-1)" in text

    dropped = render_rollout(rollout_story(log, topics, "g2-r1"))
    assert "dropped: stale at the trainer: 3 versions behind" in dropped
    errored = render_rollout(rollout_story(log, topics, "g3-r2"))
    assert "error: timeout" in errored and "dropped: errored at the scorer" in errored
    with pytest.raises(ConfigError, match="no rollout 'g9-r0'"):
        rollout_story(log, topics, "g9-r0")


def test_a_step_s_story_counts_environments_and_reports_who_loaded_it(log, topics):
    recorded_with_a_step(log, topics)
    text = render_step(step_story(log, topics, 1))
    assert "3 rollouts" in text and "reverse-digits 3" in text and "clip_fraction 0.1" in text
    assert "staleness (policy versions behind): min 0, mean 0.50, max 1" in text
    assert "replica replica-0 serving version 1" in text
    with pytest.raises(ConfigError, match="no trainer step 2"):
        step_story(log, topics, 2)


def test_the_command_decodes_with_a_tokenizer_and_names_what_is_missing(tmp_path):
    from rollwire.core.bus import EmbeddedBusSettings, open_log
    from rollwire.schemas import Topics
    from rollwire.trainer.tiny import build_char_tokenizer
    tokenizer_dir = tmp_path / "tokenizer"
    build_char_tokenizer().save_pretrained(tokenizer_dir)
    log_dir = tmp_path / "log"
    with open_log(EmbeddedBusSettings(path=log_dir)) as log:
        recorded_with_a_step(log, Topics("insp"))

    def inspect(*args):
        return subprocess.run([sys.executable, "-m", "rollwire", "inspect", *args, "--log-dir", str(log_dir),
                               "--prefix", "insp"], capture_output=True, text=True, timeout=120)

    shown = inspect("rollout", "g1-r0", "--tokenizer", str(tokenizer_dir), "--trace-url", "http://viewer/{trace_id}")
    assert shown.returncode == 0, shown.stderr
    tokenizer = build_char_tokenizer()
    assert tokenizer.decode([1, 2, 3]) in shown.stdout  # the decoded prompt
    step = inspect("step", "1")
    assert step.returncode == 0 and "produced version 1" in step.stdout
    missing = inspect("rollout", "nope")
    assert missing.returncode == 2 and "no rollout 'nope'" in missing.stderr


def test_tokens_the_model_did_not_sample_are_marked():
    from builders import rollout

    from rollwire.run.inspect import RolloutStory
    from rollwire.trainer.tiny import build_char_tokenizer
    tokenizer = build_char_tokenizer()
    ids = tokenizer.encode("ab=cd>e", add_special_tokens=False)
    mixed = rollout(completion_token_ids=ids, completion_logprobs=[-1.0] * 7, loss_mask=[1, 1, 0, 0, 0, 0, 1],
                    weight_versions=[{"version": 2, "start": 0, "end": 7}])
    assert "ab⟦=cd>⟧e" in render_rollout(RolloutStory(rollout=mixed), tokenizer)
