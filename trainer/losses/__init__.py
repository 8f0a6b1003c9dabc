"""Policy losses: one module per loss, registered by name; the training loop never branches on it.

Every loss sees the same token-level tensors, all shaped [B, T] over the completion tokens of a
batch (padding and environment tokens have `mask` 0):

    logprobs          log pi_theta(token), with gradient
    sampler_logprobs  log pi_sampler(token), as the inference server reported it
    advantages        per-token advantage (a sequence advantage repeated over its tokens)
    mask              1.0 for trained tokens

and returns the scalar loss plus detached metrics, each a token mean over the step (`token_mean`), so
a step's micro-batches add up to it. A *pairwise* loss (`pairwise = True`, e.g. `dpo`) trains
preference pairs instead: its rows come in pairs (chosen, then rejected), `sampler_logprobs` are
the reference, and it normalises by the step's pairs (`num_pairs`, `pair_mean`). Normalisation is token-level: the sum over
trained tokens divided by `num_tokens` (the trained tokens of the whole step, so gradient
accumulation over micro-batches adds up to one mean) — the length-unbiased form Dr. GRPO asks for.

Nothing here imports torch when imported (the loss modules use tensor methods), so a recipe's loss
and its parameters are checked (`check`) by processes that never load torch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from rollwire.core.errors import ConfigError
from rollwire.core.registry import Registry, UnknownNameError, closest

if TYPE_CHECKING:
    import torch


@dataclass
class LossInputs:
    """Token-level inputs of a loss, each [B, T]."""

    logprobs: torch.Tensor
    sampler_logprobs: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    num_tokens: int
    """Trained tokens in the whole optimizer step (the normaliser)."""
    num_pairs: int = 0
    """Preference pairs in the whole optimizer step (a pairwise loss's normaliser)."""


class Loss(ABC):
    """A policy loss."""

    name: ClassVar[str]
    pairwise: ClassVar[bool] = False
    """Trains preference pairs (rows: chosen, rejected, chosen, ...) rather than scored tokens."""

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


LOSSES: Registry[type[Loss]] = Registry("loss", package=__name__)


def register(cls: type[Loss]) -> type[Loss]:
    return LOSSES.add(cls.name, cls)


def check(name: str, params: Mapping[str, float], *, pairwise: bool = False) -> None:
    """Raises `ConfigError` naming the fix when `name` is not a loss of the kind asked for (token
    losses, or `pairwise` ones for preference pairs) or `params` not its parameters (without torch:
    loss modules import it only when they run)."""
    of_kind = [n for n in LOSSES.names() if LOSSES.get(n).pairwise == pairwise]
    if name not in of_kind:
        if name in LOSSES.names():
            trains = "scored tokens" if pairwise else "preference pairs"
            raise ConfigError(f"loss {name!r} trains {trains}; here it takes one of: {', '.join(sorted(of_kind))}")
        raise UnknownNameError("preference loss" if pairwise else "loss", name, of_kind)
    loss = LOSSES.get(name)
    unknown = sorted(set(params) - set(loss.defaults()))
    if unknown:
        hint = "".join(f" (did you mean {m!r}?)" for m in [closest(unknown[0], loss.defaults())] if m)
        raise ConfigError(f"loss {name!r} has no parameter {unknown[0]!r}{hint}; it takes "
                          f"{', '.join(loss.defaults()) or 'none'}")


def build(name: str, **params: float) -> Loss:
    """The loss registered as `name`, configured with `params`."""
    check(name, params, pairwise=LOSSES.get(name).pairwise)
    return LOSSES.get(name)(**params)


def token_mean(values: torch.Tensor, x: LossInputs) -> torch.Tensor:
    """Sum of `values` over trained tokens divided by the step's trained tokens."""
    return (values * x.mask).sum() / max(1, x.num_tokens)


def pair_mean(values: torch.Tensor, x: LossInputs) -> torch.Tensor:
    """Sum of `values` (one per pair) divided by the step's preference pairs."""
    return values.sum() / max(1, x.num_pairs)
