"""Latency hiding: asynchronous vs synchronous RL under environments with a long latency tail.

    python bench/async_vs_sync.py [--settings 0,4,8] [--latencies lognormal,pareto] [--steps 30] [--repeats 3]

The whole `rollwire run` pipeline (vLLM server, env worker, scorer, trainer, dispatcher on the
embedded log) once per `max_off_policy` setting and environment latency, with every rollout
delayed by a draw from the latency distribution before it runs (`env_workers.simulated_latency`):

    lognormal   median `--scale` s (0.3), sigma 1: p99 ≈ 10× the median
    pareto      minimum `--scale` s, tail index 1.5: infinite variance, the heavier tail
    zero        the same pipeline with ~no latency (lognormal at scale × 0.001): the limit

`max_off_policy = 0` is the synchronous loop: the dispatcher issues one batch, every rollout of it
must finish (the slowest included) before the trainer steps, and the next batch waits for the
replica to serve the new weights. With more allowed staleness the dispatcher keeps more work in
flight, and slow rollouts overlap with everything else.

Per run, over the steps after `--warmup`:
    samples/s     rollouts trained per second of wall time
    hiding        samples/s under latency ÷ samples/s of the same setting at zero latency (limit 1)
    trainer idle  share of that time the trainer waited for a batch
    staleness     mean version lag of what was trained
For the synchronous runs it also prints each hop of a step (`bench/hops.py`) and the floor: the
slowest environment draw of each batch plus the zero-latency synchronous step.

Each setting runs `--repeats` times; rates are medians, and each figure carries its spread: half
the range over the repeats, as a share of the median (for hiding, the spreads of its two rates
added). The zero-latency runs take `--zero-steps` steps, so that they last as long as the others
(a 3-6 s measurement swung hiding between 0.71 and 1.29 from one run to the next).

The last line is `RESULT ...`: the hiding of the best asynchronous setting under each latency, the
asynchronous/synchronous speedup and the synchronous loop against its floor. Each run starts its
own vLLM server (~40 s here): one repeat of the default settings takes 10-15 minutes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from env_bound import env_bound_recipe
from hops import step_hops, table
from rich.console import Console

from rollwire.core.bus import EmbeddedBusSettings, open_log
from rollwire.run.recipe import load_recipe
from rollwire.run.runner import run
from rollwire.schemas.topics import Topics


class CpuSampler:
    """CPU seconds used by each kind of process of a run (the roles and vLLM), sampled every second,
    so the time spent per rollout can be told apart by component."""

    def __init__(self) -> None:
        import psutil
        self._me = psutil.Process()
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def _kind(process) -> str:
        try:
            argv = process.cmdline()
        except Exception:
            return "other"
        if "rollwire.run.roles" in argv:
            return argv[argv.index("rollwire.run.roles") + 1]
        return "vllm" if any("vllm" in a.lower() for a in argv) or "vllm" in process.name().lower() else "other"

    def _run(self) -> None:
        seen: dict[int, tuple[str, float]] = {}
        while not self._stop.wait(1.0):
            for child in self._me.children(recursive=True):
                try:
                    times = child.cpu_times()
                    seen[child.pid] = (self._kind(child), times.user + times.system)
                except Exception:
                    continue
            totals: dict[str, float] = {}
            for kind, cpu in seen.values():
                totals[kind] = totals.get(kind, 0.0) + cpu
            self.samples.append((time.time() * 1000, totals))

    def between(self, start_ms: float, end_ms: float) -> dict[str, float]:
        """CPU seconds per kind between two times (the nearest samples)."""
        self._stop.set()
        self._thread.join()
        first = min(self.samples, key=lambda s: abs(s[0] - start_ms))[1]
        last = min(self.samples, key=lambda s: abs(s[0] - end_ms))[1]
        return {kind: last.get(kind, 0.0) - first.get(kind, 0.0) for kind in last}


def measure(folder: Path, name: str, max_off_policy: int, steps: int, distribution: str, scale: float,
            warmup: int, args: argparse.Namespace) -> dict:
    path = folder / f"{name}.toml"
    path.write_text(env_bound_recipe(steps=steps, distribution=distribution, scale=scale, max_off_policy=max_off_policy,
                                     concurrency=args.concurrency, inference_concurrency=args.inference_concurrency,
                                     inference_window=args.inference_window,
                                     waiting_rollouts=args.waiting_rollouts if max_off_policy else None))
    recipe = load_recipe(path, run_dir=str(folder / name))
    sampler = CpuSampler()
    result = run(recipe, console=Console(stderr=True, quiet=True))
    if result.interrupted or result.steps < steps:
        raise SystemExit(f"{name}: the run stopped at step {result.steps} of {steps}")
    rows = [json.loads(line) for line in result.metrics_path.read_text().splitlines()]
    window = rows[warmup:]
    seconds = (window[-1]["time_ms"] - rows[warmup - 1]["time_ms"]) / 1000
    with open_log(EmbeddedBusSettings(path=recipe.run_dir / "log")) as log:
        hops = [s for s in step_hops(log, Topics(recipe.topic_prefix)) if s.step > warmup]
    trained = sum(r["rollouts"] for r in window)
    cpu = sampler.between(rows[warmup - 1]["time_ms"], window[-1]["time_ms"])
    return {"name": name, "max_off_policy": max_off_policy, "seconds": seconds,
            "cpu_ms_per_rollout": {k: v * 1000 / trained for k, v in sorted(cpu.items()) if v > 0},
            "samples_per_s": sum(r["rollouts"] for r in window) / seconds,
            "idle": sum(r["wait_s"] for r in window) / seconds,
            "staleness": sum(r["staleness_mean"] for r in window) / len(window),
            "staleness_max": max(r["staleness_max"] for r in window), "hops": hops}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30,
                        help="trainer steps per asynchronous run (default: %(default)s)")
    parser.add_argument("--sync-steps", type=int, default=14,
                        help="trainer steps per synchronous run, whose steps are longer (default: %(default)s)")
    parser.add_argument("--zero-steps", type=int, default=90,
                        help="trainer steps per asynchronous run at zero latency, whose steps are shorter "
                             "(default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs of each setting; figures are medians with their spread (default: %(default)s)")
    parser.add_argument("--waiting-rollouts", type=int, default=None,
                        help="the dispatcher's allowance of issued rollouts not yet sampling (default: its own, "
                             "max_off_policy batches; 0 counts every rollout from its issue, as before the "
                             "budget counted from sampling); the synchronous setting keeps its own 0")
    parser.add_argument("--warmup", type=int, default=2, help="first steps left out of the figures (default: %(default)s)")
    parser.add_argument("--latencies", default="lognormal,pareto",
                        help="latency distributions to run besides zero (default: %(default)s)")
    parser.add_argument("--scale", type=float, default=0.3,
                        help="median (lognormal) or minimum (pareto) latency in seconds (default: %(default)s)")
    parser.add_argument("--settings", default="0,4,8", help="max_off_policy values (default: %(default)s)")
    parser.add_argument("--concurrency", type=int, default=256,
                        help="env-worker rollout slots; a slot waiting on the environment is a sleeping thread "
                             "(default: %(default)s)")
    parser.add_argument("--inference-concurrency", type=int, default=64,
                        help="generation requests in flight to vLLM (default: %(default)s)")
    parser.add_argument("--inference-window", type=float, default=0.2,
                        help="seconds a generation request may wait to reach vLLM in a batch (default: %(default)s)")
    args = parser.parse_args()
    settings = [int(v) for v in args.settings.split(",")]
    latencies = [v for v in args.latencies.split(",") if v]
    if 0 not in settings or len(settings) < 2:
        raise SystemExit("--settings must include 0 (the synchronous baseline) and at least one other value")
    if any(d not in ("lognormal", "pareto") for d in latencies):
        raise SystemExit("--latencies takes lognormal and/or pareto")
    print(f"env-worker concurrency {args.concurrency}, inference concurrency {args.inference_concurrency}, "
          f"inference window {args.inference_window * 1000:.0f} ms; "
          f"batch 32 rollouts, groups of 8; waiting_rollouts "
          f"{'default' if args.waiting_rollouts is None else args.waiting_rollouts}", flush=True)
    results: dict[tuple[str, int], dict] = {}
    spreads: dict[tuple[str, int], float] = {}
    with tempfile.TemporaryDirectory(prefix="rollwire-bench-") as tmp:
        for latency in ["zero", *latencies]:
            distribution, scale = ("lognormal", args.scale * 0.001) if latency == "zero" else (latency, args.scale)
            for value in settings:
                steps = args.sync_steps if value == 0 else args.zero_steps if latency == "zero" else args.steps
                runs = []
                for repeat in range(args.repeats):
                    print(f"{latency} latency, max_off_policy={value}: running {steps} steps "
                          f"(repeat {repeat + 1} of {args.repeats}) …", file=sys.stderr, flush=True)
                    runs.append(measure(Path(tmp), f"{latency}-off{value}-r{repeat}", value, steps, distribution,
                                        scale, args.warmup, args))
                rates = [run["samples_per_s"] for run in runs]
                r = results[(latency, value)] = min(runs, key=lambda run: abs(run["samples_per_s"] -
                                                                              statistics.median(rates)))
                r["samples_per_s"] = statistics.median(rates)
                spreads[(latency, value)] = (max(rates) - min(rates)) / 2 / r["samples_per_s"]
                zero = results[("zero", value)]["samples_per_s"]
                hiding_spread = spreads[(latency, value)] + spreads[("zero", value)]
                print(f"{latency:>9}  max_off_policy={value:>2}  {r['samples_per_s']:7.1f} samples/s "
                      f"(±{spreads[(latency, value)]:.0%} over {len(runs)})  hiding {r['samples_per_s'] / zero:5.2f} "
                      f"±{hiding_spread:.0%}  trainer idle {r['idle']:6.1%}  staleness mean {r['staleness']:.2f} "
                      f"max {r['staleness_max']}  ({r['seconds']:.0f} s measured; rates "
                      f"{', '.join(f'{x:.1f}' for x in rates)})", flush=True)
                print("           CPU ms per trained rollout: " + ", ".join(
                    f"{k} {v:.1f}" for k, v in r["cpu_ms_per_rollout"].items()), flush=True)
    zero_step = statistics.median(s.total_s for s in results[("zero", 0)]["hops"])
    floors = {}
    for latency in latencies:
        hops = results[(latency, 0)]["hops"]
        floor = statistics.mean(s.slowest_environment_s for s in hops) + zero_step
        actual = statistics.mean(s.total_s for s in hops)
        floors[latency] = actual / floor
        print(f"\nsynchronous step under {latency} latency, hop by hop:\n{table(hops)}")
        print(f"floor: slowest draw {statistics.mean(s.slowest_environment_s for s in hops) * 1000:.0f} ms + "
              f"zero-latency step {zero_step * 1000:.0f} ms = {floor * 1000:.0f} ms; the step took "
              f"{actual * 1000:.0f} ms = {actual / floor:.2f}x the floor")
    print(f"\nsynchronous step at zero latency, hop by hop:\n{table(results[('zero', 0)]['hops'])}")
    parts = []
    for latency in latencies:
        best = max((v for v in settings if v > 0), key=lambda v: results[(latency, v)]["samples_per_s"])
        rate = results[(latency, best)]["samples_per_s"]
        spread = spreads[(latency, best)] + spreads[("zero", best)]
        parts.append(f"{latency}: hiding={rate / results[('zero', best)]['samples_per_s']:.2f}±{spread:.0%} at "
                     f"max_off_policy={best} ({rate:.1f} vs {results[('zero', best)]['samples_per_s']:.1f} samples/s), "
                     f"async/sync={rate / results[(latency, 0)]['samples_per_s']:.1f}x, "
                     f"sync/floor={floors[latency]:.2f}")
    print("RESULT async_vs_sync: " + "; ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
