"""The grading command of `graded_reversal.py`: run in the rollout's container after the agent, it
checks the file the agent left against the task (ROLLWIRE_TASK) and exits 0 when it is right."""

import json
import os
import sys

task = json.loads(os.environ["ROLLWIRE_TASK"])
try:
    with open("/tmp/answer.txt") as f:
        answer = f.read().strip().rstrip(".")
except OSError as exc:
    print(f"no answer file: {exc}")
    sys.exit(1)
right = answer == task["answer"]
print(f"{answer!r} {'==' if right else '!='} {task['answer']!r}")
sys.exit(0 if right else 1)
