"""The trainer's front door: `rollwire train` calls it, and so does `rollwire run` for its `trainer`
role, so a trainer started by hand reports to the same trackers, shards the same way and stops the
same way as a run's.

Under torchrun (`trainer.processes > 1` in a run) every rank calls it: rank 0 reads batches,
steps, checkpoints and publishes; the others follow its broadcasts (`rollwire.trainer.distributed`).
"""

from __future__ import annotations

from typing import Any

from rollwire.core.bus import EventLog
from rollwire.core.objectstore import ObjectStore
from rollwire.core.telemetry import TelemetrySettings
from rollwire.schemas.topics import Topics
from rollwire.trainer.settings import TrainerSettings


def serve_trainer(log: EventLog, topics: Topics, store: ObjectStore, settings: TrainerSettings, *,
                  telemetry: TelemetrySettings, run_name: str, params: dict[str, Any] | None = None,
                  max_steps: int | None = None, idle_exit_s: float | None = None) -> None:
    """Trains until `max_steps` in all, `idle_exit_s` without a batch, or Ctrl-C; each step goes to
    the trackers `telemetry.report_to` names, under `run_name`, with `params` (default: the
    trainer's settings) as the run's parameters."""
    from rollwire.core.trackers import flat_params, open_trackers
    from rollwire.trainer.distributed import from_environment
    from rollwire.trainer.loop import Trainer, follow
    from rollwire.trainer.model import resolve_device
    shard = from_environment(resolve_device(settings.model)[0])  # under torchrun: one rank of several
    try:
        if shard is not None and not shard.leader:
            follow(settings, shard)
            return
        params = params if params is not None else {"trainer": settings.model_dump(mode="json")}
        trackers = open_trackers(telemetry, run_name=run_name, params=flat_params(params))
        trainer = Trainer(log, topics, store, settings, shard=shard, trackers=trackers)
        try:
            trainer.run(max_steps=max_steps, idle_exit_s=idle_exit_s)
        except KeyboardInterrupt:
            pass
        finally:
            trainer.close()
    finally:
        if shard is not None:
            shard.close()
