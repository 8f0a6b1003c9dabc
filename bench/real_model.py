"""Where the time goes with a real pretrained model: SmolLM2-135M-Instruct (30 layers, tied
embeddings, 49,152-token vocabulary; 538 MB of float32 safetensors), each part against the limit
the same work could reach on this machine, measured in the same run.

    python bench/real_model.py [--steps 3] [--batch 32] [--trials 5] [--threads 2]

- trainer step: rollwire's trainer end to end (scored rollouts read from the embedded log, the
  step, the checkpoint with the optimizer state, the weights published, the events) and its
  `train_step` alone, against the bare step: one padded forward of the decoder, the output layer
  at the completion positions only, the policy-gradient loss, backward, clipping and AdamW in plain
  torch on the same tokens (tokens trained per second).
- reload: a version published to the store until the replica serves it (the subscriber's
  download, verification and vLLM's in-place swap), against the plain client downloading and
  loading the same bytes (`bench/reload.py`'s measurement, on this model).
- vLLM throughput: `--batch` sequences of 24 tokens sampled at once (tokens per second), against
  the model's bare decode step in torch: one forward of `--batch` single tokens, every weight read
  once, which a decode step cannot do with less.

The rollouts are shaped like the real-model recipe's (recipes/smollm2-135m-arithmetic.toml): a
~40-token chat prompt and 8-24 completion tokens. The model is `deploy/models/fetch.py smollm2
--import`'s folder, imported once. The last line is `RESULT name=value ...`.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent / "deploy" / "models"))
sys.path.insert(0, str(BENCH))


def bare_step(model, optimizer, batch, device) -> None:
    """The least a policy-gradient step can do: one padded forward of the decoder, the output
    layer and its log-softmax at the completion positions only (the 49k-way output layer is a
    large part of the cost at this size), -advantage x logprob averaged over the completion
    tokens, backward, clip, AdamW."""
    import torch
    sequences = [s.rollout.prompt_token_ids + s.rollout.completion_token_ids for s in batch]
    width = max(map(len, sequences))
    ids = torch.zeros(len(batch), width, dtype=torch.long)
    rows, positions, targets, advantages = [], [], [], []
    for row, (scored, sequence) in enumerate(zip(batch, sequences)):
        ids[row, :len(sequence)] = torch.tensor(sequence)
        start = len(scored.rollout.prompt_token_ids)
        for position in range(start, len(sequence)):
            rows.append(row)
            positions.append(position - 1)
            targets.append(sequence[position])
            advantages.append(scored.advantage)
    ids = ids.to(device)
    hidden = model.get_decoder()(input_ids=ids).last_hidden_state[rows, positions]  # [T, H]
    logprobs = torch.log_softmax(model.get_output_embeddings()(hidden).float(), dim=-1)
    picked = logprobs.gather(-1, torch.tensor(targets, device=device)[:, None])[:, 0]
    loss = -(torch.tensor(advantages, device=device) * picked).mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def trainer_rates(model_dir: Path, work: Path, steps: int, batch_rollouts: int) -> dict[str, float]:
    """Tokens trained per second: bare step, `train_step`, the trainer end to end."""
    import torch

    from rollwire.trainer import losses
    from rollwire.trainer.model import ModelSettings, load_policy, resolve_device
    from rollwire.trainer.step import train_step
    from trainer import scored_rollouts, trainer_on_log

    settings = ModelSettings(path=str(model_dir), dtype="float32")
    device, _ = resolve_device(settings)
    rollouts = scored_rollouts((steps + 1) * batch_rollouts, 49152, prompt_tokens=40, completion_tokens=(8, 25))
    batches = [rollouts[i: i + batch_rollouts] for i in range(0, len(rollouts), batch_rollouts)]
    warm_up, timed = batches[0], batches[1:]
    tokens = sum(len(s.rollout.completion_token_ids) for b in timed for s in b)
    rates = {}

    def timed_rate(name: str, step) -> None:
        model = load_policy(settings)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
        step(model, optimizer, warm_up)
        t0 = time.perf_counter()
        for batch in timed:
            step(model, optimizer, batch)
        rates[name] = tokens / (time.perf_counter() - t0)
        print(f"{name}: {rates[name]:,.0f} trained tokens/s ({(time.perf_counter() - t0) / len(timed):.1f} s a step)",
              flush=True)

    timed_rate("bare", lambda m, o, b: bare_step(m, o, b, device))
    loss = losses.build("ppo_clip")
    timed_rate("train_step", lambda m, o, b: train_step(m, o, loss, b, micro_batch=batch_rollouts, max_grad_norm=1.0,
                                                        device=device))

    trainer = trainer_on_log(work, rollouts, settings, batch_rollouts=batch_rollouts, lr=1e-5,
                             micro_batch_rollouts=batch_rollouts)
    trainer.step(timeout_s=30)  # warm-up, as above
    t0 = time.perf_counter()
    while trainer.state.step < steps + 1:
        trainer.step(timeout_s=30)
    rates["trainer"] = tokens / (time.perf_counter() - t0)
    trainer.close()
    print(f"trainer end to end: {rates['trainer']:,.0f} trained tokens/s "
          f"({(time.perf_counter() - t0) / steps:.1f} s a step)", flush=True)
    return rates


def versions_of(model_dir: Path, work: Path) -> list[Path]:
    """The model and two versions of it a small step apart (as a trainer's versions are)."""
    import torch

    from rollwire.trainer.model import ModelSettings, load_policy, save_model
    folders = [model_dir]
    for seed in (1, 2):
        model = load_policy(ModelSettings(path=str(model_dir), dtype="float32"))
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 1e-4)
        save_model(model, work / f"v{seed}")
        folders.append(work / f"v{seed}")
    return folders


def decode_limit(model_dir: Path, batch: int) -> float:
    """Tokens per second of the bare decode step: one forward of `batch` single tokens."""
    import torch

    from rollwire.trainer.model import ModelSettings, load_policy
    model = load_policy(ModelSettings(path=str(model_dir), dtype="float32")).eval()
    ids = torch.randint(5, 49152, (batch, 1))
    with torch.no_grad():
        model(input_ids=ids)
        times = []
        for _ in range(10):
            t0 = time.perf_counter()
            model(input_ids=ids)
            times.append(time.perf_counter() - t0)
    return batch / statistics.median(times)


def vllm_rate(model_dir: Path, work: Path, batch: int) -> float:
    """Tokens per second of vLLM sampling `batch` sequences of 24 tokens at once (after a warm-up)."""
    from rollwire.consumers.vllm_server import VllmServer, VllmServerSettings
    server = VllmServer(VllmServerSettings(model=str(model_dir), dtype="float32", max_model_len=256,
                                           log_path=work / "vllm-rate.log"))
    server.start()
    try:
        prompt = server.control.render_chat([{"role": "user", "content": "What is 7 + 5? Reply with the number only."}])

        def sample(index: int) -> int:
            choice = server.control.generate(prompt, max_tokens=24, temperature=1.0, seed=index, ignore_eos=True)
            return len(choice["choices"][0]["token_ids"])

        with ThreadPoolExecutor(batch) as pool:
            sum(pool.map(sample, range(batch)))  # warm-up
            rates = []
            for trial in range(3):
                t0 = time.perf_counter()
                produced = sum(pool.map(sample, range(batch * (trial + 1), batch * (trial + 2))))
                rates.append(produced / (time.perf_counter() - t0))
        return statistics.median(rates)
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3, help="timed trainer steps per way of stepping (default %(default)s)")
    parser.add_argument("--batch", type=int, default=32, help="rollouts per step, sequences per sampling batch "
                                                              "(default %(default)s, as the recipe)")
    parser.add_argument("--trials", type=int, default=5, help="versions published to the replica (default %(default)s)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the trainer parts (default "
                                                               "%(default)s: the whole machine; a run gives its trainer 1)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (about 8 GB: checkpoints, versions)")
    args = parser.parse_args()

    import torch
    from fetch import imported

    torch.set_num_threads(args.threads)
    model_dir = imported("smollm2")
    size_mb = sum(f.stat().st_size for f in model_dir.glob("*.safetensors")) / 1e6
    work = Path(tempfile.mkdtemp(prefix="bench-real-model-"))
    print(f"SmolLM2-135M-Instruct from {model_dir} ({size_mb:.0f} MB float32); {args.threads} torch threads; "
          f"work in {work}", flush=True)
    try:
        measure(args, model_dir, size_mb, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def measure(args: argparse.Namespace, model_dir: Path, size_mb: float, work: Path) -> None:
    from reload import publish_to_serving

    rates = trainer_rates(model_dir, work / "trainer", args.steps, args.batch)
    limit = decode_limit(model_dir, args.batch)
    print(f"bare decode step in torch: {limit:,.0f} tokens/s at batch {args.batch}", flush=True)
    sampled = vllm_rate(model_dir, work, args.batch)
    print(f"vLLM: {sampled:,.0f} tokens/s sampling {args.batch} sequences at once", flush=True)
    rows = publish_to_serving(versions_of(model_dir, work), args.trials, work)
    reload_s, download_s, swap_s, raw_s, drain_s, apply_s, _ = (statistics.median(c) for c in zip(*(r[:7] for r in rows)))

    print(f"\n{'':<44} {'figure':>14} {'baseline':>14} {'ratio':>7}")
    print(f"{'trainer end to end (trained tokens/s)':<44} {rates['trainer']:14,.0f} {rates['bare']:14,.0f} "
          f"{rates['trainer'] / rates['bare']:7.2f}")
    print(f"{'train_step alone (trained tokens/s)':<44} {rates['train_step']:14,.0f} {rates['bare']:14,.0f} "
          f"{rates['train_step'] / rates['bare']:7.2f}")
    print(f"{'vLLM sampling (tokens/s)':<44} {sampled:14,.0f} {limit:14,.0f} {sampled / limit:7.2f}")
    print(f"{'publish to serving vs raw download+load (s)':<44} {reload_s:14.2f} {raw_s:14.2f} {reload_s / raw_s:7.2f}")
    print(f"reload parts (median of {len(rows)}): download+verify {download_s:.2f} s, pause {swap_s:.2f} s "
          f"(drain {drain_s:.2f} s, load {apply_s:.2f} s)")
    print(f"RESULT checkpoint_mb={size_mb:.0f} trainer_tokens_per_s={rates['trainer']:.4g} "
          f"train_step_tokens_per_s={rates['train_step']:.4g} bare_step_tokens_per_s={rates['bare']:.4g} "
          f"trainer_vs_bare={rates['trainer'] / rates['bare']:.3g} vllm_tokens_per_s={sampled:.4g} "
          f"decode_limit_tokens_per_s={limit:.4g} vllm_vs_limit={sampled / limit:.3g} reload_s={reload_s:.3g} "
          f"swap_s={swap_s:.3g} raw_download_read_s={raw_s:.3g} reload_vs_raw={reload_s / raw_s:.3g}")


if __name__ == "__main__":
    sys.exit(main())
