"""Does a vLLM server generate more slowly the longer it serves, and is it the weight reloads?

    python bench/vllm_drift.py [--minutes 90] [--warmup-minutes 10] [--reload-every 0.8] [--concurrency 32]

The 2-hour soaks of the demo (`bench/soak.py`) lost about 4% of their rate an hour on the embedded
log, and the loop there is bound by vLLM's generation: its tokens per CPU-second fell while the
machine did not slow. This takes the rest of the loop away. Two servers of the demo's model run
side by side on the same machine, each under the same closed-loop load shaped like the demo's
env worker (`--concurrency` token-in generations at a time, groups of 8 on one reverse-digits
prompt, `max_tokens` 6 with `ignore_eos` so every request costs the same, and a detokenize per
answer). One of them, `reloading`, also takes a new weight version every `--reload-every`
seconds the way the demo's replica does: received from a `WeightSender` over gloo, staged while
it serves, then pause, in-place reload, label, prefix-cache reset, resume. The other, `still`,
serves the base weights throughout: it is the baseline, measured in the same minutes on the same
machine, so whatever slows both is the machine or the serving, and whatever slows only the
reloading one is the reloads.

Each minute it reads, per server, the completion tokens answered and the CPU seconds of the whole
server (API server and engine), and the machine's probe (`bench/soak.py`'s `probe_ms`). After the
warm-up, tokens per CPU-second are fitted by least squares, in % an hour, per server; the last
line is `RESULT ...` with both fits and their difference.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from soak import cpu_seconds, machine_cpu, probe_ms, slope_per_hour  # noqa: E402
from soak import trend as fit  # noqa: E402

GROUP = 8
MAX_TOKENS = 6


def load(base_url: str, prompts: list[list[int]], concurrency: int, counters, stop) -> None:
    """Keeps `concurrency` generations in flight against `base_url` until `stop` is set, counting
    answered requests, completion tokens and failures into `counters` (a shared array)."""
    import httpx

    async def worker(client: httpx.AsyncClient, offset: int) -> None:
        n = offset
        while not stop.is_set():
            ids = prompts[(n // GROUP) % len(prompts)]
            n += concurrency
            try:
                answer = await client.post("/inference/v1/generate", json={
                    "token_ids": ids, "model": "policy",
                    "sampling_params": {"max_tokens": MAX_TOKENS, "temperature": 1.0, "ignore_eos": True,
                                        "logprobs": 0}})
                answer.raise_for_status()
                tokens = answer.json()["choices"][0]["token_ids"]
                (await client.post("/detokenize", json={"tokens": tokens})).raise_for_status()
            except (httpx.HTTPError, KeyError, ValueError):
                with counters.get_lock():
                    counters[2] += 1
                await asyncio.sleep(0.1)
                continue
            with counters.get_lock():
                counters[0] += 1
                counters[1] += len(tokens)

    async def main() -> None:
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(base_url=base_url, timeout=120, limits=limits) as client:
            await asyncio.gather(*(worker(client, i) for i in range(concurrency)))

    asyncio.run(main())


def versions(work: Path) -> tuple[Path, list[tuple[Path, object]]]:
    """The demo's model shape (Llama, hidden 128, 2 layers, character tokenizer): the base, and two
    more versions published to a local store (their manifests are what the sender offers)."""
    from rollwire.core.objectstore import LocalStore
    from rollwire.core.weight_versions import publish
    from rollwire.trainer.tiny import build_char_tokenizer, build_tiny_model

    tokenizer = build_char_tokenizer()
    base = build_tiny_model(work / "v0", tokenizer, seed=0)
    store = LocalStore(work / "store")
    published = []
    for version in (1, 2):
        folder = build_tiny_model(work / f"v{version}", tokenizer, seed=version)
        published.append((folder, publish(store, folder, f"policy/v{version}", policy="policy", version=version,
                                          step=version)))
    return base, published


def reloader(server, sender, published, every_s: float, stop: threading.Event, pauses: list[float]) -> None:
    """Swaps `server` to the next of `published` every `every_s` seconds, as the demo's replica
    swaps a version received directly; appends each pause (seconds) to `pauses`. The swaps start on
    a fixed schedule (one that ran over its slot is followed at once by the next)."""
    n, began = 0, time.monotonic()
    while not stop.wait(max(0.0, began + every_s * (n + 1) - time.monotonic())):
        folder, version = published[n % len(published)]
        number = n % len(published) + 1
        sender.offer(number, folder, version.manifest_data)
        swap = server.control.swap_received_weights(sender.address, number, version.manifest_sha256, str(n + 1),
                                                    who="bench")
        pauses.append(swap.paused_s)
        n += 1


def tree(process: psutil.Process) -> list[psutil.Process]:
    return [process, *process.children(recursive=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=90, help="length of the run (default %(default)s)")
    parser.add_argument("--warmup-minutes", type=float, default=10, help="left out of the fits (default %(default)s)")
    parser.add_argument("--reload-every", type=float, default=0.8,
                        help="seconds between the reloading server's versions; the demo makes ~1.25 a second "
                             "(default %(default)s)")
    parser.add_argument("--concurrency", type=int, default=32,
                        help="generations in flight per server, as the demo's env worker (default %(default)s)")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                        help="each server on a core of its own (default on): two unpinned servers on two cores "
                             "slow each other far beyond their share (measured here: 170 tokens/s each against "
                             "667 for one alone)")
    parser.add_argument("--report", type=Path, metavar="OUTPUT",
                        help="print the report again from a finished run's output (its minute table)")
    args = parser.parse_args()
    if args.report is not None:
        report(read_table(args.report), args.warmup_minutes, ("reloading", "still"), {})
        return

    from rollwire.consumers.vllm_server import VllmServer, VllmServerSettings
    from rollwire.core.weight_transfer import WeightSender
    from rollwire.producers.environments.reverse_digits import ReverseDigits

    work = Path(tempfile.mkdtemp(prefix="bench-vllm-drift-"))
    print(f"work folder {work}", flush=True)
    base, published = versions(work)
    names = ("reloading", "still")
    servers = {name: VllmServer(VllmServerSettings(model=str(base), dtype="float32", max_model_len=64,
                                                   kv_cache_gib=1, log_path=work / f"vllm-{name}.log"))
               for name in names}
    stop_load, stop_reload = mp.Event(), threading.Event()
    clients, pauses = [], []
    sender = WeightSender()
    try:
        everywhere = os.sched_getaffinity(0)
        for core, server in enumerate(servers.values()):
            if args.pin:  # the server's processes inherit this process's CPUs
                os.sched_setaffinity(0, {sorted(everywhere)[core % len(everywhere)]})
            try:
                server.start()
            finally:
                os.sched_setaffinity(0, everywhere)
        control = servers["reloading"].control
        rows = [row["prompt"] for _, row in zip(range(512), ReverseDigits(seed=1).rows())]
        prompts = [control.tokenize(text) for text in rows]
        counters = {name: mp.Array("d", 3) for name in names}
        for name, server in servers.items():
            client = mp.Process(target=load, args=(server.base_url, prompts, args.concurrency, counters[name],
                                                   stop_load), daemon=True)
            client.start()
            clients.append(client)
        thread = threading.Thread(target=reloader, args=(servers["reloading"], sender, published, args.reload_every,
                                                         stop_reload, pauses), daemon=True)
        thread.start()
        processes = {name: psutil.Process(server.process.pid) for name, server in servers.items()}
        minutes = []  # per minute: {name: (tokens, cpu_s, rss_mb)}, probe_ms, machine busy, steal, reloads, pause
        last = {name: (0.0, cpu_seconds(tree(p))) for name, p in processes.items()}
        last_machine, last_pauses = machine_cpu(), 0
        print(f"{'min':>4} " + " ".join(f"{n + ' tok/s':>16} {n + ' tok/cpu-s':>20} {n + ' MB':>13}" for n in names)
              + f" {'reloads':>8} {'pause ms':>9} {'probe ms':>9} {'busy':>5} {'steal':>6}", flush=True)
        started = time.monotonic()
        for minute in range(1, int(args.minutes) + 1):
            time.sleep(max(0.0, started + 60 * minute - time.monotonic()))
            row: dict = {}
            for name, process in processes.items():
                tokens, cpu = counters[name][1], cpu_seconds(tree(process))
                rss = sum(p.memory_info().rss for p in tree(process)) / 2**20
                row[name] = (tokens - last[name][0], cpu - last[name][1], rss)
                last[name] = (tokens, cpu)
            machine = machine_cpu()
            new = pauses[last_pauses:]
            last_pauses = len(pauses)
            row.update(probe=probe_ms(), busy=(machine["busy"] - last_machine["busy"]) / 60,
                       steal=(machine["steal"] - last_machine["steal"]) / 60, reloads=len(new),
                       pause=1000 * statistics.fmean(new) if new else float("nan"))
            last_machine = machine
            minutes.append(row)
            print(f"{minute:4d} " + " ".join(f"{row[n][0] / 60:16.0f} {row[n][0] / max(row[n][1], 1e-9):20.0f} "
                                             f"{row[n][2]:13.0f}" for n in names)
                  + f" {row['reloads']:8d} {row['pause']:9.1f} {row['probe']:9.1f} {row['busy']:5.2f} "
                    f"{row['steal']:6.3f}", flush=True)
            if not thread.is_alive():
                raise SystemExit("the reloading thread ended: see the log above")
        failures = {name: int(counters[name][2]) for name in names}
    finally:
        stop_reload.set()
        stop_load.set()
        for client in clients:
            client.join(timeout=10)
        sender.close()
        for server in servers.values():
            server.stop()
    report(minutes, args.warmup_minutes, names, failures)
    shutil.rmtree(work / "store", ignore_errors=True)


def read_table(output: Path) -> list[dict]:
    """The minute rows of a run's printed table, as `main` collects them."""
    rows = []
    for line in output.read_text().splitlines():
        parts = line.split()
        if len(parts) != 12 or not parts[0].isdigit():
            continue
        values = [float(v) for v in parts[1:]]
        row: dict = {}
        for name, (per_s, per_cpu, rss) in zip(("reloading", "still"), (values[0:3], values[3:6])):
            row[name] = (60 * per_s, 60 * per_s / per_cpu, rss)
        row.update(reloads=int(values[6]), pause=values[7], probe=values[8], busy=values[9], steal=values[10])
        rows.append(row)
    return rows


def report(minutes: list[dict], warmup_minutes: float, names: tuple[str, ...], failures: dict[str, int]) -> None:
    warm = [(60.0 * i, row) for i, row in enumerate(minutes, start=1) if i > warmup_minutes]
    if len(warm) < 3:
        raise SystemExit("too few minutes after the warm-up to fit")
    trends = {}
    for name in names:
        per_cpu = fit([(t, row[name][0] / row[name][1]) for t, row in warm])
        per_s = fit([(t, row[name][0] / 60) for t, row in warm])
        rss = slope_per_hour([(t, row[name][2]) for t, row in warm])
        trends[name] = per_cpu[0]
        print(f"{name:10}: tokens per CPU-second {per_cpu[0]:+.1f} ± {per_cpu[2]:.1f}% an hour (minutes' spread "
              f"{per_cpu[1]:.1f}%), "
              f"tokens a second {per_s[0]:+.1f}% an hour (spread {per_s[1]:.1f}%), RSS {rss:+.1f} MB an hour, "
              f"{failures.get(name, '?')} failed requests")
    # The machine and the clients move both servers alike from minute to minute; their ratio does not.
    ratio = fit([(t, (row["reloading"][0] / row["reloading"][1]) / (row["still"][0] / row["still"][1]))
                 for t, row in warm])
    print(f"reloading over still, tokens per CPU-second: {ratio[0]:+.1f} ± {ratio[2]:.1f}% an hour (minutes' spread "
          f"{ratio[1]:.1f}%)")
    probe = fit([(t, row["probe"]) for t, row in warm])
    pause = fit([(t, row["pause"]) for t, row in warm if row["reloads"]])
    reloads = sum(row["reloads"] for row in minutes)
    print(f"machine probe {probe[0]:+.1f}% an hour (spread {probe[1]:.1f}%); reloads {reloads}, pause "
          f"{pause[0]:+.1f}% an hour (spread {pause[1]:.1f}%)")
    print(f"RESULT minutes={len(minutes)} reloads={reloads} reloading_pct_per_h={trends['reloading']:.2f} "
          f"still_pct_per_h={trends['still']:.2f} ratio_pct_per_h={ratio[0]:.2f} "
          f"probe_pct_per_h={probe[0]:.2f}")


if __name__ == "__main__":
    sys.exit(main())
