"""Math word problems with a numeric answer (GSM8K-style), from a local file or a hub dataset.

    load_taskset("math-word", path="data/gsm8k.jsonl")          # .jsonl, .json or .parquet
    load_taskset("math-word", path="hf:openai/gsm8k", config="main", split="train")
    load_taskset("math-word", path="hf:parquet", data_files="local/*.parquet")   # datasets, offline

Each row: `{"question": "...", "answer": "... #### 42"}` (GSM8K's format; the number after
`####` is the reference). The model's answer is the last number in its reply, or the one after
`####` when it writes one. Rows with no reference number are refused when loading, with the line.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from rollwire.core.errors import ConfigError
from rollwire.producers.tasksets import RolloutView, Taskset, metric, read_rows, register_taskset, reward

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

    def __init__(self, *, path: str | Path, split: str = "train", config: str | None = None,
                 data_files: str | list[str] | None = None) -> None:
        self.path, self.split, self.config, self.data_files = path, split, config, data_files
        if not str(path).startswith("hf:") and not Path(path).is_file():
            raise ConfigError(f"math-word needs a file of {{question, answer}} rows (.jsonl, .json, .parquet) "
                              f"or hf:OWNER/NAME; {path} is missing")

    def rows(self) -> Iterator[dict]:
        for n, (where, row) in enumerate(read_rows(self.path, split=self.split, config=self.config,
                                                       data_files=self.data_files), 1):
            try:
                reference = parse_number(row["answer"])
                question = row["question"]
            except (KeyError, TypeError) as exc:
                raise ConfigError(f"{where} is not a {{question, answer}} row: missing {exc}") from exc
            if reference is None:
                raise ConfigError(f"{where} has no number after '####' in its answer")
            stem = Path(str(self.path)).stem if not str(self.path).startswith("hf:") else str(self.path)[3:].replace("/", "-")
            yield {"task_id": f"{stem}-{n}", "question": question, "reference": reference,
                   "messages": [{"role": "user", "content": question}]}
