"""The LLM judge's own logic against a scripted OpenAI-compatible endpoint (`tests/scripted_server.py`):
the score read from the reply, retries with every reason, and no silent 0. The judge against a real
vLLM server is tests/inference/test_judge.py."""

from __future__ import annotations

import pytest
from judged import JudgedQuestions
from pydantic import ValidationError
from scripted_server import ScriptedServer

from rollwire.producers.judges import JudgeError, JudgeSettings, LlmJudge
from rollwire.producers.tasksets import RolloutView


@pytest.fixture
def endpoint():
    made = []

    def make(*replies):
        made.append(ScriptedServer(list(replies)))
        return made[-1]
    yield make
    for server in made:
        server.close()


def test_the_score_is_read_from_the_reply_and_scaled(endpoint):
    server = endpoint("Reasoning... Score: 7")
    judge = LlmJudge(JudgeSettings(base_url=server.url, model="judge"))
    assert judge.score(question="2+2?", answer="4") == pytest.approx(0.7)
    assert "2+2?" in server.prompts[0] and "Answer:\n4" in server.prompts[0]


def test_a_failed_try_is_retried_and_every_reason_is_kept_when_all_fail(endpoint):
    server = endpoint(503, "I think it is fine", "Score: 3")
    judge = LlmJudge(JudgeSettings(base_url=server.url, model="judge", retries=2))
    assert judge.score(question="q", answer="a") == pytest.approx(0.3)
    failing = endpoint(503, "no number here", "Score: 42")
    with pytest.raises(JudgeError) as caught:
        LlmJudge(JudgeSettings(base_url=failing.url, model="judge", retries=2)).score(question="q", answer="a")
    message = str(caught.value)
    assert "try 1: EndpointError" in message and "503" in message
    assert "try 2: no score in the reply 'no number here'" in message
    assert "try 3: score 42 is outside 0..10" in message


def test_an_unreachable_judge_or_a_rubric_asking_for_a_missing_field_is_an_error_not_zero():
    judge = LlmJudge(JudgeSettings(base_url="http://127.0.0.1:9/v1", model="judge", retries=0, timeout_s=2))
    with pytest.raises(JudgeError, match="gave no score: try 1: EndpointError"):
        judge.score(question="q", answer="a")
    with pytest.raises(JudgeError, match="the rubric names 'reference' but the reward gave only question, answer"):
        LlmJudge(JudgeSettings(base_url="http://x/v1", model="m", rubric="{reference} {answer}")).score(
            question="q", answer="a")


def test_a_taskset_whose_judge_fails_marks_the_rollout_errored_with_the_reason(endpoint):
    server = endpoint("meh", "meh")

    taskset = JudgedQuestions({"base_url": server.url, "model": "judge", "retries": 1})
    judgement = taskset.judge(RolloutView(task={"task_id": "t", "question": "q"}, completion="a"))
    assert judgement.error is not None and judgement.error.kind == "reward"
    assert "judge raised JudgeError" in judgement.error.message and "no score in the reply 'meh'" in judgement.error.message


@pytest.mark.parametrize(("pattern", "message"), [("Score: \\d+", "needs a group"), ("(", "not a regular expression")])
def test_a_score_pattern_without_a_group_is_refused(pattern, message):
    with pytest.raises(ValidationError, match=message):
        JudgeSettings(base_url="http://x/v1", model="m", score_pattern=pattern)
