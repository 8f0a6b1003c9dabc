"""Rollouts re-scored per second by `replay score`, against the live embedded scorer on the same log.

    python bench/replay.py [--groups N] [--group-size K]

Both read the same recorded rollouts from one embedded log and write scored events and drops;
the live scorer also writes its changelog and commits, which a replay has no need for. The
baseline is the live embedded driver measured in the same run (goal: replay ≥ 1× of it). The
replay's peak memory (tracemalloc, in a second replay) is printed too: it keeps a summary per
rollout for its report, not the events (`--groups 125000` makes the 1M-rollout log of the
issue). The last line is `RESULT ...`.
"""

from __future__ import annotations

import resource
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))


def main() -> None:
    from scorer import encoded_rollouts, group_options, publish

    args = group_options(__doc__, 1000)

    from rollwire.bus import catalog_topics
    from rollwire.bus.embedded import EmbeddedLog
    from rollwire.schemas import Topics
    from rollwire.streams import replay
    from rollwire.streams.embedded_scorer import EmbeddedScorer
    from rollwire.streams.scoring import GroupScorer, ScorerSettings

    encoded = encoded_rollouts(args.groups, args.group_size)
    log, live = EmbeddedLog(tempfile.mkdtemp(prefix="bench-replay-")), Topics("bench")
    log.create_topics(catalog_topics(live))
    publish(log, live, encoded)
    del encoded
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

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
    tracemalloc.start()  # a second replay, measured for memory only (tracing slows it)
    replay.score_into(log, live, Topics("bench-replay-mem"), GroupScorer(ScorerSettings()))
    peak_mb = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()

    print(f"{total} rollouts in {args.groups} groups of {args.group_size}")
    print(f"{'':<24} {'rollouts/s':>11} {'vs live':>8}")
    print(f"{'live embedded scorer':<24} {live_rps:11,.0f} {1:8.2f}")
    print(f"{'replay score':<24} {replay_rps:11,.0f} {replay_rps / live_rps:8.2f}")
    print(f"replay's peak Python allocations {peak_mb:.1f} MB, {peak_mb * 2**20 / total:.0f} B per rollout "
          f"(process RSS before scoring: {rss_before / 1024:.0f} MB, mostly this bench's own generated log)")
    print(f"RESULT live_rps={live_rps:.4g} replay_rps={replay_rps:.4g} replay_vs_live={replay_rps / live_rps:.3g} "
          f"replay_peak_mb={peak_mb:.1f}")


if __name__ == "__main__":
    main()
