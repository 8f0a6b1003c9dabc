"""Rollouts scored per second on one core: the pure scorer, the embedded driver, faust on Kafka.

    python bench/scorer.py [--groups N] [--group-size K]

The baseline is the least work scoring a rollout takes, in this process with no transport:
decode it, `on_rollout`, encode each output event and each changelog record the step needs
(`group_changelog.writes`: one record per rollout), measured in the same run; each driver's rate is printed next to it. The
drivers run pinned to one CPU core. The embedded driver runs in-process over a fresh embedded
log; the faust worker runs as `rollwire score --bus kafka` against the broker at
$KAFKA_BOOTSTRAP_SERVERS or a local one (deploy/kafka/broker.py), and its rate is taken between
the first and the last scored record it wrote (worker start-up excluded).
The last line is `RESULT name=value ...`.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))


def rollouts(groups: int, size: int):
    from builders import group_of
    return [r for g in range(groups)
            for r in group_of(f"bench-{g}", [float((g + i) % 3 == 0) for i in range(size)],
                              lengths=[20 + (g * i) % 40 for i in range(size)])]


def group_options(description: str, default_groups: int) -> argparse.Namespace:
    """`--groups` and `--group-size`, the shape of the generated rollouts every scorer bench takes."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=default_groups, help="groups (default %(default)s)")
    parser.add_argument("--group-size", type=int, default=8, help="rollouts per group (default %(default)s)")
    return parser.parse_args()


def encoded_rollouts(groups: int, size: int) -> list[tuple[bytes, bytes]]:
    """(key, envelope) of each generated rollout, as an env worker would publish it."""
    from rollwire.schemas import Codec
    codec = Codec()
    return [(r.group_id.encode(), codec.encode(r, producer="bench")) for r in rollouts(groups, size)]


def pure_rate(encoded: list[bytes]) -> float:
    from rollwire.schemas import Codec
    from rollwire.streams import group_changelog
    from rollwire.streams.scoring import GroupScorer, ScorerSettings
    codec, scorer, states = Codec(), GroupScorer(ScorerSettings()), {}
    t0 = time.perf_counter()
    for data in encoded:
        rollout = codec.decode(data).event
        step = scorer.on_rollout(states.get(rollout.group_id), rollout)
        for event in step.events:
            codec.encode(event, producer="bench")
        for _, record in group_changelog.writes(rollout.group_id, states.get(rollout.group_id), step):
            if record is not None:
                codec.encode(record, producer="bench")
        states[rollout.group_id] = step.state
    return len(encoded) / (time.perf_counter() - t0)


def whole_group_rate(encoded: list[bytes]) -> float:
    """The baseline as the scorer once defined it: the logic, plus encoding the whole group after
    every rollout (what the changelog stored before it grew by deltas). For reference only."""
    from rollwire.schemas import Codec
    from rollwire.streams.scoring import GroupScorer, ScorerSettings
    codec, scorer, states = Codec(), GroupScorer(ScorerSettings()), {}
    t0 = time.perf_counter()
    for data in encoded:
        rollout = codec.decode(data).event
        step = scorer.on_rollout(states.get(rollout.group_id), rollout)
        for event in step.events:
            codec.encode(event, producer="bench")
        codec.encode(step.state, producer="bench")
        states[rollout.group_id] = step.state
    return len(encoded) / (time.perf_counter() - t0)


def publish(log, topics, encoded_with_keys) -> None:
    with log.producer() as producer:
        for key, value in encoded_with_keys:
            producer.send(topics.rollouts, value, key=key)
        producer.flush()


def count_scored(log, topics) -> tuple[int, int, int]:
    """(records, first timestamp, last timestamp) on the scored topic."""
    from rollwire.bus import Beginning
    n, first, last = 0, None, None
    with log.reader([topics.scored], Beginning()) as reader:
        while batch := reader.poll_batch(5000, 1.0):
            n += len(batch)
            stamps = [r.timestamp_ms for r in batch]
            first = min(stamps + ([first] if first is not None else []))
            last = max(stamps + ([last] if last is not None else []))
    return n, first or 0, last or 0


def embedded_rate(encoded_with_keys) -> float:
    from rollwire.bus import catalog_topics
    from rollwire.bus.embedded import EmbeddedLog
    from rollwire.schemas import Topics
    from rollwire.streams.embedded_scorer import EmbeddedScorer
    from rollwire.streams.scoring import GroupScorer, ScorerSettings
    log, topics = EmbeddedLog(tempfile.mkdtemp(prefix="bench-scorer-")), Topics("bench")
    log.create_topics(catalog_topics(topics))
    publish(log, topics, encoded_with_keys)
    service = EmbeddedScorer(log, topics, GroupScorer(ScorerSettings()), tick_s=3600)
    t0 = time.perf_counter()
    while service.stats["rollout.scored"] < len(encoded_with_keys):
        service.step(timeout_s=0.2)
    rate = len(encoded_with_keys) / (time.perf_counter() - t0)
    service.close()
    return rate


def embedded_log_rate(encoded_with_keys) -> float:
    """The embedded log alone on the records the embedded driver moves: read every rollout, write
    every output and changelog record (pre-encoded here, outside the timing), flush. No decoding,
    no scoring: the floor the log sets under the driver."""
    from rollwire.bus import Beginning, catalog_topics
    from rollwire.bus.embedded import EmbeddedLog
    from rollwire.bus.partitioner import partition_for
    from rollwire.schemas import Codec, Topics
    from rollwire.streams import group_changelog
    from rollwire.streams.scoring import GroupScorer, ScorerSettings, route
    codec, scorer, states, topics = Codec(), GroupScorer(ScorerSettings()), {}, Topics("bench")
    out = []
    for _, data in encoded_with_keys:
        rollout = codec.decode(data).event
        gid = rollout.group_id
        step = scorer.on_rollout(states.get(gid), rollout)
        out += [(topics.name(route(e)), gid.encode(), codec.encode(e, producer="bench"), None) for e in step.events]
        partition = partition_for(gid.encode(), 4)
        out += [(topics.name("scorer-state"), key.encode(), None if rec is None else codec.encode(rec, producer="bench"),
                 partition) for key, rec in group_changelog.writes(gid, states.get(gid), step)]
        states[gid] = step.state
    log = EmbeddedLog(tempfile.mkdtemp(prefix="bench-scorer-log-"))
    log.create_topics(catalog_topics(topics))
    publish(log, topics, encoded_with_keys)
    t0 = time.perf_counter()
    with log.reader([topics.rollouts], Beginning()) as reader:
        read = 0
        while read < len(encoded_with_keys):
            read += len(reader.poll_batch(500, 0.2))
    with log.producer() as producer:
        for topic, key, value, partition in out:
            producer.send(topic, value, key=key, partition=partition)
        producer.flush()
    return len(encoded_with_keys) / (time.perf_counter() - t0)


def faust_rate(encoded_with_keys, bootstrap: str) -> float:
    from rollwire.bus import catalog_topics
    from rollwire.bus.kafka import KafkaLog
    from rollwire.schemas import Topics
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    log, topics = KafkaLog(bootstrap), Topics(prefix)
    log.create_topics(catalog_topics(topics))
    publish(log, topics, encoded_with_keys)
    worker = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-m", "rollwire.cli", "score", "--bus", "kafka",
                               "--bootstrap", bootstrap, "--prefix", prefix, "--app-id", f"{prefix}-scorer"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            n, first, last = count_scored(log, topics)
            if n >= len(encoded_with_keys):
                break
            time.sleep(2)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
        log.close()
    if n < len(encoded_with_keys):
        raise SystemExit(f"faust scored only {n} of {len(encoded_with_keys)} rollouts in 10 minutes")
    return len(encoded_with_keys) / max(1e-3, (last - first) / 1000)


def main() -> None:
    args = group_options(__doc__, 500)

    from bus import start_broker

    encoded = encoded_rollouts(args.groups, args.group_size)
    print(f"{len(encoded)} rollouts in {args.groups} groups of {args.group_size}, ~{len(encoded[0][1])} B each")

    os.sched_setaffinity(0, {0})
    results = {"pure_rps": pure_rate([v for _, v in encoded]),
               "whole_group_rps": whole_group_rate([v for _, v in encoded])}
    results["embedded_rps"] = embedded_rate(encoded)
    results["embedded_log_rps"] = embedded_log_rate(encoded)
    os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    bootstrap, stop_broker = start_broker()
    try:
        results["faust_rps"] = faust_rate(encoded, bootstrap)
    finally:
        if stop_broker:
            stop_broker()
    base = results["pure_rps"]
    print(f"{'driver':<22} {'rollouts/s':>11} {'vs pure':>8}")
    for name, label in (("pure_rps", "pure logic (baseline)"), ("whole_group_rps", "logic + whole group"),
                        ("embedded_log_rps", "embedded log alone"), ("embedded_rps", "embedded driver"),
                        ("faust_rps", "faust on Kafka")):
        print(f"{label:<22} {results[name]:11,.0f} {results[name] / base:8.2f}")
    results["embedded_vs_pure"] = results["embedded_rps"] / base
    results["faust_vs_pure"] = results["faust_rps"] / base
    # The logic and the log both have to run: together they bound the driver.
    both = 1 / (1 / base + 1 / results["embedded_log_rps"])
    results["embedded_vs_logic_plus_log"] = results["embedded_rps"] / both
    for driver in ("embedded", "faust"):  # against the older, whole-group definition of the logic
        results[f"{driver}_vs_whole_group"] = results[f"{driver}_rps"] / results["whole_group_rps"]
    print("RESULT " + " ".join(f"{k}={v:.3g}" for k, v in results.items()))


if __name__ == "__main__":
    main()
