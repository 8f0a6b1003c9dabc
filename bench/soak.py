"""A long run, watched: each component's resident memory and open file descriptors, and the rate
the loop holds, over `--minutes` of `rollwire run` (the demo recipe, or RECIPE).

    python bench/soak.py [RECIPE] [--minutes 20] [--warmup-minutes 5] [--every 10] [--bus kafka] [--sites]

Every `--every` seconds it samples every process of the run (each component; the vLLM server
under each replica with its engine processes; `rollwire run` itself, the supervisor; with `--bus
kafka`, the broker it started): RSS, open file descriptors and threads. After the warm-up,
growth is fitted by least squares and reported per hour, as a share of the component's size
after warm-up (the goal: under 5% an hour). The rate: trainer steps and trained rollouts per minute
in the last quarter of the run against the first quarter after warm-up, measured in the same run
(1.0 = held), and the fit of every minute's trained rollouts after warm-up, in % an hour (one slow
span moves the ratio; the fit weighs every minute, beside the minutes' own spread). The run is
stopped as Ctrl-C would stop it at the end. A second fit over the run's last third tells a bound
that fills (growth that stops) from a leak (growth that goes on), and a timeline in eight spans
shows each component's RSS beside the loop's rate, stale share, staleness, the trainer's wait for a
batch and vLLM's generation throughput from its log. The last line is `RESULT ...`.
`--report FOLDER` prints a finished soak's report again from its files. Once a minute it also reads each
component's CPU seconds, the machine's busy and stolen time, and the CPU time of a fixed piece of
work (`probe_ms`): a table per span says where the CPU went, the run's CPU milliseconds per trainer
step, and whether the machine itself slowed.

`--sites` also traces every component's Python allocations (`[telemetry.memory_sites]`,
`rollwire.core.memory_sites`) and prints, per component, the allocation sites that grew most
after the warm-up, with their growth per hour: where a leak is. Tracing slows the components, so
a run with `--sites` finds growth; the rate and the growth shares come from a run without it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import psutil


def components(run: psutil.Process) -> dict[str, list[psutil.Process]]:
    """The run's processes by name: `role-index` for components, `vllm-index` for replica index's
    inference server with its engine processes (one vLLM is several: API server, engine, workers).
    A component is known by the log its output goes to (`logs/ROLE-N.log`): a faust worker
    rewrites its command line (setproctitle)."""
    found: dict[str, list[psutil.Process]] = {}
    for child in run.children():
        name = _log_name(child)
        if name is None:
            continue
        found[name] = [child]
        if name.startswith("replica-"):
            with contextlib.suppress(psutil.Error):
                found["vllm-" + name.removeprefix("replica-")] = child.children(recursive=True)
    return found


def _log_name(process: psutil.Process) -> str | None:
    """`scorer-0` for a process whose standard output is `.../logs/scorer-0.log`."""
    try:
        target = Path(os.readlink(f"/proc/{process.pid}/fd/1"))
    except OSError:
        return None
    return target.stem if target.suffix == ".log" and target.parent.name == "logs" else None


def usage(processes: list[psutil.Process]) -> tuple[float, int, int]:
    """Resident MB, open file descriptors and threads, summed over `processes`."""
    rss, fds, threads = 0.0, 0, 0
    for proc in processes:
        with contextlib.suppress(psutil.Error):
            rss += proc.memory_info().rss / 2**20
            fds += proc.num_fds()
            threads += proc.num_threads()
    return rss, fds, threads


def cpu_seconds(processes: list[psutil.Process]) -> float:
    """User and system CPU seconds used so far, summed over `processes`."""
    total = 0.0
    for proc in processes:
        with contextlib.suppress(psutil.Error):
            times = proc.cpu_times()
            total += times.user + times.system
    return total


def machine_cpu() -> dict[str, float]:
    """The machine's CPU seconds since boot: busy (all but idle and iowait), and stolen by the
    hypervisor (a neighbour's load on a shared host shows here, and slows every component alike)."""
    times = psutil.cpu_times()
    idle = times.idle + getattr(times, "iowait", 0.0)
    steal = getattr(times, "steal", 0.0)
    return {"busy": sum(times) - idle - steal, "steal": steal}


def probe_ms() -> float:
    """CPU milliseconds a fixed piece of pure-Python work takes now. It holds on a machine whose cores
    keep their speed, and rises when the host slows every core (a neighbour on the same physical cores,
    which the stolen time does not always show): the run's CPU per step read against it tells our
    work growing from the machine slowing. Compare it within one run: what else shares the cores changes
    it too (here 24-26 ms while a run was starting beside it, 15-17 ms once it ran)."""
    began = time.process_time()
    total = 0
    for i in range(300_000):
        total += i * i % 7
    return 1000 * (time.process_time() - began)


def traced_recipe(recipe: str | None, folder: Path, warmup_s: float, every_s: float) -> str:
    """The recipe (default: the demo) with `[telemetry.memory_sites]` on, written into `folder`."""
    from rollwire.run.recipe import recipe_text
    text = recipe_text(Path(recipe) if recipe else None)
    path = folder / "traced.toml"
    path.write_text(text + f"\n[telemetry.memory_sites]\nenabled = true\nwarmup_s = {warmup_s}\nevery_s = {every_s}\n")
    return str(path)


def print_sites(folder: Path, top: int = 5) -> None:
    """Per component, the allocation sites that grew most from the first line to the last, per hour."""
    from rollwire.core.memory_sites import read_sites
    print(f"\nallocation sites that grew after the warm-up (tracemalloc; {folder}):")
    for name, lines in read_sites(folder).items():
        if len(lines) < 2:
            continue
        first, last = lines[0], lines[-1]
        hours = max(last["t_s"] - first["t_s"], 1e-9) / 3600
        before = {s["site"]: s["grew_kb"] for s in first["sites"]}
        print(f"  {name}: traced {last['traced_mb']:.1f} MB, {last['threads']} threads")
        for site in last["sites"][:top]:
            rate = (site["grew_kb"] - before.get(site["site"], 0.0)) / 1024 / hours
            print(f"    {site['site']:<60} {site['grew_kb'] / 1024:8.2f} MB ({site['blocks']:+d} blocks), "
                  f"{rate:+.2f} MB/h over the last {hours * 60:.0f} min")


def wal_mb(run_dir: Path) -> tuple[float, float, str]:
    """The embedded log's SQLite write-ahead logs under `run_dir`: their total size, the largest
    one's (MB) and its topic. A WAL is reset only when no reader holds a snapshot in it as a
    writer starts; one that readers keep from resetting grows, and every read then searches a
    longer index."""
    sizes: dict[str, float] = {}
    log = run_dir / "log"  # not the whole run directory: the trainer removes old checkpoints while it is walked
    for path in log.rglob("*.sqlite-wal") if log.is_dir() else ():
        with contextlib.suppress(FileNotFoundError):
            sizes[path.name.removesuffix(".sqlite-wal")] = path.stat().st_size / 1e6
    biggest = max(sizes, key=sizes.__getitem__, default="")
    return sum(sizes.values()), sizes.get(biggest, 0.0), biggest


def disk_mb(run_dir: Path) -> dict[str, float]:
    """The size (MB) of each folder of the run directory: the weights kept, the trainer's
    checkpoints, the log, the components' logs. A run of days needs its disk bounded too."""
    def size(path: str) -> int:
        total = 0
        with contextlib.suppress(FileNotFoundError, NotADirectoryError), os.scandir(path) as entries:
            for entry in entries:  # a folder the trainer or the retention removes meanwhile is skipped
                with contextlib.suppress(FileNotFoundError):
                    total += size(entry.path) if entry.is_dir(follow_symlinks=False) else entry.stat().st_size
        return total
    with contextlib.suppress(FileNotFoundError), os.scandir(run_dir) as entries:
        return {entry.name: size(entry.path) / 1e6 for entry in entries if entry.is_dir(follow_symlinks=False)}
    return {}


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) points, per hour."""
    n = len(points)
    mean_t, mean_v = sum(t for t, _ in points) / n, sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    return 3600 * sum((t - mean_t) * (v - mean_v) for t, v in points) / var if var else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", nargs="?", help="recipe to run (default: the bundled demo)")
    parser.add_argument("--minutes", type=float, default=20.0, help="how long to watch (default %(default)s)")
    parser.add_argument("--warmup-minutes", type=float, default=5.0, help="left out of the fits (default %(default)s)")
    parser.add_argument("--every", type=float, default=10.0, help="seconds between samples (default %(default)s)")
    parser.add_argument("--bus", choices=["embedded", "kafka"], default="embedded")
    parser.add_argument("--sites", action="store_true",
                        help="trace allocations in every component and print the sites that grew (slower)")
    parser.add_argument("--report", metavar="FOLDER", type=Path,
                        help="print a finished soak's report again from its files (the folder it named), "
                             "e.g. with another --warmup-minutes; runs nothing")
    args = parser.parse_args()
    if args.report:
        settings = json.loads((args.report / "samples.json").read_text()).get("settings", {})
        report(args.report, settings.get("minutes", args.minutes),
               args.warmup_minutes, settings.get("how", ""), (args.report / "run" / "memory").exists())
        return

    folder = Path(tempfile.mkdtemp(prefix="soak-"))
    recipe = args.recipe
    if args.sites:
        recipe = traced_recipe(recipe, folder, warmup_s=args.warmup_minutes * 60,
                               every_s=max(60.0, (args.minutes - args.warmup_minutes) * 60 / 6))
    bus_args: list[str] = []
    stop_broker = None
    if args.bus == "kafka":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bus import start_broker
        bootstrap, stop_broker = start_broker()
        bus_args = ["--bus", "kafka", "--bootstrap", bootstrap]
    command = [sys.executable, "-m", "rollwire", "run", *([recipe] if recipe else []),
               "--run-dir", str(folder / "run"), "--steps", "100000", *bus_args]
    run = subprocess.Popen(command, stdout=open(folder / "run.out", "w"), stderr=subprocess.STDOUT,
                           env={**os.environ, "COLUMNS": "200"},  # SIGINT is Ctrl-C to it, even from a background job
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    samples: dict[str, list[tuple[float, float, int, int]]] = defaultdict(list)  # name -> (t, rss MB, fds, threads)
    wal: list[tuple[float, float, float, str]] = []  # (t, all WALs MB, the largest MB, its topic)
    disk: list[tuple[float, dict[str, float]]] = []  # (t, MB per folder of the run directory), once a minute
    cpu: list[tuple[float, dict[str, float]]] = []  # (t, CPU seconds so far per component, and the machine's)
    started = time.monotonic()
    metrics = folder / "run" / "metrics.jsonl"
    try:
        while not metrics.exists():  # the warm start and the server's start are not the soak
            if run.poll() is not None:
                raise SystemExit(f"rollwire run ended before its first step; see {folder / 'run.out'}")
            time.sleep(2)
        started = time.monotonic()
        parent = psutil.Process(run.pid)
        broker = [child for child in psutil.Process().children()  # the Kafka broker's JVM, which this started
                  if any("kafka.Kafka" in part for part in child.cmdline())]
        while (elapsed := time.monotonic() - started) < args.minutes * 60:
            if run.poll() is not None:
                raise SystemExit(f"rollwire run ended after {elapsed:.0f} s; see {folder / 'run.out'}")
            for name, processes in components(parent).items():
                rss, fds, threads = usage(processes)
                if rss:
                    samples[name].append((elapsed, rss, fds, threads))
            for name, processes in (("supervisor", [parent]), ("kafka-broker", broker)):
                rss, fds, threads = usage(processes)  # `rollwire run` itself, and the broker this started
                if rss:
                    samples[name].append((elapsed, rss, fds, threads))
            if not cpu or elapsed - cpu[-1][0] >= 60:
                used = {name: cpu_seconds(processes) for name, processes in components(parent).items()}
                used["supervisor"] = cpu_seconds([parent])
                if broker:
                    used["kafka-broker"] = cpu_seconds(broker)
                cpu.append((elapsed, {**used, **{f"machine.{k}": v for k, v in machine_cpu().items()},
                                      "probe.ms": probe_ms()}))
            wal.append((elapsed, *wal_mb(folder / "run")))
            if not disk or elapsed - disk[-1][0] >= 60:
                disk.append((elapsed, disk_mb(folder / "run")))
            time.sleep(args.every)
    finally:
        run.send_signal(signal.SIGINT)
        try:
            run.wait(timeout=120)
        except subprocess.TimeoutExpired:
            run.kill()
        if stop_broker:
            stop_broker()
        how = f"{args.bus} log, a sample every {args.every:g} s"
        (folder / "samples.json").write_text(json.dumps({  # (s, RSS MB, fds, threads) per component; kept if it failed
            **samples, "wal": wal, "disk": disk, "cpu": cpu, "settings": {"minutes": args.minutes, "how": how}}))

    report(folder, args.minutes, args.warmup_minutes, how, args.sites)


def report(folder: Path, minutes: float, warmup_minutes: float, how: str = "", sites: bool = False) -> None:
    """Prints the soak in `folder` (its `samples.json` and the run's `metrics.jsonl`): the fits
    after warm-up, the timeline, the rate held, the `RESULT` line."""
    saved = json.loads((folder / "samples.json").read_text())
    wal = saved.pop("wal", [])
    disk = saved.pop("disk", [])
    cpu = saved.pop("cpu", [])
    saved.pop("settings", None)
    samples = {name: [tuple(s) for s in rows] for name, rows in saved.items()}
    rows = [json.loads(line) for line in (folder / "run" / "metrics.jsonl").read_text().splitlines()]
    first_step_at = rows[0]["time_ms"] / 1000 if rows else None
    warm, total = warmup_minutes * 60, minutes * 60
    print(f"soak: {minutes:g} min of rollwire run{f' ({how})' if how else ''}, warm-up {warmup_minutes:g} min; "
          f"files in {folder}")
    print(f"{'component':<14} {'RSS MB':>8} {'growth/h':>9} {'last third':>10} {'fds':>5} {'fds/h':>7} "
          f"{'threads':>8} {'threads/h':>10}")
    worst = 0.0
    for name in sorted(samples):
        after = [s for s in samples[name] if s[0] >= warm]
        if len(after) < 3:
            continue
        rss = slope_per_hour([(t, r) for t, r, _, _ in after])
        late = [(t, r) for t, r, _, _ in after if t >= total - (total - warm) / 3]
        late_share = 100 * slope_per_hour(late) / late[0][1] if len(late) >= 3 else float("nan")
        fds = slope_per_hour([(t, float(f)) for t, _, f, _ in after])
        threads = slope_per_hour([(t, float(n)) for t, _, _, n in after])
        share = 100 * rss / after[0][1]
        worst = max(worst, share)
        print(f"{name:<14} {after[-1][1]:8.0f} {share:8.1f}% {late_share:9.1f}% {after[-1][2]:5d} {fds:7.1f} "
              f"{after[-1][3]:8d} {threads:10.1f}")
    print("(growth/h: the fit from the warm-up's end, as a share of the size then; last third: the fit over the "
          "run's last third, where the bounds that fill have filled)")
    print_timeline(samples, rows, first_step_at, total, logs=folder / "run" / "logs")
    print_cpu(cpu, rows, first_step_at, total)
    rate = _rate_held(rows, warm, total, first_step_at)
    if wal and wal[-1][1]:
        after = [w for w in wal if w[0] >= warm] or wal
        largest = max(wal, key=lambda w: w[2])
        print(f"SQLite write-ahead logs: {after[0][1]:.0f} MB after warm-up, {wal[-1][1]:.0f} MB at the end; the largest "
              f"seen: {largest[3]} {largest[2]:.0f} MB at minute {largest[0] / 60:.0f}")
    if disk:
        after = [d for d in disk if d[0] >= warm] or disk
        print("disk MB per folder of the run directory (after warm-up -> at the end, the fit per hour): " + ", ".join(
            f"{name} {after[0][1].get(name, 0):.0f} -> {after[-1][1].get(name, 0):.0f} "
            f"({slope_per_hour([(t, sizes.get(name, 0.0)) for t, sizes in after]) if len(after) >= 3 else 0:+.0f}/h)"
            for name in sorted(after[-1][1])))
    fitted, spread, error = rate_trend(rows, warm, first_step_at)
    print(f"steps: {len(rows)}; trained rollouts per minute, last quarter vs first quarter after warm-up: {rate:.2f}; "
          f"fitted over every minute after warm-up: {fitted:+.1f} ± {error:.1f}% an hour (the minutes' spread "
          f"{spread:.1f}%; ± one standard error, minutes taken as independent)")
    if sites:
        print_sites(folder / "run" / "memory")
    print(f"RESULT minutes={minutes:g} worst_rss_growth_pct_per_h={worst:.3g} rate_held={rate:.3g} "
          f"rate_trend_pct_per_h={fitted:.2g} rate_trend_error_pct_per_h={error:.2g} steps={len(rows)}")


_GENERATION = re.compile(r" (\d\d)-(\d\d) (\d\d:\d\d:\d\d) .*Avg generation throughput: ([\d.]+) tokens/s")


def generation_rates(logs: Path, year: int) -> list[list[tuple[float, float]]]:
    """vLLM's own generation throughput, as its engine logs it every 10 s, from each server's log
    (`vllm.log`, `vllm-1.log`, ...): per server, (epoch seconds, tokens/s). The loop is
    generation-bound when the trainer waits for batches; this tells vLLM's speed from rollwire's."""
    servers = []
    for log in sorted(logs.glob("vllm*.log")):
        points = []
        with log.open(errors="replace") as lines:
            for line in lines:
                if (found := _GENERATION.search(line)) is not None:
                    month, day, clock, rate = found.groups()
                    at = time.mktime(time.strptime(f"{year}-{month}-{day} {clock}", "%Y-%m-%d %H:%M:%S"))
                    points.append((at, float(rate)))
        servers.append(points)
    return servers


def print_timeline(samples: dict[str, list[tuple]], rows: list[dict], first_step_at: float | None, total: float,
                   windows: int = 8, logs: Path | None = None) -> None:
    """The run in `windows` equal spans: each component's RSS at the span's end, and what the loop
    did in it (trained rollouts a minute, the share dropped as stale, mean staleness, the
    trainer's mean wait for a batch): a fill, a leak and a change of state look different here."""
    if not rows or first_step_at is None:
        return
    span = total / windows
    ends = [span * (i + 1) for i in range(windows)]
    names = sorted(samples)
    servers = generation_rates(logs, time.gmtime(first_step_at).tm_year) if logs is not None else []
    print(f"\n{'minute':<8}" + "".join(f"{n[:13]:>14}" for n in names)
          + f"{'trained/min':>12} {'stale':>6} {'staleness':>9} {'wait s':>7}" + (" gen tok/s" if servers else ""))
    for end in ends:
        cells = []
        for name in names:
            before = [r for t, r, _, _ in samples[name] if t <= end]
            cells.append(f"{before[-1]:14.0f}" if before else f"{'':>14}")
        inside = [r for r in rows if end - span <= r["time_ms"] / 1000 - first_step_at < end]
        trained = sum(r.get("rollouts", 0) for r in inside)
        stale = sum((r.get("drops") or {}).get("stale", 0) for r in inside)
        staleness = [r["staleness_mean"] for r in inside if r.get("staleness_mean") is not None]
        waits = [r["wait_s"] for r in inside if r.get("wait_s") is not None]
        print(f"{end / 60:<8.0f}" + "".join(cells) + f"{60 * trained / span:12.0f} "
              f"{100 * stale / max(trained + stale, 1):5.1f}% "
              f"{(sum(staleness) / len(staleness) if staleness else float('nan')):9.2f} "
              f"{(sum(waits) / len(waits) if waits else float('nan')):7.2f}" + (
                  f" {_generation(servers, first_step_at + end - span, first_step_at + end):9.0f}" if servers else ""))
    print("(RSS MB per component at each span's end; the loop's figures over the span"
          + ("; gen tok/s: vLLM's generation throughput, its own log's, all servers)" if servers else ")"))


def _generation(servers: list[list[tuple[float, float]]], start: float, end: float) -> float:
    """The servers' generation throughput over [start, end): each one's mean, summed."""
    means = [[rate for at, rate in points if start <= at < end] for points in servers]
    return sum(sum(m) / len(m) for m in means if m) if any(means) else float("nan")


def print_cpu(cpu: list[tuple[float, dict[str, float]]], rows: list[dict], first_step_at: float | None,
              total: float, windows: int = 8) -> None:
    """CPU cores each component used in each of `windows` spans (from its CPU seconds, sampled once a
    minute), the machine's busy and stolen cores, and CPU milliseconds per trainer step: a component
    whose work per step grows, or a host that slows everything, looks different here."""
    if len(cpu) < 2 or first_step_at is None:
        return
    span = total / windows
    names = sorted({name for _, used in cpu for name in used if not name.startswith(("machine.", "probe."))})
    print(f"\n{'minute':<8}" + "".join(f"{n[:13]:>14}" for n in names) + f"{'machine busy':>13} {'steal':>6} "
          f"{'ms/step':>8} {'probe ms':>9}")
    for end in (span * (i + 1) for i in range(windows)):
        inside = [c for c in cpu if end - span <= c[0] <= end]
        if len(inside) < 2:
            continue
        (t0, a), (t1, b) = inside[0], inside[-1]
        cores = {name: (b[name] - a[name]) / (t1 - t0) if name in a and name in b else float("nan")
                 for name in [*names, "machine.busy", "machine.steal"]}
        steps = sum(1 for r in rows if t0 <= r["time_ms"] / 1000 - first_step_at < t1)
        used = sum(c for n, c in cores.items() if n in names and c == c) * (t1 - t0)
        probes = sorted(row["probe.ms"] for _, row in inside if "probe.ms" in row)
        probe = probes[len(probes) // 2] if probes else float("nan")
        print(f"{end / 60:<8.0f}" + "".join(f"{cores[n]:14.2f}" for n in names)
              + f"{cores['machine.busy']:13.2f} {cores['machine.steal']:6.2f} {1000 * used / max(steps, 1):8.0f}"
              + f" {probe:9.1f}")
    print("(CPU cores per component over each span; ms/step: the run's CPU time, all components, per trainer step;"
          " probe ms: the median CPU time of a fixed piece of Python work, a machine that slows shows here)")


def rate_trend(rows: list[dict], warm: float, first_step_at: float | None) -> tuple[float, float, float]:
    """Rollouts trained in each whole minute from the warm-up's end to the last step, fitted by least
    squares (`trend`). The quarter ratio (`_rate_held`) compares two spans of the run and moves with
    one slow span; the fit weighs every minute."""
    nothing = float("nan"), float("nan"), float("nan")
    if not rows or first_step_at is None:
        return nothing
    per: dict[int, int] = {}
    for r in rows:
        minute = int((r["time_ms"] / 1000 - first_step_at) // 60)
        per[minute] = per.get(minute, 0) + r.get("rollouts", 0)
    minutes = [m for m in sorted(per) if m * 60 >= warm and m < max(per)]
    if len(minutes) < 3:
        return nothing
    return trend([(60.0 * m, float(per[m])) for m in minutes])


def trend(points: list[tuple[float, float]]) -> tuple[float, float, float]:
    """(seconds, value) points fitted by least squares: the change an hour as % of the fitted value
    at the first point, the points' own spread (standard deviation over mean, %), and the slope's
    standard error in the same unit. The error takes the points as independent, which neighbouring
    minutes of a run are not quite: read it as a lower bound."""
    n = len(points)
    slope = slope_per_hour(points)
    mean_t, mean = sum(t for t, _ in points) / n, sum(v for _, v in points) / n
    at_first = mean + slope * (points[0][0] - mean_t) / 3600
    spread = (sum((v - mean) ** 2 for _, v in points) / (n - 1)) ** 0.5 / mean if mean else float("nan")
    hours = sum((t - mean_t) ** 2 for t, _ in points) / 3600**2
    residuals = sum((v - mean - slope * (t - mean_t) / 3600) ** 2 for t, v in points)
    error = (residuals / (n - 2) / hours) ** 0.5 if hours and n > 2 else float("nan")
    if not at_first:
        return float("nan"), 100 * spread, float("nan")
    return 100 * slope / at_first, 100 * spread, 100 * error / abs(at_first)


def _rate_held(rows: list[dict], warm: float, total: float, first_step_at: float | None) -> float:
    """Rollouts trained per minute in the run's last quarter over those in the first quarter after
    warm-up. The run ends at its last step, not at `total`: the watch starts when the metrics file
    appears and the last step comes a little before the stop, so a window running to `total`
    would count time in which no step could be seen (a fifth of the last quarter, measured)."""
    if not rows or first_step_at is None:
        return float("nan")
    total = min(total, rows[-1]["time_ms"] / 1000 - first_step_at)
    quarter = (total - warm) / 4

    def per_minute(start: float, end: float) -> float:
        inside = [r for r in rows if start <= r["time_ms"] / 1000 - first_step_at < end]
        return 60 * sum(r.get("rollouts", 0) for r in inside) / max(end - start, 1e-9)

    early = per_minute(warm, warm + quarter)
    return per_minute(total - quarter, total) / early if early else float("nan")


if __name__ == "__main__":
    main()
