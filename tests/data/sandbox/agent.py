"""An agent for the container runtime's test, standard library only (the image holds a bare Python).

What it does comes from its task row's `behave`:
    answer     one completion of the row's prompt through OPENAI_BASE_URL; prints it
    network    the completion, then tries to reach a public address and the host (none answers)
    fork       forks without end (a fork bomb)
    memory     allocates without end
    hang       sleeps past any time limit
    repair     no model call: writes a working /tmp/solution.py (what grade.py tests) and says "fixed"
    give-up    no model call, no file: says "gave up"
"""

import json
import os
import socket
import time
import urllib.request

task = json.loads(os.environ["ROLLWIRE_TASK"])
behave = task.get("behave", "answer")


def complete(prompt: str) -> str:
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/completions",
                                     data=json.dumps({"model": "policy", "prompt": prompt}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())["choices"][0]["text"]


if behave == "fork":
    while True:
        try:
            os.fork()
        except OSError:
            pass
if behave == "memory":
    held = []
    while True:
        held.append(bytearray(32 << 20))
if behave == "hang":
    time.sleep(3600)
if behave in ("repair", "give-up"):
    if behave == "repair":
        with open("/tmp/solution.py", "w") as f:
            f.write("def add(a, b):\n    return a + b\n")
    print("fixed" if behave == "repair" else "gave up")
    raise SystemExit(0)
answer = complete(task["prompt"])
if behave == "network":
    for host, port in (("1.1.1.1", 443), ("172.17.0.1", 22), ("pypi.org", 443)):
        socket.create_connection((host, port), timeout=5)  # raises: the container has no route anywhere
print(answer)
