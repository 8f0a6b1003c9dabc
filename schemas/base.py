"""The base every event model shares, and small field types used across events."""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING, ClassVar

from pydantic import BaseModel, ConfigDict, Field


def new_id() -> str:
    """A fresh random identifier (32 lowercase hex digits). Not secret, so from `random` (which
    reseeds in a forked child) rather than `os.urandom`: one system call per event cost more
    than encoding the event."""
    return f"{random.getrandbits(128):032x}"


def now_ms() -> int:
    """Wall-clock time in integer milliseconds since the Unix epoch."""
    return time.time_ns() // 1_000_000


class Event(BaseModel):
    """An immutable fact on the event log.

    Subclasses declare `type: Literal["area.fact"]` (the tag the envelope carries) and
    `SCHEMA_VERSION`. A field added later gets a default, so bytes written today keep decoding;
    a change an older reader cannot understand bumps `SCHEMA_VERSION`, and `upgrade` turns older
    payloads into the current shape.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True,
                              ser_json_bytes="base64", val_json_bytes="base64")

    SCHEMA_VERSION: ClassVar[int] = 1
    if TYPE_CHECKING:
        type: str  # each subclass declares its own `Literal` tag as a field

    @classmethod
    def upgrade(cls, payload: dict, from_version: int) -> dict:
        """Returns `payload`, written at `from_version` < SCHEMA_VERSION, in today's shape."""
        return payload


class Part(BaseModel):
    """A value object nested inside events: immutable, strict, documented field by field."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True,
                              ser_json_bytes="base64", val_json_bytes="base64")


class BlobPointer(Part):
    """A payload too large for a message, stored in the object store and referenced here."""

    uri: str
    """Object-store URI, e.g. `s3://bucket/traces/<id>.msgpack` or `file:///abs/path`."""
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    """Hex sha256 of the stored bytes; readers verify it before use."""
    size_bytes: int = Field(ge=0)
    """Size of the stored bytes."""
    media_type: str = "application/octet-stream"
    """MIME type of the stored bytes."""
