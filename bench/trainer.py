"""Trainer throughput: tokens per second of a step, and the share of step time spent waiting.

    python bench/trainer.py [--hidden 256] [--layers 4] [--steps 8] [--batch 32]

Scored rollouts for every step are published to an embedded log first; then the full trainer
(batch consumer, step, checkpoint, weight publishing, events) runs `--steps` steps on the
available device. The baseline, in the same run, is `train_step` alone on the same batches
already in memory: no log, no checkpoint, no publishing. Prints both rates, their ratio and where
the trainer's time went. The last line is `RESULT name=value ...`.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def scored_rollouts(n: int, vocab: int, seed: int = 0, *, prompt_tokens: int = 24,
                    completion_tokens: tuple[int, int] = (48, 96)):
    """`n` scored rollouts of random tokens in groups of 8: a prompt of 1 + `prompt_tokens`, a
    completion of `completion_tokens` (low, high: drawn from that range), half of them rewarded."""
    from rollwire.schemas import RolloutCompleted, ScoredRollout, WeightVersionSpan
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = [1] + [rng.randrange(5, vocab) for _ in range(prompt_tokens)]
        completion = [rng.randrange(5, vocab) for _ in range(rng.randrange(*completion_tokens))]
        rollout = RolloutCompleted(
            rollout_id=f"r{i}", group_id=f"g{i // 8}", task_id="t", environment="bench", algorithm="grpo",
            group_size=8, sample_index=i % 8, prompt_token_ids=prompt, completion_token_ids=completion,
            completion_logprobs=[-3.0] * len(completion), loss_mask=[1] * len(completion),
            weight_versions=[WeightVersionSpan(version=10**6, start=0, end=len(completion))], rewards={"r": 1.0},
            reward=float(i % 2))
        out.append(ScoredRollout(rollout=rollout, algorithm="grpo", reward=float(i % 2),
                                 advantage=1.0 if i % 2 else -1.0))
    return out


def trainer_on_log(work: Path, rollouts, model_settings, *, batch_rollouts: int, **settings):
    """A `Trainer` on an embedded log in `work` that already holds `rollouts` on its scored topic,
    its store and checkpoints in `work` too; `settings` are more `TrainerSettings`."""
    from rollwire.core.bus import EmbeddedBusSettings, EventProducer, catalog_topics, open_log
    from rollwire.core.objectstore import LocalStore
    from rollwire.schemas import Topics
    from rollwire.trainer.loop import Trainer, TrainerSettings
    topics = Topics("bench")
    log = open_log(EmbeddedBusSettings(path=work / "log"))
    log.create_topics(catalog_topics(topics))
    producer = EventProducer(log.producer(), topics, name="bench")
    for s in rollouts:
        producer.send(topics.scored, s, key=s.rollout.group_id)
    producer.close()
    return Trainer(log, topics, LocalStore(work / "store"),
                   TrainerSettings(model=model_settings, checkpoint_dir=work / "ckpt",
                                   batch={"batch_rollouts": batch_rollouts, "max_off_policy": 10**6}, **settings))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32, help="rollouts per step")
    args = parser.parse_args()

    import torch

    from rollwire.trainer import losses
    from rollwire.trainer.model import ModelSettings, load_policy, resolve_device
    from rollwire.trainer.step import train_step
    from rollwire.trainer.tiny import build_char_tokenizer, build_tiny_model

    work = Path(tempfile.mkdtemp(prefix="bench-trainer-"))
    tokenizer = build_char_tokenizer()
    base = build_tiny_model(work / "base", tokenizer, hidden=args.hidden, layers=args.layers,
                            intermediate=4 * args.hidden, heads=max(4, args.hidden // 64), kv_heads=2)
    model_settings = ModelSettings(path=str(base))
    device, dtype = resolve_device(model_settings)
    rollouts = scored_rollouts(args.steps * args.batch, len(tokenizer))
    batches = [rollouts[i: i + args.batch] for i in range(0, len(rollouts), args.batch)]
    tokens = sum(sum(s.rollout.loss_mask) for s in rollouts)
    print(f"device {device} ({dtype}), hidden {args.hidden}, {args.layers} layers; {args.steps} steps of "
          f"{args.batch} rollouts, {tokens / args.steps:.0f} trained tokens per step")

    model = load_policy(model_settings)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loss = losses.build("ppo_clip")
    train_step(model, optimizer, loss, batches[0], micro_batch=16, max_grad_norm=1.0, device=device)  # warm-up
    t0 = time.perf_counter()
    for batch in batches:
        train_step(model, optimizer, loss, batch, micro_batch=16, max_grad_norm=1.0, device=device)
    baseline = tokens / (time.perf_counter() - t0)

    trainer = trainer_on_log(work, rollouts, model_settings, batch_rollouts=args.batch, micro_batch_rollouts=16)
    waits, total = 0.0, 0.0
    original = trainer.consumer.next_batch

    def timed_next_batch(*a, **kw):
        nonlocal waits
        started = time.perf_counter()
        try:
            return original(*a, **kw)
        finally:
            waits += time.perf_counter() - started

    trainer.consumer.next_batch = timed_next_batch
    step_times = []
    t0 = time.perf_counter()
    while trainer.state.step < args.steps:
        started = time.perf_counter()
        event = trainer.step(timeout_s=5)
        if event is not None:
            step_times.append((time.perf_counter() - started, event.tokens_per_s))
    total = time.perf_counter() - t0
    trainer.close()
    full = tokens / total
    compute = sum(tps for _, tps in step_times) / len(step_times)
    print(f"{'':<34} {'tokens/s':>10} {'vs baseline':>12}")
    print(f"{'train_step alone (baseline)':<34} {baseline:10,.0f} {1.0:12.2f}")
    print(f"{'trainer, optimizer part':<34} {compute:10,.0f} {compute / baseline:12.2f}")
    print(f"{'trainer, whole step (end to end)':<34} {full:10,.0f} {full / baseline:12.2f}")
    print(f"time waiting for batches: {waits / total:.1%} of {total:.1f} s; the rest is the optimizer step, "
          f"the checkpoint, weight publishing and events")
    print(f"RESULT device={device.type} tokens_per_s={full:.4g} baseline_tokens_per_s={baseline:.4g} "
          f"ratio_vs_baseline={full / baseline:.3g} wait_fraction={waits / total:.3g}")


if __name__ == "__main__":
    sys.exit(main())
