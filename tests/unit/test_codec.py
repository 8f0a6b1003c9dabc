"""The envelope codec: round trips, and a typed error that says what to do for each bad input."""

from __future__ import annotations

import math

import msgpack
import pytest
from builders import ALL, rollout, scored

from rollwire.schemas import (
    Codec,
    CorruptEventError,
    EventTooLargeError,
    InvalidEventError,
    RolloutCompleted,
    SchemaVersionTooNewError,
    UnknownEventTypeError,
)


@pytest.mark.parametrize("tag", sorted(ALL))
def test_every_event_type_round_trips_with_its_envelope(tag):
    codec = Codec()
    data = codec.encode(ALL[tag], producer="test/1", traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01")
    envelope = codec.decode(data)
    assert envelope.event == ALL[tag]
    assert envelope.type == tag
    assert envelope.producer == "test/1"
    assert envelope.traceparent.startswith("00-111")
    assert len(envelope.event_id) == 32


def envelope_bytes(**overrides) -> bytes:
    fields = {"type": "rollout.completed", "schema_version": 1, "event_id": "e" * 32,
              "produced_at_ms": 0, "producer": "p", "traceparent": None,
              "payload": rollout().model_dump(), **overrides}
    return msgpack.packb(fields, use_bin_type=True)


@pytest.mark.parametrize("data, error, advice", [
    (b"\xc1\xc1 not msgpack", CorruptEventError, "not written by a rollwire producer"),
    (b"\x93\x01\x02\x03", CorruptEventError, "envelope lacks"),
    (envelope_bytes()[:-7], CorruptEventError, "truncated"),
    (envelope_bytes(type="rollout.teleported"), UnknownEventTypeError, "upgrade this consumer"),
    (envelope_bytes(schema_version=99), SchemaVersionTooNewError, "upgrade rollwire"),
    (envelope_bytes(payload={"group_id": "g"}), InvalidEventError, "task_id: Field required"),
    (envelope_bytes(payload={**rollout().model_dump(), "group_size": "four"}), InvalidEventError, "group_size"),
    (envelope_bytes(payload={**rollout().model_dump(), "loss_mask": [1]}), InvalidEventError,
     "one entry per completion token"),
], ids=["garbage", "not-a-map", "truncated", "unknown-type", "newer-version", "missing-fields",
        "ill-typed", "misaligned"])
def test_bad_bytes_raise_a_typed_error_that_says_what_to_do(data, error, advice):
    with pytest.raises(error, match=advice):
        Codec().decode(data)


def test_events_over_the_size_limit_are_refused_on_both_sides():
    big = rollout(completion_token_ids=list(range(2000)), completion_logprobs=[-1.0] * 2000, loss_mask=[1] * 2000,
                  weight_versions=[])
    with pytest.raises(EventTooLargeError, match="BlobPointer"):
        Codec(max_event_bytes=4096).encode(big, producer="p")
    data = Codec().encode(big, producer="p")
    with pytest.raises(EventTooLargeError, match="max_event_bytes"):
        Codec(max_event_bytes=4096).decode(data)


def test_models_reject_values_the_trainer_could_not_use():
    with pytest.raises(ValueError, match="finite"):
        scored(advantage=math.nan)
    with pytest.raises(ValueError, match="exactly one"):
        scored(token_advantages=[0.1] * 6)
    with pytest.raises(ValueError, match="outside"):
        rollout(weight_versions=[{"version": 1, "start": 0, "end": 99}])
    with pytest.raises(ValueError, match="sample_index"):
        rollout(sample_index=4)


def test_extra_fields_are_refused_rather_than_silently_dropped():
    with pytest.raises(ValueError, match="Extra inputs"):
        RolloutCompleted.model_validate({**rollout().model_dump(), "surprise": 1})


def test_a_payload_from_an_older_schema_version_is_upgraded_before_validation(monkeypatch):
    def upgrade(cls, payload, from_version):
        payload = dict(payload)
        payload["environment"] = payload.pop("env")
        return payload
    monkeypatch.setattr(RolloutCompleted, "SCHEMA_VERSION", 2)
    monkeypatch.setattr(RolloutCompleted, "upgrade", classmethod(upgrade))
    old = rollout().model_dump()
    old["env"] = old.pop("environment")
    assert Codec().decode(envelope_bytes(payload=old)).event.environment == "reverse-digits"
