"""Scale-out on one machine: env workers, replicas, routing, trainer ranks, each against its baseline.

    python bench/scale.py [--steps 14] [--latency 1.0] [--only workers,routing,trainer]

    workers   whole `rollwire run`s under env-bound work (every rollout waits a lognormal draw,
              median `--latency` s, before it runs; 8 rollouts at a time per worker), trained
              samples/s over the steps after warm-up:
                  1 env worker, 1 replica       (the baseline)
                  2 env workers, 1 replica      goal >= 1.7x: the environments were the limit
                  2 env workers, 2 replicas     on 2 cores the replicas share the same cores: a
                                                second replica adds no compute, only routing
    routing   one vLLM server; the same 8-token generations called directly (`VllmControl`, the
              baseline) and through the router (`RolloutRoute`: pick, in-flight count, span
              attributes): added latency per call, goal <= 5%
    trainer   the same recorded batches trained by `rollwire train` as 1 process and as 2
              torchrun ranks (gloo): step time each; two cores that also run the ranks' Python
              show no speedup here, the figure is the overhead of the reductions

The last line is `RESULT ...` with the three ratios. The whole benchmark takes about 12 minutes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from env_bound import env_bound_recipe  # noqa: E402

from rollwire.run.recipe import load_recipe  # noqa: E402
from rollwire.run.runner import run  # noqa: E402


def samples_per_s(folder: Path, name: str, workers: int, replicas: int, args: argparse.Namespace) -> float:
    path = folder / f"{name}.toml"
    path.write_text(env_bound_recipe(name=name, steps=args.steps, workers=workers, replicas=replicas,
                                     scale=args.latency, sigma=0.5))
    recipe = load_recipe(path, run_dir=str(folder / name))
    result = run(recipe, console=Console(stderr=True, quiet=True))
    if result.interrupted or result.steps < args.steps:
        raise SystemExit(f"{name}: the run stopped at step {result.steps} of {args.steps}")
    rows = [json.loads(line) for line in result.metrics_path.read_text().splitlines()]
    window = rows[args.warmup:]
    seconds = (window[-1]["time_ms"] - rows[args.warmup - 1]["time_ms"]) / 1000
    return sum(r["rollouts"] for r in window) / seconds


def bench_workers(folder: Path, args: argparse.Namespace) -> float:
    print(f"env-bound runs: {args.steps} steps of 32 rollouts, latency median {args.latency} s, first "
          f"{args.warmup} steps are warm-up")
    rates = {}
    for name, workers, replicas in (("w1r1", 1, 1), ("w2r1", 2, 1), ("w2r2", 2, 2)):
        rates[name] = samples_per_s(folder, name, workers, replicas, args)
        print(f"  {workers} env worker(s), {replicas} replica(s): {rates[name]:6.1f} samples/s  "
              f"{rates[name] / rates['w1r1']:.2f}x", flush=True)
    return rates["w2r1"] / rates["w1r1"]


def bench_routing(folder: Path, calls: int = 300) -> float:
    from rollwire.consumers.vllm_server import VllmServer, VllmServerSettings
    from rollwire.producers.routing import Router
    from rollwire.trainer.tiny import build_char_tokenizer, build_tiny_model
    model = build_tiny_model(folder / "routing-model", build_char_tokenizer(), seed=0)
    server = VllmServer(VllmServerSettings(model=str(model), max_model_len=64, dtype="float32",
                                           log_path=folder / "routing-vllm.log"))
    server.start()
    try:
        control = server.control
        router = Router.single(control)
        prompt = control.tokenize("r:4071>")

        def direct() -> None:
            control.generate(prompt, max_tokens=8, seed=1)

        def routed() -> None:
            router.route().generate(prompt, max_tokens=8, seed=1)

        for _ in range(20):
            direct(), routed()
        timings: dict[str, list[float]] = {"direct": [], "routed": []}
        for _ in range(calls):  # interleaved, so drift on a shared machine hits both alike
            for name, call in (("direct", direct), ("routed", routed)):
                started = time.perf_counter()
                call()
                timings[name].append(time.perf_counter() - started)
        medians = {k: statistics.median(v) * 1000 for k, v in timings.items()}
        print(f"routing: {calls} calls each, median direct {medians['direct']:.2f} ms, routed {medians['routed']:.2f} ms, "
              f"added {medians['routed'] / medians['direct'] - 1:+.1%}", flush=True)
        return medians["routed"] / medians["direct"]
    finally:
        server.stop()


def bench_trainer(folder: Path) -> float:
    import importlib.util

    from builders import trainable

    from rollwire.core.bus import EmbeddedBusSettings, open_log
    from rollwire.schemas import Codec, Topics
    from rollwire.trainer.tiny import build_char_tokenizer, build_tiny_model
    spec = importlib.util.spec_from_file_location("data_parallel", Path(__file__).resolve().parent.parent
                                                  / "tests" / "trainer" / "test_data_parallel.py")
    data_parallel = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(data_parallel)
    policy = build_tiny_model(folder / "trainer-model", build_char_tokenizer(), seed=0)
    recorded = [trainable(i, version=i // 8) for i in range(160)]  # each batch one version behind at most
    log = open_log(EmbeddedBusSettings(path=folder / "log"))
    seconds = {}
    for prefix, ranks in (("one", 1), ("two", 2)):
        data_parallel.record(log, Topics(prefix), recorded)
        done = subprocess.run(data_parallel.trainer_command(folder, policy, prefix, ranks), capture_output=True,
                              text=True, timeout=600)
        if done.returncode != 0:
            raise SystemExit(f"the {ranks}-rank trainer failed:\n{done.stderr[-3000:]}")
        steps = []
        with log.reader([f"{prefix}.train"]) as reader:
            while batch := reader.poll_batch(1000, 0.3):
                steps += [Codec().decode(r.value).event for r in batch]
        per_step = [s.num_tokens / s.tokens_per_s for s in steps[2:] if s.tokens_per_s]
        seconds[ranks] = statistics.median(per_step)
    log.close()
    print(f"trainer: {len(recorded) // 8} steps of 8 rollouts, median step {seconds[1] * 1000:.1f} ms with 1 process, "
          f"{seconds[2] * 1000:.1f} ms with 2 ranks ({seconds[1] / seconds[2]:.2f}x)", flush=True)
    return seconds[1] / seconds[2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=14, help="trainer steps per run (default 14)")
    parser.add_argument("--warmup", type=int, default=4, help="steps left out of the rate (default 4)")
    parser.add_argument("--latency", type=float, default=1.0, help="median environment latency, s (default 1.0)")
    parser.add_argument("--only", default="workers,routing,trainer", help="which parts (comma-separated)")
    args = parser.parse_args()
    parts = set(args.only.split(","))
    ratios = {}
    with tempfile.TemporaryDirectory(prefix="rollwire-scale-") as tmp:
        folder = Path(tmp)
        if "trainer" in parts:
            ratios["trainer_2_vs_1_rank"] = bench_trainer(folder)
        if "routing" in parts:
            ratios["routed_vs_direct_latency"] = bench_routing(folder)
        if "workers" in parts:
            ratios["env_workers_2_vs_1"] = bench_workers(folder, args)
    print("RESULT " + " ".join(f"{k}={v:.2f}" for k, v in ratios.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
