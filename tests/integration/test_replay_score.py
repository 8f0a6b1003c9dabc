"""`replay score` on the embedded log and a real Kafka broker: a run recorded by the live scorer,
re-scored into a shadow prefix. Unchanged settings give the recorded events back field for field;
another algorithm shows what would have been trained; bad targets write nothing."""

from __future__ import annotations

import subprocess
import sys

import pytest
from builders import record_scored_run

from rollwire.core.bus import Beginning, EventProducer, TopicError
from rollwire.core.errors import ConfigError
from rollwire.schemas import Codec, Topics
from rollwire.streams import replay
from rollwire.streams.scoring import GroupScorer, ScorerSettings

GROUPS = 10


def events(log, topic: str) -> list:
    ends = log.end_offsets(topic)
    out = []
    with log.reader([topic], Beginning()) as reader:
        while len(out) < sum(ends.values()):
            out += [Codec().decode(r.value).event for r in reader.poll_batch(1000, 2.0)]
    return out


def live_offsets(log, topics: Topics) -> dict:
    return {t: log.end_offsets(topics.name(t)) for t in ("rollouts", "scored", "drops", "deadletter")}


def test_unchanged_settings_reproduce_the_recorded_scores(log, topics):
    scored = record_scored_run(log, topics)
    before = live_offsets(log, topics)
    shadow = Topics(f"{topics.prefix}-shadow")

    comparison = replay.score_into(log, topics, shadow, GroupScorer(ScorerSettings()))

    assert comparison.unchanged and comparison.identical == scored
    recorded = sorted((e.model_dump() for e in events(log, topics.scored)), key=lambda d: d["rollout"]["rollout_id"])
    replayed = sorted((e.model_dump() for e in events(log, shadow.scored)), key=lambda d: d["rollout"]["rollout_id"])
    assert replayed == recorded
    assert [e.rollout_ids for e in events(log, shadow.drops)] == [e.rollout_ids for e in events(log, topics.drops)]
    assert live_offsets(log, topics) == before  # nothing written to the run's topics


def test_another_algorithm_shows_what_would_have_been_trained(log, topics):
    record_scored_run(log, topics)
    comparison = replay.score_into(log, topics, Topics(f"{topics.prefix}-rloo"), GroupScorer(ScorerSettings()),
                                   algorithms={"*": "rloo"})
    assert comparison.identical == 0 and comparison.changed == 4 * GROUPS - 1
    assert {e.algorithm for e in events(log, f"{topics.prefix}-rloo.scored")} == {"rloo"}
    report = replay.report_markdown(comparison, run=topics.prefix, shadow="x", what="rloo")
    assert "| reverse-digits | 39 |" in report and "Largest advantage changes" in report


INVERTED = """
from rollwire.producers.tasksets import reward

@reward("wrong_on_purpose", weight=2.0)
def wrong(view):
    return float(view.completion != view.task["answer"])
"""


def test_a_reward_module_judges_every_rollout_again(log, topics, tmp_path):
    record_scored_run(log, topics)
    module = tmp_path / "inverted.py"
    module.write_text(INVERTED)
    shadow = Topics(f"{topics.prefix}-inv")
    comparison = replay.score_into(log, topics, shadow, GroupScorer(ScorerSettings()),
                                   reward_module=replay.RewardModule(module))
    rescored = {e.rollout.rollout_id: e for e in events(log, shadow.scored)}
    recorded = {e.rollout.rollout_id: e for e in events(log, topics.scored)}
    assert rescored.keys() == recorded.keys()
    for rollout_id, event in rescored.items():
        assert event.rollout.rewards == {"wrong_on_purpose": 1.0 - recorded[rollout_id].rollout.rewards["exact_match"]}
        assert event.reward == 2.0 * (1.0 - recorded[rollout_id].reward)
    flips = sum(env.sign_flips for env in comparison.environments.values())
    assert flips == sum(1 for e in recorded.values() if (e.advantage or 0) != 0)


@pytest.mark.parametrize("body, error", [
    ("@reward('r')\ndef r(view):\n    raise KeyError('answer')\n", "raised KeyError"),
    ("@reward('r')\ndef r(view):\n    return 'abc'\n", "not a finite number"),
    ("def r(view):\n    return 1.0\n", "holds no reward function"),
    ("import nothing_such\n", "failed to import"),
])
def test_a_failing_reward_module_writes_nothing(log, topics, tmp_path, body, error):
    record_scored_run(log, topics)
    module = tmp_path / "bad.py"
    module.write_text("from rollwire.producers.tasksets import reward\n" + body)
    shadow = Topics(f"{topics.prefix}-bad")
    with pytest.raises(ConfigError, match=error):
        replay.score_into(log, topics, shadow, GroupScorer(ScorerSettings()),
                          reward_module=replay.RewardModule(module))
    with pytest.raises(TopicError):
        log.end_offsets(shadow.scored)


def test_bad_targets_are_refused_before_anything_is_written(log, topics):
    record_scored_run(log, topics)
    before = live_offsets(log, topics)
    with pytest.raises(ConfigError, match="must differ from the run's own"):
        replay.score_into(log, topics, topics, GroupScorer(ScorerSettings()))
    with pytest.raises(ConfigError, match="no rollouts are recorded"):
        replay.score_into(log, Topics(f"{topics.prefix}-none"), Topics(f"{topics.prefix}-x"),
                          GroupScorer(ScorerSettings()))
    replay.score_into(log, topics, Topics(f"{topics.prefix}-once"), GroupScorer(ScorerSettings()))
    with pytest.raises(ConfigError, match="already holds events"):
        replay.score_into(log, topics, Topics(f"{topics.prefix}-once"), GroupScorer(ScorerSettings()))
    assert live_offsets(log, topics) == before


def test_the_command_prints_and_writes_the_report(tmp_path):
    from rollwire.core.bus import EmbeddedBusSettings, open_log
    from rollwire.run.recipe import RunRecipe
    run_dir = tmp_path / "run"
    recipe = RunRecipe(name="rec", run_dir=run_dir, environments=[{"name": "reverse-digits"}],
                       bus=EmbeddedBusSettings(path=run_dir / "log"))
    run_dir.mkdir()
    (run_dir / "recipe.json").write_text(recipe.model_dump_json())
    with open_log(recipe.bus) as log:
        record_scored_run(log, Topics("rec"))

    def replay_cli(*args):
        return subprocess.run([sys.executable, "-m", "rollwire", "replay", "score", "--run-dir", str(run_dir), *args],
                              capture_output=True, text=True, timeout=120)

    done = replay_cli("--into", "rec-nostd", "--algorithm", "grpo-nostd")
    assert done.returncode == 0, done.stderr
    assert "sign flips" in done.stdout and "grpo-nostd" in done.stdout
    assert (run_dir / "replays" / "rec-nostd" / "report.md").read_text().startswith("# Replay of `rec`")
    assert (run_dir / "replays" / "rec-nostd" / "advantages.png").stat().st_size > 1000
    refused = replay_cli("--into", "rec")
    assert refused.returncode == 2 and "must differ from the run's own" in refused.stderr
    unknown = replay_cli("--into", "rec-x", "--algorithm", "grpoo")
    assert unknown.returncode == 2 and "grpo" in unknown.stderr


def test_a_range_takes_whole_groups_by_trainer_step_or_record_time(log, topics):
    from rollwire.schemas import TrainStepCompleted
    from rollwire.streams.replay import Range
    scored = record_scored_run(log, topics)
    producer = EventProducer(log.producer(), topics, name="trainer")
    producer.send(topics.train, TrainStepCompleted(step=1, policy_version=1, rollout_ids=["g0-r0", "g1-r2"]), key="p")
    producer.send(topics.train, TrainStepCompleted(step=2, policy_version=2, rollout_ids=["g5-r1"]), key="p")
    producer.close()

    one = replay.score_into(log, topics, Topics(f"{topics.prefix}-s1"), GroupScorer(ScorerSettings()),
                            span=Range(first_step=1, last_step=1))
    assert one.unchanged and one.identical == 8  # g0 and g1, whole
    assert {e.rollout.group_id for e in events(log, f"{topics.prefix}-s1.scored")} == {"g0", "g1"}
    every = replay.score_into(log, topics, Topics(f"{topics.prefix}-all"), GroupScorer(ScorerSettings()),
                              span=Range(since_ms=0, until_ms=2**62))
    assert every.unchanged and every.identical == scored
    # By offset: the groups whose first rollout is the first record of its partition.
    from rollwire.core.bus.partitioner import partition_for
    partitions = len(log.end_offsets(topics.rollouts))
    firsts = {}
    for i in range(10):  # record_scored_run publishes rollout 2 of g0..g9 first, in that order
        firsts.setdefault(partition_for(f"g{i}".encode(), partitions), f"g{i}")
    head = replay.score_into(log, topics, Topics(f"{topics.prefix}-o0"), GroupScorer(ScorerSettings()),
                             span=Range(from_offset=0, to_offset=0))
    assert head.unchanged and head.identical == sum(3 if g == "g3" else 4 for g in firsts.values())
    assert {e.rollout.group_id for e in events(log, f"{topics.prefix}-o0.scored")} == set(firsts.values())
    with pytest.raises(ConfigError, match="no recorded group falls in trainer steps 7..9: .* trainer steps run 1..2"):
        replay.score_into(log, topics, Topics(f"{topics.prefix}-s7"), GroupScorer(ScorerSettings()),
                          span=Range(first_step=7, last_step=9))
    with pytest.raises(TopicError):
        log.end_offsets(f"{topics.prefix}-s7.scored")
