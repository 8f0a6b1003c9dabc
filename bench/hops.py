"""Where one trainer step's time goes, hop by hop, read back from a run's own events.

    python bench/hops.py RUN_DIR [--prefix NAME]      # a `rollwire run` on the embedded log

For each trainer step, from the record timestamps of the events it caused (ms, producer clock):

    issue → rollouts     first task of the step's groups issued → their last rollout published
                         (environment latency, inference, the env worker)
    rollouts → scored    last rollout published → last of them scored (the group scorer)
    scored → trained     last scored → the step's TrainStepCompleted built (the trainer read the
                         batch, stepped, uploaded the weights)
    trained → sent       built → sent (the trainer's checkpoint, then its outbox)
    sent → serving       weights event → the replica reports it serves that version (download,
                         verification, hot swap)
    serving → next task  the replica serves the new version → the next task is issued (the dispatcher)

In a synchronous run (`max_off_policy = 0`) these hops follow one another and add up to the step;
in an asynchronous one they overlap, and only the step-to-step interval means much. The slowest
environment draw of each step's rollouts (`environment_s`) is printed too: with simulated latency,
it is the floor a synchronous step cannot beat.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from rollwire.core.bus import AtOffsets, EventLog
from rollwire.schemas.envelope import Codec
from rollwire.schemas.topics import Topics

HOPS = ("issue → rollouts", "rollouts → scored", "scored → trained", "trained → sent", "sent → serving",
        "serving → next task")


def read_topic(log: EventLog, topic: str) -> list[tuple[int, object]]:
    """(record timestamp ms, event) of every record on `topic`, up to its current end."""
    ends = log.end_offsets(topic)
    out, codec = [], Codec()
    with log.reader([topic], AtOffsets({(topic, p): 0 for p in ends})) as reader:
        remaining = {p for p, end in ends.items() if end > 0}
        while remaining:
            batch = reader.poll_batch(2000, 5.0)
            if not batch:
                raise TimeoutError(f"reading {topic} stalled before its end offsets {ends}")
            for record in batch:
                if record.offset < ends[record.partition] and record.value is not None:
                    out.append((record.timestamp_ms, codec.decode(record.value).event))
                if record.offset >= ends[record.partition] - 1:
                    remaining.discard(record.partition)
    return out


@dataclass
class StepHops:
    step: int
    hops: dict[str, float]
    """Seconds per hop (see the module docstring)."""
    total_s: float
    """First task issued → next task issued."""
    slowest_environment_s: float
    """The longest environment time among the step's rollouts."""


def step_hops(log: EventLog, topics: Topics) -> list[StepHops]:
    """The hops of every trainer step whose next task was issued."""
    tasks = sorted(ts for ts, _ in read_topic(log, topics.tasks))
    task_time = {e.group_id: ts for ts, e in read_topic(log, topics.tasks)}
    rollout_time, environment_s = {}, {}
    for ts, e in read_topic(log, topics.rollouts):
        rollout_time.setdefault(e.rollout_id, ts)
        environment_s.setdefault(e.rollout_id, e.timings.environment_s)
    scored = {}
    for ts, e in read_topic(log, topics.scored):
        scored.setdefault(e.rollout.rollout_id, (ts, e.rollout.group_id))
    weights = {e.version: ts for ts, e in read_topic(log, topics.weights)}
    serving = sorted((ts, e.serving_version) for ts, e in read_topic(log, topics.fleet)
                     if e.state == "serving" and e.serving_version is not None)
    out = []
    for sent, step in sorted(((ts, e) for ts, e in read_topic(log, topics.train)), key=lambda x: x[1].step):
        ids = [rid for rid in step.rollout_ids if rid in scored and rid in rollout_time]
        if not ids or step.policy_version not in weights:
            continue
        issued = min(task_time[scored[rid][1]] for rid in ids)
        last_rollout = max(rollout_time[rid] for rid in ids)
        last_scored = max(scored[rid][0] for rid in ids)
        served = next((ts for ts, v in serving if v >= step.policy_version and ts >= weights[step.policy_version]),
                      None)
        next_task = next((ts for ts in tasks if served is not None and ts >= served), None)
        if served is None or next_task is None:
            continue
        marks = [issued, last_rollout, last_scored, step.completed_at_ms, sent, served, next_task]
        out.append(StepHops(step.step, {h: (b - a) / 1000 for h, a, b in zip(HOPS, marks, marks[1:])},
                            (next_task - issued) / 1000, max(environment_s[rid] for rid in ids)))
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def table(steps: list[StepHops]) -> str:
    """p50 and p99 of every hop, the step total and the slowest environment draw."""
    rows = [(h, [s.hops[h] for s in steps]) for h in HOPS]
    rows += [("step total", [s.total_s for s in steps]), ("slowest environment draw", [s.slowest_environment_s
                                                                                       for s in steps])]
    lines = [f"{'hop (' + str(len(steps)) + ' steps)':<28}{'p50 ms':>9}{'p99 ms':>9}{'mean ms':>9}"]
    lines += [f"{name:<28}{percentile(v, .5) * 1000:9.0f}{percentile(v, .99) * 1000:9.0f}"
              f"{statistics.mean(v) * 1000:9.0f}" for name, v in rows]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="a `rollwire run` directory on the embedded log")
    parser.add_argument("--prefix", help="topic prefix (default: the run's, from recipe.json)")
    parser.add_argument("--skip", type=int, default=1, help="first steps left out (default: %(default)s)")
    args = parser.parse_args()
    from rollwire.core.bus import EmbeddedBusSettings, open_log
    recipe = json.loads((args.run_dir / "recipe.json").read_text())
    prefix = args.prefix or recipe["prefix"] or recipe["name"]
    with open_log(EmbeddedBusSettings(path=args.run_dir / "log")) as log:
        steps = [s for s in step_hops(log, Topics(prefix)) if s.step > args.skip]
    if not steps:
        raise SystemExit(f"no complete step in {args.run_dir}")
    print(table(steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
