"""`rollwire eval` against a real vLLM server's OpenAI API: completion and chat tasksets."""

from __future__ import annotations

import json
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
