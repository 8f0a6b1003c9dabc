"""Trace context crosses the log: a consumer's process span is the child of the producer's span."""

from __future__ import annotations

import time

from builders import rollout
from opentelemetry.trace import SpanKind

from rollwire.core import telemetry
from rollwire.core.bus import DeadLetters, EventConsumer, EventProducer, catalog_topics


def test_traceparent_travels_in_headers_and_links_consumer_to_producer(log, topics, group_id, spans):
    log.create_topics(catalog_topics(topics))
    producer = EventProducer(log.producer(), topics, name="env-worker")
    with telemetry.tracer().start_as_current_span("rollout") as root:
        producer.send(topics.rollouts, rollout(), key="group-1")
    producer.flush()

    consumer = EventConsumer(log.consumer([topics.rollouts], group_id),
                             DeadLetters(EventProducer(log.producer(), topics, name="s"), "scorer"), group=group_id)
    delivery = None
    deadline = time.monotonic() + 30
    while delivery is None and time.monotonic() < deadline:
        delivery = consumer.poll(0.5)
    with consumer.process_span(delivery):
        pass
    consumer.close()

    send = next(s for s in spans.get_finished_spans() if s.name == f"send {topics.rollouts}")
    process = next(s for s in spans.get_finished_spans() if s.name == f"process {topics.rollouts}")
    header = delivery.record.header("traceparent").decode()
    assert header.startswith(f"00-{send.context.trace_id:032x}-{send.context.span_id:016x}-")
    assert delivery.envelope.traceparent == header
    assert send.parent.span_id == root.get_span_context().span_id and send.kind == SpanKind.PRODUCER
    assert process.parent.span_id == send.context.span_id and process.kind == SpanKind.CONSUMER
    assert process.context.trace_id == root.get_span_context().trace_id
    assert send.attributes["messaging.destination.name"] == topics.rollouts
    assert send.attributes["messaging.kafka.message.key"] == "group-1"
    assert process.attributes["messaging.consumer.group.name"] == group_id
    assert process.attributes["messaging.kafka.offset"] == delivery.record.offset
    assert process.attributes["messaging.message.id"] == delivery.envelope.event_id

    links = telemetry.links_for([delivery.record.headers])
    assert [link.context.span_id for link in links] == [send.context.span_id]
