"""A separate process that uses the event log, for tests of several processes at once.

    python tests/bus_child.py produce SETTINGS_JSON TOPIC NAME COUNT
        sends COUNT records keyed NAME-<i % 10> with values NAME:<i>, then flushes
    python tests/bus_child.py consume-and-die SETTINGS_JSON TOPIC GROUP COUNT COMMIT_FIRST
        reads COUNT records in GROUP, commits after the first COMMIT_FIRST of them, prints
        "read <n>", then kills itself with SIGKILL (no close, no further commit)
"""

from __future__ import annotations

import json
import os
import signal
import sys

from pydantic import TypeAdapter

from rollwire.core.bus import open_log
from rollwire.core.bus.settings import BusSettings


def main(argv: list[str]) -> None:
    action, settings_json, topic = argv[:3]
    log = open_log(TypeAdapter(BusSettings).validate_python(json.loads(settings_json)))
    if action == "produce":
        name, count = argv[3], int(argv[4])
        producer = log.producer()
        for i in range(count):
            producer.send(topic, f"{name}:{i}".encode(), key=f"{name}-{i % 10}".encode())
        producer.close()
        print("sent", count, flush=True)
        return
    group, count, commit_first = argv[3], int(argv[4]), int(argv[5])
    consumer = log.consumer([topic], group, session_timeout_s=1.0)
    seen = []
    while len(seen) < count:
        seen.extend(consumer.poll_batch(count - len(seen), 5.0))
        if len(seen) >= commit_first and commit_first:
            consumer.commit(seen[:commit_first])
            commit_first = 0
    print("read", len(seen), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main(sys.argv[1:])
