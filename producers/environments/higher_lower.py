"""Guess a secret number, told "higher" or "lower" after each guess: a conversation with a simulated
user (the `conversation` harness), the smallest environment where the second party's words depend
on what the model said.

    system  "I am thinking of a whole number from 1 to 20. Guess it: reply with one number. ..."
    user    "Your first guess?"
    model   "10"            user (higher-lower)  "Higher."
    model   "15"            user                 "Lower."
    model   "13"            the user ends the conversation: that is the number

The user (`higher_lower_user`, registered as `higher-lower`) is a few lines of Python; its turns
are environment tokens, never trained. Rewards: `found` is 1 when the model's last guess is the
secret. Metric: `guesses`, the replies it took (bisection needs at most 5 for 1..20).
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator

from rollwire.producers.tasksets import RolloutView, Taskset, metric, register_taskset, reward
from rollwire.producers.users import USERS

_NUMBER = re.compile(r"-?\d+")


def guess_of(text: str) -> int | None:
    """The first whole number in a reply, if any."""
    found = _NUMBER.search(text)
    return int(found.group()) if found else None


def higher_lower_user(row: dict, messages: list[dict]) -> str | None:
    """Says whether the model's last guess is too low or too high; ends the conversation when it is right."""
    guess = guess_of(messages[-1].get("content") or "")
    if guess is None:
        return f"Reply with one whole number from {row['low']} to {row['high']}."
    if guess == row["secret"]:
        return None
    return "Higher." if guess < row["secret"] else "Lower."


USERS.add("higher-lower", higher_lower_user)


@register_taskset
class HigherLower(Taskset):
    name = "higher-lower"
    harness = "conversation"
    harness_options = {"user": "higher-lower", "max_turns": 6}

    def __init__(self, *, seed: int = 0, count: int = 100_000, low: int = 1, high: int = 20) -> None:
        if low >= high:
            raise ValueError(f"low ({low}) must be below high ({high})")
        self.seed, self.count, self.low, self.high = seed, count, low, high

    def rows(self) -> Iterator[dict]:
        rng = random.Random(self.seed)
        for i in range(self.count):
            yield {"task_id": f"hl-{self.seed}-{i}", "secret": rng.randint(self.low, self.high),
                   "low": self.low, "high": self.high,
                   "messages": [{"role": "system", "content": f"I am thinking of a whole number from {self.low} to "
                                 f"{self.high}. Guess it: reply with one number. After each guess I say "
                                 "higher or lower."},
                                {"role": "user", "content": "Your first guess?"}]}

    @reward("found")
    def found(self, r: RolloutView) -> float:
        return float(guess_of(r.completion) == r.task["secret"])

    @metric("guesses")
    def guesses(self, r: RolloutView) -> float:
        return float(sum(1 for m in r.messages if m.get("role") == "assistant"))
