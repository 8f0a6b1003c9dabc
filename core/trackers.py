"""Each trainer step's metrics, where users already look: TensorBoard, MLflow, W&B, trackio.

    [telemetry]
    report_to = ["tensorboard", "mlflow"]
    [telemetry.mlflow]
    tracking_uri = "http://127.0.0.1:5000"

The trainer (rank 0) reports a step once its commit is sent (`Trainer._send_outbox`): a step
re-sent after a crash is reported again under the same step number, which every tracker here
takes as the same point. Reports go through one background thread (`Trackers`), so a slow or
unreachable tracking server never holds up training; a tracker that fails is logged and dropped,
and training goes on.

The same figures are in the run's `metrics.jsonl` (`step_metrics`), derived from the `train` topic,
so a run that reported nowhere can still be looked at afterwards.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict

from rollwire.core.errors import ConfigError
from rollwire.schemas.training import TrainStepCompleted

if TYPE_CHECKING:
    from rollwire.core.telemetry import TelemetrySettings

logger = logging.getLogger(__name__)

TrackerName = Literal["tensorboard", "mlflow", "wandb", "trackio"]


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class TensorBoardSettings(_Settings):
    log_dir: Path | None = None
    """Event files' folder; in a run, `<run_dir>/tensorboard` by default (`tensorboard --logdir` it)."""


class MLflowSettings(_Settings):
    tracking_uri: str | None = None
    """The MLflow server (`http://host:5000`) or store; default: `MLFLOW_TRACKING_URI`, else `./mlruns`."""
    experiment: str = "rollwire"
    """Experiment the run is recorded under (created when missing)."""


class WandbSettings(_Settings):
    project: str = "rollwire"
    """W&B project."""
    entity: str | None = None
    """W&B team or user; default: the logged-in user's."""


class TrackioSettings(_Settings):
    project: str = "rollwire"
    """trackio project (a local dashboard: `trackio show`)."""


def step_metrics(event: TrainStepCompleted, produced_at_ms: int) -> dict:
    """One trainer step as a flat row: the run's `metrics.jsonl` line, and what trackers get."""
    staleness = event.staleness
    return {"step": event.step, "policy_version": event.policy_version, "reward_mean": event.reward_mean,
            "loss": event.loss, "rollouts": len(event.rollout_ids), "num_tokens": event.num_tokens,
            "grad_norm": event.grad_norm, "staleness_max": staleness.max if staleness else None,
            "staleness_mean": staleness.mean if staleness else None, "drops": event.drops,
            **{f"staleness/{k}": v for k, v in (staleness.model_dump(exclude={"min", "mean", "max"}) if staleness
                                                else {}).items() if v is not None},
            **{f"reward/{k}": v for k, v in event.rewards_mean.items()},
            **{f"metric/{k}": v for k, v in event.metrics_mean.items()},
            **{f"loss/{k}": v for k, v in event.loss_metrics.items()},
            "wait_s": event.wait_s, "time_ms": produced_at_ms, "skipped_reason": event.skipped_reason}


def scalars(row: dict) -> dict[str, float]:
    """The numbers of a `step_metrics` row under tracker names: sections as they are (`reward/...`,
    `loss/...`, `metric/...`), the rest under `train/`, drops as `drops/<reason>`."""
    out: dict[str, float] = {}
    for name, value in row.items():
        if name in ("step", "time_ms"):
            continue
        if name == "drops":
            out.update({f"drops/{reason}": float(n) for reason, n in (value or {}).items()})
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out[name if "/" in name else f"train/{name}"] = float(value)
    return out


def flat_params(settings: dict[str, Any], prefix: str = "", limit: int = 100) -> dict[str, Any]:
    """Nested settings as `a.b.c` parameters (the first `limit`: MLflow takes 100 per call)."""
    out: dict[str, Any] = {}
    for key, value in settings.items():
        if isinstance(value, dict) and value:
            out.update(flat_params(value, f"{prefix}{key}.", limit))
        else:
            out[f"{prefix}{key}"] = value
    return dict(list(out.items())[:limit])


class Tracker(Protocol):
    name: str

    def log(self, step: int, values: dict[str, float], time_ms: int) -> None: ...

    def close(self) -> None: ...


def _require(module: str, extra: str, what: str):
    """Imports `module` for a tracker, or says which extra installs it."""
    import importlib
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(f"report_to {what!r} needs {module.split('.')[0]}: pip install 'rollwire[{extra}]'") from exc


class TensorBoardTracker:
    name = "tensorboard"

    def __init__(self, settings: TensorBoardSettings, run_name: str) -> None:
        if settings.log_dir is None:
            raise ConfigError("telemetry.tensorboard.log_dir is not set: give the folder for the event files")
        _require("tensorboard", "tensorboard", "tensorboard")
        from torch.utils.tensorboard import SummaryWriter
        self.writer = SummaryWriter(log_dir=str(settings.log_dir), flush_secs=10)

    def log(self, step: int, values: dict[str, float], time_ms: int) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, value, global_step=step, walltime=time_ms / 1000)

    def close(self) -> None:
        self.writer.close()


class MLflowTracker:
    """One MLflow run per rollwire run, found again by its `rollwire.run` tag on resume."""

    name = "mlflow"

    def __init__(self, settings: MLflowSettings, run_name: str, params: dict[str, Any]) -> None:
        entities = _require("mlflow.entities", "mlflow", "mlflow")
        from mlflow.tracking import MlflowClient
        Metric, Param = entities.Metric, entities.Param
        self._metric = Metric
        self.client = MlflowClient(tracking_uri=settings.tracking_uri)
        experiment = self.client.get_experiment_by_name(settings.experiment)
        experiment_id = (experiment.experiment_id if experiment is not None
                         else self.client.create_experiment(settings.experiment))
        found = self.client.search_runs([experiment_id], filter_string=f"tags.`rollwire.run` = '{run_name}'",
                                        order_by=["attributes.start_time DESC"], max_results=1)
        if found:
            self.run_id = found[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            logger.info("mlflow: resuming run %s (%s)", self.run_id, run_name)
        else:
            run = self.client.create_run(experiment_id, run_name=run_name, tags={"rollwire.run": run_name})
            self.run_id = run.info.run_id
            self.client.log_batch(self.run_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()])

    def log(self, step: int, values: dict[str, float], time_ms: int) -> None:
        self.client.log_batch(self.run_id, metrics=[self._metric(k, v, time_ms, step) for k, v in values.items()])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class WandbTracker:
    """A W&B run whose id derives from the run name, so a resumed run continues it."""

    name = "wandb"

    def __init__(self, settings: WandbSettings, run_name: str, params: dict[str, Any]) -> None:
        wandb = _require("wandb", "wandb", "wandb")
        run_id = hashlib.sha256(run_name.encode()).hexdigest()[:16]
        self.run = wandb.init(project=settings.project, entity=settings.entity, name=run_name, id=run_id,
                              resume="allow", config=params)

    def log(self, step: int, values: dict[str, float], time_ms: int) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


class TrackioTracker:
    name = "trackio"

    def __init__(self, settings: TrackioSettings, run_name: str, params: dict[str, Any]) -> None:
        self.trackio = trackio = _require("trackio", "trackio", "trackio")
        self.run = trackio.init(project=settings.project, name=run_name, config=params, resume="allow")

    def log(self, step: int, values: dict[str, float], time_ms: int) -> None:
        self.trackio.log(values, step=step)

    def close(self) -> None:
        self.trackio.finish()


_STOP = object()


class Trackers:
    """Reports to several trackers from one background thread (`report` never blocks)."""

    def __init__(self, trackers: list[Tracker], *, max_queued: int = 10_000) -> None:
        self.trackers = trackers
        self._queue: queue.Queue = queue.Queue(maxsize=max_queued)
        self._thread = threading.Thread(target=self._run, name="trackers", daemon=True)
        self._thread.start()

    def report(self, row: dict) -> None:
        """Queues one `step_metrics` row (dropped, with a warning, if the trackers are far behind)."""
        try:
            self._queue.put_nowait(row)
        except queue.Full:
            logger.warning("trackers are %d steps behind: step %s not reported", self._queue.qsize(), row["step"])

    def _run(self) -> None:
        while (row := self._queue.get()) is not _STOP:
            values = scalars(row)
            for tracker in list(self.trackers):
                try:
                    tracker.log(row["step"], values, row["time_ms"])
                except Exception:
                    logger.exception("%s failed to take step %s; reporting to it stops (training goes on)",
                                     tracker.name, row["step"])
                    self.trackers.remove(tracker)

    def close(self, timeout_s: float = 30.0) -> None:
        """Reports what is queued (up to `timeout_s`), then closes each tracker."""
        deadline = time.monotonic() + timeout_s
        try:
            self._queue.put(_STOP, timeout=timeout_s)
        except queue.Full:
            pass  # a tracker stuck with the queue full: warned about below
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            logger.warning("trackers still busy after %.0f s; closing them with reports pending", timeout_s)
        for tracker in self.trackers:
            try:
                tracker.close()
            except Exception:
                logger.exception("closing %s failed", tracker.name)


def open_trackers(settings: TelemetrySettings, *, run_name: str, params: dict[str, Any]) -> Trackers | None:
    """The trackers `settings.report_to` names, opened (a missing package or an unreachable server
    raises `ConfigError` here, at start, rather than after the first step); None when it names none."""
    if not settings.report_to:
        return None
    opened: list[Tracker] = []
    started = time.monotonic()
    for name in dict.fromkeys(settings.report_to):
        if name == "tensorboard":
            opened.append(TensorBoardTracker(settings.tensorboard, run_name))
        elif name == "mlflow":
            try:
                opened.append(MLflowTracker(settings.mlflow, run_name, params))
            except ConfigError:
                raise
            except Exception as exc:
                where = settings.mlflow.tracking_uri or "the default tracking URI"
                raise ConfigError(f"report_to 'mlflow': cannot reach MLflow at {where} ({type(exc).__name__}: "
                                  f"{exc}); check telemetry.mlflow.tracking_uri") from exc
        elif name == "wandb":
            opened.append(WandbTracker(settings.wandb, run_name, params))
        else:
            opened.append(TrackioTracker(settings.trackio, run_name, params))
    logger.info("reporting each step to %s (opened in %.1f s)", ", ".join(t.name for t in opened),
                time.monotonic() - started)
    return Trackers(opened)
