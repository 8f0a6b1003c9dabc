"""The envelope codec under hostile bytes (property-based, hypothesis): random, truncated and
mutated records always fail with a typed `SchemaError`, never another exception, and every event
that decodes encodes back to the same bytes."""

from __future__ import annotations

import msgpack
from builders import ALL
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollwire.schemas import Codec, SchemaError

CODEC = Codec()
GOOD = {tag: CODEC.encode(event, producer="fuzz", event_id=f"fuzz-{tag}", produced_at_ms=1_790_000_000_000)
        for tag, event in ALL.items()}
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def decodes_or_refuses(data: bytes):
    """The decoded envelope, or None for a `SchemaError`; any other exception fails the test."""
    try:
        return CODEC.decode(data)
    except SchemaError:
        return None


@FUZZ
@given(st.binary(max_size=4096))
def test_random_bytes_give_a_typed_error(data):
    decodes_or_refuses(data)


@FUZZ
@given(st.sampled_from(sorted(GOOD)), st.data())
def test_truncated_records_give_a_typed_error(tag, data):
    good = GOOD[tag]
    cut = data.draw(st.integers(min_value=0, max_value=len(good) - 1))
    assert decodes_or_refuses(good[:cut]) is None


@FUZZ
@given(st.sampled_from(sorted(GOOD)), st.data())
def test_mutated_records_decode_to_valid_events_or_give_a_typed_error(tag, data):
    record = bytearray(GOOD[tag])
    for _ in range(data.draw(st.integers(min_value=1, max_value=8))):
        at = data.draw(st.integers(min_value=0, max_value=len(record) - 1))
        record[at] = data.draw(st.integers(min_value=0, max_value=255))
    envelope = decodes_or_refuses(bytes(record))
    if envelope is not None:  # a mutation the schema allows: the event is valid and round-trips
        again = CODEC.encode(envelope.event, producer=envelope.producer, event_id=envelope.event_id,
                             traceparent=envelope.traceparent, produced_at_ms=envelope.produced_at_ms)
        assert CODEC.decode(again).event == envelope.event


envelope_values = st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() | st.text(max_size=20)
                               | st.binary(max_size=20),
                               lambda children: st.lists(children, max_size=4)
                               | st.dictionaries(st.text(max_size=10), children, max_size=4), max_leaves=20)


@FUZZ
@given(st.sampled_from(sorted(GOOD)), st.sampled_from(["type", "schema_version", "event_id", "produced_at_ms",
                                                        "producer", "traceparent", "payload"]), envelope_values)
def test_envelopes_with_any_field_of_any_type_give_a_typed_error_or_a_valid_event(tag, field, value):
    envelope = msgpack.unpackb(GOOD[tag], raw=False)
    envelope[field] = value
    decodes_or_refuses(msgpack.packb(envelope, use_bin_type=True))


@FUZZ
@given(st.sampled_from(sorted(GOOD)), st.data())
def test_payload_fields_of_any_type_give_a_typed_error_or_a_valid_event(tag, data):
    envelope = msgpack.unpackb(GOOD[tag], raw=False)
    field = data.draw(st.sampled_from(sorted(envelope["payload"])))
    envelope["payload"][field] = data.draw(envelope_values)
    decodes_or_refuses(msgpack.packb(envelope, use_bin_type=True))


def test_every_event_type_re_encodes_to_the_same_bytes():
    for tag, data in GOOD.items():
        envelope = CODEC.decode(data)
        assert CODEC.encode(envelope.event, producer=envelope.producer, event_id=envelope.event_id,
                            traceparent=envelope.traceparent, produced_at_ms=envelope.produced_at_ms) == data, tag
