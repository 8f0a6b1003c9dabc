"""An agent written for OpenAI's Responses API (the `openai` SDK, unmodified): function calls and
their outputs as input items, each turn continuing the last response (`previous_response_id`)."""

import json

from openai import OpenAI
from tools import DESCRIPTIONS, PARAMETERS, QUESTION, SYSTEM, run

client = OpenAI()
tools = [{"type": "function", "name": n, "description": DESCRIPTIONS[n], "parameters": PARAMETERS[n]}
         for n in PARAMETERS]
response = client.responses.create(model="policy", instructions=SYSTEM, input=QUESTION, tools=tools)
for _ in range(5):
    calls = [item for item in response.output if item.type == "function_call"]
    if not calls:
        break
    outputs = [{"type": "function_call_output", "call_id": c.call_id, "output": run(c.name, json.loads(c.arguments))}
               for c in calls]
    response = client.responses.create(model="policy", instructions=SYSTEM, previous_response_id=response.id,
                                       input=outputs, tools=tools)
print(response.output_text)
