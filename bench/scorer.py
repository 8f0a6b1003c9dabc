"""Rollouts scored per second on one core: the pure scorer, the embedded driver, faust on Kafka.

    python bench/scorer.py [--groups N] [--group-size K]

The baseline is the least work scoring a rollout takes, in this process with no transport:
decode it, `on_rollout`, encode each output event, and encode the changelog records its batch
needs (`group_changelog.writes`, coalesced per batch of 500 as the drivers do), measured in the
same run; each driver's rate is printed next to it. Every rate is measured twice: with each
group's rollouts arriving one after another (the best case for coalescing) and interleaved
round-robin over all groups (the worst: nothing coalesces). The drivers run pinned to one core.
The embedded driver runs in-process over a fresh embedded log; the faust worker runs as
`rollwire score --bus kafka` against the broker at $KAFKA_BOOTSTRAP_SERVERS or a local one
(deploy/kafka/broker.py); once it has scored a warm-up group, its rate is taken from the start
of publishing the rollouts to its last scored record.
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


def rollouts(groups: int, size: int, prefix: str = "bench"):
    from builders import group_of
    return [r for g in range(groups)
            for r in group_of(f"{prefix}-{g}", [float((g + i) % 3 == 0) for i in range(size)],
                              lengths=[20 + (g * i) % 40 for i in range(size)])]


def group_options(description: str, default_groups: int, extra=None) -> argparse.Namespace:
    """`--groups` and `--group-size`, the shape of the generated rollouts every scorer bench takes;
    `extra(parser)` adds a bench's own options."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=default_groups, help="groups (default %(default)s)")
    parser.add_argument("--group-size", type=int, default=8, help="rollouts per group (default %(default)s)")
    if extra is not None:
        extra(parser)
    return parser.parse_args()


def encoded_rollouts(groups: int, size: int, prefix: str = "bench") -> list[tuple[bytes, bytes]]:
    """(key, envelope) of each generated rollout, as an env worker would publish it."""
    from rollwire.schemas import Codec
    codec = Codec()
    return [(r.group_id.encode(), codec.encode(r, producer="bench")) for r in rollouts(groups, size, prefix)]


BATCH = 500
"""Rollouts per batch: what both drivers take at once (the embedded poll, faust's `take_events`)."""


def pure_rate(encoded: list[bytes]) -> float:
    """The baseline: per rollout decode, `on_rollout`, encode the outputs; per batch of `BATCH`,
    encode the changelog records the drivers would send for it (coalesced per key, as they do)."""
    from rollwire.schemas import Codec
    from rollwire.streams import group_changelog
    from rollwire.streams.scoring import GroupScorer, ScorerSettings
    codec, scorer, states = Codec(), GroupScorer(ScorerSettings()), {}
    pending = group_changelog.PendingWrites()
    t0 = time.perf_counter()
    for i, data in enumerate(encoded, 1):
        rollout = codec.decode(data).event
        step = scorer.on_rollout(states.get(rollout.group_id), rollout)
        for event in step.events:
            codec.encode(event, producer="bench")
        pending.add(group_changelog.writes(rollout.group_id, states.get(rollout.group_id), step))
        states[rollout.group_id] = step.state
        if i % BATCH == 0 or i == len(encoded):
            for _, record in pending.drain():
                if record is not None:
                    codec.encode(record, producer="bench")
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
    from rollwire.core.bus import Beginning
    n, first, last = 0, None, None
    with log.reader([topics.scored], Beginning()) as reader:
        while batch := reader.poll_batch(5000, 1.0):
            n += len(batch)
            stamps = [r.timestamp_ms for r in batch]
            first = min(stamps + ([first] if first is not None else []))
            last = max(stamps + ([last] if last is not None else []))
    return n, first or 0, last or 0


def embedded_rate(encoded_with_keys) -> float:
    from rollwire.core.bus import catalog_topics
    from rollwire.core.bus.embedded import EmbeddedLog
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
    every output and (coalesced) changelog record, pre-encoded here outside the timing; flush. No decoding,
    no scoring: the floor the log sets under the driver."""
    from rollwire.core.bus import Beginning, catalog_topics
    from rollwire.core.bus.embedded import EmbeddedLog
    from rollwire.core.bus.partitioner import partition_for
    from rollwire.schemas import Codec, Topics
    from rollwire.streams import group_changelog
    from rollwire.streams.scoring import GroupScorer, ScorerSettings, route
    codec, scorer, states, topics = Codec(), GroupScorer(ScorerSettings()), {}, Topics("bench")
    pending = group_changelog.PendingWrites()
    out = []
    for i, (_, data) in enumerate(encoded_with_keys, 1):
        rollout = codec.decode(data).event
        gid = rollout.group_id
        step = scorer.on_rollout(states.get(gid), rollout)
        out += [(topics.name(route(e)), gid.encode(), codec.encode(e, producer="bench"), None) for e in step.events]
        pending.add(group_changelog.writes(gid, states.get(gid), step))
        states[gid] = step.state
        if i % BATCH == 0 or i == len(encoded_with_keys):  # the driver's batches, coalesced as it does
            out += [(topics.name("scorer-state"), key.encode(), None if rec is None else codec.encode(rec, producer="bench"),
                     partition_for(key.split(group_changelog.SEPARATOR)[0].encode(), 4)) for key, rec in pending.drain()]
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


def faust_rate(encoded_with_keys, bootstrap: str, group_size: int, *, passthrough: bool = False) -> float:
    """The scoring worker's rate; with `passthrough`, faust alone (bench/faust_passthrough.py):
    the same worker reading each rollout and writing one record, no scoring."""
    from rollwire.core.bus import catalog_topics
    from rollwire.core.bus.kafka import KafkaLog
    from rollwire.schemas import Topics
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    log, topics = KafkaLog(bootstrap), Topics(prefix)
    log.create_topics(catalog_topics(topics))
    command = ([sys.executable, str(REPO / "bench" / "faust_passthrough.py"), bootstrap, prefix] if passthrough else
               [sys.executable, "-m", "rollwire.cli", "score", "--bus", "kafka", "--bootstrap", bootstrap,
                "--prefix", prefix, "--app-id", f"{prefix}-scorer"])
    worker = subprocess.Popen(["taskset", "-c", "0", *command], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # A warm-up group first: once it is scored the worker is up, assigned and recovered, and
        # the clock starts when the measured rollouts start to be published.
        publish(log, topics, encoded_rollouts(1, group_size, prefix="warmup"))
        wait_for_scored(log, topics, group_size, "the warm-up group")
        started_ms = time.time_ns() // 1_000_000
        publish(log, topics, encoded_with_keys)
        last = wait_for_scored(log, topics, group_size + len(encoded_with_keys), "every rollout")
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
        log.close()
    return len(encoded_with_keys) / max(1e-3, (last - started_ms) / 1000)


def wait_for_scored(log, topics, n: int, what: str) -> int:
    """Waits until `n` rollouts are scored; returns the timestamp of the last."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        scored, _, last = count_scored(log, topics)
        if scored >= n:
            return last
        time.sleep(1)
    raise SystemExit(f"faust scored {scored} of {n} rollouts in 10 minutes, waiting for {what}")


def interleaved(encoded: list, size: int) -> list:
    """The same rollouts, round-robin over every group: rollout 0 of each group, then rollout 1...
    The worst order for a driver: no batch holds two rollouts of one group, so no group opens and
    closes within one commit and nothing coalesces."""
    return [encoded[g * size + i] for i in range(size) for g in range(len(encoded) // size)]


def main() -> None:
    args = group_options(__doc__, 500)

    from bus import start_broker

    orders = {"": encoded_rollouts(args.groups, args.group_size)}
    orders["interleaved_"] = interleaved(orders[""], args.group_size)
    print(f"{len(orders[''])} rollouts in {args.groups} groups of {args.group_size}, ~{len(orders[''][0][1])} B each")

    results = {}
    os.sched_setaffinity(0, {0})
    for order, encoded in orders.items():
        results[f"{order}pure_rps"] = pure_rate([v for _, v in encoded])
        results[f"{order}whole_group_rps"] = whole_group_rate([v for _, v in encoded])
        results[f"{order}embedded_rps"] = embedded_rate(encoded)
        results[f"{order}embedded_log_rps"] = embedded_log_rate(encoded)
    os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    bootstrap, stop_broker = start_broker()
    try:
        for order, encoded in orders.items():
            results[f"{order}faust_rps"] = faust_rate(encoded, bootstrap, args.group_size)
            results[f"{order}faust_alone_rps"] = faust_rate(encoded, bootstrap, args.group_size, passthrough=True)
    finally:
        if stop_broker:
            stop_broker()
    print(f"{'':<22} {'groups one after another':>24}   {'groups interleaved':>22}")
    print(f"{'driver':<22} {'rollouts/s':>14} {'vs pure':>9}   {'rollouts/s':>12} {'vs pure':>9}")
    for name, label in (("pure_rps", "pure logic (baseline)"), ("whole_group_rps", "logic + whole group"),
                        ("embedded_log_rps", "embedded log alone"), ("embedded_rps", "embedded driver"),
                        ("faust_alone_rps", "faust alone"), ("faust_rps", "faust on Kafka")):
        cells = [f"{results[order + name]:14,.0f} {results[order + name] / results[order + 'pure_rps']:9.2f}"
                 for order in orders]
        print(f"{label:<22} {cells[0]}   {cells[1]}")
    for order in orders:
        base = results[f"{order}pure_rps"]
        for driver in ("embedded", "faust"):
            results[f"{order}{driver}_vs_pure"] = results[f"{order}{driver}_rps"] / base
            # against the older, whole-group definition of the logic
            results[f"{order}{driver}_vs_whole_group"] = results[f"{order}{driver}_rps"] / results[f"{order}whole_group_rps"]
            # The logic and the transport both have to run on the one core: together they bound the driver.
            transport = results[f"{order}{'embedded_log' if driver == 'embedded' else 'faust_alone'}_rps"]
            results[f"{order}{driver}_vs_logic_plus_transport"] = (
                results[f"{order}{driver}_rps"] * (1 / base + 1 / transport))
    print("RESULT " + " ".join(f"{k}={v:.3g}" for k, v in results.items()))


if __name__ == "__main__":
    main()
