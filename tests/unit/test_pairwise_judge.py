"""The pairwise judge group reward against a scripted OpenAI-compatible judge over HTTP
(`tests/scripted_server.py`): every pair asked, wins shared out, positions alternated or both asked,
and a judge that gives no verdict drops the group with the reason. Against a real vLLM server
playing the judge: tests/inference/test_judge.py."""

from __future__ import annotations

import re

import pytest
from builders import group_of
from scripted_server import ScriptedServer

from rollwire.schemas import RolloutsDropped, ScoredRollout
from rollwire.streams.group_rewards import GroupRewardSpec
from rollwire.streams.scoring import GroupScorer, ScorerSettings

ANSWERS = ["7", "seven, as 3 + 4", "the answer is 3 + 4 = 7, which I checked twice"]


def answered(group_id: str, answers: list[str]):
    return [r.model_copy(update={"question": "What is 3 + 4?", "answer": a})
            for r, a in zip(group_of(group_id, [0.0] * len(answers)), answers)]


def shorter_wins(body: dict) -> str:
    """A judge that prefers the shorter answer, and says so in the rubric's terms."""
    prompt = body["messages"][0]["content"]
    a, b = re.search(r"Answer A:\n(.*)\n\nAnswer B:\n(.*)\n\nWhich", prompt, re.S).groups()
    return "Score: 5" if len(a) == len(b) else ("Score: 10" if len(a) < len(b) else "Score: 0")


@pytest.fixture
def judge():
    server = ScriptedServer(shorter_wins)
    yield server
    server.close()


def score(group, **spec):
    scorer = GroupScorer(ScorerSettings(group_rewards={"*": [GroupRewardSpec(name="pairwise_judge", **spec)]}))
    state, events = None, []
    for r in group:
        step = scorer.on_rollout(state, r)
        state, events = step.state, events + step.events
    return events


def test_every_pair_is_judged_and_each_rollout_gets_its_share_of_wins(judge):
    out = score(answered("g", ANSWERS), bonus=1.0, judge={"base_url": judge.url, "model": "judge"})

    assert [type(e) for e in out] == [ScoredRollout] * 3
    assert [e.group_rewards["pairwise_judge"] for e in out] == [1.0, 0.5, 0.0]
    assert len(judge.bodies) == 3, "one call per pair"
    first_positions = [re.search(r"Answer A:\n(.*?)\n\nAnswer B", b["messages"][0]["content"], re.S).group(1)
                       for b in judge.bodies]
    assert len(set(first_positions)) > 1, "which member comes first alternates"
    assert all("What is 3 + 4?" in b["messages"][0]["content"] and b["model"] == "judge" for b in judge.bodies)
    assert out[0].advantage > out[1].advantage > out[2].advantage, "the bonus is in the reward advantages use"


def test_both_orders_asks_each_pair_twice_and_a_tie_is_half_a_win(judge):
    out = score(answered("g", ["abc", "xyz", "much longer"]), bonus=2.0, both_orders=True,
                judge={"base_url": judge.url, "model": "judge"})
    assert len(judge.bodies) == 6
    assert [e.group_rewards["pairwise_judge"] for e in out] == [1.5, 1.5, 0.0]


def test_a_judge_without_a_verdict_drops_the_group_with_every_reason():
    server = ScriptedServer(lambda body: "I cannot decide")
    try:
        out = score(answered("g", ANSWERS[:2]), judge={"base_url": server.url, "model": "judge", "retries": 1})
    finally:
        server.close()
    [drop] = out
    assert isinstance(drop, RolloutsDropped) and drop.reason == "invalid" and sorted(drop.rollout_ids) == ["g-r0", "g-r1"]
    assert "scoring failed: JudgeError" in drop.detail and "try 2: no score in the reply 'I cannot decide'" in drop.detail


def test_rollouts_without_answers_and_settings_without_a_model_are_refused():
    [drop] = score(group_of("g", [0.0, 1.0]), judge={"base_url": "http://127.0.0.1:9/v1", "model": "judge"})
    assert isinstance(drop, RolloutsDropped) and "carry none" in drop.detail
    with pytest.raises(ValueError, match="needs option 'judge.model'"):
        GroupRewardSpec(name="pairwise_judge", judge={"base_url": "http://x/v1"})
