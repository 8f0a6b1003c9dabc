"""The OpenAI API a rollout's URL serves, driven by the real `openai` SDK as an agent uses it: tools
and tool calls, the tool turn back, text parts, streaming, and what is refused. The model behind the
URL is scripted here (own code path); the recorded tokens against a real vLLM server are the
inference tier's."""

from __future__ import annotations

import json

import openai
import pytest

from rollwire.producers.interception_server import InterceptionServer
from rollwire.producers.openai_api import ApiError, chat_request, chat_response

ADD = {"type": "function", "function": {"name": "add", "description": "Adds two numbers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}}
NEGATE = {"type": "function", "function": {"name": "negate", "parameters": {
    "type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}}}
TWO_CALLS = ('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>\n'
             '<tool_call>{"name": "negate", "arguments": {"x": 4}}</tool_call>')


class ScriptedModel:
    """The rollout's interceptor: answers from a script, records what the template was given."""

    usage = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}

    def __init__(self, replies: list[str]) -> None:
        self.replies, self.asked, self.finish_reason = list(replies), [], "stop"

    def chat(self, messages, tools=None):
        self.asked.append((json.loads(json.dumps(messages)), tools))
        return self.replies.pop(0)

    def complete(self, prompt):
        self.asked.append((prompt, None))
        return self.replies.pop(0)


@pytest.fixture
def served():
    server = InterceptionServer()

    def open_(replies: list[str]) -> tuple[openai.OpenAI, ScriptedModel]:
        model = ScriptedModel(replies)
        return openai.OpenAI(base_url=server.open(model), api_key="rollwire", max_retries=0), model

    yield open_
    server.shutdown()


def test_the_sdk_gets_parallel_tool_calls_and_its_turn_back_renders_the_sampled_text(served):
    client, model = served([TWO_CALLS, "The sum is 5 and -4."])
    messages = [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "2+3, and -4?"}]
    first = client.chat.completions.create(model="policy", messages=messages, tools=[ADD, NEGATE])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = choice.message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [("add", {"a": 2, "b": 3}),
                                                                                  ("negate", {"x": 4})]
    assert first.usage.total_tokens == 10 and model.asked[0][1] == [ADD, NEGATE]

    messages += [choice.message.model_dump(exclude_none=True),
                 *({"role": "tool", "tool_call_id": c.id, "content": r} for c, r in zip(calls, ("5", "-4")))]
    second = client.chat.completions.create(model="policy", messages=messages, tools=[ADD, NEGATE])
    assert second.choices[0].message.content == "The sum is 5 and -4." and second.choices[0].finish_reason == "stop"
    rendered, _ = model.asked[1]
    # the assistant turn is the text the model sampled, so the template re-renders the same tokens
    assert rendered[2] == {"role": "assistant", "content": TWO_CALLS}
    assert rendered[3:] == [{"role": "tool", "content": "5", "tool_call_id": calls[0].id},
                            {"role": "tool", "content": "-4", "tool_call_id": calls[1].id}]


def test_a_stream_carries_the_same_reply_in_chunks_with_usage_when_asked(served):
    client, _ = served(['Adding. <tool_call>{"name": "add", "arguments": {"a": 1, "b": 1}}</tool_call>', "2"])
    chunks = list(client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "1+1?"}],
                                                 tools=[ADD], stream=True, stream_options={"include_usage": True}))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [call for c in chunks if c.choices for call in c.choices[0].delta.tool_calls or []]
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert content == "Adding." and finish == ["tool_calls"]
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [("add", {"a": 1, "b": 1})]
    assert chunks[-1].usage.completion_tokens == 3 and not chunks[-1].choices

    plain = list(client.completions.create(model="policy", prompt="1+1=", stream=True))
    assert "".join(c.choices[0].text for c in plain) == "2" and plain[-1].choices[0].finish_reason == "stop"


def test_content_parts_and_an_unissued_tool_call_reach_the_template_as_text_and_structure(served):
    client, model = served(["ok"])
    client.chat.completions.create(model="policy", messages=[
        {"role": "developer", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "from-elsewhere", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]},
        {"role": "tool", "tool_call_id": "from-elsewhere", "content": "3"}])
    rendered, _ = model.asked[0]
    assert rendered[0] == {"role": "system", "content": "Be brief."}
    assert rendered[2] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "from-elsewhere", "type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]}


@pytest.mark.parametrize(("change", "message"), [
    ({"n": 2}, "n = 2 is not served"),
    ({"logit_bias": {"5": 10}}, "logit_bias is not served"),
    ({"tool_choice": "required", "tools": [ADD]}, 'tool_choice "required" is not served'),
    ({"response_format": {"type": "json_object"}}, "response_format is not served"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]},
     "a content part of type 'image_url' is not served: the policy reads text only"),
    ({"messages": [{"role": "narrator", "content": "x"}]}, "must be an object with a `role` of system, developer"),
])
def test_what_cannot_be_served_is_refused_with_the_reason(served, change, message):
    client, model = served(["never"])
    request = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], **change}
    with pytest.raises(openai.BadRequestError, match=message):
        client.chat.completions.create(**request)
    assert model.asked == []  # nothing was sampled for it


def test_tool_choice_none_offers_no_tools_and_a_malformed_call_stays_text():
    request = chat_request({"messages": [{"role": "user", "content": "x"}], "tools": [ADD], "tool_choice": "none"}, {})
    assert request.tools is None
    issued: dict[str, str] = {}
    reply = chat_response("<tool_call>{not json</tool_call>", "stop", {}, "policy", issued)
    assert reply["choices"][0]["message"] == {"role": "assistant", "content": "<tool_call>{not json</tool_call>"}
    assert reply["choices"][0]["finish_reason"] == "stop" and issued == {}
    with pytest.raises(ApiError, match="its arguments are not JSON"):
        chat_request({"messages": [{"role": "assistant", "tool_calls": [
            {"id": "x", "type": "function", "function": {"name": "add", "arguments": "{a: 1"}}]}]}, {})
