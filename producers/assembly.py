"""Assembling a rollout's training record from the inference calls it made, token for token.

The interception endpoint records every call's prompt and completion token ids as the server saw
and sampled them. The training record is built from those ids alone — never by re-tokenizing text:

    call 1:  prompt P1                      completion C1   (sampled: mask 1, sampler logprobs)
    call 2:  prompt P2 = P1 + C1 + E2       completion C2   (E2: tool results, user turns, template
                                                             tokens: environment tokens, mask 0)
    record:  prompt P1, completion C1 + E2 + C2 + …

A call whose prompt does not extend the sequence before it (the harness edited the history, or the
chat template re-renders what was sampled differently: Qwen3's drops earlier reasoning) cannot join
that sequence. It joins the latest other line it extends, or starts a line of its own: a branch,
in the trace. The training record is the main line (line 0, from the first call); the other lines
are trained too where the environment keeps them (`branches = "all"`), else only counted
(`metrics`). Lines are never stitched by guessing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rollwire.schemas.rollout import InferenceCall, TokenSequence, WeightVersionSpan


@dataclass
class Line:
    """One token sequence: a first call's prompt, then every completion and the environment tokens between."""

    prompt_token_ids: list[int] = field(default_factory=list)
    completion_token_ids: list[int] = field(default_factory=list)
    completion_logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    weight_versions: list[WeightVersionSpan] = field(default_factory=list)

    @property
    def sequence(self) -> list[int]:
        return self.prompt_token_ids + self.completion_token_ids

    def extended_by(self, call: InferenceCall) -> bool:
        return bool(self.prompt_token_ids) and call.prompt_token_ids[: len(self.sequence)] == self.sequence

    def add(self, call: InferenceCall) -> None:
        """Adds `call`: its prompt's new tokens as environment tokens (mask 0), then its completion."""
        if not self.prompt_token_ids:
            self.prompt_token_ids = list(call.prompt_token_ids)
        else:
            extra = call.prompt_token_ids[len(self.sequence):]
            self.completion_token_ids += extra
            self.completion_logprobs += [0.0] * len(extra)
            self.loss_mask += [0] * len(extra)
        start = len(self.completion_token_ids)
        self.completion_token_ids += call.completion_token_ids
        self.completion_logprobs += call.completion_logprobs
        self.loss_mask += [1] * len(call.completion_token_ids)
        self.weight_versions += [WeightVersionSpan(version=s.version, start=start + s.start, end=start + s.end)
                                 for s in call.weight_versions]

    def as_sequence(self) -> TokenSequence:
        return TokenSequence(prompt_token_ids=self.prompt_token_ids, completion_token_ids=self.completion_token_ids,
                             completion_logprobs=self.completion_logprobs, loss_mask=self.loss_mask,
                             weight_versions=self.weight_versions)


@dataclass
class Assembly(Line):
    """The main line of a rollout's calls, as one token sequence, and the lines that branched off it."""

    branches: list[int] = field(default_factory=list)
    """Line of each call, in call order (0 = the main line)."""
    others: list[Line] = field(default_factory=list)
    """Lines 1, 2, ...: calls that could not extend the main line, each extending the ones before it in its line."""

    @property
    def branched_calls(self) -> int:
        return sum(1 for b in self.branches if b)

    @property
    def branch_tokens(self) -> int:
        """Tokens sampled on the other lines."""
        return sum(sum(line.loss_mask) for line in self.others)

    def branch_sequences(self) -> list[TokenSequence]:
        return [line.as_sequence() for line in self.others]

    def metrics(self, *, branches_trained: bool = False) -> dict[str, float]:
        """What a rollout's metrics say of its assembly, so that a template that rewrites history
        (and with it, training data) shows in every step's figures: calls off the main line, and
        the sampled tokens left untrained (none where the other lines are trained too)."""
        return {"rollwire.branched_calls": float(self.branched_calls),
                "rollwire.untrained_tokens": 0.0 if branches_trained else float(self.branch_tokens)}


def assemble(calls: list[InferenceCall]) -> Assembly:
    """Builds the training record of `calls` (in the order they were made)."""
    out = Assembly()
    for call in calls:
        if not out.prompt_token_ids or out.extended_by(call):
            out.add(call)
            out.branches.append(0)
            continue
        joined = next((i for i in range(len(out.others) - 1, -1, -1) if out.others[i].extended_by(call)), None)
        if joined is None:
            out.others.append(Line())
            joined = len(out.others) - 1
        out.others[joined].add(call)
        out.branches.append(joined + 1)
    return out
