"""The APIs a rollout's URL serves, driven by the real `openai` and `anthropic` SDKs as agents use
them: tools and tool calls, the tool turn back, text parts, streaming, and what is refused; Chat
Completions, the Responses API and Anthropic's Messages API. The model behind the URL is scripted
here (own code path); the recorded tokens against a real vLLM server are the inference tier's."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from rollwire.producers.agent_api.common import ApiError, Issued, read_reply
from rollwire.producers.agent_api.openai_chat import parse_chat, respond_chat
from rollwire.producers.interception_server import InterceptionServer

ADD = {"type": "function", "function": {"name": "add", "description": "Adds two numbers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}}
NEGATE = {"type": "function", "function": {"name": "negate", "parameters": {
    "type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}}}
TWO_CALLS = ('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>\n'
             '<tool_call>{"name": "negate", "arguments": {"x": 4}}</tool_call>')


class ScriptedModel:
    """The rollout's interceptor: answers from a script, records what the template was given."""

    usage = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    tool_call_format = "hermes"

    def __init__(self, replies: list[str]) -> None:
        self.replies, self.asked, self.finish_reason = list(replies), [], "stop"

    def chat(self, messages, tools=None):
        self.asked.append((json.loads(json.dumps(messages)), tools))
        return self.replies.pop(0)

    def complete(self, prompt):
        self.asked.append((prompt, None))
        return self.replies.pop(0)


@pytest.fixture
def server():
    server = InterceptionServer()
    yield server
    server.shutdown()


@pytest.fixture
def served(server):
    def open_(replies: list[str]) -> tuple[openai.OpenAI, ScriptedModel]:
        model = ScriptedModel(replies)
        return openai.OpenAI(base_url=server.open(model), api_key="rollwire", max_retries=0), model

    return open_


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


@pytest.mark.parametrize("fmt, sampled", [
    ("llama3_json", '{"name": "add", "parameters": {"a": 2, "b": 3}}; {"name": "negate", "parameters": {"x": 4}}'),
    ("mistral", '[TOOL_CALLS][{"name": "add", "arguments": {"a": 2, "b": 3}}, {"name": "negate", "arguments": {"x": 4}}]'),
    ("mistral", '[TOOL_CALLS]add[ARGS]{"a": 2, "b": 3}[TOOL_CALLS]negate[ARGS]{"x": 4}'),
])
def test_calls_in_the_models_own_format_reach_the_sdk_as_tool_calls_and_come_back_as_sampled(served, fmt, sampled):
    client, model = served([sampled, "5 and -4."])
    model.tool_call_format = fmt
    messages = [{"role": "user", "content": "2+3, and -4?"}]
    choice = client.chat.completions.create(model="policy", messages=messages, tools=[ADD, NEGATE]).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = choice.message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [("add", {"a": 2, "b": 3}),
                                                                                  ("negate", {"x": 4})]
    messages += [choice.message.model_dump(exclude_none=True),
                 *({"role": "tool", "tool_call_id": c.id, "content": r} for c, r in zip(calls, ("5", "-4")))]
    client.chat.completions.create(model="policy", messages=messages, tools=[ADD, NEGATE])
    assert model.asked[1][0][1] == {"role": "assistant", "content": sampled}


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
    request = parse_chat({"messages": [{"role": "user", "content": "x"}], "tools": [ADD], "tool_choice": "none"},
                         Issued())
    assert request.tools is None
    issued = Issued()
    reply = respond_chat(read_reply("<tool_call>{not json</tool_call>", "stop", {}, issued), request, issued)
    assert reply["choices"][0]["message"] == {"role": "assistant", "content": "<tool_call>{not json</tool_call>"}
    assert reply["choices"][0]["finish_reason"] == "stop" and issued.calls == {}
    with pytest.raises(ApiError, match="its arguments are not JSON"):
        parse_chat({"messages": [{"role": "assistant", "tool_calls": [
            {"id": "x", "type": "function", "function": {"name": "add", "arguments": "{a: 1"}}]}]}, Issued())


def test_the_responses_api_returns_function_calls_and_takes_their_outputs_and_previous_responses(server):
    model = ScriptedModel([TWO_CALLS, "It is 5 and -4.", "Yes."])
    client = openai.OpenAI(base_url=server.open(model), api_key="rollwire", max_retries=0)
    tools = [{"type": "function", "name": t["function"]["name"], "description": t["function"].get("description", ""),
              "parameters": t["function"]["parameters"]} for t in (ADD, NEGATE)]
    first = client.responses.create(model="policy", instructions="Use the tools.", input="2+3, and -4?", tools=tools)
    calls = [item for item in first.output if item.type == "function_call"]
    assert first.status == "completed" and [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("add", {"a": 2, "b": 3}), ("negate", {"x": 4})]
    assert model.asked[0] == ([{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "2+3, and -4?"}],
                              [ADD, {"type": "function", "function": {**NEGATE["function"], "description": ""}}])

    # the agent sends the whole conversation back: its own input, the calls as items, their outputs
    second = client.responses.create(model="policy", tools=tools, input=[
        {"role": "user", "content": "2+3, and -4?"}, *[c.model_dump(exclude_none=True) for c in calls],
        *({"type": "function_call_output", "call_id": c.call_id, "output": r} for c, r in zip(calls, ("5", "-4")))])
    assert second.output_text == "It is 5 and -4."
    assert model.asked[1][0] == [{"role": "user", "content": "2+3, and -4?"}, {"role": "assistant", "content": TWO_CALLS},
                                 {"role": "tool", "tool_call_id": calls[0].call_id, "content": "5"},
                                 {"role": "tool", "tool_call_id": calls[1].call_id, "content": "-4"}]

    # or continues from a response: the conversation up to it, without the earlier instructions
    events = list(client.responses.create(model="policy", previous_response_id=second.id, input="Sure?", stream=True))
    assert events[-1].type == "response.completed" and events[-1].response.output_text == "Yes."
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Yes."
    assert model.asked[2][0][-3:] == [model.asked[1][0][-1], {"role": "assistant", "content": "It is 5 and -4."},
                                      {"role": "user", "content": "Sure?"}]
    with pytest.raises(openai.BadRequestError, match="previous_response_id 'resp_nope' is not a response of this"):
        client.responses.create(model="policy", previous_response_id="resp_nope", input="x")
    with pytest.raises(openai.BadRequestError, match="a tool of type 'web_search' is not served"):
        client.responses.create(model="policy", input="x", tools=[{"type": "web_search"}])


def test_the_anthropic_sdk_gets_tool_use_blocks_and_its_tool_results_render_after_the_sampled_text(server):
    model = ScriptedModel(['Let me add. <tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>',
                           "The sum is 5.", "Done."])
    client = anthropic.Anthropic(base_url=server.open(model).removesuffix("/v1"), api_key="rollwire", max_retries=0)
    tools = [{"name": "add", "description": "Adds two numbers.", "input_schema": ADD["function"]["parameters"]}]
    messages = [{"role": "user", "content": "2+3?"}]
    first = client.messages.create(model="policy", max_tokens=64, system="Use the tools.", messages=messages,
                                   tools=tools)
    assert first.stop_reason == "tool_use" and first.usage.output_tokens == 3
    text, use = first.content
    assert text.text == "Let me add." and (use.type, use.name, use.input) == ("tool_use", "add", {"a": 2, "b": 3})
    assert model.asked[0][1] == [ADD]

    messages += [{"role": "assistant", "content": [b.model_dump() for b in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "5"}]}]
    second = client.messages.create(model="policy", max_tokens=64, messages=messages, tools=tools)
    assert second.stop_reason == "end_turn" and second.content[0].text == "The sum is 5."
    sampled = 'Let me add. <tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    assert model.asked[1][0][1:] == [{"role": "assistant", "content": sampled},
                                     {"role": "tool", "tool_call_id": use.id, "content": "5"}]

    with client.messages.stream(model="policy", max_tokens=64, messages=[{"role": "user", "content": "ok?"}]) as stream:
        said = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert said == "Done." and final.stop_reason == "end_turn"
    with pytest.raises(anthropic.BadRequestError, match="'image' block is not served"):
        client.messages.create(model="policy", max_tokens=8, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])
