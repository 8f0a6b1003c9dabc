"""Small arithmetic asked in chat, answered with the number only: a task a small pretrained chat
model (SmolLM2-135M-Instruct, `recipes/smollm2-135m-arithmetic.toml`) learns on a CPU.

    user       "What is 7 + 5? Reply with the number only."
    assistant  "12"

Rewards: `correct` (1) when the reply's last number is the result, wherever it stands ("7 + 5 =
12." counts); `number_only` (0.5) when the reply is that number and nothing else (a trailing
period allowed). A chat model starts out right often enough to learn from, but says it in a
sentence; the format reward is what it learns first. Metric: completion length in tokens.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator

from rollwire.producers.environments.math_word import NumericAnswer
from rollwire.producers.tasksets import RolloutView, metric, register_taskset, reward

OPERATIONS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
_BARE_NUMBER = re.compile(r"-?\d+\.?")


@register_taskset
class Arithmetic(NumericAnswer):
    name = "arithmetic"
    harness = "chat"

    def __init__(self, *, seed: int = 0, count: int = 100_000, max_operand: int = 9, operations: str = "+",
                 instruction: str = "Reply with the number only.") -> None:
        unknown = set(operations) - set(OPERATIONS)
        if unknown or not operations:
            raise ValueError(f"operations {operations!r}: use characters of {''.join(OPERATIONS)!r}, e.g. '+-'")
        if max_operand < 1:
            raise ValueError(f"max_operand = {max_operand}: give 1 or more")
        self.seed, self.count, self.max_operand, self.operations = seed, count, max_operand, operations
        self.instruction = instruction

    def rows(self) -> Iterator[dict]:
        rng = random.Random(self.seed)
        for i in range(self.count):
            a, b, op = rng.randint(0, self.max_operand), rng.randint(0, self.max_operand), rng.choice(self.operations)
            yield {"task_id": f"arith-{self.seed}-{i}", "reference": float(OPERATIONS[op](a, b)),
                   "messages": [{"role": "user", "content": f"What is {a} {op} {b}? {self.instruction}"}]}

    def demonstration(self, row: dict, rng: random.Random) -> str:
        return f"{row['reference']:g}"

    @reward("number_only", weight=0.5)
    def number_only(self, r: RolloutView) -> float:
        reply = r.completion.strip()
        finished = r.finish_reason in (None, "stop")
        return float(finished and _BARE_NUMBER.fullmatch(reply) is not None and self.correct(r) == 1.0)

    @metric("completion_tokens")
    def completion_tokens(self, r: RolloutView) -> float:
        return float(r.completion_tokens)
