"""Agents written for hosted APIs, unmodified, as a rollout's agent program against a real vLLM
server: the `openai` SDK with tools (Chat Completions, plain and streamed, and the Responses API)
and the `anthropic` SDK with tools, each solving the same two-tool task in three model calls
(`tests/data/agents/`). The model is a tiny one trained here on that conversation as vLLM renders
it, so at temperature 0 it calls `add`, then `negate`, then answers.

Each rollout's record must be what a direct generate call gives: one token sequence (no branch:
every call's prompt extends the tokens sampled before it, though the agent sent its tool calls
back as structures), the tool results masked, and each call's completion ids and logprobs those
of `generate` on the same prompt. And the four APIs, given the same conversation, record the same
tokens."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from rollwire.producers.assembly import assemble
from rollwire.producers.harnesses import script_harness
from rollwire.producers.interception import Interceptor
from rollwire.producers.interception_server import InterceptionServer
from rollwire.schemas import SamplingParams

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

AGENTS = Path(__file__).resolve().parents[1] / "data" / "agents"
sys.path.insert(0, str(AGENTS))
from tools import DESCRIPTIONS, PARAMETERS, QUESTION, SYSTEM  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": n, "description": DESCRIPTIONS[n], "parameters": PARAMETERS[n]}}
         for n in PARAMETERS]
TURNS = ['<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>', "5",
         '<tool_call>{"name": "negate", "arguments": {"x": 5}}</tool_call>', "-5", "-5"]
"""The model's turns and the tools' answers, alternating: what it is trained to say."""
PROGRAMS = {"openai chat": ["openai_chat.py"], "openai chat, streamed": ["openai_chat.py", "stream"],
            "openai responses": ["openai_responses.py"], "anthropic messages": ["anthropic_messages.py"]}


@pytest.fixture(scope="module")
def tool_model(vllm_server, tiny_models, tmp_path_factory) -> Path:
    """A tiny model trained on the whole conversation, rendered by the served template with the tools."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    for i, turn in enumerate(TURNS):
        messages.append({"role": "assistant" if i % 2 == 0 else "tool", "content": turn})
    ids = vllm_server.control.render_chat(messages, tools=TOOLS)
    return tiny_models.overfitted(tmp_path_factory.mktemp("tool-agent") / "model", sequences=[ids], seed=7,
                                  max_loss=0.02)


@pytest.fixture(scope="module")
def rollouts(vllm_server, tool_model) -> dict[str, tuple[str, Interceptor]]:
    """Each agent program run once as a rollout's agent, at temperature 0."""
    vllm_server.control.swap_full_weights(str(tool_model), str(random.randrange(1, 10**6) * 100 + 7))
    server = InterceptionServer()
    done = {}
    try:
        for name, program in PROGRAMS.items():
            interceptor = Interceptor(vllm_server.control, SamplingParams(temperature=0.0, max_tokens=96))
            agent = script_harness([sys.executable, str(AGENTS / program[0]), *program[1:]], server, timeout_s=120)
            done[name] = (agent({"task_id": "sdk"}, interceptor), interceptor)
    finally:
        server.shutdown()
    return done


@pytest.mark.parametrize("name", PROGRAMS)
def test_the_agent_solves_the_task_in_one_token_sequence_with_the_tool_results_masked(rollouts, name, vllm_server):
    answer, interceptor = rollouts[name]
    assert answer.strip() == "-5"
    record = assemble(interceptor.calls)
    assert len(interceptor.calls) == 3 and record.branches == [0, 0, 0], "a call did not extend the sampled tokens"
    detokenize = vllm_server.control.detokenize
    sampled = [detokenize(c.completion_token_ids) for c in interceptor.calls]
    assert [s.replace("<|im_end|>", "") for s in sampled] == TURNS[0::2]
    masked = detokenize([t for t, m in zip(record.completion_token_ids, record.loss_mask) if m == 0])
    assert "<|im_start|>tool\n5<|im_end|>" in masked and "<|im_start|>tool\n-5<|im_end|>" in masked
    assert sum(record.loss_mask) == sum(len(c.completion_token_ids) for c in interceptor.calls)


@pytest.mark.parametrize("name", PROGRAMS)
def test_each_recorded_call_is_what_a_direct_generate_call_gives(rollouts, name, vllm_server):
    _, interceptor = rollouts[name]
    for call in interceptor.calls:
        direct = vllm_server.control.generate(call.prompt_token_ids, max_tokens=96, temperature=0.0,
                                              stop_token_ids=None)["choices"][0]
        n = len(call.completion_token_ids)
        assert direct["token_ids"][:n] == call.completion_token_ids
        assert [c["logprob"] for c in direct["logprobs"]["content"][:n]] == pytest.approx(call.completion_logprobs,
                                                                                           abs=1e-4)


def test_every_api_records_the_same_tokens_for_the_same_conversation(rollouts):
    sequences = {name: assemble(interceptor.calls).sequence for name, (_, interceptor) in rollouts.items()}
    assert len({tuple(s) for s in sequences.values()}) == 1, {n: len(s) for n, s in sequences.items()}
