"""One real vLLM server per test session, serving a tiny model built here; nothing is downloaded.

Tests share the server but own their weight versions, topics, stores and subscribers."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollwire.consumers.vllm_server import VllmServer, VllmServerSettings

JSON_CHARACTERS = '{}[]"_<#\\'
"""Characters the demo's alphabet lacks and tool schemas and calls need (`<tool_call>{"name": ...}`,
escapes such as a command's `\\n`)."""


class TinyModels:
    """Builds weight versions of one tiny architecture (and one that does not fit)."""

    def __init__(self, root: Path) -> None:
        from rollwire.trainer.tiny import ALPHABET, build_char_tokenizer, build_tiny_model
        self.root, self._build = root, build_tiny_model
        self.tokenizer = build_char_tokenizer(ALPHABET + JSON_CHARACTERS)
        self.base = self.version(seed=0)

    def version(self, seed: int, **overrides) -> Path:
        path = self.root / f"seed{seed}-{'-'.join(f'{k}{v}' for k, v in sorted(overrides.items()))}"
        if not path.exists():
            self._build(path, self.tokenizer, seed=seed, initializer_range=0.5, **overrides)
        return path


    def overfitted(self, path: Path, conversations: list[list[dict]] | None = None, *, seed: int, max_loss: float,
                   sequences: list[list[int]] | None = None) -> Path:
        """A model of this architecture trained on `conversations` (chat messages), or on token id
        `sequences` as a server rendered them, until greedy decoding says their assistant turns: a
        stand-in for a model that really calls a tool or really grades, built in seconds."""
        import torch
        from transformers import AutoModelForCausalLM

        from rollwire.trainer.tiny import build_tiny_model
        build_tiny_model(path, self.tokenizer, seed=seed)  # the served architecture; weights trained below
        model = AutoModelForCausalLM.from_pretrained(path)
        sequences = sequences or [self.tokenizer.apply_chat_template(c, tokenize=True)["input_ids"]
                                  for c in conversations or []]
        batch = [torch.tensor([ids]) for ids in sequences]
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        for _ in range(300):
            loss = sum(model(input_ids=ids, labels=ids).loss for ids in batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        assert loss.item() < max_loss, loss.item()
        model.save_pretrained(path, safe_serialization=True)
        return path


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> TinyModels:
    return TinyModels(tmp_path_factory.mktemp("tiny-models"))


@pytest.fixture(scope="session")
def vllm_server(tiny_models, tmp_path_factory) -> Iterator[VllmServer]:
    log_path = tmp_path_factory.mktemp("vllm") / "server.log"
    server = VllmServer(VllmServerSettings(model=str(tiny_models.base), dtype="float32", max_model_len=2048,
                                           enable_lora=True, max_lora_rank=8, log_path=log_path))
    server.start()  # a failure here fails the vllm tests with the server's log; never a skip
    yield server
    server.stop()


@pytest.fixture
def version_base() -> int:
    """A version number no other test uses (tests share one server and its version labels)."""
    return random.randrange(1, 10**6) * 100

