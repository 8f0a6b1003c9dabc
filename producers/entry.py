"""The producers' front doors: `rollwire env-worker` and `rollwire dispatch` call these, and so does
`rollwire run` for its `env-worker` and `dispatcher` roles, so a process started by hand beside a
run works exactly as the run's own. (The gateway's and the feedback API's front doors are the
`serve` of `rollwire.producers.gateway` and `rollwire.producers.feedback_api`.)

    serve_env_worker   tasks -> rollouts, traces   (EnvWorker, in the run's consumer group)
    serve_dispatcher   trainer steps, drops -> tasks, paced by the off-policy budget
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rollwire.core.bus import EventLog
from rollwire.core.objectstore import ObjectStore
from rollwire.producers.dispatcher import DispatcherSettings, EnvironmentMix
from rollwire.producers.env_worker import EnvWorkerSettings
from rollwire.producers.environment import EnvironmentSetup
from rollwire.producers.tasksets import Taskset
from rollwire.schemas.topics import Topics
from rollwire.trainer.settings import BatchSettings


def serve_env_worker(log: EventLog, topics: Topics, tasksets: dict[str, Taskset], settings: EnvWorkerSettings, *,
                     store: ObjectStore | None, base_url: str | None = None, agent_command: list[str] | None = None,
                     idle_exit_s: float | None = None, setups: Mapping[str, EnvironmentSetup] | None = None) -> int:
    """Runs rollouts until Ctrl-C, SIGTERM or `idle_exit_s` without tasks; returns how many it
    published. Model calls go to `base_url` (one vLLM server), else to every replica on `fleet`,
    routed by weight version. `agent_command` runs that program for every rollout instead of the
    taskset's harness (in the rollout's container with the container runtime, where the
    settings carry it). `setups`: each environment's own harness and runtime (a run's recipe)."""
    from rollwire.consumers.vllm_control import VllmControl
    from rollwire.producers.env_worker import EnvWorker
    from rollwire.producers.harnesses import script_harness
    from rollwire.producers.interception_server import InterceptionServer
    from rollwire.producers.routing import FleetView, Router
    server = InterceptionServer() if agent_command and settings.runtime != "container" else None
    harness = script_harness(agent_command, server) if server and agent_command else None
    router = Router.single(VllmControl(base_url)) if base_url else Router(FleetView()).follow(log, topics)
    worker = EnvWorker(log, topics, router, tasksets, settings, harness=harness, store=store, setups=setups)
    try:
        worker.run(idle_exit_s=idle_exit_s)
    except KeyboardInterrupt:
        pass
    finally:
        worker.close()
        router.close()
        if server:
            server.shutdown()
    return worker.published_total


def serve_dispatcher(log: EventLog, topics: Topics, mix: Sequence[tuple[EnvironmentMix, Taskset]], budget: BatchSettings,
                     settings: DispatcherSettings, *, max_groups: int | None = None,
                     report_lag_of: list[tuple[str, str]] | None = None) -> int:
    """Issues groups of tasks as the budget allows until Ctrl-C, SIGTERM or `max_groups`; returns
    how many it issued. `report_lag_of` (group id, topic) pairs: this process reports their
    consumer lag (`rollwire.core.metrics.LagProbe`; one process of a run does)."""
    from rollwire.core.metrics import LagProbe
    from rollwire.producers.dispatcher import Dispatcher
    dispatcher = Dispatcher(log, topics, mix, budget, settings)
    if report_lag_of:
        LagProbe(log, report_lag_of).observe()
    issued = 0
    try:
        while max_groups is None or issued < max_groups:
            issued += dispatcher.step(timeout_s=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        dispatcher.close()
    return issued
