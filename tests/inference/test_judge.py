"""The LLM judge against a real vLLM server playing the judge: a tiny model trained here to grade
two answers `Score: 7`, asked through the OpenAI chat API as any judge model would be."""

from __future__ import annotations

import pytest
from judged import JudgedQuestions

from rollwire.producers.judges import DEFAULT_RUBRIC, JudgeError, JudgeSettings, LlmJudge
from rollwire.producers.tasksets import RolloutView

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ANSWERS = ["4", "five"]


GRADED = [[{"role": "user", "content": DEFAULT_RUBRIC.format(question="2+2?", answer=a)},
           {"role": "assistant", "content": "Score: 7"}] for a in ANSWERS]
"""What the tiny judge is trained to say: `Score: 7` for each answer of ANSWERS."""


def test_a_taskset_reward_asks_the_judge_and_a_judgement_without_a_score_errs_the_rollout(vllm_server, tiny_models,
                                                                                           version_base, tmp_path):
    path = tiny_models.overfitted(tmp_path / "grader", GRADED, seed=6, max_loss=0.1)
    vllm_server.control.swap_full_weights(str(path), str(version_base))
    settings = {"base_url": f"{vllm_server.base_url}/v1", "model": "policy", "max_tokens": 12}

    row = next(JudgedQuestions(settings).rows())
    for answer in ANSWERS:
        judgement = JudgedQuestions(settings).judge(RolloutView(task=row, completion=answer))
        assert judgement.error is None and judgement.rewards == {"judge": pytest.approx(0.7)}
    strict = JudgedQuestions({**settings, "score_pattern": r"Grade: (\d+)", "retries": 1}).judge(
        RolloutView(task=row, completion=ANSWERS[0]))
    assert strict.error is not None and strict.error.kind == "reward"
    assert "try 2: no score in the reply 'Score: 7" in strict.error.message
    with pytest.raises(JudgeError, match="HTTP 404"):  # a model the server does not serve
        LlmJudge(JudgeSettings(**{**settings, "model": "nobody", "retries": 0})).score(question="q", answer="a")
