"""Unmodified agent code trained through the interception endpoint, on a real vLLM server: two
chat turns and a tool message become one token sequence, tool tokens masked."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from reference import transformers_logprobs

from rollwire.producers.assembly import assemble
from rollwire.producers.harnesses import conversation_harness, script_harness
from rollwire.producers.interception import Interceptor
from rollwire.producers.interception_server import InterceptionServer
from rollwire.schemas import SamplingParams

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

AGENT = str(Path(__file__).resolve().parent.parent / "data" / "agent.py")


def test_an_external_agent_is_captured_call_by_call_into_one_sequence(vllm_server, tiny_models, version_base):
    vllm_server.control.swap_full_weights(str(tiny_models.base), str(version_base))
    server = InterceptionServer()
    interceptor = Interceptor(vllm_server.control, SamplingParams(temperature=1.0, max_tokens=12))
    try:
        answer = script_harness([sys.executable, AGENT], server)({"question": "what is 6*7?"}, interceptor)
    finally:
        server.shutdown()

    first, second = interceptor.calls
    assert len(first.completion_token_ids) <= 12  # the task's max_tokens, not the agent's 500
    record = assemble(interceptor.calls)
    assert record.branches == [0, 0], "the second turn must extend the first token for token"
    between = second.prompt_token_ids[len(first.prompt_token_ids) + len(first.completion_token_ids):]
    tool_text = vllm_server.control._request("POST", "/detokenize", {"tokens": between})["prompt"]
    assert "tool" in tool_text and "42" in tool_text
    n1 = len(first.completion_token_ids)
    assert record.loss_mask == [1] * n1 + [0] * len(between) + [1] * len(second.completion_token_ids)
    assert record.prompt_token_ids + record.completion_token_ids == second.prompt_token_ids + second.completion_token_ids
    sampled = [i for i, m in enumerate(record.loss_mask) if m]
    reference = transformers_logprobs(tiny_models.base, record.prompt_token_ids, record.completion_token_ids)
    assert [record.completion_logprobs[i] for i in sampled] == pytest.approx([reference[i] for i in sampled], abs=1e-3)
    shown = second.completion_token_ids[:-1] if second.finish_reason == "stop" else second.completion_token_ids
    text = vllm_server.control._request("POST", "/detokenize", {"tokens": shown})["prompt"] if shown else ""
    last_line = text.strip().splitlines()[-1] if text.strip() else ""
    assert answer == last_line  # the agent printed the second reply, decoded from the sampled ids


def test_a_failing_agent_is_reported_with_its_exit_code(vllm_server, tmp_path):
    failing = tmp_path / "crash.py"
    failing.write_text("import sys\nprint('partial')\nsys.exit(3)\n")
    server = InterceptionServer()
    try:
        with pytest.raises(RuntimeError, match="exited with code 3"):
            script_harness([sys.executable, str(failing)], server)({}, Interceptor(vllm_server.control, SamplingParams()))
    finally:
        server.shutdown()


def test_the_server_renders_the_tools_of_a_chat_into_the_prompt_with_the_template(vllm_server):
    from rollwire.producers.tools import TOOLS
    messages = [{"role": "user", "content": "6*7?"}]
    plain = vllm_server.control.render_chat(messages)
    with_tools = vllm_server.control.render_chat(messages, tools=[TOOLS.get("calculator").schema])
    text = vllm_server.control.detokenize(with_tools)  # (the character tokenizer has no < or {: shown as pad)
    assert "You may call functions" in text and "calculator" in text and "Evaluates an arithmetic expression" in text
    assert with_tools[-len(plain):] == plain  # the tools block comes first, the conversation as before


def test_reasoning_the_template_drops_from_history_branches_the_rollout_counted_and_kept(vllm_server, tiny_models,
                                                                                        tmp_path, version_base):
    """The served template drops the reasoning of assistant turns before the last user message, as
    Qwen3's does (`rollwire.trainer.tiny.CHAT_TEMPLATE`). A two-turn conversation with a model that
    reasons: the second call's prompt, rendered by vLLM, no longer holds the first reply's sampled
    tokens, so the rollout has two token sequences; the metrics count the branch and its untrained
    tokens, `branches = "all"` keeps both lines, and each line is exactly what was sampled."""
    first = [{"role": "user", "content": "6*7?"}, {"role": "assistant", "content": "<think>six sevens</think>42"}]
    second = [*first, {"role": "user", "content": "And 6*8?"}, {"role": "assistant", "content": "<think>six eights</think>48"}]
    model = tiny_models.overfitted(tmp_path / "reasoner", [first, second], seed=11, max_loss=0.05)
    vllm_server.control.swap_full_weights(str(model), str(version_base + 11))
    interceptor = Interceptor(vllm_server.control, SamplingParams(temperature=0.0, max_tokens=40))
    row = {"messages": first[:1], "user_turns": ["And 6*8?"]}

    assert conversation_harness(row, interceptor, max_turns=2) == "<think>six eights</think>48"

    calls = interceptor.calls
    shown = vllm_server.control.detokenize(calls[1].prompt_token_ids)
    assert "<|im_start|>assistant\n42<|im_end|>" in shown and "six sevens" not in shown  # vLLM dropped it
    record = assemble(calls)
    assert record.branches == [0, 1]
    assert record.metrics() == {"rollwire.branched_calls": 1.0,
                                "rollwire.untrained_tokens": float(len(calls[1].completion_token_ids))}
    assert record.completion_token_ids == calls[0].completion_token_ids  # the main line: the first call
    (other,) = record.branch_sequences()  # trained too where the environment says branches = "all"
    assert other.prompt_token_ids == calls[1].prompt_token_ids and other.completion_token_ids == calls[1].completion_token_ids
    assert record.metrics(branches_trained=True)["rollwire.untrained_tokens"] == 0
    for call in calls:  # each line is what a direct generate call gives for its prompt
        direct = vllm_server.control.generate(call.prompt_token_ids, max_tokens=40, temperature=0.0,
                                              stop_token_ids=vllm_server.control.end_of_turn_ids())
        assert direct["choices"][0]["token_ids"] == call.completion_token_ids


def test_the_served_template_is_read_for_its_tool_call_format(vllm_server):
    """vLLM renders an assistant turn with a call; the tiny template writes it as Hermes does."""
    from rollwire.consumers.vllm_control import VllmControl
    fresh = VllmControl(vllm_server.control.base_url)  # nothing remembered
    try:
        assert fresh.tool_call_format() == "hermes"
    finally:
        fresh.close()
