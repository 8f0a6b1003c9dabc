"""The scorer's memory over hours of groups, in one process with no transport: does it level off?

    python bench/scorer_memory.py [--hours 5] [--group-every-ms 64] [--group-size 8]

Feeds the scorer's host (`ScorerHost`, as both drivers use it) whole groups at the demo's rate (one
every 64 ms of simulated time, ~56,000 an hour), ticking it and taking its changelog writes every
500 groups as the drivers do, with the default settings (`retain_closed_s` = 3600: closed groups are
held for an hour). A simulated hour takes about 25 s on one core. Every quarter hour of groups it prints the
process's RSS and heap (`[heap]` in /proc/self/smaps) and the closed groups held. At the end, glibc's
`malloc_trim(0)` gives back the free pages the allocator holds: what RSS is then is live memory.

The measure is the soak's: growth per hour over the second half, as a share of the RSS at the end of
the first hour (the goal for a run of days: under 5% an hour), beside the growth in the hour after the
closed groups filled.
"""

from __future__ import annotations

import argparse
import ctypes
import random
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

from dedupe_memory import resident  # noqa: E402  (RSS and the heap's resident MB)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=5, help="simulated hours of groups (at least 2)")
    parser.add_argument("--group-every-ms", type=int, default=64, help="simulated time between groups")
    parser.add_argument("--group-size", type=int, default=8)
    args = parser.parse_args()
    if args.hours < 2:
        parser.error("--hours must be at least 2: the first hour fills the closed groups")

    from builders import group_of

    from rollwire.streams.scorer_host import ScorerHost
    from rollwire.streams.scoring import GroupScorer, ScorerSettings

    rng = random.Random(1)
    host = ScorerHost(GroupScorer(ScorerSettings()), partitions=4)
    now = 1_790_000_000_000
    per_hour = 3_600_000 // args.group_every_ms
    rewards = [float(i % 2) for i in range(args.group_size)]
    samples: list[tuple[float, float]] = []
    began = time.perf_counter()
    print(f"{'hours':>6} {'RSS MB':>7} {'heap MB':>8} {'closed groups':>14} {'wall s':>6}")
    quarter = per_hour // 4
    for g in range(int(args.hours * 4) * quarter + 1):  # hours counted in whole quarters
        if g % quarter == 0:
            rss, heap = resident()
            samples.append((g / quarter / 4, rss))
            print(f"{g / quarter / 4:6.2f} {rss:7.0f} {heap:8.0f} {host.closed_groups():14d} {time.perf_counter() - began:6.0f}",
                  flush=True)
        for rollout in group_of(str(uuid.UUID(int=rng.getrandbits(128))), rewards):
            host.rollout(rollout, now=now)
        now += args.group_every_ms
        if g % 500 == 0:
            host.tick(now=now)
            host.writes()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    trimmed, _ = resident()
    at_hour = next(rss for hours, rss in samples if hours >= 1)
    after_fill = next(rss for hours, rss in samples if hours >= 2) - at_hour
    half = [(h, r) for h, r in samples if h >= args.hours / 2]
    slope = _fit(half)
    print(f"filled to {at_hour:.0f} MB in the first hour; +{after_fill:.0f} MB in the hour after; "
          f"{100 * slope / at_hour:.1f}% an hour over the second half; {trimmed:.0f} MB after malloc_trim")
    print(f"RESULT growth_pct_per_h_second_half={100 * slope / at_hour:.2f} hour_after_fill_mb={after_fill:.0f} "
          f"rss_after_hour_mb={at_hour:.0f} trimmed_mb={trimmed:.0f}")


def _fit(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of RSS over hours."""
    n = len(points)
    mx = sum(h for h, _ in points) / n
    my = sum(r for _, r in points) / n
    return sum((h - mx) * (r - my) for h, r in points) / max(sum((h - mx) ** 2 for h, _ in points), 1e-9)


if __name__ == "__main__":
    main()
