"""A taskset whose one reward asks an LLM judge, as a user would write one (`rollwire.producers.judges`);
the judge's tests use it against a scripted endpoint and against a real vLLM server."""

from __future__ import annotations

from rollwire.producers.judges import JudgeSettings, LlmJudge
from rollwire.producers.tasksets import RolloutView, Taskset, reward


class JudgedQuestions(Taskset):
    name = "judged-questions"

    def __init__(self, judge: dict, question: str = "2+2?") -> None:
        self.grader = LlmJudge(JudgeSettings(**judge))
        self.question = question

    def rows(self):
        yield {"task_id": "t", "question": self.question}

    @reward("judge")
    def by_judge(self, r: RolloutView) -> float:
        return self.grader.score(question=r.task["question"], answer=r.completion)
