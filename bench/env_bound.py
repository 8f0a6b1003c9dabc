"""The recipe the whole-run benchmarks share (bench/async_vs_sync.py, bench/scale.py): the demo's
task with no warm start, batches of 32, and every rollout delayed by a simulated environment."""

from __future__ import annotations

TEMPLATE = """
name = "{name}"
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
count = {workers}
concurrency = {concurrency}
inference_concurrency = {inference_concurrency}
inference_window_s = {inference_window}
simulated_latency = {{ distribution = "{distribution}", scale_s = {scale}, sigma = {sigma}, alpha = 1.5, max_s = 20, seed = 1 }}
[trainer]
micro_batch_rollouts = 32
[trainer.batch]
batch_rollouts = 32
max_off_policy = {max_off_policy}
{waiting}
[inference]
max_model_len = 64
replicas = {replicas}
"""


def env_bound_recipe(*, steps: int, scale: float, name: str = "bench", distribution: str = "lognormal",
                     sigma: float = 1.0, max_off_policy: int = 4, workers: int = 1, replicas: int = 1,
                     concurrency: int = 8, inference_concurrency: int = 32, inference_window: float = 0.0,
                     waiting_rollouts: int | None = None) -> str:
    """The TOML text; `scale` is the latency's median (lognormal) or minimum (pareto) in seconds;
    `waiting_rollouts` None leaves the dispatcher's default."""
    waiting = "" if waiting_rollouts is None else f"waiting_rollouts = {waiting_rollouts}"
    return TEMPLATE.format(name=name, steps=steps, scale=scale, distribution=distribution, sigma=sigma,
                           max_off_policy=max_off_policy, workers=workers, replicas=replicas, concurrency=concurrency,
                           inference_concurrency=inference_concurrency, inference_window=inference_window,
                           waiting=waiting)
