"""Reverse a string of digits: a task a tiny model learns on a CPU in minutes (docs/notes/learning.md).

    prompt  "r:40713>"      answer "31704", then end-of-sequence

Rewards: `exact_match` is 1 only for the exact reversal that ends the sequence; trailing dots
are ignored by the checker (filler a teacher may add), so the scorer's `shortest_correct` bonus
has lengths to choose between. Metrics: completion length and whether dots were used.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from rollwire.producers.tasksets import RolloutView, Taskset, metric, register_taskset, reward


@register_taskset
class ReverseDigits(Taskset):
    name = "reverse-digits"
    group_rewards = [{"name": "shortest_correct", "bonus": 0.2, "correct": "exact_match"}]

    def __init__(self, *, seed: int = 0, count: int = 100_000, min_digits: int = 3, max_digits: int = 6,
                 bos: str = "<|bos|>", teacher_noise: float = 0.3, teacher_filler: float = 0.5) -> None:
        self.seed, self.count, self.min_digits, self.max_digits = seed, count, min_digits, max_digits
        self.bos = bos
        """Text of the tokenizer's beginning-of-sequence token, written before each prompt."""
        self.teacher_noise, self.teacher_filler = teacher_noise, teacher_filler
        """The scripted teacher swaps each answer digit for a random one with probability `teacher_noise`
        and appends 1-3 filler dots with probability `teacher_filler` (docs/notes/learning.md: a clean
        teacher leaves RL nothing to improve, and without filler a length bonus has nothing to choose)."""

    def rows(self) -> Iterator[dict]:
        rng = random.Random(self.seed)
        for i in range(self.count):
            digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(self.min_digits, self.max_digits)))
            yield {"task_id": f"rev-{self.seed}-{i}", "prompt": f"{self.bos}r:{digits}>", "answer": digits[::-1]}

    def demonstration(self, row: dict, rng: random.Random) -> str:
        digits = "".join(rng.choice("0123456789") if rng.random() < self.teacher_noise else d for d in row["answer"])
        return digits + ("." * rng.randint(1, 3) if rng.random() < self.teacher_filler else "")

    @reward("exact_match")
    def exact_match(self, r: RolloutView) -> float:
        finished = r.finish_reason in (None, "stop")
        return float(finished and r.completion.strip().rstrip(".") == r.task["answer"])

    @metric("completion_tokens")
    def completion_tokens(self, r: RolloutView) -> float:
        return float(r.completion_tokens)

    @metric("used_filler")
    def used_filler(self, r: RolloutView) -> float:
        return float(r.completion.strip().endswith("."))
