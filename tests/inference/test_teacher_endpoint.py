"""The distillation teacher client against a real vLLM server: prefill logprobs of exact token ids."""

from __future__ import annotations

import pytest
from reference import transformers_logprobs

from rollwire.streams.teacher import TeacherClient, TeacherSettings

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_teacher_logprobs_are_the_served_models_logprobs_of_the_given_tokens(vllm_server, tiny_models, version_base):
    teacher = tiny_models.version(seed=51)
    vllm_server.control.swap_full_weights(str(teacher), str(version_base))
    client = TeacherClient(TeacherSettings(base_url=f"{vllm_server.base_url}/v1", model="policy"))
    prompt, completion = [1, 47, 26, 20, 16], [23, 17, 19, 28, 2, 40]

    got = client(prompt, completion)

    assert got == pytest.approx(transformers_logprobs(teacher, prompt, completion), abs=1e-3)
