"""Running `rollwire run` as a user does, for the tests of whole runs (tests/run): a short recipe, a
subprocess, and stopping it as Ctrl-C would."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

SHORT = """
name = "{name}"
steps = {steps}

[model.tiny]
seed = 1
{tiny}

[warm_start]
steps = 40

[[environments]]
name = "reverse-digits"
algorithm = "grpo-nostd"
group_size = 4
options = {{ seed = 3 }}
sampling = {{ temperature = 1.0, max_tokens = 8 }}
{environments}
[env_workers]
concurrency = 8
count = {env_workers}

[inference]
replicas = {replicas}

[trainer]
processes = {trainer_processes}
direct = {{ enabled = {direct} }}

[trainer.batch]
batch_rollouts = 16
max_off_policy = 1

[telemetry]
exporter = "file"
report_to = ["tensorboard"]
[telemetry.metrics]
exporter = "file"
interval_s = 1
"""


DEMO_STEPS = 60
"""The session's shared demo run (`tests/run/conftest.py`): long enough to show learning, and to
hold the steps and versions the documentation's commands name (25, 50 and the last ten)."""


TIED_QWEN2 = 'architecture = "qwen2"\ntokenizer = "bpe"\ntie_embeddings = true'
"""`[model.tiny]` lines for the shape of Qwen2.5: BPE tokenizer, tied output layer."""
TIED_QWEN3 = 'architecture = "qwen3"\ntokenizer = "bpe"\ntie_embeddings = true'
"""The shape of Qwen3's small models: q/k norms, BPE tokenizer, tied output layer."""


def short_recipe(name: str, steps: int, *, replicas: int = 1, env_workers: int = 1, trainer_processes: int = 1,
                 tiny: str = "", environments: str = "", direct: bool = False) -> str:
    """The short recipe's text: `replicas` inference replicas, `env_workers`, trainer ranks, more
    `[model.tiny]` lines, more `[[environments]]` after reverse-digits, and whether the trainer
    sends its versions to the replicas directly (`[trainer.direct]`)."""
    return SHORT.format(name=name, steps=steps, replicas=replicas, env_workers=env_workers,
                        trainer_processes=trainer_processes, tiny=tiny, environments=environments,
                        direct=str(direct).lower())


def served_logprob_gaps(log, rollouts_topic: str, weights_root: Path) -> dict[int, float]:
    """For each published version (1 and up), the first rollout that has tokens sampled by it: the
    largest gap, over those tokens, between the logprobs the replica served and those of that
    version's weights in the store. A rollout a hot reload split counts for both of its versions,
    each over its own span, so a token put down to the wrong version shows as a gap."""
    from reference import transformers_logprobs

    from rollwire.core.bus import HeldDeadLetters, read_to_end
    from rollwire.core.objectstore import LocalStore
    from rollwire.core.weight_versions import fetch, stored_version
    first: dict[int, tuple[object, int, int]] = {}
    for delivery in read_to_end(log, [rollouts_topic], HeldDeadLetters()):
        rollout = delivery.event
        if rollout.error is None:
            for span in rollout.weight_versions:
                if span.version >= 1 and span.end > span.start:
                    first.setdefault(span.version, (rollout, span.start, span.end))
    gaps = {}
    store = LocalStore(weights_root)
    with tempfile.TemporaryDirectory(prefix="served-") as scratch:
        for version, (rollout, start, end) in sorted(first.items()):
            published = stored_version(store, "policy", version)  # a delta is rebuilt on its base, as a replica does
            folder = Path(scratch) / f"v{version}"
            fetch(store, published.uri, published.manifest_sha256, folder)
            stored = transformers_logprobs(folder, rollout.prompt_token_ids, rollout.completion_token_ids)
            gaps[version] = max(abs(a - b) for a, b in zip(rollout.completion_logprobs[start:end], stored[start:end]))
            shutil.rmtree(folder)
    return gaps


def recipe_file(folder: Path, name: str, steps: int, **shape) -> Path:
    path = folder / f"{name}.toml"
    path.write_text(short_recipe(name, steps, **shape))
    return path


def start_run(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.Popen:
    """`rollwire run ARGS` as a subprocess in `cwd`, its output piped; `env` added to this process's environment.
    SIGINT is Ctrl-C to it even where this process was started ignoring SIGINT (a background job of
    a non-interactive shell is), as a terminal's foreground job would take it."""
    return subprocess.Popen([sys.executable, "-m", "rollwire", "run", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "COLUMNS": "200", **(env or {})},
                            cwd=cwd, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def finish(process: subprocess.Popen, timeout_s: float) -> str:
    """Waits for `rollwire run` to end; if the test gives up first, stops it as Ctrl-C would, then kills."""
    try:
        return process.communicate(timeout=timeout_s)[0]
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                for child in psutil.Process(process.pid).children(recursive=True):
                    child.kill()
                process.kill()


def metrics_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def processes_of(run_dir: Path) -> list[str]:
    """Command lines of processes still working on `run_dir` (a component, or its vLLM server)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if str(run_dir) in cmdline and proc.pid != os.getpid():
            found.append(cmdline)
    return found
