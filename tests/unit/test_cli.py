"""The `rollwire` command: help that teaches, and commands that work on a real embedded log."""

from __future__ import annotations

import json
import subprocess
import sys

from builders import rollout

from rollwire.core.bus import EventProducer, catalog_topics
from rollwire.core.bus.embedded import EmbeddedLog
from rollwire.schemas import Topics


def rollwire(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rollwire.cli", *args], capture_output=True, text=True,
                          timeout=60)


def test_help_lists_every_command_with_examples():
    result = rollwire("--help")
    assert result.returncode == 0
    for command in ("topics", "tail", "dispatch", "env-worker", "score", "inference", "train", "eval"):
        assert command in result.stdout
    assert "examples:" in result.stdout


def test_topics_create_then_tail_prints_events_and_undecodable_records(tmp_path):
    log_dir = tmp_path / "log"
    created = rollwire("topics", "--create", "--log-dir", str(log_dir), "--prefix", "demo")
    assert created.returncode == 0, created.stderr
    log = EmbeddedLog(log_dir)
    topics = Topics("demo")
    assert set(log.topics()) == {name for name, _ in topics.specs()}
    producer = EventProducer(log.producer(), topics, name="test")
    producer.send(topics.rollouts, rollout(), key="group-1")
    producer.close()
    raw = log.producer()
    raw.send(topics.rollouts, b"junk", key=b"group-1")
    raw.close()

    tailed = rollwire("tail", "rollouts", "--log-dir", str(log_dir), "--prefix", "demo", "--json")

    assert tailed.returncode == 0, tailed.stderr
    lines = [json.loads(line) for line in tailed.stdout.splitlines()]
    assert lines[0]["type"] == "rollout.completed"
    assert lines[0]["event"]["rollout_id"] == "rollout-1"
    assert lines[1]["error"].startswith("CorruptEventError")


def test_tail_filters_by_type_and_field_and_prints_lines_or_json(tmp_path):
    log_dir = tmp_path / "log"
    log = EmbeddedLog(log_dir)
    topics = Topics("demo")
    log.create_topics(catalog_topics(topics))
    producer = EventProducer(log.producer(), topics, name="test")
    for i in range(3):
        producer.send(topics.rollouts, rollout(rollout_id=f"r{i}", group_id=f"g{i % 2}", reward=float(i)), key="k")
    producer.close()

    def tail(*args):
        done = rollwire("tail", "rollouts", "--log-dir", str(log_dir), "--prefix", "demo", *args)
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    assert [json.loads(x)["event"]["rollout_id"] for x in tail("--where", "group_id=g0", "--json")] == ["r0", "r2"]
    assert [json.loads(x)["event"]["rollout_id"] for x in tail("--where", "reward=1", "--json")] == ["r1"]
    assert tail("--type", "rollout.scored") == []
    lines = tail("--type", "rollout.completed", "--limit", "2")
    assert len(lines) == 2 and lines[0].startswith("p") and "rollout.completed" in lines[0] and '"rollout_id":"r0"' in lines[0]
    bad = rollwire("tail", "rollouts", "--log-dir", str(log_dir), "--prefix", "demo", "--where", "reward")
    assert bad.returncode != 0 and "FIELD=VALUE" in bad.stderr


def test_tail_finds_a_runs_log_and_prefix_from_its_directory(tmp_path):
    from rollwire.run.recipe import load_recipe
    (tmp_path / "recipe.toml").write_text("name = 'mine'\n[[environments]]\nname = 'reverse-digits'\n")
    run_dir = tmp_path / "runs" / "mine"
    recipe = load_recipe(tmp_path / "recipe.toml", run_dir=run_dir)
    run_dir.mkdir(parents=True)
    (run_dir / "recipe.json").write_text(recipe.model_dump_json())
    log = EmbeddedLog(recipe.bus.path)
    topics = Topics(recipe.topic_prefix)
    log.create_topics(catalog_topics(topics))
    producer = EventProducer(log.producer(), topics, name="test")
    producer.send(topics.rollouts, rollout(rollout_id="in-the-run"), key="k")
    producer.close()

    done = rollwire("tail", "rollouts", "--run-dir", str(run_dir), "--json")
    assert done.returncode == 0, done.stderr
    assert [json.loads(x)["event"]["rollout_id"] for x in done.stdout.splitlines()] == ["in-the-run"]
    missing = rollwire("tail", "rollouts", "--run-dir", str(tmp_path))
    assert missing.returncode != 0 and "holds no recipe.json" in missing.stderr


def test_errors_name_the_fix_and_exit_nonzero(tmp_path):
    missing = rollwire("tail", "rollouts", "--log-dir", str(tmp_path))
    assert missing.returncode == 2 and "rollwire topics --create" in missing.stderr
    bad_age = rollwire("tail", "rollouts", "--since", "5x", "--log-dir", str(tmp_path))
    assert bad_age.returncode != 0 and "e.g. 90s" in bad_age.stderr


def test_topic_creation_is_idempotent_and_keeps_existing_topics(tmp_path):
    log = EmbeddedLog(tmp_path)
    topics = Topics("x")
    log.create_topics(catalog_topics(topics))
    log.create_topics(catalog_topics(topics))
    assert log.partitions(topics.rollouts) == 4


def test_dispatch_issues_groups_within_the_budget_and_stops_when_asked(tmp_path):
    log_dir = tmp_path / "log"
    result = rollwire("dispatch", "--env", "reverse-digits", "--option", "reverse-digits.seed=4", "--group-size", "4",
                      "--batch-rollouts", "8", "--max-off-policy", "0", "--max-groups", "2", "--log-dir", str(log_dir))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"groups_issued": 2}
    log = EmbeddedLog(log_dir)
    with log.reader([Topics("rollwire").tasks]) as reader:
        tasks = []
        while batch := reader.poll_batch(100, 0.3):
            tasks += batch
    assert len(tasks) == 2
    bad = rollwire("dispatch", "--env", "reverse-digits", "--option", "seed=4", "--log-dir", str(log_dir))
    assert bad.returncode != 0 and "ENV.KEY=VALUE" in bad.stderr


def test_traces_console_prints_the_spans_of_a_command(tmp_path):
    result = rollwire("--traces", "console", "dispatch", "--env", "reverse-digits", "--max-groups", "1",
                      "--batch-rollouts", "8", "--group-size", "4", "--log-dir", str(tmp_path / "log"),
                      "--prefix", "traced")
    assert result.returncode == 0, result.stderr
    assert '"name": "send traced.tasks"' in result.stdout and '"service.name": "rollwire-dispatch"' in result.stdout


def test_bad_settings_files_name_the_field_to_change(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text('[trainer]\nlr = -1\n[scorer]\ngroup_timeout_s = "soon"\n')
    train = rollwire("train", "--model", "m", "--config", str(config), "--log-dir", str(tmp_path / "log"))
    assert train.returncode != 0 and "rollwire train: invalid settings: trainer.lr" in train.stderr
    score = rollwire("score", "--config", str(config), "--log-dir", str(tmp_path / "log"))
    assert score.returncode != 0 and "scorer.group_timeout_s" in score.stderr and "Traceback" not in score.stderr
    missing = rollwire("score", "--config", str(tmp_path / "none.toml"))
    assert "cannot read --config" in missing.stderr


def test_single_role_commands_take_kafka_security_from_a_recipe_like_table(tmp_path):
    import argparse

    from rollwire.cli.options import add_bus_options, bus_settings
    (tmp_path / "kafka.toml").write_text('[bus.security]\nprotocol = "SASL_SSL"\nusername = "scorer"\n'
                                         f'ca_file = "{tmp_path / "ca.pem"}"\n')
    parser = argparse.ArgumentParser()
    add_bus_options(parser)
    args = parser.parse_args(["--bus", "kafka", "--bootstrap", "k1:9093", "--kafka-security", str(tmp_path / "kafka.toml")])
    settings = bus_settings(args)
    assert settings.security.protocol == "SASL_SSL" and settings.security.username == "scorer"
    config = settings.client_settings({"KAFKA_PASSWORD": "pw"})
    assert config["sasl.mechanisms"] == "SCRAM-SHA-512" and config["ssl.ca.location"] == str(tmp_path / "ca.pem")
