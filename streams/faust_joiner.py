"""The feedback joiner on faust-streaming: the scale-out driver on Kafka.

    agent `route`   reads <prefix>.served, <prefix>.feedback (keyed by conversation) and re-keys each
                    record by its receipt onto <prefix>.joiner-in (the same bytes and headers);
                    feedback naming no receipt is handled here (a correction rendered from its
                    messages, or a drop)
    agent `join`    reads <prefix>.joiner-in (concurrency 1): served records, feedback, the messages
                    receipts send each other about preferences (`PartnerRecord`), ticks
    writes:         <prefix>.scored, <prefix>.drops, <prefix>.deadletter, <prefix>.joiner-in
    table:          `receipts`, changelog <prefix>.joiner-state (the in-process driver's records: a
                    `FeedbackJoinState` per receipt; a `SourceBaseline` per source and partition)

Everything about one receipt lives on the joiner-in partition its key hashes to (the table's
changelog partition is the same: `ReceiptTable.partition_for_key`), so workers started with the
same app id split the receipts between them; a preference whose two receipts live on different
partitions completes by the messages the logic emits. A source's rating baseline is kept per
partition (each partition's running mean of the ratings it joined: the same estimate from a
share of the ratings). Faust flushes the producer (outputs, changelog, messages) before it
commits offsets: delivery is at-least-once, and a replayed record is recognised by the state
(a feedback id already joined, a record already held).
"""

from __future__ import annotations

import heapq
import logging
from typing import Any

import faust

from rollwire.core import telemetry
from rollwire.core.bus.base import Record
from rollwire.core.bus.events import dead_letter_for, outgoing
from rollwire.core.bus.partitioner import partition_for
from rollwire.core.bus.settings import KafkaBusSettings
from rollwire.schemas.base import Event, now_ms
from rollwire.schemas.envelope import Codec
from rollwire.schemas.errors import SchemaError
from rollwire.schemas.feedback import FeedbackReceived
from rollwire.schemas.joiner import FeedbackJoinState, PartnerRecord, SourceBaseline
from rollwire.schemas.rollout import ScoredRollout
from rollwire.schemas.scorer import ScorerTick
from rollwire.schemas.serving import ResponseServed
from rollwire.schemas.topics import Topics
from rollwire.streams.faust_app import FaustWorkerSettings, add_ticks, faust_app, record_of, table_event
from rollwire.streams.feedback_join import FeedbackJoiner, JoinStep, joining_span, receipt_of

logger = logging.getLogger(__name__)

BASELINE_KEY = "\x00"
"""Before a source's name (and NUL, its partition) in a baseline's table key; receipts never start with NUL."""


def baseline_key(source: str, partition: int) -> bytes:
    return f"{BASELINE_KEY}{source}{BASELINE_KEY}{partition}".encode()


class ReceiptTable(faust.Table):
    """The `receipts` table: a receipt's state on the partition its records arrive on; a baseline
    on the partition its key names (the in-process driver's `NUL source` keys: by hash)."""

    def partition_for_key(self, key: Any) -> int:
        if key.startswith(BASELINE_KEY.encode()):
            _, _, partition = key[1:].rpartition(BASELINE_KEY.encode())
            if partition.isdigit():
                return int(partition)
        return partition_for(key, self.partitions)


def build_app(settings: FaustWorkerSettings, joiner: FeedbackJoiner, *, bus: KafkaBusSettings,
              topics: Topics) -> faust.App:
    """A faust app with the routing and joining agents, the tick timer and the receipt table
    (`FaustWorkerSettings`: how a faust worker of rollwire runs, whichever processor it is)."""
    codec = Codec()
    app = faust_app(settings, bus)
    raw = {"schema": faust.Schema(key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")}
    partitions = topics.spec(topics.name("joiner-in")).partitions
    state_topic = app.topic(topics.name("joiner-state"), partitions=partitions, internal=False, **raw)
    joiner_in = app.topic(topics.name("joiner-in"), partitions=partitions, internal=False, **raw)
    receipts = app.tables.add(ReceiptTable(app, name="receipts", default=None, partitions=partitions,
                                           changelog_topic=state_topic, beacon=app.tables.beacon, **raw))
    outputs = {name: app.topic(topics.name(name), internal=False, **raw) for name in ("scored", "drops", "deadletter")}

    # decoded views of the table, rebuilt after a rebalance: states by receipt, baselines and the
    # tick schedule (a heap of (due ms, receipt)) by partition
    held: dict[str, FeedbackJoinState | None] = {}
    baselines: dict[int, dict[str, SourceBaseline]] = {}
    schedules: dict[int, list[tuple[int, str]]] = {}

    @app.on_partitions_revoked.connect
    async def forget_decoded(*_args: Any, **_kwargs: Any) -> None:
        held.clear()
        baselines.clear()
        schedules.clear()

    def partition_of(receipt: str) -> int:
        return partition_for(receipt.encode(), partitions)

    def stored(key: bytes) -> Event | None:
        return table_event(receipts, key, codec, "joiner-state")

    def state_of(receipt: str) -> FeedbackJoinState | None:
        if receipt not in held:
            state = stored(receipt.encode())
            held[receipt] = state if isinstance(state, FeedbackJoinState) else None
        return held[receipt]

    def baselines_of(partition: int) -> dict[str, SourceBaseline]:
        if partition not in baselines:  # the first use since the assignment: one pass over the table
            baselines[partition] = {}
            for key in [k for k in list(receipts.keys()) if k.startswith(BASELINE_KEY.encode())]:
                if receipts.partition_for_key(key) == partition and isinstance(b := stored(key), SourceBaseline):
                    baselines[partition][b.source] = b
        return baselines[partition]

    def schedule_of(partition: int) -> list[tuple[int, str]]:
        if partition not in schedules:
            schedules[partition] = []
            for key in [k for k in list(receipts.keys()) if not k.startswith(BASELINE_KEY.encode())]:
                if receipts.partition_for_key(key) == partition and (state := state_of(key.decode())) is not None:
                    schedules[partition].append((FeedbackJoiner.due_ms(state, joiner.settings), state.response_id))
            heapq.heapify(schedules[partition])
        return schedules[partition]

    async def send(topic_name: str, event: Event, key: str) -> None:
        with outgoing(topics, codec, settings.app_id, topics.name(topic_name), event, key) as out:
            if topic_name == "joiner-in":
                await joiner_in.send(key=out.key, value=out.value, headers=out.headers, partition=partition_of(key))
            else:
                await outputs[topic_name].send(key=out.key, value=out.value, headers=out.headers)

    async def emit(event: Event, state: FeedbackJoinState | None) -> None:
        with joining_span(event, state):
            if isinstance(event, ScoredRollout):
                await send("scored", event, event.rollout.group_id)
            else:
                await send("drops", event, getattr(event, "group_id", None) or "feedback")

    async def apply(receipt: str, step: JoinStep) -> None:
        for event in step.events:
            await emit(event, step.state)
        partition = partition_of(receipt)
        for source, baseline in step.baselines.items():
            baselines_of(partition)[source] = baseline
            receipts[baseline_key(source, partition)] = codec.encode(baseline, producer=settings.app_id)
        before = state_of(receipt)
        if step.state is None:
            if before is not None:
                receipts.pop(receipt.encode(), None)
                held[receipt] = None
        elif step.state != before:
            held[receipt] = step.state
            receipts[receipt.encode()] = codec.encode(step.state, producer=settings.app_id)
            if partition in schedules:
                heapq.heappush(schedules[partition], (FeedbackJoiner.due_ms(step.state, joiner.settings), receipt))
        for message in step.messages:
            await send("joiner-in", message, message.to)

    async def dead_letter(record: Record, error: Exception | str, stage: str) -> None:
        await send("deadletter", dead_letter_for(record, error, stage=stage, component="feedback-joiner"), record.topic)

    async def decoded(record: Record) -> Event | None:
        """The record's event; None for a tombstone, or one that does not decode (dead-lettered)."""
        if record.value is None:
            return None
        try:
            return codec.decode(record.value).event
        except SchemaError as exc:
            await dead_letter(record, exc, "decode")
            return None

    @app.agent(app.topic(topics.served, topics.feedback, **raw), concurrency=1)
    async def route(stream) -> None:
        async for batch in stream.take_events(settings.batch_records, within=settings.batch_wait_s):
            for event in batch:
                record = record_of(event, topics.served)
                if (incoming := await decoded(record)) is None:
                    continue
                if isinstance(incoming, ResponseServed):
                    receipt: str | None = incoming.response_id
                elif isinstance(incoming, FeedbackReceived):
                    receipt = receipt_of(incoming)
                else:
                    await dead_letter(record, f"a {incoming.type} event does not belong on {record.topic}", "process")
                    continue
                if receipt is None:  # nothing to join: rendered from its messages, or dropped
                    with telemetry.process_span(record.topic, record.partition, record.offset, record.headers,
                                                settings.app_id):
                        assert isinstance(incoming, FeedbackReceived)
                        for out in joiner.on_feedback(None, incoming, {}).events:
                            await emit(out, None)
                    continue
                await joiner_in.send(key=receipt.encode(), value=record.value, headers=list(record.headers),
                                     partition=partition_of(receipt))

    @app.agent(joiner_in, concurrency=1)
    async def join(stream) -> None:
        # faust acks a batch's records after the loop body ran for it: the offsets committed never
        # pass a record whose outputs, messages and table changes were not yet sent
        async for batch in stream.take_events(settings.batch_records, within=settings.batch_wait_s):
            for event in batch:
                record = record_of(event, topics.name("joiner-in"))
                with telemetry.process_span(record.topic, record.partition, record.offset, record.headers,
                                            settings.app_id):
                    await handle(record)

    async def handle(record: Record) -> None:
        if (incoming := await decoded(record)) is None:
            return
        partition = record.partition
        if isinstance(incoming, ScorerTick):
            now, schedule = now_ms(), schedule_of(partition)
            while schedule and schedule[0][0] <= now:
                receipt = heapq.heappop(schedule)[1]
                if (state := state_of(receipt)) is not None:
                    await apply(receipt, joiner.on_tick(state, now=now))
            return
        if isinstance(incoming, ResponseServed):
            receipt = incoming.response_id
            await apply(receipt, joiner.on_served(state_of(receipt), incoming, baselines_of(partition)))
        elif isinstance(incoming, FeedbackReceived) and (receipt := receipt_of(incoming) or "") != "":
            await apply(receipt, joiner.on_feedback(state_of(receipt), incoming, baselines_of(partition)))
        elif isinstance(incoming, PartnerRecord):
            await apply(incoming.to, joiner.on_partner(state_of(incoming.to), incoming, baselines_of(partition)))
        else:
            await dead_letter(record, f"a {incoming.type} event does not belong on {record.topic}", "process")

    add_ticks(app, joiner_in, partitions, settings, codec)
    return app
