"""Policy losses: one module per loss, registered by name; the training loop never branches on it.

Every loss sees the same token-level tensors, all shaped [B, T] over the completion tokens of a
batch (padding and environment tokens have `mask` 0):

    logprobs          log pi_theta(token), with gradient
    sampler_logprobs  log pi_sampler(token), as the inference server reported it
    advantages        per-token advantage (a sequence advantage repeated over its tokens)
    mask              1.0 for trained tokens

and returns the scalar loss plus detached metrics. Normalisation is token-level: the sum over
trained tokens divided by `num_tokens` (the trained tokens of the whole step, so gradient
accumulation over micro-batches adds up to one mean) — the length-unbiased form Dr. GRPO asks for.
"""

from __future__ import annotations

import importlib
import pkgutil
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch

from rollwire.errors import ConfigError


@dataclass
class LossInputs:
    """Token-level inputs of a loss, each [B, T]."""

    logprobs: torch.Tensor
    sampler_logprobs: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    num_tokens: int
    """Trained tokens in the whole optimizer step (the normaliser)."""


class Loss(ABC):
    """A policy loss."""

    name: ClassVar[str]

    def __init__(self, **params: float) -> None:
        unknown = set(params) - set(self.defaults())
        if unknown:
            raise ConfigError(f"loss {self.name!r} has no parameters {sorted(unknown)}; it takes {self.defaults()}")
        self.params = {**self.defaults(), **params}

    @classmethod
    def defaults(cls) -> dict[str, float]:
        return {}

    @abstractmethod
    def __call__(self, x: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        """The scalar loss and metrics."""


_REGISTRY: dict[str, type[Loss]] = {}


def register(cls: type[Loss]) -> type[Loss]:
    _REGISTRY[cls.name] = cls
    return cls


def build(name: str, **params: float) -> Loss:
    """The loss registered as `name`, configured with `params`."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    if name not in _REGISTRY:
        raise ConfigError(f"unknown loss {name!r}; known: {', '.join(sorted(_REGISTRY))} (set trainer.loss)")
    return _REGISTRY[name](**params)


def token_mean(values: torch.Tensor, x: LossInputs) -> torch.Tensor:
    """Sum of `values` over trained tokens divided by the step's trained tokens."""
    return (values * x.mask).sum() / max(1, x.num_tokens)
