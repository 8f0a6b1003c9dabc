"""Tasksets: rows, rewards by name and weight, and failures reported on the rollout."""

from __future__ import annotations

import json

import pytest

from rollwire.core.errors import ConfigError
from rollwire.producers.environments.math_word import parse_number
from rollwire.producers.tasksets import RolloutView, Taskset, load_taskset, reward


def test_reverse_digits_rows_are_stable_and_judged_exactly():
    taskset = load_taskset("reverse-digits", seed=3, count=5)
    rows = list(taskset.rows())
    assert rows == list(load_taskset("reverse-digits", seed=3, count=5).rows())
    row = rows[0]
    good = taskset.judge(RolloutView(task=row, completion=row["answer"] + "..", finish_reason="stop"))
    cut = taskset.judge(RolloutView(task=row, completion=row["answer"], finish_reason="length"))
    assert (good.rewards, good.reward, good.metrics["used_filler"]) == ({"exact_match": 1.0}, 1.0, 1.0)
    assert cut.reward == 0.0


def test_math_word_reads_gsm8k_style_lines_and_checks_the_number(tmp_path):
    path = tmp_path / "gsm.jsonl"
    path.write_text(json.dumps({"question": "2 apples and 3 more?", "answer": "2 + 3 = 5\n#### 5"}) + "\n")
    taskset = load_taskset("math-word", path=path)
    [row] = list(taskset.rows())
    assert row["reference"] == 5.0
    assert taskset.judge(RolloutView(task=row, completion="That makes 5 apples.")).rewards == {"correct": 1.0}
    assert taskset.judge(RolloutView(task=row, completion="#### 1,005")).rewards == {"correct": 0.0}
    assert parse_number("no number") is None and parse_number("x #### -3.5") == -3.5


def test_math_word_reads_parquet_json_and_hugging_face_datasets_from_local_files(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    rows = [{"question": "1 + 1?", "answer": "#### 2"}, {"question": "2 * 3?", "answer": "it is 6 #### 6"}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "gsm.parquet")
    (tmp_path / "gsm.json").write_text(json.dumps(rows))
    sources = [{"path": tmp_path / "gsm.parquet"}, {"path": tmp_path / "gsm.json"},
               # datasets.load_dataset itself, on a local file (nothing from the hub)
               {"path": "hf:parquet", "data_files": str(tmp_path / "gsm.parquet")}]
    for options in sources:
        loaded = list(load_taskset("math-word", **options).rows())
        assert [r["reference"] for r in loaded] == [2.0, 6.0] and loaded[1]["question"] == "2 * 3?"
    with pytest.raises(ConfigError, match="no number after"):
        pq.write_table(pa.Table.from_pylist([{"question": "q", "answer": "none"}]), tmp_path / "bad.parquet")
        list(load_taskset("math-word", path=tmp_path / "bad.parquet").rows())


def test_malformed_rows_name_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "q", "answer": "#### 1"}\n{"question": "q"}\n')
    with pytest.raises(ConfigError, match="bad.jsonl:2"):
        list(load_taskset("math-word", path=path).rows())
    with pytest.raises(ConfigError, match="valid: arithmetic, calculator, higher-lower, math-word, reverse-digits"):
        load_taskset("chess")


class Fragile(Taskset):
    name = "fragile"

    def rows(self):
        yield {"task_id": "t"}

    @reward("ok", weight=0.5)
    def ok(self, r):
        return 1.0

    @reward("boom")
    def boom(self, r):
        return 1 / 0


def test_a_reward_function_that_raises_marks_the_rollout_errored_with_its_name():
    judgement = Fragile().judge(RolloutView(task={"task_id": "t"}, completion="x"))
    assert judgement.error.kind == "reward" and judgement.error.message.startswith("boom raised ZeroDivisionError")


def test_the_calculator_taskset_checks_the_final_number_and_names_its_harness():
    taskset = load_taskset("calculator", seed=1, count=3)
    row = next(taskset.rows())
    assert taskset.harness == "chat" and row["messages"][0]["role"] == "system"
    right = taskset.judge(RolloutView(task=row, completion=f"It is {row['reference']:.0f}"))
    wrong = taskset.judge(RolloutView(task=row, completion="CALL calculator(1+1)"))
    assert right.rewards == {"correct": 1.0} and wrong.rewards == {"correct": 0.0}


def test_an_attribute_that_hides_a_taskset_method_is_refused_at_load_with_the_fix(tmp_path):
    shadowing = tmp_path / "shadowing.py"
    shadowing.write_text("from rollwire.producers.tasksets import Taskset\n\n"
                         "class Graded(Taskset):\n    name = 'graded'\n"
                         "    def __init__(self):\n        self.judge = object()\n"
                         "    def rows(self):\n        yield from ()\n")
    with pytest.raises(ConfigError, match="its attribute judge hides the Taskset method of that name.*self.grader"):
        load_taskset(f"{shadowing}:Graded")
