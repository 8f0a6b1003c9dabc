"""The stream processors' front doors: `rollwire score` and `rollwire join` call these, and so does
`rollwire run` for its `scorer` and `joiner` roles, so a processor started by hand is the same
processor a run starts: same consumer group, same driver choice, same settings.

    serve_scorer   rollouts -> scored, drops      (GroupScorer)
    serve_joiner   served, feedback -> scored     (FeedbackJoiner)

Each runs its state machine on faust-streaming (Kafka only; the default there) or in-process
(either log), until Ctrl-C or SIGTERM, or until `stop_after_idle_s` passes without input (in
process only: a faust worker runs until stopped).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal

from rollwire.core.bus import BusSettings, EventLog, KafkaBusSettings
from rollwire.core.errors import ConfigError
from rollwire.schemas.topics import Topics
from rollwire.streams.feedback_join import FeedbackJoinSettings
from rollwire.streams.scoring import ScorerSettings

Driver = Literal["faust", "embedded"]

logger = logging.getLogger(__name__)


def choose_driver(bus: BusSettings, asked: Driver | None = None) -> Driver:
    """The driver asked for, else faust on Kafka and in-process on the embedded log."""
    driver: Driver = asked or ("faust" if bus.type == "kafka" else "embedded")
    if driver == "faust" and bus.type != "kafka":
        raise ConfigError("the faust driver needs a Kafka broker (--bus kafka); the embedded log runs the "
                          "in-process driver (--driver embedded)")
    return driver


def serve_scorer(log: EventLog, topics: Topics, settings: ScorerSettings, *, bus: BusSettings,
                 group_id: str | None = None, driver: Driver | None = None, data_dir: Path | None = None,
                 stop_after_idle_s: float | None = None, loglevel: str = "warning") -> dict[str, int] | None:
    """The group scorer on `topics`, in consumer group `group_id` (default `<prefix>-scorer`);
    returns its counts when it stops (None for faust, which reports only on its topics)."""
    group_id = group_id or topics.group("scorer")
    if choose_driver(bus, driver) == "faust":
        assert isinstance(bus, KafkaBusSettings)  # choose_driver refuses faust on the embedded log
        from rollwire.streams.faust_app import Liveness, build_app, run_worker, scorer_inputs
        worker = _faust_settings(group_id, data_dir)
        run_worker(build_app(worker, settings, bus=bus, topics=topics), loglevel=loglevel,
                   startup_timeout_s=worker.startup_timeout_s,
                   liveness=Liveness(bus, worker.app_id, scorer_inputs(topics), worker.stall_timeout_s))
        return None
    from rollwire.streams.embedded_scorer import EmbeddedScorer
    from rollwire.streams.scoring import GroupScorer
    return _run_in_process(EmbeddedScorer(log, topics, GroupScorer(settings), group_id=group_id), stop_after_idle_s)


def serve_joiner(log: EventLog, topics: Topics, settings: FeedbackJoinSettings, *, bus: BusSettings,
                 group_id: str | None = None, driver: Driver | None = None, data_dir: Path | None = None,
                 stop_after_idle_s: float | None = None, loglevel: str = "warning") -> dict[str, int] | None:
    """The feedback joiner on `topics`, in consumer group `group_id` (default `<prefix>-joiner`);
    returns its counts when it stops (None for faust)."""
    from rollwire.streams.feedback_join import FeedbackJoiner
    group_id = group_id or topics.group("joiner")
    joiner = FeedbackJoiner.from_settings(settings)
    if choose_driver(bus, driver) == "faust":
        assert isinstance(bus, KafkaBusSettings)
        from rollwire.streams.faust_app import Liveness, run_worker
        from rollwire.streams.faust_joiner import build_app, joiner_inputs
        worker = _faust_settings(group_id, data_dir)
        run_worker(build_app(worker, joiner, bus=bus, topics=topics), loglevel=loglevel,
                   startup_timeout_s=worker.startup_timeout_s,
                   liveness=Liveness(bus, worker.app_id, joiner_inputs(topics), worker.stall_timeout_s))
        return None
    from rollwire.streams.embedded_joiner import EmbeddedJoiner
    return _run_in_process(EmbeddedJoiner(log, topics, joiner, group_id=group_id), stop_after_idle_s)


def _faust_settings(group_id: str, data_dir: Path | None):
    from rollwire.streams.faust_app import FaustWorkerSettings
    settings = FaustWorkerSettings(app_id=group_id)
    return settings if data_dir is None else settings.model_copy(update={"data_dir": data_dir})


def _run_in_process(service, stop_after_idle_s: float | None) -> dict[str, int]:
    """Runs an in-process driver until it stops or is interrupted; always closes it."""
    try:
        service.run(stop_after_idle_s=stop_after_idle_s)
    except KeyboardInterrupt:
        pass
    finally:
        service.close()
    return dict(service.stats)
