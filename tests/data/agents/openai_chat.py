"""An agent written for OpenAI's Chat Completions API (the `openai` SDK, unmodified): it calls tools
until the model answers; `stream` as its argument streams every reply."""

import json
import sys

from openai import OpenAI
from tools import DESCRIPTIONS, PARAMETERS, QUESTION, SYSTEM, run

stream = "stream" in sys.argv[1:]
client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
tools = [{"type": "function", "function": {"name": n, "description": DESCRIPTIONS[n], "parameters": PARAMETERS[n]}}
         for n in PARAMETERS]
messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
for _ in range(5):
    if stream:
        content, calls = "", {}
        for chunk in client.chat.completions.create(model="policy", messages=messages, tools=tools, stream=True):
            delta = chunk.choices[0].delta if chunk.choices else None
            content += (delta.content or "") if delta else ""
            for call in (delta.tool_calls or []) if delta else []:
                calls.setdefault(call.index, {"id": call.id, "type": "function",
                                              "function": {"name": call.function.name, "arguments": ""}})
                calls[call.index]["function"]["arguments"] += call.function.arguments or ""
        message = {"role": "assistant", "content": content or None, "tool_calls": list(calls.values()) or None}
    else:
        reply = client.chat.completions.create(model="policy", messages=messages, tools=tools)
        message = reply.choices[0].message.model_dump(exclude_none=True)
    messages.append({k: v for k, v in message.items() if v is not None})
    if not message.get("tool_calls"):
        break
    for call in message["tool_calls"]:
        messages.append({"role": "tool", "tool_call_id": call["id"],
                         "content": run(call["function"]["name"], json.loads(call["function"]["arguments"]))})
print(messages[-1]["content"])
