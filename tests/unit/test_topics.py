"""The topic catalog is complete and consistent (the documentation's topic page is generated from it:
`tests/docs/test_site.py`)."""

from __future__ import annotations

import pytest
from builders import rollout, weights

from rollwire.core.errors import ConfigError
from rollwire.schemas import CATALOG, EVENT_TYPES, Topics


def test_every_event_type_travels_on_exactly_one_topic():
    carried = [e.model_fields["type"].default for spec in CATALOG for e in spec.events]
    assert sorted(carried) == sorted(EVENT_TYPES)


def test_the_weights_topic_is_compacted_and_keyed_by_policy():
    spec = Topics("run1").spec("run1.weights")
    assert spec.cleanup == "compact" and spec.key == "policy name"


def test_an_event_on_the_wrong_topic_is_refused_with_the_allowed_types():
    topics = Topics("run1")
    topics.check(topics.weights, weights())
    with pytest.raises(ConfigError, match="carries weights.published"):
        topics.check(topics.weights, rollout())


def test_invalid_prefixes_say_what_is_allowed():
    with pytest.raises(ConfigError, match="letters, digits"):
        Topics("bad prefix!")

