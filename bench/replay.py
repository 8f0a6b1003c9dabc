"""Rollouts re-scored per second by `replay score`, against the live embedded scorer on the same log,
and the replay's peak memory as the log grows.

    python bench/replay.py [--groups N] [--group-size K] [--spacing-ms MS]

Generated rollouts are published with record times `--spacing-ms` apart per group (default 100 ms:
1M rollouts span 3.5 hours, as a long run's log does). Both read the same recorded rollouts from
one embedded log and write scored events and drops; the live scorer also writes its changelog
and commits, which a replay has no need for. The baseline is the live embedded driver measured in
the same run (goal: replay ≥ 1× of it). Memory: a second replay runs alone in a child process
(`python bench/replay.py --measure LOG_DIR`), whose peak resident size is printed, imports
included; `--groups 125000` makes the 1M-rollout log of the issue. The last line is `RESULT ...`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))


def high_water_mb() -> float:
    """This process's peak resident size (VmHWM: reset by exec, unlike getrusage's ru_maxrss, which
    a child started from a big parent inherits)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def measure(log_dir: str) -> None:
    """The child: one replay of the log at `log_dir`, then its peak resident size as JSON."""
    from rollwire.core.bus.embedded import EmbeddedLog
    from rollwire.schemas import Topics
    from rollwire.streams import replay
    from rollwire.streams.scoring import GroupScorer, ScorerSettings
    baseline = high_water_mb()
    comparison = replay.score_into(EmbeddedLog(log_dir), Topics("bench"), Topics("bench-replay-mem"),
                                   GroupScorer(ScorerSettings()))
    assert comparison.unchanged, "the replay did not reproduce the record"
    print(json.dumps({"peak_mb": high_water_mb(), "imports_mb": baseline}))


def publish_spread(log, topics, encoded, group_size: int, spacing_ms: int) -> None:
    """Publishes each group `spacing_ms` after the previous one, ending now."""
    start = time.time_ns() // 1_000_000 - spacing_ms * (len(encoded) // group_size)
    with log.producer() as producer:
        for i, (key, value) in enumerate(encoded):
            producer.send(topics.rollouts, value, key=key, timestamp_ms=start + spacing_ms * (i // group_size) + i % group_size)
        producer.flush()


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--measure":
        measure(sys.argv[2])
        return
    from scorer import encoded_rollouts, group_options

    args = group_options(__doc__, 1000, extra=lambda p: p.add_argument(
        "--spacing-ms", type=int, default=100, help="record time between groups (default %(default)s)"))

    from rollwire.core.bus import catalog_topics
    from rollwire.core.bus.embedded import EmbeddedLog
    from rollwire.schemas import Topics
    from rollwire.streams import replay
    from rollwire.streams.embedded_scorer import EmbeddedScorer
    from rollwire.streams.scoring import GroupScorer, ScorerSettings

    log_dir = tempfile.mkdtemp(prefix="bench-replay-")
    log, live = EmbeddedLog(log_dir), Topics("bench")
    log.create_topics(catalog_topics(live))
    encoded = encoded_rollouts(args.groups, args.group_size)
    publish_spread(log, live, encoded, args.group_size, args.spacing_ms)
    del encoded

    scorer = EmbeddedScorer(log, live, GroupScorer(ScorerSettings()), tick_s=3600)
    total = args.groups * args.group_size
    t0 = time.perf_counter()
    while scorer.stats["rollout.scored"] < total:
        scorer.step(timeout_s=0.2)
    live_rps = total / (time.perf_counter() - t0)
    scorer.close()

    t0 = time.perf_counter()
    comparison = replay.score_into(log, live, Topics("bench-replay"), GroupScorer(ScorerSettings()))
    replay_rps = total / (time.perf_counter() - t0)
    assert comparison.unchanged and comparison.identical == total, "the replay did not reproduce the record"
    child = subprocess.run([sys.executable, __file__, "--measure", log_dir], capture_output=True, text=True,
                           check=True)
    memory = json.loads(child.stdout.strip().splitlines()[-1])

    span_h = args.spacing_ms * args.groups / 3.6e6
    print(f"{total} rollouts in {args.groups} groups of {args.group_size}, recorded over {span_h:.1f} h")
    print(f"{'':<24} {'rollouts/s':>11} {'vs live':>8}")
    print(f"{'live embedded scorer':<24} {live_rps:11,.0f} {1:8.2f}")
    print(f"{'replay score':<24} {replay_rps:11,.0f} {replay_rps / live_rps:8.2f}")
    print(f"replay alone in a process: peak resident {memory['peak_mb']:.0f} MB "
          f"({memory['imports_mb']:.0f} MB after imports)")
    print(f"RESULT live_rps={live_rps:.4g} replay_rps={replay_rps:.4g} replay_vs_live={replay_rps / live_rps:.3g} "
          f"replay_peak_rss_mb={memory['peak_mb']:.0f} imports_rss_mb={memory['imports_mb']:.0f}")


if __name__ == "__main__":
    main()
