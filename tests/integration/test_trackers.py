"""Each trainer step's metrics in TensorBoard and in a real MLflow server (`rollwire.core.trackers`)."""

from __future__ import annotations

import threading
import time

import pytest

from rollwire.core.telemetry import TelemetrySettings
from rollwire.core.trackers import MLflowSettings, TensorBoardSettings, Trackers, open_trackers, scalars, step_metrics
from rollwire.schemas.training import Staleness, TrainStepCompleted


def step(n: int) -> TrainStepCompleted:
    return TrainStepCompleted(step=n, policy_version=n, rollout_ids=[f"g{n}-{i}" for i in range(4)], loss=1.0 / n,
                              reward_mean=0.1 * n, staleness=Staleness(min=0, mean=0.5, max=1),
                              drops={"stale": n % 2}, rewards_mean={"shortest_correct": 0.05 * n},
                              metrics_mean={"completion_tokens": 7.0}, loss_metrics={"clip_fraction": 0.01})


def rows(steps: range) -> list[dict]:
    return [step_metrics(step(n), 1_700_000_000_000 + 1000 * n) for n in steps]


def test_a_step_goes_to_trackers_under_sectioned_names():
    values = scalars(rows(range(3, 4))[0])
    assert values["train/reward_mean"] == pytest.approx(0.3)
    assert values["reward/shortest_correct"] == pytest.approx(0.15)
    assert values["loss/clip_fraction"] == 0.01
    assert values["drops/stale"] == 1.0
    assert values["train/staleness_max"] == 1.0
    assert "train/step" not in values and "train/skipped_reason" not in values


def test_tensorboard_event_files_hold_every_step(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    settings = TelemetrySettings(report_to=["tensorboard"], tensorboard=TensorBoardSettings(log_dir=tmp_path / "tb"))
    trackers = open_trackers(settings, run_name="tb-test", params={})
    for row in rows(range(1, 6)):
        trackers.report(row)
    trackers.close()

    events = EventAccumulator(str(tmp_path / "tb")).Reload()
    rewards = events.Scalars("train/reward_mean")
    assert [e.step for e in rewards] == [1, 2, 3, 4, 5]
    assert [round(e.value, 6) for e in rewards] == [0.1, 0.2, 0.3, 0.4, 0.5]
    assert [e.value for e in events.Scalars("reward/shortest_correct")][-1] == pytest.approx(0.25)


@pytest.mark.mlflow
def test_mlflow_holds_every_step_and_a_resumed_run_continues_the_same_run(mlflow_url, group_id):
    from mlflow.tracking import MlflowClient
    settings = TelemetrySettings(report_to=["mlflow"], mlflow=MLflowSettings(tracking_uri=mlflow_url,
                                                                            experiment=f"exp-{group_id}"))
    first = open_trackers(settings, run_name=group_id, params={"trainer.lr": 3e-4, "trainer.loss": "ppo_clip"})
    for row in rows(range(1, 4)):
        first.report(row)
    first.close()
    resumed = open_trackers(settings, run_name=group_id, params={})  # `rollwire run` again, same run
    for row in rows(range(4, 7)):
        resumed.report(row)
    resumed.close()

    client = MlflowClient(tracking_uri=mlflow_url)
    experiment = client.get_experiment_by_name(f"exp-{group_id}")
    (run,) = client.search_runs([experiment.experiment_id])
    history = client.get_metric_history(run.info.run_id, "train/reward_mean")
    assert sorted((m.step, round(m.value, 6)) for m in history) == [(n, round(0.1 * n, 6)) for n in range(1, 7)]
    assert run.data.params == {"trainer.lr": "0.0003", "trainer.loss": "ppo_clip"}
    assert run.data.tags["rollwire.run"] == group_id and run.info.status == "FINISHED"


class Failing:
    name = "failing"

    def log(self, step, values, time_ms):
        raise ConnectionError("tracking server went away")

    def close(self):
        pass


class Recording:
    name = "recording"

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.steps: list[int] = []
        self.gate = gate
        self.busy = threading.Event()

    def log(self, step, values, time_ms):
        self.busy.set()
        if self.gate is not None:
            self.gate.wait()
        self.steps.append(step)

    def close(self):
        pass


def test_a_failing_tracker_is_dropped_and_the_others_still_get_every_step():
    recording = Recording()
    trackers = Trackers([Failing(), recording])
    for row in rows(range(1, 5)):
        trackers.report(row)
    trackers.close()
    assert recording.steps == [1, 2, 3, 4]
    assert [t.name for t in trackers.trackers] == ["recording"]


def test_reporting_never_waits_for_a_slow_tracker():
    gate = threading.Event()
    slow = Recording(gate)
    trackers = Trackers([slow], max_queued=2)
    first, *others = rows(range(1, 6))
    trackers.report(first)
    assert slow.busy.wait(10)
    for row in others:  # returns at once: the tracker is stuck on step 1, two wait, the rest are dropped
        trackers.report(row)
    gate.set()
    trackers.close()
    assert slow.steps == [1, 2, 3]


def test_closing_does_not_hang_on_a_stuck_tracker():
    stuck = Recording(threading.Event())  # never released
    trackers = Trackers([stuck], max_queued=1)
    for row in rows(range(1, 4)):
        trackers.report(row)
    assert stuck.busy.wait(10)
    started = time.monotonic()
    trackers.close(timeout_s=1.0)
    assert time.monotonic() - started < 3
