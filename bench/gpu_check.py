"""The GPU path in one run (under 8 minutes on one GPU): what `bench/gpu_check.sh` runs.

    python bench/gpu_check.py            # on a machine where torch sees CUDA and vLLM's CUDA build is installed

1. the trainer on CUDA: `dtype = auto` picks bfloat16; trainer tokens/s over a few steps, against
   the bare optimizer step on the same batches (the baseline: `bench/trainer.py`'s);
2. a vLLM CUDA server (the real `VllmServer`, the worker extension included) with a tiny tied Qwen2,
   three full-weight hot reloads: reload time and the largest gap between served logprobs and
   transformers' on each version's weights (float32, so the gap is the reload's, not bf16's).

Prints `RESULT name=value ...` last; a check that fails exits non-zero with the reason.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))


def trainer_rate() -> float:
    out = subprocess.run([sys.executable, str(REPO / "bench" / "trainer.py"), "--hidden", "512", "--layers", "8",
                          "--steps", "6", "--batch", "32"], capture_output=True, text=True, timeout=300)
    print(out.stdout[-1500:], file=sys.stderr)
    if out.returncode != 0:
        raise SystemExit(f"bench/trainer.py failed on CUDA:\n{out.stderr[-3000:]}")
    result = next(line for line in out.stdout.splitlines() if line.startswith("RESULT"))
    fields = dict(part.split("=", 1) for part in result.split()[1:])
    if fields.get("device") != "cuda":
        raise SystemExit(f"the trainer ran on {fields.get('device')}, not CUDA")
    return float(fields["tokens_per_s"])


def reload_check(folder: Path) -> tuple[float, float]:
    import torch
    from reference import transformers_logprobs

    from rollwire.consumers.vllm_server import VllmServer, VllmServerSettings
    from rollwire.trainer.tiny import build_bpe_tokenizer, build_tiny_model
    assert torch.cuda.is_available(), "torch sees no CUDA device"
    tokenizer = build_bpe_tokenizer()
    versions = [build_tiny_model(folder / f"v{i}", tokenizer, seed=i, tie_embeddings=True, initializer_range=0.5,
                                 architecture="qwen2") for i in range(4)]
    server = VllmServer(VllmServerSettings(model=str(versions[0]), dtype="float32", max_model_len=512,
                                           log_path=folder / "vllm.log",
                                           extra_args=["--gpu-memory-utilization", "0.2"]))
    server.start()
    prompt = tokenizer.encode("reverse the digits 4071:", add_special_tokens=False)
    worst, swaps = 0.0, []
    try:
        for i, weights in enumerate(versions[1:], 1):
            swaps.append(server.control.swap_full_weights(str(weights), str(i)).paused_s)
            choice = server.control.generate(prompt, max_tokens=16, seed=i, ignore_eos=True)["choices"][0]
            served = [c["logprob"] for c in choice["logprobs"]["content"]]
            reference = transformers_logprobs(weights, prompt, choice["token_ids"])
            worst = max(worst, max(abs(a - b) for a, b in zip(served, reference)))
    finally:
        server.stop()
    if worst > 1e-2:
        raise SystemExit(f"served logprobs differ from the weights' by {worst:.3g} after a reload: "
                         "the hot reload (or the re-tie) is wrong on this GPU build")
    return sum(swaps) / len(swaps), worst


def main() -> int:
    started = time.monotonic()
    rate = trainer_rate()
    with tempfile.TemporaryDirectory() as folder:
        reload_s, gap = reload_check(Path(folder))
    print(f"RESULT trainer_tokens_per_s={rate:.0f} reload_s={reload_s:.3f} max_logprob_gap={gap:.2e} "
          f"minutes={(time.monotonic() - started) / 60:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
