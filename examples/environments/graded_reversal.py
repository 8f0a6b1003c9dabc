"""Reverse digits, answered by an agent program in a container and graded in that container.

    [[environments]]
    name = "examples/environments/graded_reversal.py:GradedReversal"
    agent_command = ["python3", "/agents/reverse.py"]
    runtime = "container"
    container = { mounts = ["examples/environments/agents:/agents"],
                  grade_command = ["python3", "/agents/check.py"] }

The agent (`agents/reverse.py`) asks the model through the rollout's URL and leaves its answer in
a file; the grading command (`agents/check.py`) runs in the same container after it and checks that
file, as a repository's tests would check an agent's edit. The reward reads what the grader found
(`RolloutView.sandbox`). The rows, the teacher and the group bonus are reverse-digits'.
"""

from __future__ import annotations

from collections.abc import Iterator

from rollwire.producers.environments.reverse_digits import ReverseDigits
from rollwire.producers.tasksets import RolloutView, metric, reward


class GradedReversal(ReverseDigits):
    name = "graded-reversal"
    group_rewards = [{"name": "shortest_correct", "bonus": 0.2, "correct": "graded_correct"}]

    def rows(self) -> Iterator[dict]:
        for row in super().rows():
            yield {**row, "task_id": row["task_id"].replace("rev-", "graded-", 1)}

    def exact_match(self, r: RolloutView) -> float:  # unmarked: the parent's reward is not this environment's
        return 0.0

    @reward("graded_correct")
    def graded_correct(self, r: RolloutView) -> float:
        """1 when the grading command in the rollout's container passed."""
        return float(r.sandbox is not None and r.sandbox["returncode"] == 0)

    @metric("answer_matches")
    def answer_matches(self, r: RolloutView) -> float:
        """The grader's check made here on the answer the agent printed (they agree when grading works)."""
        return float(r.completion.strip().rstrip(".") == r.task["answer"])
