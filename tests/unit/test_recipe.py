"""Run recipes: the bundled demo loads, bad recipes say what to change, progress reads the run's events."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest
from builders import rollout

from rollwire.bus import EmbeddedBusSettings, EventProducer, catalog_topics, open_log
from rollwire.errors import ConfigError
from rollwire.run.progress import RunProgress, plot
from rollwire.run.recipe import load_recipe, recipe_text
from rollwire.schemas import Topics, TrainStepCompleted
from rollwire.schemas.training import Staleness
from rollwire.schemas.weights import ReplicaStatus


def test_the_bundled_demo_is_a_complete_recipe():
    recipe = load_recipe()
    assert recipe.name == "demo" and str(recipe.run_dir) == "runs/demo" and recipe.prefix == "demo"
    assert recipe.environments[0].name == "reverse-digits" and recipe.warm_start.steps > 0
    trainer = recipe.trainer_settings()
    assert trainer.model.path == "runs/demo/base" and str(trainer.checkpoint_dir) == "runs/demo/trainer"
    assert recipe.scorer.group_rewards["reverse-digits"][0].name == "shortest_correct"
    import torch
    # the server samples in the trainer's dtype (vLLM's own `auto` would pick bfloat16 on a CPU)
    assert recipe.inference_dtype() == ("bfloat16" if torch.cuda.is_available() else "float32")
    printed = subprocess.run([sys.executable, "-m", "rollwire", "run", "--print-recipe"], capture_output=True,
                             text=True, timeout=60)
    assert tomllib.loads(printed.stdout) == tomllib.loads(recipe_text())


def test_overrides_and_kafka_settings(tmp_path):
    recipe = load_recipe(None, steps=3, run_dir=str(tmp_path / "r"), **{"bus.type": "kafka",
                                                                      "bus.bootstrap_servers": "10.0.0.1:9092"})
    assert recipe.steps == 3 and recipe.bus_settings().bootstrap_servers == "10.0.0.1:9092"
    assert recipe.trainer_settings().model.path == str(tmp_path / "r" / "base")


@pytest.mark.parametrize("text, message", [
    ("steps = 3", "environments"),
    ("[[environments]]\nname = 'reverse-digits'\n[trainer]\nlr = -1", "trainer"),
    ("[[environments]]\nname = 'reverse-digits'\n[warm_start]\nsteps = 5\nenvironment = 'chess'", "chess"),
    ("[[environments]]\nname = 'reverse-digits'\n[bus]\ntype = 'kafka'\nbootstrap_servers = 'nohost'", "host:port"),
    ("steps = [", "not valid TOML"),
    ("[[environments]]\nname = 'chess'", "unknown environment 'chess'"),
])
def test_bad_recipes_say_what_to_change(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_recipe(path)
    with pytest.raises(ConfigError, match="no recipe at"):
        load_recipe(tmp_path / "missing.toml")


def test_a_tied_embedding_model_is_refused_for_full_weight_training(tmp_path):
    (tmp_path / "tied").mkdir()
    (tmp_path / "tied" / "config.json").write_text('{"tie_word_embeddings": true}')
    recipe = tmp_path / "r.toml"
    recipe.write_text(f"[model]\npath = '{tmp_path / 'tied'}'\n[[environments]]\nname = 'reverse-digits'\n")
    with pytest.raises(ConfigError, match="tie_word_embeddings"):
        load_recipe(recipe)
    recipe.write_text(recipe.read_text() + "[trainer.model.lora]\nrank = 4\n")
    assert load_recipe(recipe).trainer_settings().model.lora.rank == 4
    recipe.write_text("[model.tiny]\ntie_embeddings = true\n[[environments]]\nname = 'reverse-digits'\n")
    with pytest.raises(ConfigError, match="tie_embeddings = true"):
        load_recipe(recipe)


def test_progress_rebuilds_metrics_from_the_log_and_draws_the_curve(tmp_path):
    topics = Topics("p")
    log = open_log(EmbeddedBusSettings(path=tmp_path / "log"))
    log.create_topics(catalog_topics(topics))
    producer = EventProducer(log.producer(), topics, name="test")
    for step in (1, 2, 3):
        producer.send(topics.train, TrainStepCompleted(step=step, policy_version=step, rollout_ids=["a", "b"],
                                                       reward_mean=0.1 * step, staleness=Staleness(min=0, mean=0.5, max=1),
                                                       metrics_mean={"completion_tokens": 5.0 - step}, wait_s=0.2),
                      key="policy")
    producer.send(topics.fleet, ReplicaStatus(replica_id="r0", state="serving", serving_version=3), key="r0")
    producer.send(topics.rollouts, rollout(), key="g")
    producer.flush()
    raw = log.producer()
    raw.send(topics.train, b"junk", key=b"policy")
    raw.close()

    metrics = tmp_path / "m.jsonl"
    progress = RunProgress(log, topics, metrics)
    while progress.poll(0.3):
        pass
    progress.close()
    rows = [__import__("json").loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[2]["reward_mean"] == pytest.approx(0.3)
    assert rows[0]["metric/completion_tokens"] == 4.0 and rows[0]["wait_s"] == 0.2
    assert progress.serving == {"r0": 3} and progress.rollouts == 1
    assert progress.unreadable == 1 and "p.train" in progress.summary()
    assert progress.mean_reward(first=2) == pytest.approx(0.15) and progress.mean_reward(last=1) == pytest.approx(0.3)
    import io

    from rich.console import Console
    screen = io.StringIO()
    Console(file=screen, force_terminal=True, width=120).print(progress.table(10, "training"))
    shown = screen.getvalue()
    assert "3/10" in shown and "0.300 now" in shown and "r0 v3 (serving)" in shown and "unreadable" in shown
    png = plot(progress.rows, tmp_path / "curve.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
