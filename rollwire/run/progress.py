"""What a run has done, read back from its own events: metrics, the live display, the reward curve.

    reads: <prefix>.train (TrainStepCompleted), <prefix>.fleet (ReplicaStatus), <prefix>.rollouts

Everything here is derived from the log, so a resumed run rebuilds its metrics file from the
first step, and `rollwire run` shows the same figures whether it started the run or not.
"""

from __future__ import annotations

import collections
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.table import Table

from rollwire.core import bounds
from rollwire.core.bus import Beginning, BusError, EventLog
from rollwire.core.metrics import LagProbe
from rollwire.core.trackers import step_metrics
from rollwire.schemas.envelope import Codec
from rollwire.schemas.rollout import RolloutCompleted, SamplingStarted
from rollwire.schemas.topics import Topics
from rollwire.schemas.training import TrainStepCompleted
from rollwire.schemas.weights import ReplicaStatus

RECENT_STEPS = 100
"""Steps whose metrics the display keeps whole (its last-10 figures and rate)."""
FIRST_STEPS = 10
CURVE_STEPS = 4000
"""Most steps the reward curve holds, each as its `curve_point` (~0.5 KB for the demo's step; a whole
step's metrics take ~3 KB): a 2-hour soak's supervisor grew 10 MB an hour while it kept every step's
metrics, then 10 MB in its first hour while the bounded curve of whole rows filled."""


def curve_point(row: dict) -> dict:
    """What the reward curve draws of a step's metrics (`plot`): its number, the mean reward, each named
    reward and each environment metric; the rest of the row (staleness, timings, losses) stays in the
    metrics file."""
    return {key: value for key, value in row.items()
            if key in ("step", "reward_mean") or key.startswith(("reward/", "metric/"))}


@dataclass
class RunProgress:
    """Follows a run's events; `poll()` takes in what is new."""

    log: EventLog
    topics: Topics
    metrics_path: Path | None = None
    rows: collections.deque[dict] = field(default_factory=lambda: collections.deque(maxlen=RECENT_STEPS))
    """The newest steps' metrics (every step's is in `metrics_path`): a run of days holds no more."""
    curve: bounds.Points = field(default_factory=lambda: bounds.Points(CURVE_STEPS))
    """Every step's metrics for the reward curve, every other one dropped past `CURVE_STEPS`."""
    first: list[dict] = field(default_factory=list)
    """The first `FIRST_STEPS` steps' metrics (the curve's start, as the summary quotes it)."""
    serving: dict[str, int | None] = field(default_factory=dict)
    """Version each replica serves, by replica id."""
    replica_state: dict[str, str] = field(default_factory=dict)
    rollouts: int = 0
    errored: int = 0
    started: int = 0
    """Rollouts that made their first generation request (`SamplingStarted`, a model-free one at its end)."""
    unreadable: int = 0
    """Events this display could not decode (the components dead-letter theirs; here they are counted)."""
    last_error: str | None = None
    stall: str | None = None
    """Why the run stands still (`StallWatch`), shown while it does."""
    lag_probe: LagProbe | None = None
    """Reads the consumer groups' lag (every `lag_every_s`) for the display."""
    lag_every_s: float = 5.0
    lag: dict[tuple[str, str], int] = field(default_factory=dict)
    loads: dict[str, ReplicaStatus] = field(default_factory=dict)
    """Per replica: the status of its last version load (its download, staging and pause)."""

    def __post_init__(self) -> None:
        self._codec = Codec()
        self._reader = self.log.reader([self.topics.train, self.topics.fleet, self.topics.rollouts,
                                        self.topics.sampling], Beginning())
        self._lag_read_at = -self.lag_every_s
        if self.metrics_path is not None:
            self.metrics_path.parent.mkdir(parents=True, exist_ok=True)
            self._out = open(self.metrics_path, "w")  # rebuilt from the log: a resumed run rewrites it whole

    def poll(self, timeout_s: float = 0.5) -> list[dict]:
        """Reads what is new (every partition); returns the new metrics rows."""
        new = []
        records = self._reader.poll_batch(2000, timeout_s)
        while more := self._reader.poll_batch(2000, 0.0):
            records += more
        for record in records:
            if record.value is None:
                continue
            try:
                envelope = self._codec.decode(record.value)
            except Exception as exc:  # the components dead-letter bad events; the display counts them
                self.unreadable += 1
                self.last_error = f"{record.topic}@{record.offset}: {exc}"
                continue
            event = envelope.event
            if isinstance(event, TrainStepCompleted):
                new.append(step_metrics(event, envelope.produced_at_ms))
            elif isinstance(event, ReplicaStatus):
                self.serving[event.replica_id] = event.serving_version
                self.replica_state[event.replica_id] = event.state
                if event.state == "serving" and event.requested_version is not None:
                    self.loads[event.replica_id] = event
            elif isinstance(event, RolloutCompleted):
                self.rollouts += 1
                self.errored += event.error is not None
            elif isinstance(event, SamplingStarted):
                self.started += 1
        new.sort(key=lambda row: row["step"])
        for row in new:
            self.rows.append(row)
            self.curve.add(curve_point(row))
            if len(self.first) < FIRST_STEPS:
                self.first.append(row)
        self._read_lag()
        if self.metrics_path is not None and new:
            self._out.writelines(json.dumps(row) + "\n" for row in new)
            self._out.flush()
        return new

    def _read_lag(self) -> None:
        if self.lag_probe is None or time.monotonic() - self._lag_read_at < self.lag_every_s:
            return
        self._lag_read_at = time.monotonic()
        try:
            self.lag = self.lag_probe.read()
        except Exception as exc:  # a topic not there yet, the broker away: shown as unknown
            self.lag = {}
            self.last_error = f"consumer lag: {exc}"

    @property
    def step(self) -> int:
        return self.rows[-1]["step"] if self.rows else 0

    def mean_reward(self, first: int | None = None, last: int | None = None) -> float | None:
        if (first or 0) > FIRST_STEPS or (last or 0) > RECENT_STEPS:
            raise ValueError(f"the progress keeps the first {FIRST_STEPS} and the last {RECENT_STEPS} steps whole")
        rows = self.first[:first] if first else list(self.rows)[-last:] if last else self.curve.rows
        return sum(r["reward_mean"] for r in rows) / len(rows) if rows else None

    def throughput(self, window: int = 10) -> float | None:
        """Rollouts trained per second over the last `window` steps."""
        rows = list(self.rows)[-(window + 1):]
        if len(rows) < 2:
            return None
        seconds = (rows[-1]["time_ms"] - rows[0]["time_ms"]) / 1000
        return sum(r["rollouts"] for r in rows[1:]) / seconds if seconds > 0 else None

    def summary(self) -> str:
        """One line: where the run is."""
        if not self.rows:
            unreadable = f" · {self.unreadable} unreadable events (last: {self.last_error})" if self.unreadable else ""
            return f"waiting for the first step · {self.rollouts} rollouts so far{unreadable}"
        last = self.rows[-1]
        parts = [f"step {last['step']}", f"reward {last['reward_mean']:.3f}",
                 f"last-10 {self.mean_reward(last=10):.3f}"]
        if last["staleness_max"] is not None:
            parts.append(f"staleness max {last['staleness_max']} mean {last['staleness_mean']:.2f}")
        if (rate := self.throughput()) is not None:
            parts.append(f"{rate:.0f} rollouts/s")
        parts.append("serving " + ", ".join(f"v{v or 0}" for v in self.serving.values()) if self.serving else "no replica yet")
        if self.lag:
            parts.append("lag " + ", ".join(f"{topic.rsplit('.', 1)[-1]} {n}" for (_, topic), n in self.lag.items()))
        if self.unreadable:
            parts.append(f"{self.unreadable} unreadable events (last: {self.last_error})")
        return " · ".join(parts)

    def table(self, total_steps: int, phase: str) -> Table:
        """The live display."""
        table = Table(title=f"rollwire run · {phase}", show_header=False, box=None, padding=(0, 1))
        table.add_column(style="bold")
        table.add_column()
        step = self.step
        filled = int(30 * step / total_steps) if total_steps else 0
        table.add_row("step", f"{'━' * filled}{'╌' * (30 - filled)} {step}/{total_steps}")
        if self.rows:
            last = self.rows[-1]
            table.add_row("reward", f"{last['reward_mean']:.3f} now · {self.mean_reward(first=10):.3f} first 10 · "
                                    f"{self.mean_reward(last=10):.3f} last 10")
            if "metric/completion_tokens" in last:
                table.add_row("completion", f"{last['metric/completion_tokens']:.2f} tokens")
            if last["staleness_max"] is not None:
                table.add_row("staleness", f"max {last['staleness_max']} · mean {last['staleness_mean']:.2f} versions")
            rate = self.throughput()
            table.add_row("throughput", f"{rate:.1f} rollouts/s trained" if rate else "…")
        sampling = f" · {self.started - self.rollouts} sampling now" if self.started > self.rollouts else ""
        table.add_row("rollouts", f"{self.rollouts} published · {self.errored} errored{sampling}")
        table.add_row("serving", ", ".join(f"{rid} v{v or 0} ({self.replica_state[rid]}{self._reload(rid)})"
                                           for rid, v in self.serving.items()) or "starting")
        if self.lag:
            table.add_row("lag", " · ".join(f"{group} {n} on {topic.rsplit('.', 1)[-1]}"
                                            for (group, topic), n in self.lag.items()) + " records")
        if self.unreadable:
            table.add_row("[red]unreadable", f"{self.unreadable} events, last: {self.last_error}")
        if self.stall:
            table.add_row("[red]stalled", self.stall)
        return table

    def _reload(self, replica_id: str) -> str:
        """`, last load 0.16 s from the store (paused 61 ms: drain 22, apply 32)`, or "" before any."""
        load = self.loads.get(replica_id)
        if load is None:
            return ""
        seconds = load.download_s + load.stage_s + load.swap_s
        source = "directly" if load.transfer == "direct" else "from the store"
        return (f", last load {seconds:.2f} s {source} (paused {1000 * load.swap_s:.0f} ms: drain "
                f"{1000 * load.drain_s:.0f}, apply {1000 * load.apply_s:.0f})")

    def close(self) -> None:
        self._reader.close()
        if self.metrics_path is not None:
            self._out.close()


STAGES = (("tasks", "the dispatcher issued no task", "dispatcher"),
          ("rollouts", "the env workers published no rollout", "env-worker"),
          ("scored", "the scorer scored no rollout", "scorer"),
          ("train", "the trainer finished no step", "trainer"))
"""The loop's stages in order: the topic each one writes, what its silence means, its log."""


class StallWatch:
    """Notices a run that stopped making progress, and names the stage that stopped first.

    It watches only the end offsets of each stage's topic (nothing is decoded). Once no trainer
    step has come for `after_s`, the stage whose output stopped earliest is the one to look at:
    a dead scorer stops `scored` first, and the dispatcher stops issuing only later, when the
    rollouts it waits for fill its budget."""

    def __init__(self, log: EventLog, topics: Topics, after_s: float, logs_dir: Path | None = None) -> None:
        self.log, self.topics, self.after_s, self.logs_dir = log, topics, after_s, logs_dir
        now = time.monotonic()
        self._ends: dict[str, int] = {}
        self._moved: dict[str, float] = {stage: now for stage, _, _ in STAGES}

    def check(self, now: float | None = None) -> str | None:
        """A one-line warning while the run stands still, else None."""
        now = time.monotonic() if now is None else now
        try:
            ends = {stage: sum(self.log.end_offsets(self.topics.name(stage)).values()) for stage, _, _ in STAGES}
        except BusError as exc:  # the broker away: the components wait for it, and so does this watch
            return f"the event log cannot be read now ({exc}); every component waits for it"
        for stage, total in ends.items():
            if total != self._ends.get(stage):
                self._ends[stage], self._moved[stage] = total, now
        if now - self._moved["train"] < self.after_s:
            return None
        stage, silence, role = min(STAGES, key=lambda s: self._moved[s[0]])
        where = f"; see {self.logs_dir / f'{role}-0.log'}" if self.logs_dir else ""
        return (f"no trainer step for {now - self._moved['train']:.0f} s: {silence} for "
                f"{now - self._moved[stage]:.0f} s, the first stage to stop{where}")


def _smooth(values: list[float], window: int = 10) -> list[float]:
    return [sum(values[max(0, i - window + 1): i + 1]) / len(values[max(0, i - window + 1): i + 1])
            for i in range(len(values))]


def plot(rows: list[dict], path: Path, title: str = "rollwire run") -> Path:
    """The reward curve; below it, when recorded, the mean completion length (what a length bonus moves)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    steps = [r["step"] for r in rows]
    lengths: list = [r.get("metric/completion_tokens") for r in rows]
    panels = 2 if rows and all(v is not None for v in lengths) else 1
    figure, axes = plt.subplots(panels, 1, figsize=(8, 3.2 * panels + 0.6), dpi=110, sharex=True, squeeze=False)
    reward_axis = axes[0][0]
    rewards = [r["reward_mean"] for r in rows]
    reward_axis.plot(steps, rewards, color="tab:blue", alpha=0.3, label="mean reward per step")
    reward_axis.plot(steps, _smooth(rewards), color="tab:blue", label="10-step mean")
    named = sorted(k for k in (rows[-1] if rows else {}) if k.startswith("reward/"))
    for key in named:
        reward_axis.plot(steps, _smooth([r.get(key, 0.0) for r in rows]), linestyle="--", linewidth=1,
                         label=f"{key.removeprefix('reward/')} (10-step mean)")
    reward_axis.set_ylabel("reward")
    reward_axis.set_title(title)
    reward_axis.grid(alpha=0.3)
    reward_axis.legend(loc="lower right", fontsize="small")
    if panels == 2:
        length_axis = axes[1][0]
        length_axis.plot(steps, lengths, color="tab:orange", alpha=0.3)
        length_axis.plot(steps, _smooth(lengths), color="tab:orange", label="completion tokens (10-step mean)")
        length_axis.set_ylabel("completion tokens")
        length_axis.grid(alpha=0.3)
        handles, labels = length_axis.get_legend_handles_labels()
        shares = [k for k in sorted(rows[-1]) if k.startswith("metric/") and k != "metric/completion_tokens"
                  and all(0.0 <= r.get(k, 0.0) <= 1.0 for r in rows)]
        if shares:  # 0/1 metrics (e.g. used_filler) as the share of rollouts, on their own axis
            share_axis = length_axis.twinx()
            for key in shares:
                share_axis.plot(steps, _smooth([r.get(key, 0.0) for r in rows]), linestyle="--",
                                label=f"{key.removeprefix('metric/')} (share, 10-step mean)")
            share_axis.set_ylabel("share of rollouts")
            share_axis.set_ylim(0, 1)
            more = share_axis.get_legend_handles_labels()
            handles, labels = handles + more[0], labels + more[1]
        length_axis.legend(handles, labels, loc="upper right", fontsize="small")
    axes[-1][0].set_xlabel("trainer step")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
    return path
