"""Assembling a rollout's training record from the inference calls it made, token for token.

The interception endpoint records every call's prompt and completion token ids as the server saw
and sampled them. The training record is built from those ids alone — never by re-tokenizing text:

    call 1:  prompt P1                      completion C1   (sampled: mask 1, sampler logprobs)
    call 2:  prompt P2 = P1 + C1 + E2       completion C2   (E2: tool results, user turns, template
                                                             tokens: environment tokens, mask 0)
    record:  prompt P1, completion C1 + E2 + C2 + …

A call whose prompt does not extend everything before it (the harness edited the history, or
re-rendering the conversation does not reproduce the sampled tokens) cannot join the same token
sequence: it opens a new branch in the trace, and the training record keeps the main line (the
calls before the break). Branches are never stitched by guessing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rollwire.schemas.rollout import InferenceCall, WeightVersionSpan


@dataclass
class Assembly:
    """The main line of a rollout's calls, as one token sequence."""

    prompt_token_ids: list[int] = field(default_factory=list)
    completion_token_ids: list[int] = field(default_factory=list)
    completion_logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    weight_versions: list[WeightVersionSpan] = field(default_factory=list)
    branches: list[int] = field(default_factory=list)
    """Branch of each call, in call order (0 = the main line)."""
    untrained_tokens: int = 0
    """Tokens sampled by calls off the main line: in the trace, not in the training record."""

    @property
    def branched_calls(self) -> int:
        return sum(1 for b in self.branches if b)

    def metrics(self) -> dict[str, float]:
        """What a rollout's metrics say of its assembly, so that a template that rewrites history
        (and with it, lost training data) shows in every step's figures."""
        return {"rollwire.branched_calls": float(self.branched_calls),
                "rollwire.untrained_tokens": float(self.untrained_tokens)}

    @property
    def sequence(self) -> list[int]:
        return self.prompt_token_ids + self.completion_token_ids


def assemble(calls: list[InferenceCall]) -> Assembly:
    """Builds the training record of `calls` (in the order they were made)."""
    out = Assembly()
    branch = 0
    for call in calls:
        if not out.prompt_token_ids:
            out.prompt_token_ids = list(call.prompt_token_ids)
        elif branch == 0 and call.prompt_token_ids[: len(out.sequence)] == out.sequence:
            extra = call.prompt_token_ids[len(out.sequence):]
            out.completion_token_ids += extra
            out.completion_logprobs += [0.0] * len(extra)
            out.loss_mask += [0] * len(extra)
        else:
            branch += 1
            out.branches.append(branch)
            out.untrained_tokens += len(call.completion_token_ids)
            continue
        start = len(out.completion_token_ids)
        out.completion_token_ids += call.completion_token_ids
        out.completion_logprobs += call.completion_logprobs
        out.loss_mask += [1] * len(call.completion_token_ids)
        out.weight_versions += [WeightVersionSpan(version=s.version, start=start + s.start, end=start + s.end)
                                for s in call.weight_versions]
        out.branches.append(0)
    return out

