"""Asynchronous vs synchronous RL under an environment with a long latency tail.

    python bench/async_vs_sync.py [--steps 14] [--latency lognormal|pareto] [--settings 0,1,2,4,8]

The whole `rollwire run` pipeline (vLLM server, env worker, scorer, trainer, dispatcher on the
embedded log), once per `max_off_policy` setting, with every rollout delayed by a draw from a
long-tailed distribution before it runs (`env_workers.simulated_latency`). `max_off_policy = 0`
is the synchronous loop: the dispatcher issues one batch, every rollout of it must finish (the
slowest included) before the trainer steps and the next batch starts. With more allowed
staleness the dispatcher keeps more work in flight, and slow rollouts overlap with training.

Per setting, over the steps after the first two (start-up excluded):
    samples/s     rollouts trained per second of wall time
    trainer idle  share of that time the trainer waited for a batch (`TrainStepCompleted.wait_s`)
    staleness     mean version lag of what was trained

The last line is `RESULT ...` with the speedup of the best asynchronous setting over the
synchronous one. Each setting starts its own vLLM server (~40 s here), so a run takes minutes.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from rich.console import Console

from rollwire.run.recipe import load_recipe
from rollwire.run.runner import run

RECIPE = """
name = "bench"
steps = {steps}
[model.tiny]
seed = 0
[warm_start]
steps = 0
[[environments]]
name = "reverse-digits"
algorithm = "grpo-nostd"
group_size = 8
options = {{ seed = 7 }}
sampling = {{ temperature = 1.0, max_tokens = 8 }}
[env_workers]
concurrency = 64
tasks_per_poll = 16
simulated_latency = {{ distribution = "{distribution}", scale_s = {scale}, sigma = 1.0, alpha = 1.5, max_s = 20, seed = 1 }}
[trainer]
micro_batch_rollouts = 32
[trainer.batch]
batch_rollouts = 32
max_off_policy = {max_off_policy}
[inference]
max_model_len = 64
"""


def measure(folder: Path, max_off_policy: int, steps: int, distribution: str, scale: float, warmup: int) -> dict:
    path = folder / f"off{max_off_policy}.toml"
    path.write_text(RECIPE.format(steps=steps, distribution=distribution, scale=scale, max_off_policy=max_off_policy))
    recipe = load_recipe(path, run_dir=str(folder / f"off{max_off_policy}"))
    result = run(recipe, console=Console(stderr=True, quiet=True))
    if result.interrupted or result.steps < steps:
        raise SystemExit(f"max_off_policy={max_off_policy}: the run stopped at step {result.steps} of {steps}")
    rows = [json.loads(line) for line in result.metrics_path.read_text().splitlines()]
    window = rows[warmup:]
    seconds = (window[-1]["time_ms"] - rows[warmup - 1]["time_ms"]) / 1000
    return {"max_off_policy": max_off_policy, "samples_per_s": sum(r["rollouts"] for r in window) / seconds,
            "idle": sum(r["wait_s"] for r in window) / seconds,
            "staleness": sum(r["staleness_mean"] for r in window) / len(window), "seconds": seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=14, help="trainer steps per setting (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=2, help="first steps left out of the figures (default: %(default)s)")
    parser.add_argument("--latency", choices=["lognormal", "pareto"], default="lognormal",
                        help="environment latency distribution (default: %(default)s)")
    parser.add_argument("--scale", type=float, default=0.3,
                        help="median (lognormal) or minimum (pareto) latency in seconds (default: %(default)s)")
    parser.add_argument("--settings", default="0,1,2,4,8", help="max_off_policy values (default: %(default)s)")
    args = parser.parse_args()
    settings = [int(v) for v in args.settings.split(",")]
    if 0 not in settings or len(settings) < 2:
        raise SystemExit("--settings must include 0 (the synchronous baseline) and at least one other value")
    results = []
    with tempfile.TemporaryDirectory(prefix="rollwire-bench-") as tmp:
        for value in settings:
            print(f"max_off_policy={value}: running {args.steps} steps …", file=sys.stderr, flush=True)
            results.append(measure(Path(tmp), value, args.steps, args.latency, args.scale, args.warmup))
            r = results[-1]
            print(f"max_off_policy={value:>2}  {r['samples_per_s']:7.1f} samples/s  trainer idle {r['idle']:6.1%}  "
                  f"staleness {r['staleness']:.2f}  ({r['seconds']:.0f} s measured)", flush=True)
    sync = next(r for r in results if r["max_off_policy"] == 0)
    best = max((r for r in results if r["max_off_policy"] > 0), key=lambda r: r["samples_per_s"])
    print(f"RESULT async_vs_sync: max_off_policy={best['max_off_policy']} trains {best['samples_per_s']:.1f} samples/s "
          f"vs {sync['samples_per_s']:.1f} synchronous = {best['samples_per_s'] / sync['samples_per_s']:.2f}x "
          f"(trainer idle {best['idle']:.0%} vs {sync['idle']:.0%}; {args.latency} environment latency)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
