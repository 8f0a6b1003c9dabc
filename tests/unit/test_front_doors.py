"""One front door per role: the `rollwire` command and `rollwire run` start each role through the
same entry, and neither builds a role's component itself (that is how a hand-started scorer once
joined another consumer group than the run's, and `rollwire train` reported to no tracker)."""

from __future__ import annotations

import ast
from pathlib import Path

from rollwire.core.bus import EmbeddedBusSettings, HeldDeadLetters, read_to_end
from rollwire.run.roles import ROLES
from rollwire.schemas import Topics

REPO = Path(__file__).resolve().parents[2]
ROLES_MODULE = REPO / "rollwire" / "run" / "roles.py"
FRONT_DOORS = {
    "replica": ("rollwire.consumers.entry", "serve_replica", "services.py"),
    "scorer": ("rollwire.streams.entry", "serve_scorer", "services.py"),
    "trainer": ("rollwire.trainer.entry", "serve_trainer", "services.py"),
    "env-worker": ("rollwire.producers.entry", "serve_env_worker", "producers.py"),
    "dispatcher": ("rollwire.producers.entry", "serve_dispatcher", "producers.py"),
    "gateway": ("rollwire.producers.gateway", "serve", "feedback.py"),
    "feedback-api": ("rollwire.producers.feedback_api", "serve", "feedback.py"),
    "joiner": ("rollwire.streams.entry", "serve_joiner", "feedback.py"),
}
"""Each role's entry, and the CLI module of its command."""
COMPONENTS = {"Trainer", "EmbeddedScorer", "EmbeddedJoiner", "Replica", "EnvWorker", "Dispatcher", "build_app",
              "run_worker", "open_trackers", "Router", "InterceptionServer"}
"""What only a front door builds."""


def _imports(path: Path) -> set[tuple[str, str]]:
    return {(node.module, alias.name) for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom) and node.module for alias in node.names}


def test_every_role_has_one_front_door_that_its_command_and_the_run_both_use():
    assert set(FRONT_DOORS) == set(ROLES)
    run_imports = _imports(ROLES_MODULE)
    for role, (module, name, cli) in FRONT_DOORS.items():
        assert (module, name) in run_imports, f"rollwire run's {role} role must start through {module}.{name}"
        assert (module, name) in _imports(REPO / "rollwire" / "cli" / cli), \
            f"the {role} command (rollwire/cli/{cli}) must start through {module}.{name}"


def test_neither_the_commands_nor_the_run_build_a_component_themselves():
    built = []
    for path in [*(REPO / "rollwire" / "cli").glob("*.py"), *(REPO / "rollwire" / "run").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
                if name in COMPONENTS:
                    built.append(f"{path.relative_to(REPO)}:{node.lineno} {name}")
    assert built == [], "a front door (streams/entry.py, trainer/entry.py, ...) builds these: " + ", ".join(built)


def test_a_scorer_started_by_hand_scores_in_the_runs_consumer_group(tmp_path):
    """`rollwire score --prefix RUN` beside a run: its group is the run's own, so the two share the
    partitions instead of scoring every group twice."""
    import json
    import subprocess
    import sys

    from builders import group_of

    from rollwire.core.bus import EventProducer, catalog_topics, open_log
    from rollwire.run.recipe import RunRecipe

    recipe = RunRecipe.model_validate({"name": "hand", "run_dir": str(tmp_path / "run"),
                                       "environments": [{"name": "reverse-digits", "group_size": 2}]})
    topics = Topics(recipe.topic_prefix)
    with open_log(EmbeddedBusSettings(path=tmp_path / "log")) as log:
        log.create_topics(catalog_topics(topics))
        producer = EventProducer(log.producer(), topics, name="env-worker")
        for rollout in group_of("g1", [1.0, 0.0]):
            producer.send(topics.rollouts, rollout, key="g1")
        producer.close()
    done = subprocess.run([sys.executable, "-m", "rollwire", "score", "--log-dir", str(tmp_path / "log"),
                           "--prefix", topics.prefix, "--exit-when-idle", "2"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1])
    with open_log(EmbeddedBusSettings(path=tmp_path / "log")) as log:
        assert sum(log.committed(recipe.group_id("scorer"), topics.rollouts).values()) == 2
        scored = [d.event for d in read_to_end(log, [topics.scored], HeldDeadLetters())]
    assert len(scored) == 2


def _subcommand(parser, *path: str):
    for name in path:
        parser = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices[name]
    return parser


def test_no_command_declares_a_flag_that_copies_a_settings_field():
    """A flag named after a field of the settings its command builds is generated from that field
    (`add_settings_flags`: its type, default and doc), never typed again by hand."""
    from rollwire.cli import build_parser
    from rollwire.consumers.vllm_server import VllmServerSettings
    from rollwire.consumers.weight_subscriber import WeightSubscriberSettings
    from rollwire.producers.dispatcher import DispatcherSettings, EnvironmentMix
    from rollwire.producers.env_worker import EnvWorkerSettings
    from rollwire.producers.feedback_api import FeedbackApiSettings
    from rollwire.producers.gateway import GatewaySettings
    from rollwire.schemas.rollout import SamplingParams
    from rollwire.trainer.settings import BatchSettings, TrainerSettings
    commands = {("serve",): [GatewaySettings], ("feedback", "serve"): [FeedbackApiSettings],
                ("inference",): [VllmServerSettings, WeightSubscriberSettings], ("env-worker",): [EnvWorkerSettings],
                ("dispatch",): [EnvironmentMix, SamplingParams, BatchSettings, DispatcherSettings],
                ("train",): [TrainerSettings, BatchSettings]}
    copies = []
    for path, models in commands.items():
        docs = {name: (info.description or "").split("\n")[0].rstrip(".") for model in models
                for name, info in model.model_fields.items()}
        for action in _subcommand(build_parser(), *path)._actions:
            if action.dest in docs and not (action.help or "").startswith(docs[action.dest]):
                copies.append(f"rollwire {' '.join(path)} {'/'.join(action.option_strings)}")
    assert copies == [], "declare these with add_settings_flags: " + ", ".join(copies)
