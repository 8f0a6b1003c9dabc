"""The LLM judges against a real vLLM server playing the judge, asked through the OpenAI chat API as
any judge model would be: a tiny model trained here to grade two answers `Score: 7`, and to prefer
"4" to "five" for 2+2 whichever position it is shown in (the pairwise group reward in the scorer)."""

from __future__ import annotations

import pytest
from judged import JudgedQuestions

from rollwire.producers.judges import DEFAULT_RUBRIC, JudgeError, JudgeSettings, LlmJudge
from rollwire.producers.tasksets import RolloutView
from rollwire.schemas import ScoredRollout
from rollwire.streams.group_rewards import PAIRWISE_RUBRIC, GroupRewardSpec
from rollwire.streams.scoring import GroupScorer, ScorerSettings

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ANSWERS = ["4", "five"]


GRADED = [[{"role": "user", "content": DEFAULT_RUBRIC.format(question="2+2?", answer=a)},
           {"role": "assistant", "content": "Score: 7"}] for a in ANSWERS]
"""What the tiny judge is trained to say: `Score: 7` for each answer of ANSWERS."""
COMPARED = [[{"role": "user", "content": PAIRWISE_RUBRIC.format(question="2+2?", answer_a=a, answer_b=b)},
             {"role": "assistant", "content": verdict}] for a, b, verdict in (("4", "five", "Score: 10"),
                                                                               ("five", "4", "Score: 0"))]
"""And, shown both answers, that "4" is the better one, in either position."""


@pytest.fixture(scope="module")
def judge_model(tiny_models, tmp_path_factory):
    return tiny_models.overfitted(tmp_path_factory.mktemp("judge") / "grader", GRADED + COMPARED, seed=6,
                                  max_loss=0.2)


def test_a_taskset_reward_asks_the_judge_and_a_judgement_without_a_score_errs_the_rollout(vllm_server, judge_model,
                                                                                           version_base):
    vllm_server.control.swap_full_weights(str(judge_model), str(version_base))
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


def test_the_pairwise_group_reward_ranks_a_groups_answers_with_the_judge(vllm_server, judge_model, version_base):
    from builders import group_of
    vllm_server.control.swap_full_weights(str(judge_model), str(version_base))
    group = [r.model_copy(update={"question": "2+2?", "answer": a}) for r, a in zip(group_of("g", [0.0, 0.0]), ANSWERS)]
    spec = GroupRewardSpec(name="pairwise_judge", bonus=1.0, both_orders=True,
                           judge={"base_url": f"{vllm_server.base_url}/v1", "model": "policy", "max_tokens": 12})
    scorer = GroupScorer(ScorerSettings(group_rewards={"*": [spec]}))
    state, events = None, []
    for r in group:
        step = scorer.on_rollout(state, r)
        state, events = step.state, events + step.events
    assert [type(e) for e in events] == [ScoredRollout, ScoredRollout], events
    assert [e.group_rewards["pairwise_judge"] for e in events] == [1.0, 0.0], "4 beats five in both positions"
    assert events[0].advantage > events[1].advantage
