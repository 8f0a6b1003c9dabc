"""The policy model: loading, device and dtype, and log-probabilities of sampled tokens.

Token fidelity: the trainer scores exactly the token ids the inference server sampled
(`prompt_token_ids + completion_token_ids` of each rollout); nothing is re-tokenized.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from rollwire.core.errors import ConfigError
from rollwire.schemas.rollout import RolloutCompleted, TokenSequence
from rollwire.trainer.settings import ModelSettings


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """No transformers progress bar within: the trainer loads and saves weights on every step and a
    replay once a version, so its bars ("Loading weights", "Writing model shards") bury the output."""
    from transformers.utils import logging as hf_logging
    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            hf_logging.enable_progress_bar()


def save_model(model, folder: Path) -> None:
    """`model.save_pretrained(folder)` in safetensors, quietly."""
    with quiet_transformers():
        model.save_pretrained(folder, safe_serialization=True)


def resolve_device(settings: ModelSettings) -> tuple[torch.device, torch.dtype]:
    cuda = torch.cuda.is_available()
    if settings.device == "cuda" and not cuda:
        raise ConfigError("trainer.model.device = 'cuda' but torch sees no CUDA device; use 'auto' or 'cpu'")
    device = torch.device("cuda" if settings.device == "cuda" or (settings.device == "auto" and cuda) else "cpu")
    if settings.dtype == "auto":
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    else:
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[settings.dtype]
    return device, dtype


def load_policy(settings: ModelSettings, weights: str | None = None):
    """The causal LM at `weights` (default: `settings.path`), on the chosen device, in train mode."""
    from transformers import AutoModelForCausalLM
    device, dtype = resolve_device(settings)
    with quiet_transformers():
        model = AutoModelForCausalLM.from_pretrained(weights or settings.path, dtype=dtype).to(device)  # type: ignore[arg-type]
    if settings.lora is not None:
        try:
            from peft import LoraConfig, get_peft_model
        except ImportError as exc:
            raise ConfigError("trainer.model.lora needs peft: pip install 'rollwire[lora]'") from exc
        model = get_peft_model(model, LoraConfig(r=settings.lora.rank, lora_alpha=settings.lora.alpha,  # type: ignore[arg-type]  # peft takes a float; its annotation says int

                                                 target_modules=settings.lora.target_modules))
    model.train()
    return model


@dataclass
class TokenBatch:
    """Rollouts laid out for one forward pass; completion-aligned tensors are [B, C]."""

    input_ids: torch.Tensor        # [B, L]  prompt + completion, right-padded
    attention_mask: torch.Tensor   # [B, L]
    targets: torch.Tensor          # [B, C]  completion token ids, 0-padded
    gather_from: torch.Tensor      # [B, C]  logit position predicting each completion token
    mask: torch.Tensor             # [B, C]  loss mask (0 on padding)


def layout(rollouts: Sequence[RolloutCompleted | TokenSequence], device: torch.device, pad_id: int = 0) -> TokenBatch:
    """Packs rollouts (or a rollout's other lines) into padded tensors without re-tokenizing anything."""
    lengths = [len(r.prompt_token_ids) + len(r.completion_token_ids) for r in rollouts]
    width, completion = max(lengths), max(len(r.completion_token_ids) for r in rollouts)
    input_ids = torch.full((len(rollouts), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rollouts), width), dtype=torch.long)
    targets = torch.zeros((len(rollouts), completion), dtype=torch.long)
    gather = torch.zeros((len(rollouts), completion), dtype=torch.long)
    mask = torch.zeros((len(rollouts), completion), dtype=torch.float32)
    for i, r in enumerate(rollouts):
        p, c = len(r.prompt_token_ids), len(r.completion_token_ids)
        input_ids[i, : p + c] = torch.tensor(r.prompt_token_ids + r.completion_token_ids)
        attention[i, : p + c] = 1
        targets[i, :c] = torch.tensor(r.completion_token_ids)
        gather[i, :c] = torch.arange(p - 1, p + c - 1)
        mask[i, :c] = torch.tensor(r.loss_mask, dtype=torch.float32)
    return TokenBatch(input_ids.to(device), attention.to(device), targets.to(device), gather.to(device),
                      mask.to(device))


def token_logprobs(model, batch: TokenBatch) -> torch.Tensor:
    """log p(completion token | everything before it), [B, C], in float32. The output layer runs
    only from the first position that predicts a completion token (`logits_to_keep`, where the
    model takes it): with a large vocabulary, the prompts' logits are much of a step's cost."""
    first = int(batch.gather_from[:, 0].min())  # a row's first completion position (0 for an empty one)
    keep = batch.input_ids.size(1) - first
    try:
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, logits_to_keep=keep).logits
    except TypeError:  # a model whose forward does not take it: every position's logits
        logits, first = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits, 0
    positions = (batch.gather_from - first).clamp(min=0)  # padding (gather 0) lands anywhere: it is masked
    picked = torch.gather(logits, 1, positions.unsqueeze(-1).expand(-1, -1, logits.size(-1)))  # [B, C, V]
    logprobs = torch.log_softmax(picked.float(), dim=-1)
    return torch.gather(logprobs, 2, batch.targets.unsqueeze(-1)).squeeze(-1)
