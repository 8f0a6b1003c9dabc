"""The group scorer's pure logic: groups close, rewards and advantages apply, bad input is named."""

from __future__ import annotations

import pytest
from builders import group_of

from rollwire.schemas import RolloutsDropped, ScoredRollout
from rollwire.streams.group_rewards import GroupRewardSpec
from rollwire.streams.scoring import GroupScorer, ScorerSettings

T0 = 1_790_000_000_000


def feed(scorer, rollouts, state=None, now=T0):
    steps = []
    for r in rollouts:
        step = scorer.on_rollout(state, r, now=now)
        state = step.state
        steps.append(step)
    return state, steps


def scored(steps):
    return [e for s in steps for e in s.events if isinstance(e, ScoredRollout)]


def dropped(steps):
    return [e for s in steps for e in s.events if isinstance(e, RolloutsDropped)]


def test_a_complete_group_is_scored_with_the_shortest_correct_bonus_before_advantages():
    scorer = GroupScorer(ScorerSettings(group_rewards={"reverse-digits": [
        GroupRewardSpec(name="shortest_correct", bonus=0.5, correct="exact_match")]}))
    state, steps = feed(scorer, group_of("g1", [1, 1, 0, 0], lengths=[6, 4, 3, 5]))

    out = scored(steps)
    assert [s.changed for s in steps] == [True] * 4 and state.closed_at_ms == T0 and state.rollouts == []
    assert [e.rollout.rollout_id for e in out] == ["g1-r0", "g1-r1", "g1-r2", "g1-r3"]
    assert [e.group_rewards["shortest_correct"] for e in out] == [0, 0.5, 0, 0]
    # final rewards 1, 1.5, 0, 0: mean 0.625, population std 0.6495
    assert [e.reward for e in out] == [1, 1.5, 0, 0]
    assert [e.advantage for e in out] == pytest.approx([0.5774, 1.3472, -0.9623, -0.9623], abs=1e-4)
    assert all(e.group_reward_mean == 0.625 for e in out)


def test_redelivered_rollouts_are_ignored_before_and_after_the_group_closes():
    scorer = GroupScorer(ScorerSettings())
    rollouts = group_of("g1", [1, 0])
    state, _ = feed(scorer, rollouts[:1])
    again = scorer.on_rollout(state, rollouts[0], now=T0)
    assert again.duplicate and not again.changed and again.events == []
    state, steps = feed(scorer, rollouts[1:], state)
    assert len(scored(steps)) == 2
    late = scorer.on_rollout(state, rollouts[1], now=T0 + 5)
    assert late.duplicate and late.events == []


@pytest.mark.parametrize("change, reason", [
    ({"rewards": {"exact_match": float("nan")}}, "not a finite number"),
    ({"rewards": {}}, "no rewards"),
    ({"algorithm": "ppo"}, "unknown advantage algorithm 'ppo'"),
])
def test_unusable_rollouts_are_rejected_with_a_reason(change, reason):
    bad = group_of("g1", [1, 0])[0].model_copy(update=change)
    step = GroupScorer(ScorerSettings()).on_rollout(None, bad, now=T0)
    assert step.rejected and reason in step.rejected and step.state is None


def test_a_group_declared_larger_than_max_group_size_is_never_held():
    scorer = GroupScorer(ScorerSettings(max_group_size=4))
    assert scorer.on_rollout(None, group_of("g1", [1, 0, 1, 0])[0], now=T0).state is not None
    step = scorer.on_rollout(None, group_of("g2", [1, 0, 1, 0, 1])[0], now=T0)
    assert step.state is None and step.rejected == "group_size 5 is over the scorer's max_group_size 4"


def test_a_group_larger_than_declared_or_inconsistent_is_rejected():
    scorer = GroupScorer(ScorerSettings())
    state, _ = feed(scorer, group_of("g1", [1, 0]))
    extra = group_of("g1", [1, 0, 1])[2]
    assert "already closed" in scorer.on_rollout(state, extra, now=T0).rejected
    open_state, _ = feed(scorer, group_of("g2", [1, 0, 1])[:1])
    other_size = group_of("g2", [1, 0])[1]
    assert "group_size 2" in scorer.on_rollout(open_state, other_size, now=T0).rejected


def test_errored_rollouts_close_the_group_but_are_dropped_not_trained():
    scorer = GroupScorer(ScorerSettings())
    _, steps = feed(scorer, group_of("g1", [1, 0, 1, 0], errored=(2,)))
    assert [e.rollout.rollout_id for e in scored(steps)] == ["g1-r0", "g1-r1", "g1-r3"]
    assert [(d.reason, d.rollout_ids) for d in dropped(steps)] == [("errored", ["g1-r2"])]


def test_a_timed_out_group_is_scored_if_big_enough_else_dropped():
    scorer = GroupScorer(ScorerSettings(group_timeout_s=30, min_group_size=2))
    partial, _ = feed(scorer, group_of("g1", [1, 0, 1, 1])[:2])
    assert scorer.on_tick(partial, now=T0 + 29_000).events == []
    late = scorer.on_tick(partial, now=T0 + 30_000)
    assert [e.advantage for e in scored([late])] == pytest.approx([1, -1], abs=1e-5)

    lonely, _ = feed(scorer, group_of("g2", [1, 0, 1, 1])[:1])
    gone = scorer.on_tick(lonely, now=T0 + 31_000)
    assert [(d.reason, d.rollout_ids) for d in dropped([gone])] == [("group_timeout", ["g2-r0"])]
    assert "1 usable rollouts < min_group_size 2" in dropped([gone])[0].detail


def test_closed_groups_are_forgotten_after_the_retention():
    scorer = GroupScorer(ScorerSettings(retain_closed_s=60))
    state, _ = feed(scorer, group_of("g1", [1, 0]))
    assert scorer.on_tick(state, now=T0 + 59_000).state is state
    forget = scorer.on_tick(state, now=T0 + 60_000)
    assert forget.state is None and forget.changed


def test_distillation_asks_the_teacher_for_each_rollouts_exact_tokens():
    calls = []

    def teacher(prompt_ids, completion_ids):
        calls.append((list(prompt_ids), list(completion_ids)))
        return [-0.25] * len(completion_ids)

    _, steps = feed(GroupScorer(ScorerSettings(), teacher=teacher), group_of("g1", [0, 0], algorithm="distill"))
    out = scored(steps)
    assert calls == [([1, 2, 3], [10, 11, 12, 13])] * 2
    assert out[0].advantage is None and out[0].token_advantages == [0.25] * 4


def test_a_failing_teacher_drops_the_group_with_the_reason():
    def teacher(prompt_ids, completion_ids):
        raise ConnectionError("teacher endpoint refused the connection")

    _, steps = feed(GroupScorer(ScorerSettings(), teacher=teacher), group_of("g1", [0, 0], algorithm="distill"))
    assert scored(steps) == []
    assert "teacher endpoint refused" in dropped(steps)[0].detail


def test_deadlines_give_a_tick_only_the_groups_due():
    from rollwire.schemas.scorer import ScorerGroupState
    from rollwire.streams.scoring import Deadlines
    settings = ScorerSettings(group_timeout_s=10, retain_closed_s=60)
    deadlines = Deadlines(settings)
    open_state = ScorerGroupState(group_id="open", environment="e", algorithm="grpo", group_size=2, first_seen_ms=1_000)
    closed = open_state.model_copy(update={"group_id": "closed", "closed_at_ms": 2_000})
    deadlines.push("open", open_state)
    deadlines.push("closed", closed)
    deadlines.push("open", open_state)  # pushed again after a change: due once
    assert deadlines.due(10_999) == []
    assert deadlines.due(11_000) == ["open"]
    assert deadlines.due(61_999) == [] and deadlines.due(62_000) == ["closed"] and len(deadlines) == 0
