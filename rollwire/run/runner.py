"""`rollwire run`: the whole loop on one machine, from a recipe.

    # Step 1  resolve the recipe; write <run_dir>/recipe.json (every component reads it)
    # Step 2  the policy's version 0: build the tiny model and warm-start it, unless it exists
    # Step 3  start the replica (vLLM) and wait until it answers
    # Step 4  start scorer, trainer, env workers, dispatcher; with [feedback], the joiner, the
    #         feedback ingestion API and the serving gateway
    # Step 5  follow the run's events: live display, metrics JSONL; restart crashed components
    # Step 6  when the trainer has done its last step: wait (a while) for every replica to serve
    #         the last version; then (or on Ctrl-C) stop everything in order, draw the reward
    #         curve, print first-10 and last-10 mean reward

Interrupted and started again with the same recipe, it resumes: the base model is kept, the
trainer restarts from its last checkpoint, the dispatcher recounts what it issued, and the
metrics file is rebuilt from the log.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from rollwire.consumers.vllm_control import VllmControl
from rollwire.consumers.vllm_server import free_port
from rollwire.core.bus import catalog_topics, open_log
from rollwire.core.metrics import LagProbe
from rollwire.run.progress import RunProgress, StallWatch, plot
from rollwire.run.recipe import RunRecipe
from rollwire.run.roles import base_url, torchrun
from rollwire.run.supervisor import RunFailed, Supervisor


@dataclass
class RunResult:
    steps: int
    first10: float | None
    last10: float | None
    metrics_path: Path
    plot_path: Path | None
    interrupted: bool
    seconds: float


def resolve(recipe: RunRecipe) -> Path:
    """Step 1: fixes what must be the same in every process (the server port) and writes recipe.json."""
    recipe.run_dir.mkdir(parents=True, exist_ok=True)
    inference = recipe.inference
    if not inference.replica_ports:
        inference.replica_ports = ([free_port() for _ in range(inference.replicas)] if inference.port == 0 else
                                   [inference.port + i for i in range(inference.replicas)])
        inference.port = inference.replica_ports[0]
    feedback = recipe.feedback
    if feedback.enabled:
        for service in (feedback.gateway, feedback.ingest):
            if service.port == 0:
                service.port = free_port()
        feedback.gateway.upstream = base_url(recipe)
        feedback.gateway.model = recipe.identity.policy
    path = recipe.run_dir / "recipe.json"
    path.write_text(recipe.model_dump_json(indent=1))
    return path


def prepare_model(recipe: RunRecipe, console: Console) -> None:
    """Step 2: builds `<run_dir>/base` (tiny model + warm start, or the import of a GGUF file) once;
    a finished one is kept. The build runs in a child process: torch and the warm start's
    allocations (about 570 MB on the demo) would otherwise stay in this process, which supervises
    the run for as long as it lasts."""
    base = Path(recipe.base_model)
    if recipe.model.path == recipe.base_model or (base / "config.json").exists():
        return
    # A new interpreter, not multiprocessing: a spawned child would import the caller's main script.
    # Ctrl-C reaches both; the child leaves `base.partial`, which the next try starts over.
    child = subprocess.run([sys.executable, "-m", "rollwire.run.runner", "--build-base"],
                           input=recipe.model_dump_json(), text=True)
    if child.returncode != 0:
        raise RunFailed(f"building {base} failed (exit code {child.returncode}): its error is printed above; "
                        f"the same command tries again")


def _build_base(recipe_json: str) -> None:
    """`prepare_model`'s child: builds the base into `base.partial`, renamed to `base` when whole."""
    recipe = RunRecipe.model_validate_json(recipe_json)
    console = Console(soft_wrap=True)
    base = Path(recipe.base_model)
    building = base.with_name(base.name + ".partial")
    shutil.rmtree(building, ignore_errors=True)
    if recipe.model.path is not None:
        from rollwire.trainer.model_import import import_gguf
        with console.status(f"importing {recipe.model.path} into {base} (once) ..."):
            imported = import_gguf(recipe.model.path, building)
        console.print(f"imported {recipe.model.path}: {imported.summary}")
        building.rename(base)
        return
    import torch

    from rollwire.producers.tasksets import load_taskset
    from rollwire.trainer.tiny import build_bpe_tokenizer, build_char_tokenizer, build_tiny_model
    from rollwire.trainer.warmstart import warm_start
    torch.set_num_threads(2)
    tiny = recipe.model.tiny
    tokenizer = build_bpe_tokenizer() if tiny.tokenizer == "bpe" else build_char_tokenizer()
    build_tiny_model(building, tokenizer, seed=tiny.seed, hidden=tiny.hidden, layers=tiny.layers, heads=tiny.heads,
                     kv_heads=tiny.kv_heads, intermediate=tiny.intermediate, tie_embeddings=tiny.tie_embeddings,
                     architecture=tiny.architecture)
    settings = recipe.warm_start
    if settings.steps:
        environment = recipe.warm_start_environment()
        taskset = load_taskset(environment.name, **environment.options)
        columns = (TextColumn("warm start on the {task.fields[env]} teacher"), BarColumn(),
                   TextColumn("{task.completed}/{task.total} steps · loss {task.fields[loss]:.3f}"),
                   TimeElapsedColumn(), TimeRemainingColumn())
        with Progress(*columns, console=console, transient=False) as bar:
            task = bar.add_task("warm start", total=settings.steps, env=environment.name, loss=float("nan"))
            warm_start(building, taskset, settings,
                       on_step=lambda step, loss: bar.update(task, completed=step, loss=loss))
    building.rename(base)  # complete, or not there at all


def prepare(recipe: RunRecipe, console: Console | None = None) -> Path:
    """Steps 1 and 2, and the topics: all a deployment that starts each role itself needs first
    (`rollwire run --prepare-only`, the compose stack's `init` service). Returns recipe.json's path."""
    recipe_json = resolve(recipe)
    prepare_model(recipe, console or Console(soft_wrap=True))
    with open_log(recipe.bus) as log:
        log.create_topics(catalog_topics(recipe.identity.topics))
    return recipe_json


def _wait_for_servers(supervisor: Supervisor, recipe: RunRecipe, console: Console, timeout_s: float = 600) -> None:
    """Step 3's wait: until every replica's vLLM answers (~40 s each on a small CPU)."""
    waiting = {i: VllmControl(base_url(recipe, i), timeout_s=2.0) for i in range(recipe.inference.replicas)}
    deadline = time.monotonic() + timeout_s
    what = "the vLLM server" if len(waiting) == 1 else f"{len(waiting)} vLLM servers"
    with console.status(f"starting {what} (about 40 s on a small CPU) …"):
        while time.monotonic() < deadline:
            for line in supervisor.check():
                console.print(f"[yellow]{line}")
            for index in [i for i, control in waiting.items() if control.healthy()]:
                waiting.pop(index).close()
            if not waiting:
                return
            time.sleep(1.0)
    raise RunFailed(f"{what} did not answer within {timeout_s:.0f} s; see {recipe.run_dir / 'logs'}")


def run(recipe: RunRecipe, *, metrics_out: Path | None = None, console: Console | None = None) -> RunResult:
    console = console or Console(soft_wrap=True)
    started = time.monotonic()
    # Step 1
    recipe_json = resolve(recipe)
    metrics_path = metrics_out or recipe.run_dir / "metrics.jsonl"
    console.print(f"[bold]rollwire run[/] {recipe.name} → {recipe.run_dir}  ({recipe.bus.type} log, "
                  f"{recipe.steps} steps; Ctrl-C stops, the same command resumes)")
    # Step 2
    prepare_model(recipe, console)
    topics = recipe.identity.topics
    log = open_log(_watching(recipe.bus))
    log.create_topics(catalog_topics(topics))
    launchers = {"trainer": torchrun(recipe.trainer.processes)} if recipe.trainer.processes > 1 else None
    supervisor = Supervisor(recipe_json, recipe.run_dir / "logs", launchers=launchers)
    progress = RunProgress(log, topics, metrics_path, lag_probe=LagProbe(log, recipe.consumer_groups()))
    interrupted = False
    try:
        # Step 3
        for index in range(recipe.inference.replicas):
            supervisor.start("replica", index)
        _wait_for_servers(supervisor, recipe, console)
        # Step 4
        for role in ("scorer", "trainer"):
            supervisor.start(role)
        for index in range(recipe.env_workers.count):
            supervisor.start("env-worker", index)
        supervisor.start("dispatcher")
        if recipe.feedback.enabled:
            _start_feedback(supervisor, recipe, console)
        # Step 5
        _follow(supervisor, progress, recipe, console)
    except KeyboardInterrupt:
        interrupted = True
        console.print(f"[yellow]interrupted at step {progress.step}: stopping; run the same command to resume")
    finally:
        # Step 6
        with console.status("stopping the components …"):
            supervisor.stop()
            # a replica killed while it started its server (a restart at the very end) leaves the
            # server shutting down on its own: end it, so that nothing outlives the run
            from rollwire.consumers.vllm_server import end_left_behind
            for index in range(recipe.inference.replicas):
                end_left_behind(recipe.identity.replica_cache(index) / "vllm.pid")
        progress.poll(0.2)
        progress.close()
        log.close()
    plot_path = None
    if progress.rows:
        try:
            plot_path = plot(progress.curve.rows, recipe.run_dir / "reward_curve.png", title=f"rollwire run: {recipe.name}")
        except ImportError:
            console.print("[yellow]no reward curve: matplotlib is not installed (pip install matplotlib)")
    result = RunResult(progress.step, progress.mean_reward(first=10), progress.mean_reward(last=10), metrics_path,
                       plot_path, interrupted, time.monotonic() - started)
    _report(result, console)
    return result


def _watching(bus):
    """The bus settings for this process's own reads (display, lag, stall watch): on Kafka, a
    broker away is not waited for here (the components wait for it), so that a crashed component
    is still restarted meanwhile; the display shows the lag as unknown."""
    return bus.model_copy(update={"outage_s": 5.0}) if bus.type == "kafka" else bus


def _start_feedback(supervisor: Supervisor, recipe: RunRecipe, console: Console) -> None:
    """Step 4 for production feedback: the joiner, the ingestion API, the gateway."""
    for role in ("joiner", "feedback-api", "gateway"):
        supervisor.start(role)
    gateway, ingest = recipe.feedback.gateway, recipe.feedback.ingest
    console.print(f"production: OpenAI API at http://{gateway.host}:{gateway.port}/v1 (model {gateway.model!r}), "
                  f"feedback at http://{ingest.host}:{ingest.port}/v1/feedback; the trainer takes up to "
                  f"{100 * recipe.trainer.feedback.share:.0f}% of each batch from it")


@contextlib.contextmanager
def _ctrl_c_between_polls() -> Iterator[threading.Event]:
    """Ctrl-C while following is taken between two polls, not in the middle of one: a
    KeyboardInterrupt raised after the reader returned records but before they were counted would
    lose them from the metrics file (a step missing from metrics.jsonl)."""
    pressed = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield pressed
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: pressed.set())
    try:
        yield pressed
    finally:
        signal.signal(signal.SIGINT, previous)
    if pressed.is_set():
        raise KeyboardInterrupt


def _follow(supervisor: Supervisor, progress: RunProgress, recipe: RunRecipe, console: Console) -> None:
    """Step 5: until the trainer finishes its last step; a run that stands still says where."""
    stall = StallWatch(progress.log, progress.topics, recipe.stall_after_s, recipe.run_dir / "logs")
    warned_at = 0.0

    def trainer_done() -> bool:
        return any(c.role == "trainer" and c.finished for c in supervisor.children)

    def stalled(say) -> str | None:
        nonlocal warned_at
        warning = stall.check()
        if warning and time.monotonic() - warned_at > recipe.stall_after_s:  # once per stall period, in the log
            say(f"[red]{warning}")
            warned_at = time.monotonic()
        return warning

    with _ctrl_c_between_polls() as ctrl_c:
        if console.is_terminal:
            with Live(progress.table(recipe.steps, "training"), console=console, refresh_per_second=2) as live:
                while not trainer_done() and not ctrl_c.is_set():
                    progress.poll(0.5)
                    for line in supervisor.check():
                        live.console.print(f"[yellow]{line}")
                    progress.stall = stalled(live.console.print)
                    live.update(progress.table(recipe.steps, "training"))
            if not ctrl_c.is_set():
                _wait_for_last_version(supervisor, progress, recipe, console, ctrl_c)
            return
        reported = time.monotonic()
        # not a terminal (CI, a pipe): one line per step, or a minute of silence
        while not trainer_done() and not ctrl_c.is_set():
            new = progress.poll(0.5)
            if new or time.monotonic() - reported > 60:
                console.print(progress.summary())
                reported = time.monotonic()
            for line in supervisor.check():
                console.print(line)
            progress.stall = stalled(console.print)
        if not ctrl_c.is_set():
            progress.poll(0.5)
            _wait_for_last_version(supervisor, progress, recipe, console, ctrl_c)


def _wait_for_last_version(supervisor: Supervisor, progress: RunProgress, recipe: RunRecipe, console: Console,
                           ctrl_c: threading.Event, timeout_s: float = 120.0) -> None:
    """Step 6's wait: a run ends with every replica serving what it trained last (the fleet
    topic's word), unless that takes longer than `timeout_s`, which is said."""
    if not progress.rows:
        return
    last = progress.rows[-1]["policy_version"]
    deadline = time.monotonic() + timeout_s

    def behind() -> list[str]:
        return [rid for rid, version in progress.serving.items()
                if progress.replica_state.get(rid) != "stopped" and version != last]

    with console.status(f"waiting for the replicas to serve version {last} …"):
        while behind() and not ctrl_c.is_set() and time.monotonic() < deadline:
            progress.poll(0.5)
            for line in supervisor.check():
                console.print(line)
    if behind():
        console.print(f"[yellow]{', '.join(behind())} did not serve version {last} within {timeout_s:.0f} s")


def _report(result: RunResult, console: Console) -> None:
    if result.steps == 0:
        console.print("no trainer step finished")
        return
    console.print(f"[bold]{result.steps} steps[/] in {result.seconds / 60:.1f} min · mean reward first 10 steps "
                  f"[bold]{result.first10:.3f}[/] → last 10 steps [bold]{result.last10:.3f}[/]")
    console.print(f"metrics: {result.metrics_path}" + (f" · reward curve: {result.plot_path}" if result.plot_path else ""))


if __name__ == "__main__":  # `prepare_model`'s child: the resolved recipe's JSON on standard input
    if sys.argv[1:] != ["--build-base"]:
        raise SystemExit("usage: python -m rollwire.run.runner --build-base < recipe.json (started by rollwire run)")
    _build_base(sys.stdin.read())
