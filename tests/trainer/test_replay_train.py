"""`replay train` on the embedded log and a real Kafka broker: a run trained by the live trainer
(off-policy: `max_off_policy` 2), retrained from its checkpoints. Over its own scored events the
replay publishes the run's weights byte for byte; over re-scored events it shows the difference;
targets that would write into the run are refused before anything is written."""

from __future__ import annotations

import subprocess
import sys

import pytest
from builders import trainable

from rollwire.core.bus import EventProducer, catalog_topics
from rollwire.core.errors import ConfigError
from rollwire.core.objectstore import LocalStore
from rollwire.schemas import Topics, TrainStepCompleted
from rollwire.trainer import replay
from rollwire.trainer.loop import Trainer, TrainerSettings
from rollwire.trainer.model import ModelSettings

STEPS = 6


def settings(tmp_path, tiny_policy, **changes) -> TrainerSettings:
    return TrainerSettings(model=ModelSettings(path=str(tiny_policy)), lr=3e-3, micro_batch_rollouts=3,
                           checkpoint_dir=tmp_path / "ckpt", keep_checkpoints=1, keep_checkpoint_every=2,
                           batch={"batch_rollouts": 8, "max_off_policy": 2}, **changes)


def scored_rollouts():
    """16 rollouts sampled at each of versions 0..5, advantages of both signs."""
    return [trainable(i, version=v, advantage=1.0 if i % 3 else -1.5)
            for v in range(STEPS) for i in range(v * 100, v * 100 + 16)]


def send(log, topics: Topics, items) -> None:
    producer = EventProducer(log.producer(), topics, name="scorer")
    for s in items:
        producer.send(topics.scored, s, key=s.rollout.group_id)
    producer.close()


def trained_run(log, topics, store, train_settings) -> dict[int, TrainStepCompleted]:
    log.create_topics(catalog_topics(topics))
    send(log, topics, scored_rollouts())
    trainer = Trainer(log, topics, store, train_settings)
    try:
        trainer.run(max_steps=STEPS, idle_exit_s=10)
    finally:
        trainer.close()
    steps = replay.recorded_steps(log, topics, train_settings.policy)
    assert sorted(steps) == list(range(1, STEPS + 1))
    assert max(s.staleness.max for s in steps.values() if s.staleness) > 0, "the run must train off-policy"
    return steps


def offsets(log, topics: Topics) -> dict:
    return {t: log.end_offsets(topics.name(t)) for t in ("scored", "train", "weights", "drops", "deadletter")}


def test_retraining_from_a_checkpoint_reproduces_the_published_weights_byte_for_byte(log, topics, tmp_path,
                                                                                     tiny_policy):
    store, train_settings = LocalStore(tmp_path / "store"), settings(tmp_path, tiny_policy)
    trained_run(log, topics, store, train_settings)
    before = offsets(log, topics)

    for start in (2, 0):
        into = Topics(f"{topics.prefix}-again{start}")
        result = replay.train_into(log, topics, topics, into, store, train_settings, from_step=start)
        assert [s.step for s in result.steps] == list(range(start + 1, STEPS + 1))
        assert [(s.version, s.identical, s.max_abs_diff) for s in result.steps] == [
            (v, True, 0.0) for v in range(start + 1, STEPS + 1)]
        assert result.reproduced and all(s.missing == [] for s in result.steps)
        assert [s.loss for s in result.steps] == [s.recorded_loss for s in result.steps]
        assert store.exists(f"{into.prefix}/v{STEPS:08d}/model.safetensors")
        assert sorted(replay.recorded_steps(log, into, into.prefix)) == list(range(start + 1, STEPS + 1))
        assert sorted(replay.recorded_weights(log, into, into.prefix)) == list(range(start + 1, STEPS + 1))
        assert "are byte for byte the run's" in replay.report_markdown(result)
    assert offsets(log, topics) == before  # nothing written to the run's topics


def test_re_scored_rollouts_train_other_weights_and_the_report_says_by_how_much(log, topics, tmp_path,
                                                                              tiny_policy):
    store, train_settings = LocalStore(tmp_path / "store"), settings(tmp_path, tiny_policy)
    trained_run(log, topics, store, train_settings)
    shadow = Topics(f"{topics.prefix}-flip")
    log.create_topics(catalog_topics(shadow))
    flipped = [s.model_copy(update={"advantage": -s.advantage}) for s in scored_rollouts()]
    send(log, shadow, [s for s in flipped if s.rollout.rollout_id != "r300"])  # the shadow dropped one

    result = replay.train_into(log, topics, shadow, shadow, store, train_settings, from_step=2)

    assert [s.identical for s in result.steps] == [False] * (STEPS - 2)
    assert all(s.max_abs_diff > 1e-4 for s in result.steps)
    assert [rid for s in result.steps for rid in s.missing] in ([], ["r300"])  # r300 only if a later step took it
    report = replay.report_markdown(result)
    assert "0 of 4 published versions still stored are byte for byte" in report and "Largest absolute weight difference" in report


def test_targets_that_would_touch_the_run_and_missing_checkpoints_are_refused(log, topics, tmp_path, tiny_policy):
    store, train_settings = LocalStore(tmp_path / "store"), settings(tmp_path, tiny_policy)
    trained_run(log, topics, store, train_settings)
    before, stored = offsets(log, topics), sorted(p.as_posix() for p in (tmp_path / "store").rglob("*"))

    def refused(into: str, match: str, **kwargs):
        with pytest.raises(ConfigError, match=match):
            replay.train_into(log, topics, topics, Topics(into), store, kwargs.pop("settings", train_settings),
                              **kwargs)

    refused(topics.prefix, "must differ from the run's prefix")
    refused("policy", "is the run's policy name")
    refused(f"{topics.prefix}-x", r"the run recorded steps 1..6", from_step=2, to_step=9)
    refused(f"{topics.prefix}-x", r"no checkpoint of step 2 in .*keeps steps none .*keep_checkpoints",
            from_step=2, settings=train_settings.model_copy(update={"checkpoint_dir": tmp_path / "elsewhere"}))
    refused(f"{topics.prefix}-x", "no trainer steps of policy 'other'",
            settings=train_settings.model_copy(update={"policy": "other"}))
    assert offsets(log, topics) == before
    assert sorted(p.as_posix() for p in (tmp_path / "store").rglob("*")) == stored


def test_the_command_retrains_a_run_directory_and_writes_the_report(tmp_path, tiny_policy):
    from rollwire.core.bus import EmbeddedBusSettings, open_log
    from rollwire.core.objectstore import open_store
    from rollwire.run.recipe import RunRecipe
    run_dir = tmp_path / "run"
    recipe = RunRecipe(name="rec", run_dir=run_dir, environments=[{"name": "reverse-digits"}],
                       model={"path": str(tiny_policy)}, bus=EmbeddedBusSettings(path=run_dir / "log"),
                       trainer=settings(tmp_path, tiny_policy).model_dump(exclude={"checkpoint_dir"}))
    run_dir.mkdir()
    (run_dir / "recipe.json").write_text(recipe.model_dump_json())
    with open_log(recipe.bus) as log:
        trained_run(log, Topics("rec"), open_store(recipe.store), recipe.trainer)

    def replay_cli(*args):
        return subprocess.run([sys.executable, "-m", "rollwire", "replay", "train", "--run-dir", str(run_dir), *args],
                              capture_output=True, text=True, timeout=300)

    done = replay_cli("--into", "rec-again", "--from-step", "4")
    assert done.returncode == 0, done.stderr
    report = (run_dir / "replays" / "rec-again" / "train-report.md").read_text()
    assert report.startswith("# Replay train: `rec`")
    assert "2 of 2 published versions still stored are byte for byte the run's" in report
    assert "replayed loss" in done.stdout and "2 of 2 published versions" in done.stdout  # printed too
    again = replay_cli("--into", "rec-again", "--from-step", "4")
    assert again.returncode == 2 and "already holds trainer steps" in again.stderr
    gone = replay_cli("--into", "rec-other", "--from-step", "3")  # only steps 2, 4 and 6 are kept
    assert gone.returncode == 2 and "no checkpoint of step 3" in gone.stderr and "keeps steps 2, 4, 6" in gone.stderr


def test_versions_pruned_by_the_runs_retention_are_reported_as_such_and_the_rest_compared(log, topics, tmp_path,
                                                                                         tiny_policy):
    """The demo's case: the run keeps only some of its versions. Each pruned one is named in the
    report, the verdict counts only the versions still stored, and nothing crashes."""
    store = LocalStore(tmp_path / "store")
    train_settings = settings(tmp_path, tiny_policy, retention={"keep_last": 2, "keep_every": 3})
    trained_run(log, topics, store, train_settings)
    assert not store.exists(f"policy/v{1:08d}/model.safetensors"), "the run's retention must have pruned v1"

    result = replay.train_into(log, topics, topics, Topics(f"{topics.prefix}-again"), store, train_settings)

    kept = {3, 5, 6}  # every 3rd, and the last 2
    assert [s.version for s in result.steps if s.pruned] == [v for v in range(1, STEPS + 1) if v not in kept]
    assert [s.version for s in result.compared] == sorted(kept) and result.reproduced
    report = replay.report_markdown(result)
    assert "3 of 3 published versions still stored are byte for byte the run's" in report
    assert "3 more the run published were pruned by its retention" in report
    assert report.count("pruned by the run's retention: not compared") == 3
