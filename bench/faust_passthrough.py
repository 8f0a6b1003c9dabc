"""faust alone, for bench/scorer.py: a worker that reads each rollout and writes one record for it.

    python bench/faust_passthrough.py BOOTSTRAP PREFIX

The same consumer and producer settings, batches and topics as the scorer's worker
(`streams/faust_app.py`), with no decoding, scoring or table: what faust's own per-record path
costs, the ceiling it sets under the scoring worker. Each record written is a copy of a scored
event's size, on the `scored` topic, so bench/scorer.py times it as it times the scorer.
"""

from __future__ import annotations

import sys

import faust

from rollwire.core.bus.settings import KafkaBusSettings
from rollwire.schemas.topics import Topics
from rollwire.streams.faust_app import FaustWorkerSettings, faust_app, run_worker


def main() -> None:
    bootstrap, prefix = sys.argv[1:3]
    topics, settings = Topics(prefix), FaustWorkerSettings(app_id=f"{prefix}-passthrough")
    app = faust_app(settings, KafkaBusSettings(bootstrap_servers=bootstrap))
    raw = {"schema": faust.Schema(key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")}
    scored = app.topic(topics.scored, internal=False, **raw)

    @app.agent(app.topic(topics.rollouts, **raw), concurrency=1)
    async def passthrough(stream) -> None:
        async for batch in stream.take_events(settings.batch_records, within=settings.batch_wait_s):
            for event in batch:
                await scored.send(key=event.message.key, value=event.message.value)

    run_worker(app)


if __name__ == "__main__":
    main()
