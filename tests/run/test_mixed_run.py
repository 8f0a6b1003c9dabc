"""One run of four environments, each with its own harness and runtime: `examples/mixed.toml`, as a
user runs it from the repository's root, made short (4 steps of 32 rollouts after 400 warm-start
steps, equal weights so that each environment is drawn). On the embedded log, with a real vLLM
server and a real Docker engine:

    reverse-digits    completion, in the worker's process (the bundled one)
    shop              chat with tools of several typed arguments, in a subprocess
    higher-lower      a conversation with a simulated user
    graded-reversal   an agent program in a container, graded by a command in that container

Whether the mix learns is measured on the full recipe (60 steps, `bench/RESULTS.md`); here: every
environment's rollouts are scored by its own rewards and trained, the user's turns are never
trained, the tools' schemas reach the model, and the grader in the container agrees with the same
check made outside it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from docker_engine import engine_with_images
from user_runs import finish, metrics_rows, start_run

from rollwire.producers.sandbox import OWNER_LABEL

pytestmark = [pytest.mark.vllm, pytest.mark.container, pytest.mark.slow, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[2]
STEPS = 4
ENVIRONMENTS = {"reverse-digits", "examples/environments/shop.py:Shop", "higher-lower",
                "examples/environments/graded_reversal.py:GradedReversal"}


def short(recipe: str) -> str:
    """The example, 32 rollouts a step with every environment drawn alike."""
    recipe = re.sub(r"(?m)^weight = \d+\n", "", recipe)
    recipe = re.sub(r"(?m)^(batch_rollouts|micro_batch_rollouts) = 128", r"\1 = 32", recipe)
    assert recipe.count("rollouts = 32") == 2, "examples/mixed.toml changed shape: update this test's shortening"
    return recipe


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory) -> dict:
    with engine_with_images(["debian", "python"], "the mixed run"):
        folder = tmp_path_factory.mktemp("mixed")
        recipe = folder / "mixed.toml"
        recipe.write_text(short((REPO / "examples" / "mixed.toml").read_text()))
        run = start_run(str(recipe), "--steps", str(STEPS), "--warm-start-steps", "400", "--run-dir", str(folder / "run"),
                        cwd=REPO)
        output = finish(run, 900)
        left = subprocess.run(["docker", "ps", "-aq", "--filter", f"label={OWNER_LABEL}"], capture_output=True,
                              text=True).stdout.split()
    return {"code": run.returncode, "output": output, "run_dir": folder / "run", "containers_left": left}


def _events(run_dir: Path, topic: str) -> list:
    from rollwire.core.bus import Beginning, EmbeddedBusSettings, open_log
    from rollwire.schemas import Codec
    found = []
    with open_log(EmbeddedBusSettings(path=run_dir / "log")) as log, log.reader([topic], Beginning()) as reader:
        while batch := reader.poll_batch(500, 0.5):
            found += [Codec().decode(record.value).event for record in batch]
    return found


def test_the_run_trains_every_environment_by_its_own_rewards(mixed_run):
    assert mixed_run["code"] == 0, mixed_run["output"][-4000:]
    assert len(metrics_rows(mixed_run["run_dir"] / "metrics.jsonl")) == STEPS
    scored = {s.rollout.rollout_id: s.rollout for s in _events(mixed_run["run_dir"], "mixed.scored")}
    trained = {rid for step in _events(mixed_run["run_dir"], "mixed.train") for rid in step.rollout_ids}
    by_environment: dict[str, list] = {}
    for rollout in scored.values():
        by_environment.setdefault(rollout.environment, []).append(rollout)
    assert set(by_environment) == ENVIRONMENTS
    own = {"reverse-digits": {"exact_match"}, "examples/environments/shop.py:Shop": {"said_a_number"},
           "higher-lower": {"found"}, "examples/environments/graded_reversal.py:GradedReversal": {"graded_correct"}}
    for name, rollouts in by_environment.items():
        good = [r for r in rollouts if r.error is None]
        assert len(good) >= len(rollouts) * 0.9, (name, [r.error for r in rollouts if r.error][:3])
        assert all(set(r.rewards) == own[name] for r in good), name
        assert {r.rollout_id for r in good} & trained, f"no rollout of {name} was trained"
    assert mixed_run["containers_left"] == []


def test_the_grader_in_the_container_agrees_with_the_same_check_outside_it(mixed_run):
    graded = [s.rollout for s in _events(mixed_run["run_dir"], "mixed.scored")
              if s.rollout.environment.endswith(":GradedReversal") and s.rollout.error is None]
    pairs = [(r.rewards["graded_correct"], r.metrics["answer_matches"]) for r in graded]
    assert all(inside == outside for inside, outside in pairs), pairs
    assert {inside for inside, _ in pairs} == {0.0, 1.0}, "both verdicts occur after the warm start"


def test_the_simulated_users_turns_and_the_tools_schemas_reach_the_model_untrained(mixed_run):
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(mixed_run["run_dir"] / "base")
    rollouts = [s.rollout for s in _events(mixed_run["run_dir"], "mixed.scored") if s.rollout.error is None]
    conversations = [r for r in rollouts if r.environment == "higher-lower"]
    # the user's turns: environment tokens of a sequence the model's next reply extends, or the prompt of
    # a sequence of its own where the template re-rendered the reply before it (branches = "all")
    lines = [line for r in conversations for line in [r, *r.branches]]
    said_by_user = [tokenizer.decode([t for t, m in zip(line.completion_token_ids, line.loss_mask) if not m])
                    for line in lines if 0 in line.loss_mask]
    said_by_user += [tokenizer.decode(line.prompt_token_ids).rsplit("<|im_start|>user", 1)[-1]
                     for r in conversations for line in r.branches]
    assert said_by_user, "no conversation went past the model's first reply"
    for text in said_by_user:
        assert re.search(r"Higher\.|Lower\.|Reply with one whole number", text), text
    for r in conversations:  # every sequence kept and trained: none of the model's tokens left out
        assert bool(r.branches) == (r.metrics["rollwire.branched_calls"] > 0)
        assert r.metrics["rollwire.untrained_tokens"] == 0
    shop = [r for r in rollouts if r.environment.endswith(":Shop")]
    assert all("quantity" in tokenizer.decode(r.prompt_token_ids) for r in shop)  # price(item, quantity)
