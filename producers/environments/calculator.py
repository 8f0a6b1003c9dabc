"""Arithmetic with a calculator tool: a multi-turn tool-use task for the `chat` harness.

The system message teaches the protocol: write `CALL calculator(expression)` and the next
message (role `tool`) carries the result; the final reply without a call is the answer. The
reward checks the last number of that answer; a metric records whether the tool was used.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from rollwire.producers.environments.math_word import NumericAnswer
from rollwire.producers.harnesses import calculator
from rollwire.producers.tasksets import register_taskset

SYSTEM = ("You can use a calculator. To compute something, write CALL calculator(expression) and wait "
          "for the result. When you know the answer, reply with the number only.")


@register_taskset
class Calculator(NumericAnswer):
    name = "calculator"
    harness = "chat"

    def __init__(self, *, seed: int = 0, count: int = 10_000, max_operand: int = 999) -> None:
        self.seed, self.count, self.max_operand = seed, count, max_operand

    def rows(self) -> Iterator[dict]:
        rng = random.Random(self.seed)
        for i in range(self.count):
            a, b = rng.randint(2, self.max_operand), rng.randint(2, self.max_operand)
            op = rng.choice("+-*")
            expression = f"{a} {op} {b}"
            yield {"task_id": f"calc-{self.seed}-{i}", "reference": float(calculator(expression)),
                   "messages": [{"role": "system", "content": SYSTEM},
                                {"role": "user", "content": f"What is {expression}?"}]}
