"""Steps per second of `replay train`, against the bare optimizer step on the same batches.

    python bench/replay_train.py [--steps N] [--batch K] [--hidden H] [--layers L]

A tiny Llama (the demo's shape by default) is trained for N steps by the live trainer on
generated scored rollouts (embedded log, local store, a checkpoint and a published version every
step); `replay train` then retrains all N from the starting weights over the recorded events.
The baseline is the limit the work could reach: `train_step` alone on the same batches, with no
log, checkpoint or publishing. Both the live trainer and the replay are printed as a ratio of
it. The replay also checks it reproduced every version byte for byte. The last line is
`RESULT ...`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="trainer steps (default %(default)s)")
    parser.add_argument("--batch", type=int, default=32, help="rollouts per step (default %(default)s)")
    parser.add_argument("--hidden", type=int, default=128, help="model width (default %(default)s)")
    parser.add_argument("--layers", type=int, default=2, help="model layers (default %(default)s)")
    args = parser.parse_args()

    import torch
    from builders import trainable

    from rollwire.core.bus import EventProducer, catalog_topics
    from rollwire.core.bus.embedded import EmbeddedLog
    from rollwire.core.objectstore import LocalStore
    from rollwire.schemas import Topics
    from rollwire.trainer import losses, replay
    from rollwire.trainer.loop import Trainer, TrainerSettings
    from rollwire.trainer.model import ModelSettings, load_policy
    from rollwire.trainer.step import train_step
    from rollwire.trainer.tiny import build_char_tokenizer, build_tiny_model

    torch.set_num_threads(1)  # as `rollwire run`'s trainer (trainer_threads = 1)
    work = Path(tempfile.mkdtemp(prefix="bench-replay-train-"))
    base = build_tiny_model(work / "base", build_char_tokenizer(), hidden=args.hidden, layers=args.layers,
                            intermediate=2 * args.hidden)
    settings = TrainerSettings(model=ModelSettings(path=str(base)), checkpoint_dir=work / "ckpt",
                               keep_checkpoints=2, batch={"batch_rollouts": args.batch, "max_off_policy": args.steps})
    batches = [[trainable(s * args.batch + i, version=s // 2, advantage=1.0 if i % 3 else -1.5)
                for i in range(args.batch)] for s in range(args.steps)]
    log, live, store = EmbeddedLog(work / "log"), Topics("bench"), LocalStore(work / "store")
    log.create_topics(catalog_topics(live))
    producer = EventProducer(log.producer(), live, name="bench")
    for batch in batches:
        for s in batch:
            producer.send(live.scored, s, key=s.rollout.group_id)
    producer.close()

    torch.manual_seed(0)
    model = load_policy(settings.model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    loss = losses.build(settings.loss, **settings.loss_params)
    t0 = time.perf_counter()
    for batch in batches:
        train_step(model, optimizer, loss, batch, micro_batch=settings.micro_batch_rollouts,
                   max_grad_norm=settings.max_grad_norm, device=torch.device("cpu"))
    bare = args.steps / (time.perf_counter() - t0)

    trainer = Trainer(log, live, store, settings)
    t0 = time.perf_counter()
    trainer.run(max_steps=args.steps, idle_exit_s=10)
    live_sps = trainer.state.step / (time.perf_counter() - t0)
    trainer.close()

    t0 = time.perf_counter()
    result = replay.train_into(log, live, live, Topics("bench-again"), store, settings, from_step=0)
    replay_sps = args.steps / (time.perf_counter() - t0)
    assert result.reproduced and len(result.compared) == args.steps, replay.report_markdown(result)

    print(f"{args.steps} steps of {args.batch} rollouts, hidden {args.hidden}, {args.layers} layers, 1 thread")
    print(f"{'':<28} {'steps/s':>8} {'vs bare':>8}")
    for label, value in (("bare train_step (baseline)", bare), ("live trainer", live_sps), ("replay train", replay_sps)):
        print(f"{label:<28} {value:8.2f} {value / bare:8.2f}")
    print(f"RESULT bare_sps={bare:.3g} live_sps={live_sps:.3g} replay_sps={replay_sps:.3g} "
          f"live_vs_bare={live_sps / bare:.3g} replay_vs_bare={replay_sps / bare:.3g} "
          f"replay_vs_live={replay_sps / live_sps:.3g}")


if __name__ == "__main__":
    main()
