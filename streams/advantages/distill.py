"""On-policy distillation: the student samples, a teacher scores each sampled token.

    A_t = log p_teacher(x_t | x_<t) - log p_student(x_t | x_<t)     for trained tokens, else 0

This is the per-token negative reverse KL (Agarwal et al., 2024; Thinking Machines, "On-Policy
Distillation", 2025): tokens the teacher finds likelier than the student did are reinforced.
The student's log-probabilities are the sampler's; the teacher's come from a prefill request on
the exact sampled token ids (`rollwire.streams.teacher`). Rewards are not used.
"""

from __future__ import annotations

from collections.abc import Sequence

from rollwire.streams.advantages import AdvantageEstimator, GroupSample, register


@register
class OnPolicyDistillation(AdvantageEstimator):
    name = "distill"
    per_token = True
    needs_teacher = True

    def __call__(self, group: Sequence[GroupSample]) -> list[list[float]]:
        out = []
        for s in group:
            if s.teacher_logprobs is None or len(s.teacher_logprobs) != len(s.sampler_logprobs):
                raise ValueError("on-policy distillation needs one teacher logprob per completion token")
            out.append([(t - p) if m else 0.0
                        for t, p, m in zip(s.teacher_logprobs, s.sampler_logprobs, s.loss_mask)])
        return out
