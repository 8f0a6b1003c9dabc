"""The same trainer code on CUDA: bf16 chosen by `dtype = auto`, one step that learns.

These run wherever torch sees a CUDA device and are skipped elsewhere (the development and CI
machines have none); the skip says so, and no other test depends on them."""

from __future__ import annotations

import pytest
import torch
from builders import trainable as scored

from rollwire.trainer import losses
from rollwire.trainer.model import ModelSettings, load_policy, resolve_device
from rollwire.trainer.step import train_step

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")


@needs_cuda
def test_auto_settings_pick_cuda_and_bfloat16():
    assert resolve_device(ModelSettings(path="x")) == (torch.device("cuda"), torch.bfloat16)


@needs_cuda
def test_a_bf16_step_on_cuda_changes_the_weights_and_stays_finite(tiny_policy):
    model = load_policy(ModelSettings(path=str(tiny_policy)))
    assert next(model.parameters()).is_cuda and next(model.parameters()).dtype == torch.bfloat16
    before = [p.detach().clone() for p in model.parameters()]
    result = train_step(model, torch.optim.AdamW(model.parameters(), lr=1e-3), losses.build("ppo_clip"),
                        [scored(i) for i in range(8)], micro_batch=4, max_grad_norm=1.0, device=torch.device("cuda"))
    assert result.skipped_reason is None and result.grad_norm > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_asking_for_cuda_without_it_names_the_fix():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from rollwire.core.errors import ConfigError
    with pytest.raises(ConfigError, match="use 'auto' or 'cpu'"):
        resolve_device(ModelSettings(path="x", device="cuda"))
