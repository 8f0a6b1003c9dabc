"""Supervised warm start from a taskset's scripted teacher, before RL.

    for each step:   rows -> prompt ids + teacher answer ids + eos  (the model's own tokenizer)
                     cross-entropy on the answer tokens only -> AdamW step
    at the end:      save model and tokenizer in place (they become the policy's version 0)

A tiny random model earns no reward at all, so RL has no signal to start from
(docs/notes/learning.md). A short warm start on a deliberately noisy teacher gives a policy that is
right when greedy but often wrong when sampling — room that RL then fills.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from pathlib import Path

import torch

from rollwire.producers.tasksets import Taskset
from rollwire.trainer.model import save_model
from rollwire.trainer.settings import WarmStartSettings


def warm_start(model_dir: Path, taskset: Taskset, settings: WarmStartSettings,
               on_step: Callable[[int, float], None] | None = None) -> float:
    """Trains the model saved at `model_dir` on `taskset.demonstration` and saves it back; returns the last loss."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    torch.manual_seed(settings.seed)
    rng = random.Random(settings.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr)
    rows = itertools.cycle(taskset.rows())
    loss_value = float("nan")
    for step in range(1, settings.steps + 1):
        input_ids, attention, labels = _examples(tokenizer, taskset, [next(rows) for _ in range(settings.batch)], rng)
        loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss_value = loss.item()
        if on_step is not None:
            on_step(step, loss_value)
    save_model(model, model_dir)
    return loss_value


def _examples(tokenizer, taskset: Taskset, rows: list[dict], rng: random.Random) -> tuple[torch.Tensor, ...]:
    """Right-padded [B, L] input ids, attention mask and labels (-100 on the prompt and the padding)."""
    sequences = []
    for row in rows:
        prompt = tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]
        answer = tokenizer(taskset.demonstration(row, rng), add_special_tokens=False)["input_ids"]
        sequences.append((prompt, answer + [tokenizer.eos_token_id]))
    width = max(len(p) + len(a) for p, a in sequences)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (prompt, answer) in enumerate(sequences):
        input_ids[i, : len(prompt) + len(answer)] = torch.tensor(prompt + answer)
        attention[i, : len(prompt) + len(answer)] = 1
        labels[i, len(prompt): len(prompt) + len(answer)] = torch.tensor(answer)
    return input_ids, attention, labels
