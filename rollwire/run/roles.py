"""One component of a run, in its own process: `python -m rollwire.run.roles ROLE RECIPE_JSON`.

Each role starts through its front door, the same one its own command uses (`rollwire score`,
`rollwire train`, ...), given the settings the recipe holds:

    replica      vLLM server + weight subscriber     rollwire.consumers.entry.serve_replica
    scorer       group scorer (faust on Kafka)       rollwire.streams.entry.serve_scorer
    trainer      until the recipe's last step        rollwire.trainer.entry.serve_trainer (torchrun: processes > 1)
    env-worker   tasks -> rollouts via the replicas  rollwire.producers.entry.serve_env_worker
    dispatcher   tasks, paced by the off-policy budget  rollwire.producers.entry.serve_dispatcher
    gateway      `rollwire serve` before the replica    rollwire.producers.gateway.serve       [feedback]
    feedback-api `rollwire feedback serve`              rollwire.producers.feedback_api.serve  [feedback]
    joiner       `rollwire join` (faust on Kafka)       rollwire.streams.entry.serve_joiner    [feedback]

The supervisor (`rollwire.run.supervisor`) starts these; each reads its settings from the
resolved recipe, and the run's names (topics, consumer groups, policy, folders) from the one
`RunIdentity` the recipe owns (`rollwire.core.identity`); each stops cleanly on SIGTERM (Ctrl-C
reaches only the supervisor).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from rollwire.core import metrics, telemetry
from rollwire.core.bus import catalog_topics, open_log
from rollwire.core.processes import configure_logging, stop_on_sigterm
from rollwire.run.recipe import RunRecipe
from rollwire.schemas.topics import Topics

ROLES = ("replica", "scorer", "trainer", "env-worker", "dispatcher", "gateway", "feedback-api", "joiner")


def base_url(recipe: RunRecipe, index: int = 0) -> str:
    """Replica `index`'s server (the gateway's upstream is replica 0's)."""
    return f"http://127.0.0.1:{recipe.server_port(index)}"


def run_replica(recipe: RunRecipe, log, topics: Topics, index: int) -> None:
    from rollwire.consumers.entry import serve_replica
    from rollwire.consumers.weight_subscriber import WeightSubscriberSettings
    from rollwire.core.objectstore import open_store
    cache = recipe.identity.replica_cache(index)
    subscriber = WeightSubscriberSettings(replica_id=f"replica-{index}", policy=recipe.identity.policy, cache_dir=cache,
                                          stage_weights=recipe.inference.stage_weights,
                                          direct_weights=recipe.inference.direct_weights)
    server = recipe.server_settings(index).model_copy(update={"pid_file": cache / "vllm.pid"})
    serve_replica(log, topics, open_store(recipe.store), server, subscriber)


def run_scorer(recipe: RunRecipe, log, topics: Topics, index: int) -> None:
    from rollwire.streams.entry import serve_scorer
    serve_scorer(log, topics, recipe.scorer, bus=recipe.bus, group_id=recipe.group_id("scorer"),
                 data_dir=recipe.identity.faust_dir)


def run_trainer(recipe: RunRecipe, log, topics: Topics, index: int) -> None:
    from rollwire.core.objectstore import open_store
    from rollwire.trainer.entry import serve_trainer
    params = {"trainer": recipe.trainer.model_dump(mode="json"),
              "environments": ",".join(e.name for e in recipe.environments), "steps": recipe.steps}
    serve_trainer(log, topics, open_store(recipe.store), recipe.trainer, telemetry=recipe.telemetry_for("trainer"),
                  run_name=recipe.name, params=params, max_steps=recipe.steps)


def torchrun(processes: int) -> list[str]:
    """The launcher of a data-parallel trainer role: torchrun on this machine, `processes` ranks,
    all restarted together (from the last commit point) when one dies, up to three times."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}",
            "--max-restarts=3", "-m"]


def run_env_worker(recipe: RunRecipe, log, topics: Topics, index: int) -> None:
    from rollwire.core.objectstore import open_store
    from rollwire.producers.entry import serve_env_worker
    from rollwire.producers.tasksets import load_taskset
    tasksets = {e.name: load_taskset(e.name, **e.options) for e in recipe.environments}
    serve_env_worker(log, topics, tasksets, recipe.env_workers.for_worker(index), store=open_store(recipe.store),
                     setups={e.name: e.setup() for e in recipe.environments})


def run_dispatcher(recipe: RunRecipe, log, topics: Topics, index: int) -> None:
    from rollwire.producers.entry import serve_dispatcher
    from rollwire.producers.tasksets import load_taskset
    mix = [(e, load_taskset(e.name, **e.options)) for e in recipe.environments]
    # one process reports every group's lag: this one
    serve_dispatcher(log, topics, mix, recipe.trainer.batch, recipe.dispatcher, report_lag_of=recipe.consumer_groups())


def run_gateway(recipe: RunRecipe, log, topics: Topics, index: int) -> None:
    from rollwire.producers.gateway import serve
    serve(log, topics, recipe.feedback.gateway)


def run_feedback_api(recipe: RunRecipe, log, topics: Topics, index: int) -> None:
    from rollwire.producers.feedback_api import serve
    serve(log, topics, recipe.feedback.ingest)


def run_joiner(recipe: RunRecipe, log, topics: Topics, index: int) -> None:
    from rollwire.streams.entry import serve_joiner
    serve_joiner(log, topics, recipe.feedback.join, bus=recipe.bus, group_id=recipe.group_id("joiner"),
                 data_dir=recipe.identity.faust_dir)


RUNNERS = {"replica": run_replica, "scorer": run_scorer, "trainer": run_trainer, "env-worker": run_env_worker,
           "dispatcher": run_dispatcher, "gateway": run_gateway, "feedback-api": run_feedback_api,
           "joiner": run_joiner}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rollwire.run.roles",
                                     description="one component of a `rollwire run` (started by its supervisor)")
    parser.add_argument("role", choices=ROLES)
    parser.add_argument("recipe", type=Path, help="the resolved recipe (<run_dir>/recipe.json)")
    parser.add_argument("--index", type=int, default=0, help="which one of several processes of the role")
    args = parser.parse_args(argv)
    configure_logging(logging.INFO, f"%(asctime)s {args.role}-{args.index} %(levelname)s %(name)s: %(message)s")
    recipe = RunRecipe.model_validate_json(args.recipe.read_text())
    if args.role != "replica":  # the replica handles SIGTERM itself: it must stop its vLLM server
        stop_on_sigterm()
    if args.role == "trainer":
        import torch
        torch.set_num_threads(recipe.trainer_threads)
    settings = recipe.telemetry_for(args.role)
    provider = telemetry.configure(settings)
    meters = metrics.configure(settings.metrics, settings.service_name)
    topics = recipe.identity.topics
    started = time.monotonic()
    sites = None
    if settings.memory_sites.enabled:
        from rollwire.core.memory_sites import MemorySites
        sites = MemorySites(recipe.run_dir / "memory" / f"{args.role}-{args.index}.jsonl", settings.memory_sites,
                            root=str(Path(__file__).resolve().parents[2])).start()
    try:
        with open_log(recipe.bus) as log:
            log.create_topics(catalog_topics(topics))
            RUNNERS[args.role](recipe, log, topics, args.index)
    except KeyboardInterrupt:
        logging.getLogger(__name__).info("stopped after %.0f s", time.monotonic() - started)
    finally:
        if sites is not None:
            sites.stop()
        for shut in (provider, meters):
            if shut is not None:
                shut.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
