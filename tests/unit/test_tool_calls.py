"""Tool calls in the format Hermes and Qwen templates use, through the chat harness, the real
interceptor and the assembly of the training record: tools rendered into the prompt by the
template, every sampled id kept with mask 1, tool results and template tokens with mask 0. The
model is scripted (its replies are token ids of a real BPE tokenizer); the template is rendered as
a server would, with transformers."""

from __future__ import annotations

import pytest

from rollwire.consumers.vllm_control import VllmControl
from rollwire.producers.assembly import assemble
from rollwire.producers.harnesses import chat_harness
from rollwire.producers.interception import Interceptor
from rollwire.producers.tool_calls import ToolCall, parse_tool_calls
from rollwire.producers.tools import TOOLS
from rollwire.schemas.rollout import SamplingParams
from rollwire.trainer.tiny import CHAT_TEMPLATE, build_bpe_tokenizer


def test_hermes_calls_are_parsed_each_one_and_a_malformed_one_becomes_an_error_for_the_model():
    reply = ('Let me check.<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
             '<tool_call>\n{"name": "calculator", "arguments": "{\\"expression\\": \\"1+1\\"}"}\n</tool_call>')
    assert parse_tool_calls(reply) == [ToolCall("calculator", {"expression": "6*7"}),
                                       ToolCall("calculator", {"expression": "1+1"})]
    (broken,) = parse_tool_calls('<tool_call>{"name": "calculator", "arguments": {"expression": "1+</tool_call>')
    assert broken.error.startswith("error: malformed tool call") and broken.name == ""
    (cut,) = parse_tool_calls('<tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}')
    assert cut == ToolCall("calculator", {"expression": "2*3"})  # generation stopped before the closing tag
    assert parse_tool_calls("CALL calculator(2+2) and CALL calculator(3)") == [ToolCall("calculator", "2+2")]
    assert parse_tool_calls("The answer is 42") == []


class TemplateServer:
    """Stands in for the server's render/tokenize/generate routes with a real tokenizer; the model's
    replies are scripted."""

    def __init__(self, tokenizer, replies: list[str]) -> None:
        self.tokenizer, self.replies, self.rendered_tools = tokenizer, list(replies), []
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self._end_of_turn = None
        self.turn_end = VllmControl.end_of_turn_ids(self)  # the real reading of the template, on this one
        self.rendered_tools = []

    def render_chat(self, messages, *, model="policy", tools=None, add_generation_prompt=True):
        self.rendered_tools.append(tools)
        return self.tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                                  tokenize=True, return_dict=False)

    def end_of_turn_ids(self, model="policy"):
        return self.turn_end

    def tokenize(self, text):
        return self.tokenizer.encode(text, add_special_tokens=False)

    def detokenize(self, ids):
        return self.tokenizer.decode(ids)

    def generate(self, prompt_ids, **options):
        ids = self.tokenize(self.replies.pop(0)) + [self.end]
        return {"choices": [{"token_ids": ids, "finish_reason": "stop", "stop_reason": self.end,
                             "logprobs": {"content": [{"logprob": -0.5} for _ in ids]},
                             "weight_versions": [{"version": "3", "start": 0, "end": len(ids)}]}]}


def test_a_hermes_tool_call_round_trips_into_a_record_of_exactly_the_sampled_ids():
    tokenizer = build_bpe_tokenizer()
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call>'
    server = TemplateServer(tokenizer, [call, "42"])
    interceptor = Interceptor(server, SamplingParams(max_tokens=64), model="policy")
    row = {"messages": [{"role": "user", "content": "What is 6*7?"}], "tools": ["calculator"]}

    assert chat_harness(row, interceptor) == "42"

    assert server.rendered_tools == [[TOOLS.get("calculator").schema]] * 2  # the template rendered the tools
    first_prompt = tokenizer.decode(interceptor.calls[0].prompt_token_ids)
    assert "<tools>" in first_prompt and '"name": "calculator"' in first_prompt
    record = assemble(interceptor.calls)
    assert record.branches == [0, 0]  # the second prompt extends the first call's ids: one token sequence
    sampled = [i for i, m in zip(record.completion_token_ids, record.loss_mask) if m == 1]
    assert sampled == interceptor.calls[0].completion_token_ids + interceptor.calls[1].completion_token_ids
    environment = tokenizer.decode([i for i, m in zip(record.completion_token_ids, record.loss_mask) if m == 0])
    assert "<|im_start|>tool\n42<|im_end|>" in environment and "<tool_call>" not in environment
    assert all(lp == 0.0 for lp, m in zip(record.completion_logprobs, record.loss_mask) if m == 0)


@pytest.mark.parametrize("reply, told", [
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "6*"}}</tool_call>', "error: "),
    ('<tool_call>{"name": "search", "arguments": {"query": "cats"}}</tool_call>', "error: no tool 'search'"),
    ('<tool_call>{"name": "calculator" "arguments": {}}</tool_call>', "error: malformed tool call"),
])
def test_a_bad_tool_call_is_answered_with_an_error_and_the_rollout_goes_on(reply, told):
    tokenizer = build_bpe_tokenizer()
    server = TemplateServer(tokenizer, [reply, "done"])
    interceptor = Interceptor(server, SamplingParams(max_tokens=64), model="policy")
    row = {"messages": [{"role": "user", "content": "?"}], "tools": ["calculator"]}
    assert chat_harness(row, interceptor) == "done"
    second_prompt = tokenizer.decode(interceptor.calls[1].prompt_token_ids)
    assert f"<|im_start|>tool\n{told}" in second_prompt


QWEN3_STYLE = CHAT_TEMPLATE.replace(
    "{{ message['content'] }}",
    "{% if message['role'] == 'assistant' and not loop.last and '</think>' in message['content'] %}"
    "{{ message['content'].split('</think>')[-1] }}{% else %}{{ message['content'] }}{% endif %}")
"""ChatML that drops the reasoning of earlier assistant turns when it renders them, as Qwen3's does."""


def test_a_template_that_drops_earlier_reasoning_branches_the_rollout_and_the_loss_is_counted():
    tokenizer = build_bpe_tokenizer()
    tokenizer.chat_template = QWEN3_STYLE
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
    server = TemplateServer(tokenizer, ["<think>six sevens</think>" + call, "42"])
    interceptor = Interceptor(server, SamplingParams(max_tokens=64), model="policy")
    assert chat_harness({"messages": [{"role": "user", "content": "6*7?"}], "tools": ["calculator"]}, interceptor) == "42"

    record = assemble(interceptor.calls)
    assert record.branches == [0, 1]  # the second prompt lost the sampled reasoning: it cannot extend the first call
    assert record.metrics() == {"rollwire.branched_calls": 1.0,
                                "rollwire.untrained_tokens": float(len(interceptor.calls[1].completion_token_ids))}
    assert record.completion_token_ids == interceptor.calls[0].completion_token_ids  # the main line only
