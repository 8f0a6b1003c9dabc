"""A tiny policy to train (synthetic scored rollouts on its vocabulary: `builders.trainable`)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_policy(tmp_path_factory):
    from rollwire.trainer.tiny import build_char_tokenizer, build_tiny_model
    return build_tiny_model(tmp_path_factory.mktemp("policy") / "base", build_char_tokenizer(), seed=0)
