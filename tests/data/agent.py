"""An unmodified "agent": it knows only the OpenAI client, a base URL and its task.

Two turns with a tool result between them, as an agent framework would send them."""

import json
import os

from openai import OpenAI

task = json.loads(os.environ["ROLLWIRE_TASK"])
client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY come from the environment
messages = [{"role": "user", "content": task["question"]}]
first = client.chat.completions.create(model="policy", messages=messages, temperature=0.0, max_tokens=500)
messages += [{"role": "assistant", "content": first.choices[0].message.content},
             {"role": "tool", "content": "42"}]
second = client.chat.completions.create(model="policy", messages=messages)
print(second.choices[0].message.content)
