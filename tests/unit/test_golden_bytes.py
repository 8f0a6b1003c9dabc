"""Bytes written by earlier versions of rollwire keep decoding (see tests/golden/generate.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from builders import ALL

from rollwire.schemas import EVENT_TYPES, Codec

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
FILES = sorted(GOLDEN.glob("v*/*.msgpack"))


@pytest.mark.parametrize("path", FILES, ids=[f"{p.parent.name}/{p.stem}" for p in FILES])
def test_golden_bytes_still_decode_to_the_same_fields(path: Path):
    envelope = Codec().decode(path.read_bytes())
    expected = json.loads(path.with_suffix(".json").read_text())
    assert _known_fields(envelope.event.model_dump(mode="json"), expected) == expected
    assert envelope.event_id == f"golden-{path.stem}"


def _known_fields(now, expected):
    """`now` restricted to the fields `expected` has, at every depth: fields added later (with
    defaults) may appear, every old field must keep its value."""
    if isinstance(expected, dict) and isinstance(now, dict):
        return {k: _known_fields(now.get(k), v) for k, v in expected.items()}
    if isinstance(expected, list) and isinstance(now, list) and len(now) == len(expected):
        return [_known_fields(n, e) for n, e in zip(now, expected)]
    return now


def test_every_event_type_has_golden_bytes_in_the_newest_generation():
    newest = max(GOLDEN.glob("v*"), key=lambda p: int(p.name[1:]))
    assert {p.stem for p in newest.glob("*.msgpack")} == set(EVENT_TYPES) == set(ALL)
