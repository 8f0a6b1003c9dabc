"""Math word problems with a numeric answer (GSM8K-style), read from a local JSONL file.

Each line: `{"question": "...", "answer": "... #### 42"}` (GSM8K's format; the number after
`####` is the reference). The model's answer is the last number in its reply, or the one after
`####` when it writes one. Rows with no reference number are refused when loading, with the line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

from rollwire.errors import ConfigError
from rollwire.producers.tasksets import RolloutView, Taskset, metric, register_taskset, reward

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def parse_number(text: str) -> float | None:
    """The answer in `text`: the number after `####` if present, else the last number."""
    tail = text.split("####")[-1] if "####" in text else text
    found = _NUMBER.findall(tail)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


class NumericAnswer(Taskset):
    """Rewards for tasksets whose rows hold a numeric `reference`: the answer's number must equal it."""

    @reward("correct")
    def correct(self, r: RolloutView) -> float:
        answer = parse_number(r.completion)
        return float(answer is not None and abs(answer - r.task["reference"]) < 1e-6)

    @metric("answered")
    def answered(self, r: RolloutView) -> float:
        return float(parse_number(r.completion) is not None)


@register_taskset
class MathWord(NumericAnswer):
    name = "math-word"
    harness = "chat"

    def __init__(self, *, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ConfigError(f"math-word needs a JSONL file of {{question, answer}} rows; {self.path} is missing")

    def rows(self) -> Iterator[dict]:
        with open(self.path) as lines:
            for n, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    reference = parse_number(row["answer"])
                except (ValueError, KeyError, TypeError) as exc:
                    raise ConfigError(f"{self.path}:{n} is not a {{question, answer}} JSON row: {exc}") from exc
                if reference is None:
                    raise ConfigError(f"{self.path}:{n} has no number after '####' in its answer")
                yield {"task_id": f"{self.path.stem}-{n}", "question": row["question"], "reference": reference,
                       "messages": [{"role": "user", "content": row["question"]}]}
