"""Run recipes: the bundled demo loads, bad recipes say what to change, progress reads the run's events."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import tomllib

import pytest
from builders import rollout

from rollwire.core.bus import EmbeddedBusSettings, EventProducer, catalog_topics, open_log
from rollwire.core.errors import ConfigError
from rollwire.run.progress import RunProgress, plot
from rollwire.run.recipe import load_recipe
from rollwire.schemas import SamplingStarted, Topics, TrainStepCompleted
from rollwire.schemas.training import Staleness
from rollwire.schemas.weights import ReplicaStatus


def test_the_bundled_demo_is_a_complete_recipe():
    recipe = load_recipe()
    assert recipe.name == "demo" and str(recipe.run_dir) == "runs/demo" and recipe.topic_prefix == "demo"
    assert recipe.environments[0].name == "reverse-digits" and recipe.warm_start.steps > 0
    assert recipe.trainer.model.path == "runs/demo/base" and str(recipe.trainer.checkpoint_dir) == "runs/demo/trainer"
    assert str(recipe.bus.path) == "runs/demo/log" and str(recipe.store.root) == "runs/demo/weights"
    assert recipe.scorer.group_rewards["reverse-digits"][0].name == "shortest_correct"
    import torch
    # the server samples in the trainer's dtype (vLLM's own `auto` would pick bfloat16 on a CPU)
    assert recipe.server_settings().dtype == ("bfloat16" if torch.cuda.is_available() else "float32")


def _fields(model, path=()):
    """Every (dotted path, value) of a settings model, nested tables and lists of tables included."""
    from pydantic import BaseModel
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            yield from _fields(value, (*path, name))
        elif isinstance(value, list) and value and isinstance(value[0], BaseModel):
            for item in value:
                yield from _fields(item, (*path, name))
        else:
            yield ".".join((*path, name)), value


def test_print_recipe_shows_every_setting_with_its_doc_and_reads_back_the_same():
    recipe = load_recipe()
    printed = subprocess.run([sys.executable, "-m", "rollwire", "run", "--print-recipe"], capture_output=True,
                             text=True, timeout=60)
    assert printed.returncode == 0, printed.stderr
    documented: dict[str, bool] = {}  # dotted setting -> whether a doc comment precedes it
    table, previous = "", ""
    for line in printed.stdout.splitlines():
        if line.startswith("["):
            table = line.strip("[]")
        elif " =" in line and not line.startswith("# ") or line.startswith("# ") and line.endswith("(unset)"):
            key = line.removeprefix("# ").split(" =")[0]
            documented[f"{table}.{key}".lstrip(".")] = bool(re.match(r"# (?![\w\"-]+ = )", previous))
        previous = line
    for dotted, _ in _fields(recipe):
        assert dotted in documented, f"{dotted} is missing from --print-recipe"
        assert documented[dotted], f"{dotted} has no doc comment"
    from rollwire.run.recipe import RunRecipe
    assert RunRecipe.model_validate(tomllib.loads(printed.stdout)).model_dump() == recipe.model_dump()


def test_overrides_and_kafka_settings(tmp_path):
    recipe = load_recipe(None, steps=3, run_dir=str(tmp_path / "r"), **{"bus.type": "kafka",
                                                                      "bus.bootstrap_servers": "10.0.0.1:9092"})
    assert recipe.steps == 3 and recipe.bus.bootstrap_servers == "10.0.0.1:9092"
    assert recipe.trainer.model.path == str(tmp_path / "r" / "base")


ENV = "[[environments]]\nname = 'reverse-digits'\n"


def test_the_recipe_owns_the_runs_names_and_every_component_gets_them(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text("name = 'exp1'\nprefix = 'exp1-a'\npolicy = 'qwen-mini'\n" + ENV)
    recipe = load_recipe(path)
    identity = recipe.identity
    assert (identity.name, identity.prefix, identity.policy, identity.run_dir) == (
        "exp1", "exp1-a", "qwen-mini", recipe.run_dir)
    assert recipe.trainer.policy == recipe.inference.served_model_name == "qwen-mini"
    assert recipe.group_id("scorer") == identity.group("scorer") == "exp1-a-scorer" == Topics("exp1-a").group("scorer")
    assert identity.topics.rollouts == "exp1-a.rollouts" and identity.faust_dir == recipe.run_dir / "faust"


@pytest.mark.parametrize("text, message", [
    ("steps = 3", "environments: Field required"),
    (ENV + "[trainer]\nlr = -1", "trainer.lr"),
    (ENV + "[warm_start]\nsteps = 5\nenvironment = 'chess'", "chess"),
    (ENV + "[bus]\ntype = 'kafka'\nbootstrap_servers = 'nohost'", "host:port"),
    ("steps = [", "not valid TOML"),
    ("[[environments]]\nname = 'chess'", "environments.0.name: unknown taskset 'chess'; valid: arithmetic, calculator"),
    (ENV + "algorithm = 'grpoo'", "environments.0.algorithm: unknown advantage algorithm 'grpoo'; valid: .*"
                                  "did you mean 'grpo'"),
    (ENV + "options = { sed = 1 }", "taskset reverse-digits has no option 'sed' \\(did you mean 'seed'\\?\\); "
                                    "it takes seed, count"),
    (ENV + "[trainer]\nloss = 'ppo_clp'", "trainer: unknown loss 'ppo_clp'; valid: .*did you mean 'ppo_clip'"),
    (ENV + "[trainer]\nloss_params = { eps_hi = 0.3 }", "no parameter 'eps_hi' \\(did you mean 'eps_high'\\?\\)"),
    (ENV + "[trainer]\ncorrections = [{ name = 'token_tiss' }]",
     "trainer.corrections.0: unknown off-policy correction 'token_tiss'; valid: .*did you mean 'token_tis'"),
    (ENV + "[scorer.group_rewards]\nreverse-digits = [{ name = 'shortest' }]",
     "unknown group reward 'shortest'; valid: pairwise_judge, shortest_correct \\(did you mean 'shortest_correct'\\?\\)"),
    (ENV + "[scorer.group_rewards]\nreverse-digits = [{ name = 'shortest_correct', bonnus = 1 }]",
     "group reward shortest_correct has no option 'bonnus' \\(did you mean 'bonus'\\?\\)"),
    (ENV + "[env_workers]\nruntime = 'docker'", "env_workers.runtime: Input should be 'in-process', 'subprocess' or 'container'"),
    (ENV + "[trainer]\npolicy = 'mine'", "trainer.policy = 'mine' differs from the run's policy 'policy'.*"
                                         "set `policy = 'mine'` at the top of the recipe"),
])
def test_bad_recipes_say_what_to_change(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_recipe(path)
    with pytest.raises(ConfigError, match="no recipe at"):
        load_recipe(tmp_path / "missing.toml")


def test_a_mistyped_recipe_ends_rollwire_run_at_once_in_one_line(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(ENV + "algorithm = 'grpoo'\n[trainer]\nloss = 'ppo_clp'\n")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "rollwire", "run", str(path), "--run-dir", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=60)
    took = time.monotonic() - started
    assert done.returncode == 2 and took < 5.0, (took, done.stderr)
    [line] = done.stderr.strip().splitlines()
    assert "environments.0.algorithm: unknown advantage algorithm 'grpoo'" in line and "trainer: unknown loss" in line
    assert "Traceback" not in done.stderr and not (tmp_path / "run").exists()


def test_parsing_a_recipe_and_the_light_roles_import_no_torch():
    """Settings are checked by processes that never load a model: the dispatcher, the scorer and
    the env workers run on machines without torch."""
    code = ("import sys\n"
            "from rollwire.run.recipe import load_recipe\n"
            "from rollwire.producers.dispatcher import Dispatcher\n"
            "from rollwire.producers.env_worker import EnvWorker\n"
            "from rollwire.producers.tasksets import load_taskset\n"
            "from rollwire.streams.embedded_scorer import EmbeddedScorer\n"
            "from rollwire.streams.scoring import GroupScorer\n"
            "recipe = load_recipe()\n"
            "GroupScorer(recipe.scorer)\n"
            "[load_taskset(e.name, **e.options) for e in recipe.environments]\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_tied_embedding_model_trains_full_weight(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text("[model.tiny]\ntie_embeddings = true\n[[environments]]\nname = 'reverse-digits'\n")
    loaded = load_recipe(recipe)
    assert loaded.model.tiny.tie_embeddings and loaded.trainer.model.lora is None


def _read_to_the_end(progress: RunProgress) -> RunProgress:
    while progress.poll(0.3):
        pass
    progress.close()
    return progress


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
    producer.send(topics.fleet, ReplicaStatus(replica_id="r1", state="serving", serving_version=3, requested_version=3,
                                              stage_s=0.1, swap_s=0.05, drain_s=0.002, apply_s=0.045,
                                              transfer="direct"), key="r1")
    producer.send(topics.rollouts, rollout(), key="g")
    for index in range(3):  # one of them the rollout above; two still sampling
        producer.send(topics.sampling, SamplingStarted(group_id="g", sample_index=index, worker="w"), key="g")
    producer.flush()
    raw = log.producer()
    raw.send(topics.train, b"junk", key=b"policy")
    raw.close()

    metrics = tmp_path / "m.jsonl"
    progress = _read_to_the_end(RunProgress(log, topics, metrics))
    rows = [__import__("json").loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[2]["reward_mean"] == pytest.approx(0.3)
    assert rows[0]["metric/completion_tokens"] == 4.0 and rows[0]["wait_s"] == 0.2
    assert progress.serving == {"r0": 3, "r1": 3} and progress.rollouts == 1
    assert progress.unreadable == 1 and "p.train" in progress.summary()
    assert progress.mean_reward(first=2) == pytest.approx(0.15) and progress.mean_reward(last=1) == pytest.approx(0.3)
    import io

    from rich.console import Console
    screen = io.StringIO()
    Console(file=screen, force_terminal=True, width=120).print(progress.table(10, "training"))
    shown = screen.getvalue()
    assert "3/10" in shown and "0.300 now" in shown and "r0 v3 (serving)" in shown and "unreadable" in shown
    assert "1 published · 0 errored · 2 sampling now" in shown
    assert "r1 v3 (serving, last load 0.15 s directly (paused 50 ms: drain 2, apply 45))" in shown
    png = plot(progress.curve.rows, tmp_path / "curve.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    # the curve holds what it draws of each step, not the whole row the metrics file has
    assert progress.curve.rows[0] == {"step": 1, "reward_mean": pytest.approx(0.1), "metric/completion_tokens": 4.0}


def test_progress_holds_a_bounded_part_of_a_long_runs_steps_and_writes_every_one(tmp_path, monkeypatch):
    from rollwire.run import progress as module
    monkeypatch.setattr(module, "CURVE_STEPS", 64)
    topics = Topics("long")
    log = open_log(EmbeddedBusSettings(path=tmp_path / "log"))
    log.create_topics(catalog_topics(topics))
    producer = EventProducer(log.producer(), topics, name="test")
    steps = 3 * module.RECENT_STEPS
    for step in range(1, steps + 1):
        producer.send(topics.train, TrainStepCompleted(step=step, policy_version=step, rollout_ids=["a"],
                                                       reward_mean=step / steps), key="policy")
    producer.flush()
    metrics = tmp_path / "m.jsonl"
    progress = _read_to_the_end(RunProgress(log, topics, metrics))
    assert len(metrics.read_text().splitlines()) == steps  # the file has every step
    assert len(progress.rows) == module.RECENT_STEPS and progress.step == steps
    assert len(progress.curve.rows) <= 64 and progress.curve.rows[0]["step"] == 1
    assert progress.mean_reward(first=10) == pytest.approx(5.5 / steps)
    assert progress.mean_reward(last=10) == pytest.approx((steps - 4.5) / steps)


def test_a_run_that_stands_still_names_the_stage_that_stopped_first(tmp_path):
    from rollwire.run.progress import StallWatch
    topics = Topics("s")
    log = open_log(EmbeddedBusSettings(path=tmp_path / "log"))
    log.create_topics(catalog_topics(topics))
    start = time.monotonic()
    watch = StallWatch(log, topics, after_s=10, logs_dir=tmp_path / "logs")
    assert watch.check(start) is None
    with log.producer() as producer:  # tasks and rollouts keep coming; nothing is scored or trained
        producer.send(topics.tasks, b"t", key=b"g")
        producer.send(topics.rollouts, b"r", key=b"g")
    assert watch.check(start + 5) is None
    warning = watch.check(start + 20)
    assert "no trainer step for 20 s: the scorer scored no rollout for 20 s" in warning
    assert str(tmp_path / "logs" / "scorer-0.log") in warning
    log.close()


def test_the_base_model_is_built_in_a_child_so_the_supervisor_never_holds_torch(tmp_path):
    """`rollwire run` supervises a run for as long as it lasts: the warm start (torch, the model, the
    optimizer) runs in a child process, and nothing else the supervisor does imports torch (its
    RSS on the Kafka soak: 658 MB before, 322 MB with only the warm start moved out)."""
    script = f"""
import sys
from pathlib import Path
from rich.console import Console
from rollwire.run.recipe import load_recipe
from rollwire.run.roles import base_url
from rollwire.run.runner import prepare_model, resolve
recipe = load_recipe(None, run_dir=Path({str(tmp_path / "run")!r}), **{{"warm_start.steps": 3}})
resolve(recipe)
prepare_model(recipe, Console())
base_url(recipe)  # the supervisor's other use of the recipe's server (its dtype needs torch; its port does not)
print("torch imported here:", "torch" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "torch imported here: False" in done.stdout
    assert "3/3 steps" in done.stdout  # the child's progress bar reached this process's output
    assert (tmp_path / "run" / "base" / "config.json").exists()
    assert not (tmp_path / "run" / "base.partial").exists()


def test_a_base_that_fails_to_build_says_so_and_keeps_nothing_half_built(tmp_path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a GGUF file at all")
    recipe = load_recipe(None, run_dir=tmp_path / "run", **{"model.path": str(broken)})
    from rich.console import Console

    from rollwire.run.runner import RunFailed, prepare_model, resolve
    resolve(recipe)
    with pytest.raises(RunFailed, match="building .*base failed"):
        prepare_model(recipe, Console())
    assert not (tmp_path / "run" / "base").exists()
