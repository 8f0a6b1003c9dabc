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

import logging
from typing import Any

import faust

from rollwire.core import telemetry
from rollwire.core.bus.base import Record
from rollwire.core.bus.events import dead_letter_for, outgoing
from rollwire.core.bus.partitioner import partition_for
from rollwire.core.bus.settings import KafkaBusSettings
from rollwire.schemas.base import Event
from rollwire.schemas.envelope import Codec
from rollwire.schemas.errors import SchemaError
from rollwire.schemas.feedback import FeedbackReceived
from rollwire.schemas.joiner import FeedbackJoinState, SourceBaseline
from rollwire.schemas.scorer import ScorerTick
from rollwire.schemas.serving import ResponseServed
from rollwire.schemas.topics import Topics
from rollwire.streams.faust_app import FaustWorkerSettings, Sink, add_ticks, faust_app, record_of, table_event
from rollwire.streams.feedback_join import FeedbackJoiner, joining_span, receipt_of
from rollwire.streams.host import Output
from rollwire.streams.joiner_host import JoinerHost, baseline_partition

logger = logging.getLogger(__name__)

class ReceiptTable(faust.Table):
    """The `receipts` table: a receipt's state on the partition its records arrive on; a baseline
    on the partition its key names (`joiner_host.baseline_key`)."""

    def partition_for_key(self, key: Any) -> int:
        partition = baseline_partition(key, self.partitions)
        return partition_for(key, self.partitions) if partition is None else partition


class TableReceipts:
    """The receipts and baselines in faust's `receipts` table (`JoinerHost`'s store)."""

    def __init__(self, table: ReceiptTable, codec: Codec) -> None:
        self.table, self.codec = table, codec

    def _stored(self, key: bytes) -> Event | None:
        return table_event(self.table, key, self.codec, "joiner-state")

    def receipt(self, receipt: str) -> FeedbackJoinState | None:
        state = self._stored(receipt.encode())
        return state if isinstance(state, FeedbackJoinState) else None

    def receipts(self, partition: int) -> list[str]:
        return [k.decode() for k in list(self.table.keys())
                if baseline_partition(k, self.table.partitions) is None and self.table.partition_for_key(k) == partition]

    def baselines(self, partition: int) -> dict[str, SourceBaseline]:
        found = {}
        for key in list(self.table.keys()):
            if baseline_partition(key, self.table.partitions) == partition and isinstance(
                    b := self._stored(key), SourceBaseline):
                found[b.source] = b
        return found


def joiner_inputs(topics: Topics) -> list[str]:
    """The topics the joiner's agents read."""
    return [topics.served, topics.feedback, topics.name("joiner-in")]


def build_app(settings: FaustWorkerSettings, joiner: FeedbackJoiner, *, bus: KafkaBusSettings,
              topics: Topics, sink: Sink | None = None) -> faust.App:
    """A faust app with the routing and joining agents (feeding a `JoinerHost`), the tick timer and
    the receipt table (`FaustWorkerSettings`: how a faust worker of rollwire runs, whichever
    processor it is). Outputs go to their Kafka topics, or to `sink` when given (broker-free tests)."""
    codec = Codec()
    app = faust_app(settings, bus)
    raw = {"schema": faust.Schema(key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")}
    partitions = topics.spec(topics.name("joiner-in")).partitions
    state_topic = app.topic(topics.name("joiner-state"), partitions=partitions, internal=False, **raw)
    joiner_in = app.topic(topics.name("joiner-in"), partitions=partitions, internal=False, **raw)
    receipts = app.tables.add(ReceiptTable(app, name="receipts", default=None, partitions=partitions,
                                           changelog_topic=state_topic, beacon=app.tables.beacon, **raw))
    outputs = {name: app.topic(topics.name(name), internal=False, **raw) for name in ("scored", "drops", "deadletter")}
    host = JoinerHost(joiner, partitions, TableReceipts(receipts, codec))

    @app.on_partitions_revoked.connect
    async def forget_decoded(*_args: Any, **_kwargs: Any) -> None:
        host.reset(TableReceipts(receipts, codec))

    async def send(topic_name: str, event: Event, key: str) -> None:
        with outgoing(topics, codec, settings.app_id, topics.name(topic_name), event, key) as out:
            if sink is not None:
                await sink(topics.name(topic_name), out.key, out.value, out.headers)
            elif topic_name == "joiner-in":
                await joiner_in.send(key=out.key, value=out.value, headers=out.headers,
                                     partition=host.partition_of(key))
            else:
                await outputs[topic_name].send(key=out.key, value=out.value, headers=out.headers)

    async def send_all(joined: list[Output]) -> None:
        for out in joined:
            with joining_span(out.event, out.made_by if isinstance(out.made_by, FeedbackJoinState) else None):
                await send(out.topic, out.event, out.key)

    def write_table() -> None:
        """The batch's changes, coalesced, into the table (faust sends each to the changelog)."""
        for key, record in host.writes():
            if record is None:
                receipts.pop(key.encode(), None)
            else:
                receipts[key.encode()] = codec.encode(record, producer=settings.app_id)

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
                        await send_all(host.event(incoming) or [])
                    continue
                await joiner_in.send(key=receipt.encode(), value=record.value, headers=list(record.headers),
                                     partition=host.partition_of(receipt))

    add_ticks(app, joiner_in, partitions, settings, codec)

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
            write_table()

    async def handle(record: Record) -> None:
        if (incoming := await decoded(record)) is None:
            return
        if isinstance(incoming, ScorerTick):
            await send_all(host.tick(partitions=[record.partition]))
            return
        joined = host.event(incoming)
        if joined is None:
            await dead_letter(record, f"a {incoming.type} event does not belong on {record.topic}", "process")
        else:
            await send_all(joined)

    return app
