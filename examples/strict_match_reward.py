"""A fixed reward for the demo, to re-score a recorded run with (docs/concepts/replay.md: "A reward-bug backfill").

The demo's `exact_match` ignores trailing dots, so an answer padded with filler earns full credit.
Say that was a bug: this check wants the reversal and nothing after it.

    rollwire replay score --run-dir runs/demo --into demo-strict --reward-module examples/strict_match_reward.py
"""

from rollwire.producers.tasksets import RolloutView, reward


@reward("exact_match")
def exact_match(r: RolloutView) -> float:
    finished = r.finish_reason in (None, "stop")
    return float(finished and r.completion.strip() == r.task["answer"])
