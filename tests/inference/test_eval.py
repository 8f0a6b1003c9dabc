"""`rollwire eval` against a real vLLM server's OpenAI API: completion and chat tasksets."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rollwire.producers.tasksets import RolloutView, load_taskset

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def rollwire_eval(server, *args):
    return subprocess.run([sys.executable, "-m", "rollwire.cli", "eval", *args, "--base-url", f"{server.base_url}/v1",
                           "--model", "policy"], capture_output=True, text=True, timeout=300)


def test_eval_scores_a_completion_taskset_and_a_chat_taskset(vllm_server, tmp_path):
    out = tmp_path / "answers.jsonl"
    result = rollwire_eval(vllm_server, "reverse-digits", "--option", "seed=5", "-n", "6", "--max-tokens", "8",
                           "--out", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    scores = json.loads(result.stdout.strip().splitlines()[-1])
    answers = [json.loads(line) for line in out.read_text().splitlines()]
    assert scores["answers"] == 6 == len(answers) and scores["error_rate"] == 0.0
    taskset = load_taskset("reverse-digits", seed=5)
    rows = {r["task_id"]: r for r, _ in zip(taskset.rows(), range(6))}
    for a in answers:  # each recorded score is the taskset's judgement of the returned text
        assert a["rewards"] == taskset.judge(RolloutView(task=rows[a["task_id"]], completion=a["completion"],
                                                         finish_reason=a["finish_reason"])).rewards
    assert scores["exact_match"] == sum(a["rewards"]["exact_match"] for a in answers) / 6

    data = tmp_path / "math.jsonl"
    data.write_text("\n".join(json.dumps({"question": f"What is {i} plus 1?", "answer": f"#### {i + 1}"})
                              for i in range(3)))
    chat = rollwire_eval(vllm_server, "math-word", "--option", f"path={data}", "-n", "3", "--max-tokens", "6")
    assert chat.returncode == 0, chat.stderr[-2000:]
    assert json.loads(chat.stdout.strip().splitlines()[-1])["answers"] == 3


def test_an_unreachable_endpoint_is_reported_per_answer_not_fatal(tmp_path):
    result = subprocess.run([sys.executable, "-m", "rollwire.cli", "eval", "reverse-digits", "-n", "2",
                             "--base-url", "http://127.0.0.1:9/v1", "--model", "x"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0
    assert json.loads(result.stdout.strip().splitlines()[-1])["error_rate"] == 1.0


def test_published_versions_are_compared_on_the_same_rows_each_with_its_own_weights(vllm_server, tiny_models,
                                                                                   tmp_path, version_base):
    from rollwire.core.bus import EmbeddedBusSettings, EventProducer, catalog_topics, open_log
    from rollwire.core.errors import ConfigError
    from rollwire.core.objectstore import LocalStore
    from rollwire.core.weight_versions import publish
    from rollwire.producers.evaluate import Contender, evaluate_versions, published_version
    from rollwire.schemas import Topics, WeightsPublished

    store, run, shadow = LocalStore(tmp_path / "store"), Topics("run"), Topics("run-fixed")
    log = open_log(EmbeddedBusSettings(path=tmp_path / "log"))
    for topics, policy, seed in ((run, "policy", 1), (shadow, "run-fixed", 2)):  # the run's, a replay's
        log.create_topics(catalog_topics(topics))
        producer = EventProducer(log.producer(), topics, name="trainer")
        done = publish(store, tiny_models.version(seed=seed), f"{policy}/v00000007", policy=policy, version=7,
                       step=7, base_model="tiny")
        producer.send(topics.weights, WeightsPublished(policy=policy, version=7, step=7, uri=done.uri,
                                                       manifest_sha256=done.manifest_sha256, base_model="tiny"),
                      key=policy)
        producer.close()
    contenders = [Contender("policy@7", published_version(log, [run], "policy", 7)),
                  Contender("run-fixed@7", published_version(log, [run, shadow], "run-fixed", 7))]
    with pytest.raises(ConfigError, match="policy has versions 7..7"):
        published_version(log, [run], "policy", 8)

    rows = evaluate_versions(load_taskset("reverse-digits", seed=3), contenders, store=store,
                             control=vllm_server.control, base_url=f"{vllm_server.base_url}/v1", served_model="policy",
                             work_dir=tmp_path / "work", limit=6, max_tokens=8)
    vllm_server.control.swap_full_weights(str(tiny_models.base), str(version_base))  # as other tests expect

    assert [label for label, _ in rows] == ["policy@7", "run-fixed@7"]
    (_, first), (_, second) = rows
    assert [r.task_id for r in first] == [r.task_id for r in second] and all(r.error is None for r in first + second)
    # Greedy answers from two different random models: the rows were not served by one set of weights.
    assert [r.completion for r in first] != [r.completion for r in second]
    alone = evaluate_versions(load_taskset("reverse-digits", seed=3), contenders[:1], store=store,
                              control=vllm_server.control, base_url=f"{vllm_server.base_url}/v1",
                              served_model="policy", work_dir=tmp_path / "again", limit=6, max_tokens=8)
    vllm_server.control.swap_full_weights(str(tiny_models.base), str(version_base))
    assert [r.completion for r in alone[0][1]] == [r.completion for r in first]  # each row is its version's
    log.close()


def test_several_models_of_one_endpoint_print_a_row_each(vllm_server):
    result = subprocess.run([sys.executable, "-m", "rollwire.cli", "eval", "reverse-digits", "-n", "2",
                             "--max-tokens", "4", "--base-url", f"{vllm_server.base_url}/v1",
                             "--model", "policy", "--model", "no-such-model"], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [json.loads(line) for line in result.stdout.strip().splitlines()[-2:]]
    assert [(r["model"], r["error_rate"]) for r in rows] == [("policy", 0.0), ("no-such-model", 1.0)]


def test_env_check_runs_a_file_environment_against_the_model_and_prints_each_rollout(vllm_server, tmp_path):
    """`rollwire env check` on a taskset a user wrote in a file: loaded by reference, a few rollouts
    against the real server, each one's reward and metric printed, and the means as JSON."""
    (tmp_path / "echo_env.py").write_text(
        "from rollwire.producers.tasksets import Taskset, metric, reward\n\n"
        "class Echo(Taskset):\n"
        "    name = 'echo'\n"
        "    def rows(self):\n"
        "        for i in range(10):\n"
        "            yield {'task_id': f'echo-{i}', 'prompt': f'<|bos|>r:{i}{i}>', 'answer': f'{i}{i}'}\n"
        "    @reward('starts_right')\n"
        "    def starts_right(self, r):\n"
        "        return float(r.completion[:1] == r.task['answer'][:1])\n"
        "    @metric('chars')\n"
        "    def chars(self, r):\n"
        "        return float(len(r.completion))\n")
    result = subprocess.run([sys.executable, "-m", "rollwire.cli", "env", "check", str(tmp_path / "echo_env.py"), "-n",
                             "3", "--max-tokens", "4", "--base-url", f"{vllm_server.base_url}/v1", "--model", "policy"],
                            capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert result.returncode == 0, result.stderr[-2000:]
    means = json.loads(result.stdout.strip().splitlines()[-1])
    assert means["rollouts"] == 3 and means["error_rate"] == 0.0 and 0 < means["chars"] <= 4 * 8
    assert all(f"echo-{i}" in result.stdout for i in range(3)) and "starts_right" in result.stdout
    missing = subprocess.run([sys.executable, "-m", "rollwire.cli", "env", "check", "reverse-digit", "--base-url",
                              f"{vllm_server.base_url}/v1", "--model", "policy"], capture_output=True, text=True)
    assert missing.returncode != 0 and "did you mean 'reverse-digits'" in missing.stderr


def test_sampled_answers_repeat_with_the_same_seed(vllm_server, tmp_path):
    """At temperature 1, two evaluations with one seed give the same answers, answer for answer (vLLM
    honours each request's seed); another seed gives others."""
    def answers(seed: int) -> list[str]:
        out = tmp_path / f"seed{seed}-{len(list(tmp_path.iterdir()))}.jsonl"
        done = rollwire_eval(vllm_server, "reverse-digits", "-n", "6", "--samples", "2", "--temperature", "1",
                             "--max-tokens", "8", "--seed", str(seed), "--out", str(out))
        assert done.returncode == 0, done.stderr[-2000:]
        return [json.loads(line)["completion"] for line in out.read_text().splitlines()]

    first = answers(11)
    assert len(set(first)) > 1, "temperature 1 should sample different answers"
    assert answers(11) == first
    assert answers(12) != first
