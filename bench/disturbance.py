"""Does the loop come back after a disturbance? The demo run, a disturbance in its middle, and
the rate and the stale drops before, during and after it, with the waiting allowance fixed
(`stale_drop_target = 1`, the rule before it adapted) and adapting (the default).

    python bench/disturbance.py [--before 5] [--disturbed 5] [--after 8] [--arms fixed,adaptive]
                                [--disturbance hogs|explorer|second-run|none] [--hogs 2]

Per arm: `rollwire run` of the demo recipe on the embedded log; once its first step is on the log
and `--warmup` minutes passed, `--before` minutes undisturbed, then `--disturbed` minutes of the
disturbance, then `--after` minutes undisturbed again. The disturbances:
  hogs        `--hogs` processes that spin on the CPU at the run's priority
  explorer    `rollwire explore` on the run's own log, catching up from its start (readers of the
              same SQLite files: the 2-hour soak's disturbance, half of it)
  second-run  a second demo run in a directory of its own (the soak's other half)
  none        nothing: the control, how far the rate drifts on its own between the same phases
From the run's `metrics.jsonl`, per phase: rollouts trained per minute, the share of the work
dropped as stale (stale / (trained + stale)) and the mean staleness trained; at each phase's end,
the size of the run's SQLite write-ahead logs (a WAL that readers keep from being reset grows, and
every read then searches a longer index).

The baseline is the same run before the disturbance: `recovered` = trained per minute over the
last half of `after` ÷ that of `before` (1.0: the loop came back whole). The last line is `RESULT ...`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak import wal_mb  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ARMS = {"fixed": 1.0, "adaptive": None}
"""`stale_drop_target` per arm (None: the default)."""


def recipe_for(arm: str, folder: Path) -> Path:
    text = (REPO / "rollwire" / "run" / "demo.toml").read_text()
    target = ARMS[arm]
    if target is not None:
        text, found = re.subn(r"(?m)^\[trainer\.batch\]\n", f"[trainer.batch]\nstale_drop_target = {target}\n", text)
        assert found == 1, "the demo recipe has no [trainer.batch] table: update bench/disturbance.py"
    path = folder / f"{arm}.toml"
    path.write_text(text)
    return path


def start_disturbance(kind: str, args: argparse.Namespace, folder: Path, run_dir: Path, arm: str) -> list[subprocess.Popen]:
    if kind == "none":
        return []
    if kind == "hogs":
        return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
    if kind == "explorer":
        command = [sys.executable, "-m", "rollwire", "explore", "--run-dir", str(run_dir), "--port", "0"]
    else:
        command = [sys.executable, "-m", "rollwire", "run", "--run-dir", str(folder / f"{arm}-second"), "--steps", "100000"]
    out = open(folder / f"{arm}-{kind}.out", "w")
    return [subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "COLUMNS": "200"},
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))]


def stop_disturbance(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        process.send_signal(signal.SIGINT)  # a second run stops its children; a hog just ends
    for process in processes:
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run_arm(arm: str, args: argparse.Namespace, folder: Path) -> dict:
    run_dir = folder / arm
    out = open(folder / f"{arm}.out", "w")
    run = subprocess.Popen([sys.executable, "-m", "rollwire", "run", str(recipe_for(arm, folder)), "--run-dir", str(run_dir),
                            "--steps", "100000"], stdout=out, stderr=subprocess.STDOUT,
                           env={**os.environ, "COLUMNS": "200"},
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    metrics = run_dir / "metrics.jsonl"
    disturbers: list[subprocess.Popen] = []
    try:
        while not metrics.exists() or not metrics.read_text().strip():
            if run.poll() is not None:
                raise SystemExit(f"rollwire run ended before its first step; see {folder / f'{arm}.out'}")
            time.sleep(2)
        first = json.loads(metrics.read_text().splitlines()[0])["time_ms"] / 1000
        marks = {"warm": args.warmup * 60}
        marks["before"] = marks["warm"] + args.before * 60
        marks["disturbed"] = marks["before"] + args.disturbed * 60
        marks["after"] = marks["disturbed"] + args.after * 60
        wal: dict[str, tuple[float, float, str]] = {}
        for phase, until in marks.items():
            while time.time() - first < until:
                if run.poll() is not None:
                    raise SystemExit(f"rollwire run ended in its {phase} phase; see {folder / f'{arm}.out'}")
                time.sleep(1)
            wal[phase] = wal_mb(run_dir)
            print(f"  {arm}: {phase} phase ends at {until / 60:.1f} min; WAL {wal[phase][0]:.0f} MB "
                  f"(largest {wal[phase][2]} {wal[phase][1]:.0f} MB)", flush=True)
            if phase == "before":
                disturbers = start_disturbance(args.disturbance, args, folder, run_dir, arm)
            elif phase == "disturbed":
                stop_disturbance(disturbers)
                disturbers = []
    finally:
        stop_disturbance(disturbers)
        run.send_signal(signal.SIGINT)
        try:
            run.wait(timeout=120)
        except subprocess.TimeoutExpired:
            run.kill()
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    start = marks["warm"]
    phases = {"before": (start, marks["before"]), "disturbed": (marks["before"], marks["disturbed"]),
              "after": (marks["disturbed"], marks["after"]),
              "after, 2nd half": ((marks["disturbed"] + marks["after"]) / 2, marks["after"])}
    log = run_dir / "logs" / "dispatcher-0.log"  # it logs the first narrowing and every 100th
    narrowed = max((int(n) for n in re.findall(r"narrowed (\d+) times", log.read_text())), default=0) if log.exists() else 0
    return {"phases": {name: phase_figures(rows, first, lo, hi) for name, (lo, hi) in phases.items()},
            "narrowed_logged": narrowed, "steps": len(rows), "wal_mb": wal}


def phase_figures(rows: list[dict], first: float, lo: float, hi: float) -> dict:
    inside = [r for r in rows if lo <= r["time_ms"] / 1000 - first < hi]
    trained = sum(r["rollouts"] for r in inside)
    stale = sum((r.get("drops") or {}).get("stale", 0) for r in inside)
    staleness = [r["staleness_mean"] for r in inside if r.get("staleness_mean") is not None]
    return {"per_min": 60 * trained / (hi - lo), "stale_share": stale / max(trained + stale, 1),
            "staleness": sum(staleness) / len(staleness) if staleness else float("nan"), "steps": len(inside)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--warmup", type=float, default=2.0, help="minutes after the first step left out (default %(default)s)")
    parser.add_argument("--before", type=float, default=5.0, help="undisturbed minutes, the baseline (default %(default)s)")
    parser.add_argument("--disturbed", type=float, default=5.0, help="minutes disturbed (default %(default)s)")
    parser.add_argument("--after", type=float, default=8.0, help="undisturbed minutes after (default %(default)s)")
    parser.add_argument("--disturbance", choices=["hogs", "explorer", "second-run", "none"], default="hogs",
                        help="what disturbs the run (default %(default)s; see above)")
    parser.add_argument("--hogs", type=int, default=2, help="processes spinning, with --disturbance hogs (default %(default)s)")
    parser.add_argument("--arms", default="fixed,adaptive", help="which arms, in order (default %(default)s)")
    args = parser.parse_args()
    arms = args.arms.split(",")
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        parser.error(f"unknown arms {unknown}: choose from {', '.join(ARMS)}")
    folder = Path(tempfile.mkdtemp(prefix="disturbance-"))
    what = f"{args.hogs} hogs" if args.disturbance == "hogs" else args.disturbance
    print(f"disturbance: the demo, {args.before:g} min before, {what} for {args.disturbed:g} min, "
          f"{args.after:g} min after (warm-up {args.warmup:g} min); files in {folder}", flush=True)
    results = {arm: run_arm(arm, args, folder) for arm in arms}
    (folder / "results.json").write_text(json.dumps(results, indent=1))
    print(f"{'arm':<9} {'phase':<16} {'trained/min':>11} {'stale share':>11} {'staleness':>9} {'steps':>6}")
    summary = []
    for arm, result in results.items():
        for name, f in result["phases"].items():
            print(f"{arm:<9} {name:<16} {f['per_min']:11.0f} {100 * f['stale_share']:10.1f}% {f['staleness']:9.2f} "
                  f"{f['steps']:6d}")
        phases = result["phases"]
        recovered = phases["after, 2nd half"]["per_min"] / max(phases["before"]["per_min"], 1e-9)
        print(f"{arm:<9} recovered {recovered:.2f} (trained per minute, 2nd half of after ÷ before); the allowance "
              f"narrowed at least {result['narrowed_logged']} time(s) (the dispatcher logs the 1st and every 100th)")
        wal = result["wal_mb"]
        print(f"{arm:<9} WAL MB at the end of each phase: " + ", ".join(f"{p} {w[0]:.0f}" for p, w in wal.items()))
        summary.append(f"{arm}_recovered={recovered:.2f} {arm}_stale_after={100 * phases['after, 2nd half']['stale_share']:.1f}%")
    print("RESULT " + " ".join(summary))


if __name__ == "__main__":
    main()
