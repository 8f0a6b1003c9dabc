"""Tool calls in the format Hermes and Qwen templates use, through the chat harness, the real
interceptor and the assembly of the training record: tools rendered into the prompt by the
template, every sampled id kept with mask 1, tool results and template tokens with mask 0. The
model is scripted (its replies are token ids of a real BPE tokenizer); the template is rendered as
a server would, with transformers."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollwire.consumers.vllm_control import VllmControl
from rollwire.producers.assembly import assemble
from rollwire.producers.harnesses import chat_harness, conversation_harness
from rollwire.producers.interception import Interceptor
from rollwire.producers.tool_calls import ToolCall, format_written, parse_tool_calls, read_tool_calls
from rollwire.producers.tools import TOOLS
from rollwire.schemas.rollout import SamplingParams
from rollwire.trainer.tiny import build_bpe_tokenizer


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
        self._end_of_turn = self._tool_call_format = None
        self.turn_end = VllmControl.end_of_turn_ids(self)  # the real readings of the template, on this one
        self.end = self.turn_end[0]
        self.format = VllmControl.tool_call_format(self)
        self.rendered_tools = []

    def render_chat(self, messages, *, model="policy", tools=None, add_generation_prompt=True):
        self.rendered_tools.append(tools)
        return self.tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                                  tokenize=True, return_dict=False)

    def end_of_turn_ids(self, model="policy"):
        return self.turn_end

    def tool_call_format(self, model="policy"):
        return self.format

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


def test_a_template_that_drops_earlier_reasoning_branches_the_rollout_and_the_loss_is_counted():
    """The tiny models' template drops the reasoning of assistant turns before the last user message,
    as Qwen3's does; within a tool loop (no new user message) it keeps it, and the calls join."""
    tokenizer = build_bpe_tokenizer()
    server = TemplateServer(tokenizer, ["<think>six sevens</think>42", "<think>six eights</think>48"])
    interceptor = Interceptor(server, SamplingParams(max_tokens=64), model="policy")
    row = {"messages": [{"role": "user", "content": "6*7?"}], "user_turns": ["And 6*8?"]}
    assert conversation_harness(row, interceptor, max_turns=2) == "<think>six eights</think>48"

    second_prompt = tokenizer.decode(interceptor.calls[1].prompt_token_ids)
    assert "<|im_start|>assistant\n42<|im_end|>" in second_prompt and "six sevens" not in second_prompt
    record = assemble(interceptor.calls)
    assert record.branches == [0, 1]  # the second prompt lost the sampled reasoning: it cannot extend the first call
    assert record.metrics() == {"rollwire.branched_calls": 1.0,
                                "rollwire.untrained_tokens": float(len(interceptor.calls[1].completion_token_ids))}
    assert record.completion_token_ids == interceptor.calls[0].completion_token_ids  # the main line only

    call = '<think>six sevens</think><tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
    in_a_loop = Interceptor(TemplateServer(tokenizer, [call, "42"]), SamplingParams(max_tokens=64), model="policy")
    chat_harness({"messages": [{"role": "user", "content": "6*7?"}], "tools": ["calculator"]}, in_a_loop)
    assert assemble(in_a_loop.calls).branches == [0, 0]


def test_llama3_json_calls_are_the_whole_reply_and_a_json_answer_stays_an_answer():
    two = '{"name": "add", "parameters": {"a": 2, "b": 3}}; {"name": "negate", "parameters": {"x": 4}}'
    assert read_tool_calls(two, "llama3_json").calls == [ToolCall("add", {"a": 2, "b": 3}), ToolCall("negate", {"x": 4})]
    tagged = read_tool_calls('<|python_tag|>{"name": "add", "arguments": "{\\"a\\": 1}"}', "llama3_json")
    assert tagged.calls == [ToolCall("add", {"a": 1})] and tagged.content == ""
    answer = '{"answer": 5}'
    assert read_tool_calls(answer, "llama3_json").calls == [] and read_tool_calls(answer, "llama3_json").content == answer
    assert read_tool_calls("It is 5.", "llama3_json").calls == []
    (broken,) = read_tool_calls('<|python_tag|>{"name": "add", "parameters": {"a": ', "llama3_json").calls
    assert broken.error.startswith("error: malformed tool call")
    trailing = '{"name": "add", "parameters": {}} and more'
    assert read_tool_calls(trailing, "llama3_json").content == trailing  # not calls: text follows them


def test_mistral_calls_as_its_own_tokenizer_writes_them_before_v11_and_after():
    """Before v11 the calls are a JSON list after [TOOL_CALLS], as mistral_common's tekken tokenizer
    (bundled with it, v3) encodes an assistant turn; from v11, `name[ARGS]{...}` after each marker."""
    written = _mistral_common_turn()
    read = read_tool_calls("Let me add." + written, "mistral")
    assert read.calls == [ToolCall("add", {"a": 2, "b": 3}), ToolCall("negate", {"x": 4})] and read.content == "Let me add."
    v11 = read_tool_calls('[TOOL_CALLS]add[ARGS]{"a": 2, "b": 3}[TOOL_CALLS]negate[ARGS]{"x": 4}', "mistral")
    assert v11.calls == [ToolCall("add", {"a": 2, "b": 3}), ToolCall("negate", {"x": 4})] and v11.content == ""
    assert read_tool_calls('[TOOL_CALLS]now{}', "mistral").calls == [ToolCall("now", {})]
    (broken,) = read_tool_calls('[TOOL_CALLS]add[ARGS]{"a": 2', "mistral").calls
    assert broken.error.startswith("error: malformed tool call")
    assert read_tool_calls("5", "mistral").calls == []


def _mistral_common_turn() -> str:
    """An assistant turn calling add and negate, encoded by Mistral's own tokenizer library and decoded
    with its control tokens kept: `[TOOL_CALLS][{...}, {...}]`."""
    import mistral_common
    from mistral_common.protocol.instruct.messages import AssistantMessage, ToolMessage, UserMessage
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.protocol.instruct.tool_calls import Function, FunctionCall, Tool
    from mistral_common.protocol.instruct.tool_calls import ToolCall as MistralCall
    from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    tokenizer = MistralTokenizer.from_file(str(Path(mistral_common.__file__).parent / "data" / "tekken_240911.json"))
    calls = [MistralCall(id="abcdefghi", function=FunctionCall(name="add", arguments='{"a": 2, "b": 3}')),
             MistralCall(id="bcdefghij", function=FunctionCall(name="negate", arguments='{"x": 4}'))]
    request = ChatCompletionRequest(
        messages=[UserMessage(content="2+3, and -4?"), AssistantMessage(content=None, tool_calls=calls),
                  ToolMessage(content="5", tool_call_id="abcdefghi"), ToolMessage(content="-4", tool_call_id="bcdefghij")],
        tools=[Tool(function=Function(name=n, description=n, parameters={"type": "object"})) for n in ("add", "negate")])
    text = tokenizer.instruct_tokenizer.tokenizer.decode(tokenizer.encode_chat_completion(request).tokens,
                                                         special_token_policy=SpecialTokenPolicy.KEEP)
    return text[text.index("[/INST]") + len("[/INST]"): text.index("</s>")]


LLAMA3_JSON = (
    "{{ bos_token }}{% if tools %}<|start_header_id|>system<|end_header_id|>\n\nTo call a function, answer with "
    "{\"name\": function name, \"parameters\": {argument: value}}. The functions:\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}<|eot_id|>{% endif %}"
    "{% for message in messages %}"
    "{% set role = 'ipython' if message['role'] == 'tool' else message['role'] %}"
    "<|start_header_id|>{{ role }}<|end_header_id|>\n\n{{ message['content'] or '' }}"
    "{% for call in message['tool_calls'] or [] %}{\"name\": \"{{ call['function']['name'] }}\", "
    "\"parameters\": {{ call['function']['arguments'] | tojson }}}{% endfor %}<|eot_id|>"
    "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
"""The shape of Llama 3.1's JSON tool-calling template: calls as bare JSON, results as `ipython` turns."""
LLAMA3_SPECIALS = ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>"]


def test_the_format_is_read_from_what_the_template_writes_for_a_call():
    hermes = build_bpe_tokenizer()
    llama = build_bpe_tokenizer()
    llama.add_special_tokens({"additional_special_tokens": LLAMA3_SPECIALS})
    llama.chat_template = LLAMA3_JSON
    plain = build_bpe_tokenizer()
    plain.chat_template = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>{% endfor %}"
    assert [TemplateServer(t, []).format for t in (hermes, llama, plain)] == ["hermes", "llama3_json", None]
    assert format_written("[INST]hi[/INST]" + _mistral_common_turn(), "add") == "mistral"
    # the tools' own description is no call: only what the template wrote for the call counts
    assert format_written('{"name": "probe_tool", "parameters": {}}', "probe_tool") == "llama3_json"


def test_a_llama3_model_calls_a_tool_through_the_harness_and_the_record_is_exactly_the_sampled_ids():
    tokenizer = build_bpe_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": LLAMA3_SPECIALS})
    tokenizer.chat_template = LLAMA3_JSON
    server = TemplateServer(tokenizer, ['{"name": "calculator", "parameters": {"expression": "6*7"}}', "42"])
    assert server.turn_end == [tokenizer.convert_tokens_to_ids("<|eot_id|>")]
    interceptor = Interceptor(server, SamplingParams(max_tokens=64), model="policy")
    row = {"messages": [{"role": "user", "content": "What is 6*7?"}], "tools": ["calculator"]}

    assert chat_harness(row, interceptor) == "42" and interceptor.tool_call_format == "llama3_json"

    second_prompt = tokenizer.decode(interceptor.calls[1].prompt_token_ids)
    assert second_prompt.endswith("<|start_header_id|>ipython<|end_header_id|>\n\n42<|eot_id|>"
                                  "<|start_header_id|>assistant<|end_header_id|>\n\n")
    record = assemble(interceptor.calls)
    assert record.branches == [0, 0]
    sampled = [i for i, m in zip(record.completion_token_ids, record.loss_mask) if m == 1]
    assert sampled == interceptor.calls[0].completion_token_ids + interceptor.calls[1].completion_token_ids
