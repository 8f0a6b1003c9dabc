"""Arithmetic with a calculator tool: a multi-turn tool-use task for the `chat` harness.

The system message teaches the protocol: write `CALL calculator(expression)` and the next
message (role `tool`) carries the result; the final reply without a call is the answer. With
`tool_format = "hermes"` the tool's schema goes to the chat template instead (as Qwen's and
Hermes' templates render `tools`), and the model calls it as `<tool_call>{"name": "calculator",
"arguments": {"expression": ...}}</tool_call>`. The reward checks the last number of the answer.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from rollwire.producers.environments.math_word import NumericAnswer
from rollwire.producers.tasksets import register_taskset
from rollwire.producers.tools import calculator

SYSTEM = ("You can use a calculator. To compute something, write CALL calculator(expression) and wait "
          "for the result. When you know the answer, reply with the number only.")
SYSTEM_HERMES = ("Use the calculator tool to compute. When you know the answer, reply with the number only.")


@register_taskset
class Calculator(NumericAnswer):
    name = "calculator"
    harness = "chat"

    def __init__(self, *, seed: int = 0, count: int = 10_000, max_operand: int = 999,
                 tool_format: str = "call") -> None:
        if tool_format not in ("call", "hermes"):
            raise ValueError(f"tool_format {tool_format!r}: pick 'call' (CALL calculator(...)) or 'hermes' "
                             "(<tool_call> JSON, tools rendered by the chat template)")
        self.seed, self.count, self.max_operand, self.tool_format = seed, count, max_operand, tool_format

    def rows(self) -> Iterator[dict]:
        rng = random.Random(self.seed)
        for i in range(self.count):
            a, b = rng.randint(2, self.max_operand), rng.randint(2, self.max_operand)
            op = rng.choice("+-*")
            expression = f"{a} {op} {b}"
            row = {"task_id": f"calc-{self.seed}-{i}", "reference": float(calculator(expression)),
                   "messages": [{"role": "system", "content": SYSTEM if self.tool_format == "call" else SYSTEM_HERMES},
                                {"role": "user", "content": f"What is {expression}?"}]}
            if self.tool_format == "hermes":
                row["tools"] = ["calculator"]
            yield row
