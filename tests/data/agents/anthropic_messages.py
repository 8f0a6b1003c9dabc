"""An agent written for Anthropic's Messages API (the `anthropic` SDK, unmodified): `tool_use`
blocks answered by `tool_result` blocks until the model ends its turn."""

from anthropic import Anthropic
from tools import DESCRIPTIONS, PARAMETERS, QUESTION, SYSTEM, run

client = Anthropic()  # ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY from the environment
tools = [{"name": n, "description": DESCRIPTIONS[n], "input_schema": PARAMETERS[n]} for n in PARAMETERS]
messages = [{"role": "user", "content": QUESTION}]
for _ in range(5):
    reply = client.messages.create(model="policy", max_tokens=256, system=SYSTEM, messages=messages, tools=tools)
    messages.append({"role": "assistant", "content": [block.model_dump() for block in reply.content]})
    if reply.stop_reason != "tool_use":
        break
    messages.append({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": block.id, "content": run(block.name, block.input)}
        for block in reply.content if block.type == "tool_use"]})
print("".join(block.text for block in reply.content if block.type == "text"))
