"""An agent program for `graded_reversal.py`, standard library only (the image holds a bare Python):
asks the model for the task's completion through OPENAI_BASE_URL, leaves the answer in
/tmp/answer.txt for the grader, and prints it (its last line is the rollout's answer)."""

import json
import os
import urllib.request

task = json.loads(os.environ["ROLLWIRE_TASK"])
request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/completions",
                                 data=json.dumps({"model": "policy", "prompt": task["prompt"]}).encode(),
                                 headers={"Content-Type": "application/json"})
with urllib.request.urlopen(request, timeout=60) as response:
    answer = json.loads(response.read())["choices"][0]["text"].strip()
with open("/tmp/answer.txt", "w") as out:
    out.write(answer)
print(answer)
