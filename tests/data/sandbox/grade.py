"""The grading command of the container runtime's test: run in the rollout's container after the
agent, it tests the /tmp/solution.py the agent left (standard library only) and says what passed."""

import importlib.util
import os
import sys

print(f"answer: {os.environ.get('ROLLWIRE_ANSWER', '')}")
try:
    spec = importlib.util.spec_from_file_location("solution", "/tmp/solution.py")
    solution = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(solution)
    passed = solution.add(2, 3) == 5
except Exception as exc:  # no file, or it does not work: the test fails
    print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
    passed = False
print("1 passed" if passed else "1 failed")
sys.exit(0 if passed else 1)
